# session 51, call 9 (run tool, kind=nvidia-h100-x1, carry [".site"], timeout_s 520), at once on the same warm H100. 352 s
# (the 36-layer spec model was built first on this machine). Given back after it with 457 s left.
SPEC_SIDES=ours,upstream SPEC_CONC=128 SPEC_SSM_LAYERS=36 SPEC_ARGS="--attention-backend flashinfer --output-len 1024 --ring-len 8" SPEC_POOL_ARGS="--disable-radix-cache --max-running-requests 128" PLAN_DEADLINE_S=470 bash scripts/device_plan.sh spec256
