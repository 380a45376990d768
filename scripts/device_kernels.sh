#!/usr/bin/env bash
# Kernel tests, per-phase profile and the kernel benchmark on the lent H200, in one device call.
#
#   run(command="bash scripts/device_kernels.sh tests profile", carry=[".whl"], timeout_s=600)
#   run(command="bash scripts/device_kernels.sh bench", carry=[".whl"], timeout_s=600)
#   run(command="bash scripts/device_kernels.sh m2profile", carry=[".whl"], timeout_s=600)
#
# (All three parts do not fit the 10-minute call limit together: tests ~3 min, profile ~1 min,
# bench ~6-8 min.)
# .whl is built by ../shared/devtools/sglang_device_wheels.sh (SGLang 0.5.17 for the baselines);
# carry .site instead (scripts/device_site_pack.sh) to have the whole server set in the same call.
# Writes $OUT/{kernel_tests.log, profile_gdn.log, bench.log, bench.json}; prints the tables last.
# Parts: tests | gdntests (GDN only, with the split-checkpoint tests) | profile | bench | m2profile | pdlprobe | ncu (default: the first three; m2profile:
# the Mamba-2 per-phase profile, $OUT/profile_m2.{log,json}; M2PROFILE_ARGS adds flags; pdlprobe:
# scripts/pdl_probe.py, $OUT/pdl_probe.log, PDLPROBE_ARGS adds flags, PDLPROBE_TIMEOUT default 300 s; ncu:
# Nsight Compute's full sections on the GDN decode at batch 256, ours and SGLang's packed decode
# (scripts/ncu_gdn_decode.py; NCU_ARGS adds its flags, NCU_TIMEOUT default 300 s): $OUT/gdn_ncu.ncu-rep,
# gdn_ncu_details.txt (every section, text), gdn_ncu_raw.csv and gdn_ncu_summary.md (a line per kernel)).
# Env: GDNPROFILE_ARGS / GDNPROFILE_TIMEOUT (extra profile_gdn_phases.py flags, seconds; default 150),
#      GDNTESTS_TIMEOUT (seconds for gdntests, default 240; session 16 ran them in 195 s),
#      GDNTESTS_K (a pytest -k expression: a subset of the GDN kernel tests),
#      BENCH_ARGS (extra bench_kernels.py flags, e.g. "--sweep" or "--family gdn"),
#      BENCH_TIMEOUT (seconds for the benchmark, default 540).
set -uo pipefail
OUT=${OUT:-/tmp/kernels_out}
mkdir -p "$OUT"
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$REPO"
# SGLang into /tmp/site from whatever was carried (.site, or .whl), once per machine: the same
# install as device_e2e.sh's (it stops with the carry to give when SGLang is missing).
# shellcheck disable=SC1091
source "$REPO/scripts/device_e2e.sh" install
export PYTHONPATH=/tmp/site:$REPO/triton_kernels:$REPO PATH=/opt/torch/.venv/bin:$PATH HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
PARTS=${*:-tests profile bench}
has() { case " $PARTS " in *" $1 "*) return 0;; *) return 1;; esac; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
if has tests; then
  timeout 300 python3 -m pytest tests/test_gdn_kernels.py tests/test_mamba2_kernels.py -q -p no:cacheprovider \
    > "$OUT/kernel_tests.log" 2>&1
  echo "kernel tests rc=$? ($(tail -1 "$OUT/kernel_tests.log"))"
fi
if has gdntests; then
  timeout "${GDNTESTS_TIMEOUT:-240}" python3 -m pytest tests/test_gdn_kernels.py tests/test_gdn_ckpt_split.py -q -p no:cacheprovider \
    ${GDNTESTS_K:+-k "$GDNTESTS_K"} > "$OUT/gdn_tests.log" 2>&1
  echo "gdn kernel tests rc=$? ($(tail -1 "$OUT/gdn_tests.log"))"
fi
if has profile; then
  timeout "${GDNPROFILE_TIMEOUT:-150}" python3 scripts/profile_gdn_phases.py --batch 256 --ceiling ${GDNPROFILE_ARGS:-} \
    > "$OUT/profile_gdn.log" 2>&1
  echo "profile rc=$?"; tail -1 "$OUT/profile_gdn.log" | cut -c1-2000
fi
if has m2profile; then
  timeout "${M2PROFILE_TIMEOUT:-300}" python3 scripts/profile_mamba2_phases.py --json "$OUT/profile_m2.json" \
    ${M2PROFILE_ARGS:-} > "$OUT/profile_m2.log" 2>&1
  echo "m2profile rc=$?"; grep -A40 "^plan " "$OUT/profile_m2.log"
fi
if has pdlprobe; then
  timeout "${PDLPROBE_TIMEOUT:-300}" python3 scripts/pdl_probe.py ${PDLPROBE_ARGS:-} > "$OUT/pdl_probe.log" 2>&1
  echo "pdlprobe rc=$?"; tail -25 "$OUT/pdl_probe.log"
fi
if has ncu; then
  NCU_BIN=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | tail -n 1)
  if [ -z "$NCU_BIN" ]; then
    echo "ncu: not found (PATH, /opt/nvidia/nsight-compute)"
  else
    # --clock-control none: the clocks as they are (device README); the profiled region is the
    # driver's cudaProfilerStart/Stop pair, after its warm-up launches.
    timeout "${NCU_TIMEOUT:-300}" "$NCU_BIN" --clock-control none --profile-from-start off --set full -f \
      -o "$OUT/gdn_ncu" python3 scripts/ncu_gdn_decode.py ${NCU_ARGS:-} > "$OUT/gdn_ncu.log" 2>&1
    echo "ncu rc=$? ($(grep -c "^==PROF==" "$OUT/gdn_ncu.log") profiler lines)"; grep "^profiled" "$OUT/gdn_ncu.log" | cut -c1-400
    "$NCU_BIN" --import "$OUT/gdn_ncu.ncu-rep" --page details > "$OUT/gdn_ncu_details.txt" 2>&1
    "$NCU_BIN" --import "$OUT/gdn_ncu.ncu-rep" --page raw --csv > "$OUT/gdn_ncu_raw.csv" 2>&1
    python3 scripts/ncu_gdn_decode.py --summarize "$OUT/gdn_ncu_raw.csv" 2>&1 | tee "$OUT/gdn_ncu_summary.md"
  fi
fi
if has bench; then
  timeout "${BENCH_TIMEOUT:-540}" python3 scripts/bench_kernels.py --reps 12 --json "$OUT/bench.json" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"
  grep -v '^{"family' "$OUT/bench.log" | tail -5
  python3 scripts/perf_report.py "$OUT/bench.log" | tail -60
fi
