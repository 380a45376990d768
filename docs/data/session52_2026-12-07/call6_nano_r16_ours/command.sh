# session 52, call 6 (run tool, kind=nvidia-h100-x1, carry [".site"], timeout_s 420), at once on call 5's warm H100. 139 s.
# Ours at the default ring of 16 (no --ring-len).
nvidia-smi --query-gpu=name --format=csv,noheader; mv /tmp/b_decode_nano9b /tmp/b_decode_nano9b_r8; DECODE_MODELS=nano9b DECODE_CONC=256 DECODE_SIDES=ours DECODE_ARGS="--output-len 2048 --rounds 1" DECODE_POOL_ARGS="--disable-radix-cache --max-running-requests 256 --stream-interval 8" PLAN_DEADLINE_S=380 bash scripts/device_plan.sh decode_fixed
