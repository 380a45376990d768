#!/usr/bin/env bash
# session 39 (untracked, deleted afterwards): where ours' 5 s end-of-wave stall goes (stack samples, triton compiles)
cd "$(dirname "$0")/../.."
source scripts/device_e2e.sh install >/dev/null 2>&1; install_plugin >/dev/null 2>&1
export PYTHONUNBUFFERED=1
nvidia-smi -L
timeout 330 python3 scripts/bench_serving.py --models-dir /tmp/bench_models --quiet --min-server-s 60 --model gdn --study decode \
  --only ours --concurrency 256 --output-len 512 --rounds 1 \
  --server-args="--disable-radix-cache --max-mamba-cache-size 300 --max-running-requests 256" \
  --diag /tmp/diagw --out /tmp/b_diag > $OUT/bench.log 2>&1
echo "bench rc=$?"
tail -5 $OUT/bench.log
cp -r /tmp/b_diag/logs /tmp/b_diag/cases /tmp/b_diag/diag $OUT/ 2>/dev/null
find / -xdev -path '*triton*cache*' -name '*.json' -newer /tmp/site -printf '%TT %p\n' 2>/dev/null | sort > $OUT/triton_cache.txt
wc -l $OUT/triton_cache.txt
grep -E "Decode batch|POST /generate|Prefill batch, #new-seq: 1," $OUT/logs/*ours*.log | awk '{print $2, $4, $5}' | uniq -c | tail -20
cp /tmp/b_diag/report.md $OUT/ 2>/dev/null
python3 -c "
import json,glob
for f in glob.glob('/tmp/b_diag/cases/*.json'):
    m=json.load(open(f))['metrics']; print(f.split('/')[-1], {k:m.get(k) for k in ('duration_s','output_throughput','stream_mb','median_stream_lag_ms','max_stream_lag_ms')})"
python3 scripts/diag/summarize.py ours=$(ls -d /tmp/b_diag/diag/* | head -1) --top 25 2>&1 | tail -30
