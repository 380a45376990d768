# session 50, call 7 (run tool, kind=nvidia-h100-x1, carry [".site"], timeout_s 360); a fresh H100 80GB HBM3. 228 s.
# L16 ran first and hit its 110 s BENCH_TIMEOUT in its first-use compiles after the GPU check (L16/bench.log has the check only);
# L8 and L32 completed. rerun_L16/ is call 8 on the same warm machine (29 s):
#   R=$OUT; for L in 16; do OUT=$R/L$L BENCH_TIMEOUT=170 BENCH_ARGS="...the same..." bash scripts/device_kernels.sh bench > $R/L$L.out 2>&1; ...; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; R=$OUT; for L in 16 8 32; do OUT=$R/L$L BENCH_TIMEOUT=110 BENCH_ARGS="--family gdn --batches 256 --gdn-ckpt-split --ring-len $L --gdn-decode-plans 5x16x1x1x8x0x1x1x8x13x96 --gdn-verify-plans 16x1x2x6" bash scripts/device_kernels.sh bench > $R/L$L.out 2>&1; rm -f $R/L$L/gpu.txt; echo "L=$L"; grep -E "^H16|bench rc|check" $R/L$L.out $R/L$L/bench.log | head -8; done
