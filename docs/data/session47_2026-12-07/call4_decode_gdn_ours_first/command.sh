# run tool, warm H100, carry [".site"], timeout_s 460; 239 s; default plan, no REPLAYSSM_CONFIG
REPLAYSSM_DIAG_FLUSH=256 DECODE_MODELS=gdn DECODE_CONC=256 DECODE_SIDES=ours,stock DECODE_ARGS="--output-len 2048 --rounds 1" DECODE_POOL_ARGS="--disable-radix-cache --max-mamba-cache-size 300 --max-running-requests 256 --stream-interval 8" PLAN_DEADLINE_S=420 bash scripts/device_plan.sh decode_fixed
