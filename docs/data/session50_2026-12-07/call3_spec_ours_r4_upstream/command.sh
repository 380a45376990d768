# session 50, call 3 (run tool, kind=nvidia-h100-x1, carry [".site"], timeout_s 590); the same warm H100. 211 s.
# --ring-len reaches only ours in the spec study (SGLang's own spec rings have no length flag).
mv /tmp/b_spec256 /tmp/b_spec256_r8; SPEC_SIDES=ours,upstream SPEC_CONC=128 SPEC_SSM_LAYERS=36 SPEC_ARGS="--attention-backend flashinfer --output-len 1024 --ring-len 4" SPEC_POOL_ARGS="--disable-radix-cache --max-running-requests 128" PLAN_DEADLINE_S=570 bash scripts/device_plan.sh install spec256
