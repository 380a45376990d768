PROF_TAG=_tr PROF_BENCH_MIN_S=9999 PLAN_DEADLINE_S=330 bash scripts/device_plan.sh decode_prof
