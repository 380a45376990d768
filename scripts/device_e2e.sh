#!/usr/bin/env bash
# End-to-end parity on the lent H200: stock SGLang (--mamba-backend triton) vs ours
# (--mamba-backend replayssm) for {qwen3_next, qwen3_5, qwen3_5_moe, nemotron_h} x {no spec,
# NEXTN}, with scripts/e2e_parity.py (one process per case; cases run concurrently on the one GPU).
#
# One call with carry [".site"] (scripts/device_site_pack.sh packs both wheel folders as one
# ~40 MiB archive): bash scripts/device_e2e.sh run [CASE ...]. Without it the wheels do not fit one
# carry (64 MiB), so it takes two device calls issued back to back (a machine stays warm only
# ~30 s after a call; see /work/shared/devtools/README.md):
#   call 1, carry [".whl"]:            bash scripts/device_e2e.sh install
#   call 2, carry [".whl2", ".tiny"]:  bash scripts/device_e2e.sh run [CASE ...]
# CASE: qwen3_next | qwen3_next:nextn | qwen3_5 | qwen3_5:nextn | qwen3_5_moe | qwen3_5_moe:nextn |
# nemotron_h | nemotron_h:nextn (default: the qwen3_next and nemotron_h four). qwen3_5 and
# qwen3_5_moe are text-only Qwen3.5 checkpoints (Qwen3_5ForCausalLM with a dense MLP,
# Qwen3_5MoeForCausalLM with 8 experts top-2 and a shared expert; NEXTN through
# Qwen3_5ForCausalLMMTP, whose layer has the target's MLP). SGLang 0.5.17 leaves their
# radix-cache strategy unresolved (the archs are missing from its mamba radix-cache arch sets), so
# e2e_parity.py gives both servers --disable-radix-cache, or with :radix the extra_buffer strategy
# SGLang picks for Qwen3-Next (:nobuffer chooses no_buffer itself). A
# `:ring` suffix (e.g. qwen3_next:ring, qwen3_next:nextn:ring) runs our server with
# REPLAYSSM_CONFIG=gdn_ring_min_batch=1, i.e. the GDN ring decode at every batch size (by default
# GDN decode batches below 256 rows run SGLang's kernel on folded checkpoints). Further modifiers,
# combinable (e.g. qwen3_next:nextn:radix:nobuffer), exercise the prefix-cache and scheduler paths:
#   :radix     a second batch built from the first one's outputs hits the radix cache (decode-time
#              track snapshots, prefill ends, repeated prompts); both servers must report hits
#   :nobuffer  --mamba-radix-cache-strategy no_buffer --disable-overlap-schedule (both servers)
#   :retract   --max-total-tokens $E2E_RETRACT_TOKENS (6000): the KV pool runs out during decode,
#              both servers must retract requests (and recompute them)
#   :mixed     --enable-mixed-chunk (prefill chunks and decode rows in one batch)
# Results: $OUT/summary.txt, $OUT/results.json (all cases' result.json) and $OUT/e2e_logs.tar.gz
# (server and driver logs, token outputs); the run tool returns at most 8 files from $OUT.
# `run` installs whatever wheel folders it finds that are not installed yet, so with a bigger
# carry one call can do both. Without .tiny/<preset>/ the checkpoint is built on the device
# (scripts/make_tiny_model.py, ~15 s each).
#
# Env knobs:
#   OUT              output folder (the run tool sets it; default /tmp/e2e_out)
#   E2E_WORK         working folder for per-case logs (default /tmp/e2e_work)
#   E2E_ONLY         both | stock | ours                         (default both)
#   E2E_PARALLEL     cases run at once (1..4)                    (default 4)
#   E2E_DEADLINE_S   wall budget for the whole command, seconds  (default 570)
#   E2E_PORT_BASE    first server port; case i uses BASE + 1000 i (default 30000; two runs at once
#                    need bases apart, or their servers race for the same port)
#   E2E_PROMPTS      prompts per case                            (default 32)
#   E2E_TOKENS       new tokens per prompt                       (default 256)
#   E2E_SERVER_FLAGS extra flags for every server (default: explicit small pools, see below)
#   E2E_GRAPH_BS     --cuda-graph-max-bs-decode of every server   (default 48)
#   E2E_STARTUP_S    longest startup wait of each server, seconds (default 330; e2e_parity.py cuts it
#                    to what the case has left after 130 s for each side still to run. A fresh
#                    machine's first stock Nemotron-H NEXTN server at 320 rows was not ready after
#                    254 s; on 2026-12-04 the old default, half of what was left, gave stock 163 s on a
#                    fresh machine and both NEXTN cases failed unstarted)
#   (batches of >= 256 rows, where the GDN ring decode engages by default and where the NEXTN
#    draft-runner cursor bug lived: E2E_PROMPTS=320 E2E_GRAPH_BS=320 E2E_SERVER_FLAGS="--mem-fraction-static
#    0.85 --max-total-tokens 200000 --max-mamba-cache-size 1700 --max-running-requests 320": with the radix
#    cache SGLang admits slots // 5 requests, and a GDN decode-only server below 256 gets no rings)
#   E2E_OURS_FLAGS   extra flags for our server only (e.g. "--replayssm-ring-len 16")
#   E2E_DRIVER_FLAGS extra e2e_parity.py flags (e.g. "--issm-check allocated --max-logprob-diff 0.1")
#   E2E_PREFILL_GRAPH=1  keep prefill CUDA graphs (default: --disable-prefill-cuda-graph; their
#                        capture alone took ~100 s on the H200)
#   TINY_QWEN_FLAGS / TINY_QWEN35_FLAGS / TINY_QWEN35MOE_FLAGS / TINY_NEMOTRON_FLAGS
#                    make_tiny_model.py flags for on-device builds (qwen3_next / qwen3_5 /
#                    qwen3_5_moe / nemotron_h)
set -uo pipefail

