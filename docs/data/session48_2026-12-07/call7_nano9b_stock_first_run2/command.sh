# run tool, warm H100, carry [".site"], timeout_s 430; 269.3 s
mv /tmp/b_decode_nano9b /tmp/b_decode_nano9b_second 2>/dev/null; DECODE_MODELS=nano9b DECODE_CONC=256 DECODE_SIDES=stock,ours DECODE_ARGS="--output-len 2048 --rounds 1" PLAN_DEADLINE_S=400 bash scripts/device_plan.sh decode_fixed
