# run tool, warm H100, carry [".site"], timeout_s 570; 283.8 s
mv /tmp/b_decode_nano9b /tmp/b_decode_nano9b_first 2>/dev/null; DECODE_MODELS=nano9b DECODE_CONC=256 DECODE_SIDES=ours,stock DECODE_ARGS="--output-len 2048 --rounds 1" PLAN_DEADLINE_S=540 bash scripts/device_plan.sh decode_fixed