T0=$(date +%s)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SITE=${SITE:-/tmp/site}
OUT=${OUT:-/tmp/e2e_out}
WORK=${E2E_WORK:-/tmp/e2e_work}
PY=${PYTHON:-python3}
MODE=${1:-run}
shift || true
mkdir -p "$OUT" "$WORK"

log() { echo "[device_e2e +$(( $(date +%s) - T0 ))s] $*"; }
die() { echo "[device_e2e] ERROR: $*" >&2; exit 2; }

setup_env() {
  export PYTHONPATH="$SITE:$REPO:$REPO/triton_kernels${PYTHONPATH:+:$PYTHONPATH}"
  export PATH=/opt/torch/.venv/bin:$PATH HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 USE_HUB_KERNELS=NO
  # flashinfer / tvm-ffi JIT need curand.h and a linkable libcuda.so (devtools README).
  local inc=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/include
  if [ -d "$inc" ]; then export NVCC_APPEND_FLAGS="-I$inc${NVCC_APPEND_FLAGS:+ $NVCC_APPEND_FLAGS}"; fi
  local libcuda
  libcuda=$(ldconfig -p 2>/dev/null | awk '/libcuda.so.1 /{print $NF; exit}')
  if [ -n "$libcuda" ]; then
    mkdir -p /tmp/cudalink && ln -sf "$libcuda" /tmp/cudalink/libcuda.so
    export LIBRARY_PATH="/tmp/cudalink${LIBRARY_PATH:+:$LIBRARY_PATH}"
  fi
}

