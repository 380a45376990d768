# run tool, same warm H100, carry [".site"], timeout_s 280
nvidia-smi --query-gpu=name --format=csv,noheader; BENCH_TIMEOUT=230 BENCH_ARGS="--family gdn --batches 256,64 --gdn-ckpt-split --gdn-decode-only --gdn-decode-plans 5x16x1x1x8x0x1x1x8x13x96,5x16x1x3x8x0x1x1x8x13,5x16x1x1x8x0x0x1x8x13x96,5x16x1x1x8x0x1x1x8x13x112" bash scripts/device_kernels.sh bench 2>&1 | tail -45
