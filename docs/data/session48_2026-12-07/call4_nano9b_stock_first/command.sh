# run tool, warm H100, carry [".site"], timeout_s 590; 480.5 s (includes the checkpoint build); SGLang's default stream interval
DECODE_MODELS=nano9b DECODE_CONC=256 DECODE_SIDES=stock,ours DECODE_ARGS="--output-len 2048 --rounds 1" PLAN_DEADLINE_S=560 bash scripts/device_plan.sh install decode_fixed
