# run tool, warm H100 (same machine as call 2, whose stock case bench_serving.py resumed), carry [".site"], timeout_s 540; 137 s
SPEC_SIDES=ours SPEC_CONC=128 SPEC_SSM_LAYERS=36 SPEC_ARGS="--attention-backend flashinfer --output-len 1024" SPEC_POOL_ARGS="--disable-radix-cache --max-running-requests 128" PLAN_DEADLINE_S=500 bash scripts/device_plan.sh spec256
