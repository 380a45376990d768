PLAN_DEADLINE_S=200 bash scripts/device_plan.sh gdn_ncu   # carry [".site"], warm machine after call 4
