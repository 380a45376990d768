# session 49, call 4 (run tool, kind=nvidia-h100-x1, carry [".site"], timeout_s 600); fresh H100 80GB HBM3
# (calls 2 and 3 asked for an H200 with needs_h200 for stock's C=256 spec side and got no machine)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; SPEC_SIDES=stock,upstream,ours SPEC_CONC=128 SPEC_SSM_LAYERS=36 SPEC_ARGS="--attention-backend flashinfer --output-len 1024" SPEC_POOL_ARGS="--disable-radix-cache --max-running-requests 128" PLAN_DEADLINE_S=570 bash scripts/device_plan.sh install spec256
