PROF_TAG=_fi PROF_ARGS="--attention-backend flashinfer" PROF_BENCH_MIN_S=9999 PLAN_DEADLINE_S=570 bash scripts/device_plan.sh decode_prof
