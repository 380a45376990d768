# run tool, warm H100, carry [".site"], timeout_s 600; 381 s (includes building the 36-layer spec checkpoint)
SPEC_SIDES=stock SPEC_CONC=128 SPEC_SSM_LAYERS=36 SPEC_ARGS="--attention-backend flashinfer --output-len 1024" SPEC_POOL_ARGS="--disable-radix-cache --max-running-requests 128" PLAN_DEADLINE_S=580 bash scripts/device_plan.sh install spec256
