#!/usr/bin/env bash
# Session 40's first device call (run as scripts/diag/first_call.sh, then deleted): runbook row 0 on an H200,
# row 1's first half elsewhere.
set -uo pipefail
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  echo "== H200: row 0"
  BENCH_TIMEOUT=420 BENCH_ARGS="--family gdn --batches 256,64,1 --gdn-ckpt-split --gdn-decode-plans 3x16x1x3x8x0x1,5x16x1x3x8x0x1x1x8,5x16x1x2x8x0x1x1x8 --gdn-verify-plans 16x1x2x6,32x2x2x6,16x1x1x6x8" bash scripts/device_kernels.sh bench
else
  echo "== not an H200: row 1 (incremental streaming)"
  bash scripts/device_e2e.sh install
  PROF_TAG=_incr PROF_BENCH_MIN_S=9999 PROF_POOL_ARGS="--disable-radix-cache --max-mamba-cache-size 300 --max-running-requests 256 --incremental-streaming-output" PLAN_DEADLINE_S=560 bash scripts/device_plan.sh decode_prof
fi
