# session 53, call 3 (run tool, the same warm H100 80GB HBM3; carry [".site"], timeout_s 480). Tree 78bbcb2 with one
# uncommitted experimental edit: configs._MAXNREG_MIN["decode"] lowered from 96 to 88 (reverted after this call).
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; BENCH_TIMEOUT=400 BENCH_ARGS="--family gdn --batches 256,64 --gdn-ckpt-split --gdn-decode-only --gdn-decode-plans 5x16x1x1x8x0x1x1x8x13x96,5x16x1x1x8x1x1x1x8x13x96,5x16x1x1x8x1x1x1x8x13x88,5x16x1x1x8x0x1x1x8x13x88" bash scripts/device_kernels.sh bench
