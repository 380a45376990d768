#!/bin/bash
# session 43 one-off: spec at C=256 on an H200 (runbook row 3), else Nano-9B decode at output 2048 (row 2)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  SPEC_SIDES=ours SPEC_CONC=256 SPEC_SSM_LAYERS=36 SPEC_ARGS="--attention-backend flashinfer" \
  SPEC_POOL_ARGS="--disable-radix-cache --max-running-requests 256" PLAN_DEADLINE_S=575 \
  bash scripts/device_plan.sh install spec256 jit_cache_pack
else
  DECODE_MODELS=nano9b DECODE_CONC=256 DECODE_SIDES=ours,stock DECODE_ARGS="--output-len 2048 --rounds 1" \
  DECODE_POOL_ARGS="--disable-radix-cache --max-running-requests 256 --stream-interval 8" \
  PLAN_DEADLINE_S=585 bash scripts/device_plan.sh install decode_fixed
fi
