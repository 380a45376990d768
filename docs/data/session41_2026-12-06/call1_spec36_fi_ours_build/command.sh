#!/usr/bin/env bash
# carried as scripts/diag/s41_row1.sh (untracked, deleted after the session); call 1: bash scripts/diag/s41_row1.sh ours
# session 41 one-off: row 1 (flashinfer spec) at C=256 on an H200, C=128 otherwise
SIDE=${1:-ours}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then C=256; else C=128; fi
echo "side=$SIDE C=$C"
SPEC_SIDES=$SIDE SPEC_CONC=$C SPEC_SSM_LAYERS=36 SPEC_ARGS="--attention-backend flashinfer" \
SPEC_POOL_ARGS="--disable-radix-cache --max-running-requests $C" PLAN_DEADLINE_S=${DL:-575} \
  bash scripts/device_plan.sh ${INSTALL-install} spec256
du -sh ~/.cache/flashinfer 2>/dev/null; ls ~/.cache 2>/dev/null
