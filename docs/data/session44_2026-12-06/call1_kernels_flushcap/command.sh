#!/usr/bin/env bash
# session 44 call 1: runbook row 1 (flush capacity sweep), then row 1b (tree form, 2 warps) if time is left.
T0=$(date +%s)
OUT_ROOT=$OUT
OUT=$OUT_ROOT/row1 BENCH_TIMEOUT=330 BENCH_ARGS="--family gdn --batches 256 --gdn-ckpt-split --gdn-decode-only --gdn-decode-plans 5x16x1x3x8x0x1x1x8,5x16x1x3x8x0x1x1x8x13,5x16x1x3x8x0x1x1x8x7,5x16x1x3x8x0x1x1x8x25,5x16x1x3x8x0x1x2x8,5x16x1x3x8x0x1x1x4" bash scripts/device_kernels.sh bench
LEFT=$(( 575 - ($(date +%s) - T0) ))
echo "== row1 done after $(( $(date +%s) - T0 )) s; left $LEFT s"
if [ "$LEFT" -gt 120 ]; then
  OUT=$OUT_ROOT/row1b REPLAYSSM_CONFIG=gdn_k_tree=1 BENCH_TIMEOUT=$LEFT BENCH_ARGS="--family gdn --batches 256 --gdn-ckpt-split --gdn-decode-only --gdn-decode-plans 5x16x1x3x8x0x1x1x8,5x16x2x3x8x0x1x1x8" bash scripts/device_kernels.sh bench
fi