install_folder() {  # install_folder DIR: pip-install DIR/*.whl into $SITE once per machine
  local d=$1 marker="$SITE/.installed_$(basename "$1")"
  [ -d "$REPO/$d" ] || return 0
  if [ -e "$marker" ]; then log "$d already installed"; return 0; fi
  ls "$REPO/$d"/*.whl >/dev/null 2>&1 || die "$d has no wheels"
  log "installing $d ($(du -sm "$REPO/$d" | cut -f1) MiB)"
  local plog=/tmp/pip_$(basename "$d").log
  if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$REPO/$d"/*.whl >"$plog" 2>&1; then
    cat "$plog"; die "pip install of $d failed"
  fi
  grep -v "already exists" "$plog" || true  # .whl2: harmless "/tmp/site/bin already exists"
  touch "$marker"
}

unpack_once() {  # unpack_once ARCHIVE DST MARKER: a carried .tar.xz into DST once per machine; 0 if unpacked now
  local a=$1 dst=$2 marker=$3 name
  name=$(basename "$(dirname "$a")")
  [ -f "$a" ] || return 1
  if [ -e "$marker" ]; then log "$name already unpacked"; return 1; fi
  log "unpacking $name ($(du -sm "$a" | cut -f1) MiB) into $dst"
  mkdir -p "$dst"
  "$PY" -c "import sys, tarfile; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2], filter='tar')" \
    "$a" "$dst" || die "unpacking $a failed"
  touch "$marker"
}

install_site_archive() {  # .site/site.tar.xz (scripts/device_site_pack.sh): both wheel folders in one carry
  # The folders it holds count as installed (a later .whl/.whl2 carry is not installed over it).
  if unpack_once "$REPO/.site/site.tar.xz" "$SITE" "$SITE/.installed_site"; then
    touch "$SITE/.installed_.whl" "$SITE/.installed_.whl2"
  fi
}

install_jit_cache() {
  # .jitcache/jit_cache.tar.xz (written by `device_plan.sh jit_cache_pack` on an earlier machine and
  # copied here): flashinfer's JIT-built modules (~/.cache/flashinfer, ~/.cache/tvm-ffi). Without them
  # the first server with --attention-backend flashinfer builds them for ~250-280 s (session 41).
  # Unpacked once per machine; flashinfer rebuilds any module whose sources no longer match.
  [ -f "$REPO/.jitcache/jit_cache.tar.xz" ] || return 0
  local dst=${JIT_CACHE_HOME:-${HOME:?}/.cache}
  unpack_once "$REPO/.jitcache/jit_cache.tar.xz" "$dst" "$dst/.replayssm_jit_cache" || true
}

install_plugin() {
  # The plugin runs from the repo copy (PYTHONPATH); SGLang finds it through the
  # `sglang.srt.plugins` entry point, so write a minimal dist-info carrying pyproject's entry points.
  "$PY" - "$REPO" "$SITE" <<'EOF'
import pathlib, sys, tomllib
repo, site = map(pathlib.Path, sys.argv[1:])
proj = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
eps = proj.get("entry-points", {})
name = proj["name"].replace("-", "_")
for old in site.glob(f"{name}-*.dist-info"):
    for f in old.iterdir():
        f.unlink()
    old.rmdir()
if (repo / f"{name}.egg-info").exists():
    print(f"plugin: using {name}.egg-info from the repo")
    sys.exit(0)
d = site / f"{name}-{proj['version']}.dist-info"
d.mkdir(parents=True)
(d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {proj['name']}\nVersion: {proj['version']}\n")
lines = []
for group, entries in eps.items():
    lines.append(f"[{group}]")
    lines += [f"{k} = {v}" for k, v in entries.items()]
    lines.append("")
(d / "entry_points.txt").write_text("\n".join(lines))
print(f"plugin: wrote {d.name}; entry points: {eps.get('sglang.srt.plugins', 'NONE (sglang.srt.plugins missing!)')}")
EOF
}

do_install() {
  setup_env
  install_site_archive
  install_jit_cache
  install_folder .whl
  install_folder .whl2
  [ -d "$SITE/sglang" ] || die "sglang is not in $SITE after install (carry .site, or .whl then .whl2)"
  log "install done"
}

build_or_find_model() {  # build_or_find_model PRESET -> prints the checkpoint dir
  local preset=$1
  if [ -f "$REPO/.tiny/$preset/config.json" ]; then echo "$REPO/.tiny/$preset"; return 0; fi
  local dst=/tmp/tiny/$preset flags
  if [ -f "$dst/config.json" ]; then echo "$dst"; return 0; fi
  case $preset in
    qwen3_next) flags=${TINY_QWEN_FLAGS:---mixer-out-scale 300 --accept-rate-knob 0.3} ;;
    qwen3_5) flags=${TINY_QWEN35_FLAGS:---mixer-out-scale 300 --accept-rate-knob 0.3} ;;
    qwen3_5_moe) flags=${TINY_QWEN35MOE_FLAGS:---mixer-out-scale 300 --accept-rate-knob 0.3} ;;
    nemotron_h) flags=${TINY_NEMOTRON_FLAGS:---mixer-out-scale 10 --accept-rate-knob 0.3} ;;
  esac
  # shellcheck disable=SC2086
  "$PY" "$REPO/scripts/make_tiny_model.py" --preset "$preset" --out "$dst" $flags >"$WORK/build_$preset.log" 2>&1 \
    || { echo "build of $preset failed, see $WORK/build_$preset.log" >&2; return 1; }
  echo "$dst"
}

do_run() {
  do_install
  install_plugin
  local cases=("$@")
  [ ${#cases[@]} -gt 0 ] || cases=(qwen3_next qwen3_next:nextn nemotron_h nemotron_h:nextn)
  local deadline=${E2E_DEADLINE_S:-570} parallel=${E2E_PARALLEL:-4} only=${E2E_ONLY:-both}
  local prompts=${E2E_PROMPTS:-32} tokens=${E2E_TOKENS:-256}
  # Explicit small pools: several servers can share the GPU, and every server (stock or ours,
  # started early or late) gets the same sizes.
  local server_flags=${E2E_SERVER_FLAGS:---mem-fraction-static 0.85 --max-total-tokens 65536 --max-mamba-cache-size 128 --max-running-requests 48}
  local prefill_flag=--disable-prefill-cuda-graph
  [ "${E2E_PREFILL_GRAPH:-0}" = 1 ] && prefill_flag=

  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/[gpu] /'
  "$PY" -c "import importlib.metadata as m; print('[plugins]', [e.value for e in m.entry_points(group='sglang.srt.plugins')])"

  local -A model=()
  local c preset
  for c in "${cases[@]}"; do
    preset=${c%%:*}
    case $preset in qwen3_next|qwen3_5|qwen3_5_moe|nemotron_h) ;; *) die "unknown case $c" ;; esac
    local mod
    for mod in $(tr ':' ' ' <<<"${c#"$preset"}"); do
      case $mod in nextn|ring|radix|nobuffer|retract|mixed) ;; *) die "unknown case modifier :$mod in $c" ;; esac
    done
    if [ -z "${model[$preset]:-}" ]; then
      model[$preset]=$(build_or_find_model "$preset") || die "no checkpoint for $preset"
      log "$preset: ${model[$preset]}"
    fi
  done

  local pids=() names=() i=0 running=0
  for c in "${cases[@]}"; do
    preset=${c%%:*}
    local name=${c//:/_} spec=() case_env=() case_flags="" case_driver=()
    [[ $c == *:nextn* ]] && spec=(--spec)
    # REPLAYSSM_CONFIG only reaches our server: the stock server runs without the plugin.
    [[ $c == *:ring* ]] && case_env=(REPLAYSSM_CONFIG=gdn_ring_min_batch=1${REPLAYSSM_CONFIG:+,$REPLAYSSM_CONFIG})
    # Prefix-cache and scheduler paths (both servers get the same flags; later flags win):
    [[ $c == *:radix* ]] && case_driver+=(--radix-waves)
    [[ $c == *:nobuffer* ]] && case_flags+=" --mamba-radix-cache-strategy no_buffer --disable-overlap-schedule"
    [[ $c == *:retract* ]] && { case_flags+=" --max-total-tokens ${E2E_RETRACT_TOKENS:-6000}"; case_driver+=(--expect-retract); }
    [[ $c == *:mixed* ]] && case_flags+=" --enable-mixed-chunk"
    while [ "$running" -ge "$parallel" ]; do
      wait -n 2>/dev/null || true
      running=$(jobs -rp | wc -l)
    done
    local left=$(( deadline - ($(date +%s) - T0) - 10 ))
    if [ "$left" -lt 60 ]; then log "skipping $name: ${left}s left"; continue; fi
    # Startup covers import, weights, CUDA-graph capture and the warmup request (which waits
    # for flashinfer's JIT on Nemotron-H the first time).
    # e2e_parity.py cuts each server's wait to what is left after its reserve for the sides still
    # to run (--later-side-reserve), so the first side may take most of the case's time.
    local startup=330
    [ -n "${E2E_STARTUP_S:-}" ] && startup=$E2E_STARTUP_S
    rm -rf "${WORK:?}/$name"; mkdir -p "$WORK/$name"
    log "start $name (stock+ours, ${left}s left, startup timeout ${startup}s)"
    env "${case_env[@]}" timeout -s TERM -k 15 "$left" "$PY" "$REPO/scripts/e2e_parity.py" --time-budget $(( left - 15 )) \
      --model "${model[$preset]}" "${spec[@]}" --only "$only" --out "$WORK/$name" \
      --port $(( ${E2E_PORT_BASE:-30000} + 1000 * i )) --num-prompts "$prompts" --max-new-tokens "$tokens" \
      $prefill_flag --cuda-graph-max-bs "${E2E_GRAPH_BS:-48}" --sampling-backend pytorch \
      --extra-args="$server_flags$case_flags" --ours-extra-args="${E2E_OURS_FLAGS:-}" "${case_driver[@]}" \
      --startup-timeout "$startup" --request-timeout 120 --python "$PY" ${E2E_DRIVER_FLAGS:-} \
      >"$WORK/$name/driver.log" 2>&1 &
    pids+=($!); names+=("$name"); i=$((i + 1)); running=$((running + 1))
  done

  local rc=0 k status summary="$WORK/summary.txt"
  : >"$summary"
  for k in "${!pids[@]}"; do
    wait "${pids[$k]}"; status=$?
    [ "$status" -ne 0 ] && rc=1
    echo "${names[$k]} exit=$status ($( [ "$status" = 0 ] && echo PASS || echo FAIL))" >>"$summary"
  done
  log "all cases finished"
  for k in "${!names[@]}"; do
    echo
    echo "=================== ${names[$k]} ==================="
    # The driver prints its table last; show it (and any log tail it printed before).
    sed -n '/^--- \|^e2e parity/,$p' "$WORK/${names[$k]}/driver.log" | tail -n 60
    # Which GDN decode dispatch our server announced (none for Nemotron-H).
    grep -rhoa "sglang-replayssm: GDN decode batches[^.]*" "$WORK/${names[$k]}" 2>/dev/null | sort -u | sed 's/^/[dispatch] /'
  done
  echo
  cat "$summary"
  collect "${names[@]}"
  log "done (rc=$rc)"
  return $rc
}

collect() {  # collect CASE...: few files into $OUT (the run tool returns at most 8)
  cp "$WORK/summary.txt" "$OUT/summary.txt"
  "$PY" - "$WORK" "$OUT/results.json" "$@" <<'EOF'
import json, pathlib, sys
work, dst, names = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
res = {}
for n in names:
    p = work / n / "result.json"
    res[n] = json.loads(p.read_text()) if p.exists() else {"ok": False, "error": "no result.json"}
pathlib.Path(dst).write_text(json.dumps(res, indent=1))
EOF
  tar czf "$OUT/e2e_logs.tar.gz" -C "$WORK" . 2>/dev/null
  log "wrote $OUT/summary.txt, results.json, e2e_logs.tar.gz ($(du -k "$OUT/e2e_logs.tar.gz" | cut -f1) KiB)"
}

case $MODE in
  install) do_install ;;
  run) do_run "$@" ;;
  *) die "usage: $0 install | run [CASE ...]" ;;
esac
