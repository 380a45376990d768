PROF_TAG=_fi2 PROF_ARGS="--attention-backend flashinfer" PROF_BENCH_MIN_S=9999 PLAN_DEADLINE_S=400 bash scripts/device_plan.sh decode_prof
