#!/usr/bin/env bash
# session 45 call 1: H200 -> issue 5's spec at C=256 (ours); else the decode plan-5 register-cap bench.
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "GPU: $gpu"
if echo "$gpu" | grep -q H200; then
  SPEC_SIDES=ours SPEC_CONC=256 SPEC_SSM_LAYERS=36 SPEC_ARGS="--attention-backend flashinfer" SPEC_POOL_ARGS="--disable-radix-cache --max-running-requests 256" PLAN_DEADLINE_S=560 bash scripts/device_plan.sh install spec256 jit_cache_pack
else
  DEADLINE=480 bash scripts/diag/s45_maxnreg.sh
fi
