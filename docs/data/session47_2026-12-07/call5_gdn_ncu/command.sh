# run tool, warm H100, carry [".site"], timeout_s 270; 49 s (gdn_ncu.ncu-rep was too large to come back)
PLAN_DEADLINE_S=230 bash scripts/device_plan.sh gdn_ncu
