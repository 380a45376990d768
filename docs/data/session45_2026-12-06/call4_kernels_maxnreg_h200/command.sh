#!/usr/bin/env bash
# session 44 call 6: decode plan 5 (split, flush capacity 13 %) with register caps 0 / 96 / 80 (configs.gdn_decode_maxnreg), 3, 2, 1 and 0 (register prefetch) load stages.
T0=$(date +%s); OUT_ROOT=$OUT
for cfg in "" gdn_decode_maxnreg=96 gdn_decode_maxnreg=80; do
  LEFT=$(( ${DEADLINE:-480} - ($(date +%s) - T0) ))
  [ "$LEFT" -lt 45 ] && { echo "== skip '$cfg' ($LEFT s left)"; continue; }
  tag=${cfg##*=}; tag=mx${tag:-0}
  echo "== $tag ($LEFT s left)"
  OUT=$OUT_ROOT/$tag REPLAYSSM_CONFIG=$cfg BENCH_TIMEOUT=$(( LEFT < 150 ? LEFT : 150 )) BENCH_ARGS="--family gdn --batches 256 --gdn-ckpt-split --gdn-decode-only --gdn-decode-plans 5x16x1x3x8x0x1x1x8x13,5x16x1x2x8x0x1x1x8x13,5x16x1x1x8x0x1x1x8x13,5x16x1x0x8x0x1x1x8x13" bash scripts/device_kernels.sh bench 2>&1 | grep -E "correctness|rc=|ring, split"
  python3 - "$OUT_ROOT/$tag/bench.json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as e:
    print("no json", e); raise SystemExit
for x in d["results"]:
    print("HV", x["HV"], "packed", round(x["decode_packed_us"], 1),
          {k.split("_us_")[-1]: round(v, 1) for k, v in x.items() if k.startswith("decode_ours_split_staggered_us_")})
PY
done
# Then batch 64 (the ring decode's first batch, configs.gdn_decode_large_from): the capacity's default against the plan without it.
LEFT=$(( ${DEADLINE:-480} - ($(date +%s) - T0) ))
if [ "$LEFT" -ge 45 ]; then
  echo "== batch 64 ($LEFT s left)"
  OUT=$OUT_ROOT/b64 BENCH_TIMEOUT=$LEFT BENCH_ARGS="--family gdn --batches 64 --gdn-ckpt-split --gdn-decode-only --gdn-decode-plans 5x16x1x3x8x0x1x1x8,5x16x1x3x8x0x1x1x8x13" bash scripts/device_kernels.sh bench 2>&1 | grep -E "correctness|rc=|ring, split"
  python3 -c "
import json; d = json.load(open('$OUT_ROOT/b64/bench.json'))
for x in d['results']: print('HV', x['HV'], 'B', x['B'], 'packed', round(x['decode_packed_us'], 1), {k.split('_us_')[-1]: round(v, 1) for k, v in x.items() if k.startswith('decode_ours_split_staggered_us_')})"
fi
