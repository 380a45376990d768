# session 55, call 6 (run tool, the same warm H200, carry [".site"], timeout_s 330), right after call 5. Tree 6a9632a.
nvidia-smi --query-gpu=name --format=csv,noheader; PLAN_DEADLINE_S=300 bash scripts/device_plan.sh gdn_ncu
