# session 53, call 7 (run tool, kind nvidia-h200 with needs_h200 (stock's 72 GiB of intermediate_ssm at C=256 do not
# fit an H100), carry [".site"], timeout_s 600). Calls 4-6 started no machine. A fresh H200 (143771 MiB) came at 18:04 UTC
# (1012 s held at the end of this call, the start included). Tree 565c45d.
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; date -u; SPEC_SIDES=stock SPEC_CONC=256 SPEC_SSM_LAYERS=36 SPEC_ARGS="--attention-backend flashinfer --output-len 1024" SPEC_POOL_ARGS="--disable-radix-cache --max-running-requests 256" PLAN_DEADLINE_S=580 bash scripts/device_plan.sh install spec256
