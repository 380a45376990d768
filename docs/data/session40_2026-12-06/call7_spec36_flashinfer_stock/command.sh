#!/usr/bin/env bash
# Session 40 (run as scripts/diag/spec_fi.sh, then deleted): GDN spec at C=128, 36 SSM layers, flashinfer attention, both sides.
set -uo pipefail
source scripts/device_e2e.sh install
export PYTHONPATH=/tmp/site:$PWD/triton_kernels:$PWD PATH=/opt/torch/.venv/bin:$PATH HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 540 python3 scripts/bench_serving.py --models-dir /tmp/bench_models --quiet --min-server-s 60 --model gdn \
  --study spec --ssm-layers 36 --only stock,ours --concurrency 128 --attention-backend flashinfer \
  --server-args="--disable-radix-cache --max-running-requests 128" --out /tmp/b_spec_fi --pack $OUT/spec_fi.tgz \
  --time-budget 520 > $OUT/spec_fi.log 2>&1
echo rc=$?; grep -v "^\s*$" $OUT/spec_fi.log | tail -22 | cut -c1-200
