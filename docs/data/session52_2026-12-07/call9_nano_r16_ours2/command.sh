# session 52, call 9 (run tool, kind=nvidia-h100-x1, carry [".site"], timeout_s 250), same warm H100. 124 s. Ours at ring 16 again.
# The machine was given back after this call with 228 s left.
mv /tmp/b_decode_nano9b /tmp/b_decode_nano9b_r8b; DECODE_MODELS=nano9b DECODE_CONC=256 DECODE_SIDES=ours DECODE_ARGS="--output-len 2048 --rounds 1" DECODE_POOL_ARGS="--disable-radix-cache --max-running-requests 256 --stream-interval 8" PLAN_DEADLINE_S=220 bash scripts/device_plan.sh decode_fixed
