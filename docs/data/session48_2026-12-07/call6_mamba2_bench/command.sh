# run tool, warm H100, carry [".site"], timeout_s 260; 41.6 s
BENCH_TIMEOUT=220 BENCH_ARGS="--family mamba2 --batches 256,64,1" bash scripts/device_kernels.sh bench
