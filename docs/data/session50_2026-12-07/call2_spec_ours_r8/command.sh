# session 50, call 2 (run tool, kind=nvidia-h100-x1, carry [".site"], timeout_s 590); the same warm H100 as call 1. 359 s.
SPEC_SIDES=ours SPEC_CONC=128 SPEC_SSM_LAYERS=36 SPEC_ARGS="--attention-backend flashinfer --output-len 1024 --ring-len 8" SPEC_POOL_ARGS="--disable-radix-cache --max-running-requests 128" PLAN_DEADLINE_S=570 bash scripts/device_plan.sh install spec256
