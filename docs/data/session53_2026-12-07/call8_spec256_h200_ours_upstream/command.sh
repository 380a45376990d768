# session 53, call 8 (run tool, the same warm H200, needs_h200, carry [".site"], timeout_s 590), right after call 7;
# bench_serving resumed call 7's stock case from /tmp/b_spec256 and added ours, then SGLang's own. Tree 565c45d.
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; date -u; SPEC_SIDES=ours,upstream SPEC_CONC=256 SPEC_SSM_LAYERS=36 SPEC_ARGS="--attention-backend flashinfer --output-len 1024" SPEC_POOL_ARGS="--disable-radix-cache --max-running-requests 256" PLAN_DEADLINE_S=560 bash scripts/device_plan.sh spec256
