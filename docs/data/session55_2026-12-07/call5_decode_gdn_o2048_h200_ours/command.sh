# session 55, call 5 (run tool, the same warm H200, carry [".site"], timeout_s 430), right after call 4; bench_serving resumed
# call 4's stock case from /tmp/b_decode_gdn and ran ours. Tree 6a9632a.
nvidia-smi --query-gpu=name --format=csv,noheader; REPLAYSSM_DIAG_FLUSH=256 DECODE_MODELS=gdn DECODE_CONC=256 DECODE_SIDES=stock,ours DECODE_ARGS="--output-len 2048 --rounds 1" DECODE_POOL_ARGS="--disable-radix-cache --max-mamba-cache-size 300 --max-running-requests 256 --stream-interval 8" PLAN_DEADLINE_S=400 bash scripts/device_plan.sh decode_fixed
