#!/usr/bin/env bash
# The device measurements of docs/runbook.md as named steps, so that a session's calls are
# typed once and checked on the CPU (tests/test_device_plan.py parses every command a step runs).
#
#   run(command="bash scripts/device_plan.sh STEP [STEP ...]", carry=[...])
#
# Steps (carry in brackets; on a fresh machine carry .site, built here by
# scripts/device_site_pack.sh, which holds .whl and .whl2 and fits one carry; else the first call
# carries .whl and the next, at once, .whl2):
#   install        SGLang wheels into /tmp/site                          [.site] or [.whl] then [.whl2]
#   kernels        GDN + Mamba-2 kernel tests on the GPU                  [.whl]
#   m2_profile     Mamba-2 decode per phase (non-flush / flush step) per plan and unroll  [.whl]
#   m2_sweep       Mamba-2 decode plans (split plans, chunked tiles) and verify tiles vs SGLang's
#                  SSU paths, kernel benchmark  [.whl]
#   gdn_profile    GDN per phase at batch 256: verify launches alone, commit folds, decode plan 3  [.whl]
#   gdn_kc         GDN kernel tests, then the state launch per K chunk (configs.gdn_state_kc 0/32/16) at
#                  batch 256, then the GDN kernel benchmark at 256 and 64 rows  [.whl]
#   gdn_rt         GDN kernel tests with the value-row-major ring history (configs.gdn_history_rt) and the
#                  one-warp chunked prep (configs.gdn_prep); the spec/decode phases at batch 256 with
#                  them off and on; the benchmark with the history option on  [.whl]
#   gdn_shfl       the shuffle form of the GDN exact replay (configs.gdn_k_tree=2): GDN kernel tests with
#                  it on, decode/fold phases at batch 256 plain vs shuffle, the benchmark with it  [.whl]
#   gdn_dot        the GDN verify's state launch on tensor cores (configs.gdn_state_dot): GDN kernel tests
#                  with it on, verify phases at batch 256 per tile off vs on, the benchmark with it  [.whl]
#   gdn_order      GDN decode cycles at batch 256, synchronised and staggered, per row order of the state
#                  launch (configs.gdn_flush_spread) and per non-flush product option; bench  [.site]
#   gdn_pdl        the GDN prep/state pair with programmatic dependent launch (configs.gdn_pdl, off):
#                  scripts/pdl_probe.py (eager and CUDA-graph steps with a watchdog: the bench gave no
#                  result with it on in session 27), then if that passed the GDN kernel tests and the
#                  benchmark at batches 1 and 256 with it on                               [.site]
#   gdn_prep       the GDN pair's prep launch plans (configs.gdn_prep, never timed): GDN kernel tests with
#                  1x32, the decode's launches alone and the verify phases per plan, bench  [.site]
#   gdn_plan4      GDN decode plans 4 (plan 3 without its prep launch, session 27) and 5 (one program per
#                  row and value head, session 28), never on a GPU: the GDN decode tests, decode cycles
#                  plan 3 vs 4 vs 5, the benchmark at 256/128/64                           [.site]
#   gdn_vloop      the GDN verify's state launch as one program per row and value head walking its value
#                  rows, tile loads software-pipelined (verify plan products 5, session 28, never on a
#                  GPU): GDN verify tests with it, verify phases per plan, bench 256          [.site]
#   gdn_vsmall     the looping verify plans with loop splits (session 29) at batches 8 and 1 (bench),
#                  then the verify phases at 256 with gdn_verify_maxnreg=168                   [.site]
#   gdn_vtiers     the verify's three default plans (session 30) and 32x1x2x4 at batches 2-128 (bench,
#                  decode with its default plan only), then the GDN verify tests with the defaults  [.site]
#   gdn_ring32     GDN decode and spec at 256 with ring length 16, then 32 (the commit's folds half as
#                  often), default plans                                                     [.site]
#   gdn_dflush     GDN decode plan 5 with a flush split (session 31, never on a GPU): the plan-5 decode
#                  tests, then the benchmark at 256/128/64 beside plan 3 and plan 5 split 2       [.site]
#   gdn_small      GDN spec below batch 64: the one-launch commit (cursor move inside the fold): tests
#                  with it on, bench 64/32/8/1 timing the commit both ways               [.whl]
#   gdn_sweep      GDN launch plans and the exact replay's unroll depths vs SGLang's kernels  [.whl]
#   e2e320         Nemotron-H + NEXTN parity at 320 running requests      [.whl2 .tiny]
#   e2e_dispatch   GDN decode plan 3 and the ring decode from 64 rows: the 32-prompt cases (ring at
#                  every batch in qwen3_next:ring) beside 160 prompts of spread output lengths (the
#                  batch crosses 64 rows downwards with rings pending); builds the GDN spec
#                  checkpoint for spec_fit2 in the background   [.whl2 .tiny]
#   e2e_prefix     prefix-cache / scheduler parity cases (:radix :nobuffer :retract :mixed)  [.tiny]
#   spec_c1        GDN spec at concurrency 1, 16 requests a case: ours then stock, then stock then
#                  ours (SPEC_C1_ORDERS="a b"; one order per call on a fresh machine); --diag summaries
#   decode_c1      GDN decode at concurrency 1, 16 requests a case, both orders (DECODE_C1_ORDERS="a b"),
#                  host stacks (--diag) and GPU kernels (--gpu-profile-steps) of both sides: where
#                  ours' longer time to first token at C=1 (session 23) goes
#   spec_fit       max concurrency with NEXTN on and the radix cache off (scripts/fit_probe.py;
#                  resumable: repeat the call if a side was left)                [.whl2 if 2nd call]
#   spec_fit2      spec_fit without calibration launches: stock at N=960 (its session-11 launch), then
#                  ours at N=2540 with --mem-fraction-static 0.707 (session 11: ours at 3227 and
#                  SGLang's default fraction ran out of activation memory in the decode logits);
#                  FIT2_SIDES=stock|ours runs one side (one call each, same warm machine)
#   decode_fixed   GDN and Nano-9B decode with the same fixed pools on both sides (DECODE_MODELS=gdn|nano9b
#                  for one model per call; DECODE_SIDES=stock,upstream,ours adds SGLang's own ReplaySSM)
#   spec256        GDN spec at concurrency 256 and 128 vs stock spec, fixed pools (SPEC_SIDES as DECODE_SIDES)
#   decode_prof    GDN decode at C=256, both sides, each with a GPU kernel profile of steady decode steps
#                  (--gpu-profile-delay): where the served step saving falls short of the kernel's
#   aime           AIME parity runner end to end on the tiny Qwen3-Next    [.aime_data .tiny]
#   gdn_ncu        Nsight Compute on the GDN decode at batch 256 (scripts/ncu_gdn_decode.py): ours on
#                  split checkpoints with staggered rows and SGLang's packed decode, every section; the
#                  reports and a summary line per kernel (DRAM bandwidth, occupancy, registers)  [.site]
#   jit_cache_pack flashinfer's JIT builds on this machine (~/.cache/flashinfer, ~/.cache/tvm-ffi) as
#                  $OUT/jit_cache.tar.xz; copy it here as .jitcache/jit_cache.tar.xz and carry
#                  [".site", ".jitcache"]: `install` unpacks it, and a fresh machine's first
#                  flashinfer server skips its ~250 s build. Run it last, after a flashinfer server
#
# Each step logs to $OUT/<step>.log, packs its result folder as $OUT/<step>.tgz (report.md beside
# it) and prints its table last. PLAN_DEADLINE_S (default 570) bounds the whole command; steps
# share it in order. DRY=1 prints the commands instead of running them.
set -uo pipefail

T0=$(date +%s)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${OUT:-/tmp/plan_out}
PY=${PYTHON:-python3}
DEADLINE=${PLAN_DEADLINE_S:-570}
DRY=${DRY:-0}
mkdir -p "$OUT"
cd "$REPO" || exit 2

left() { echo $(( DEADLINE - ($(date +%s) - T0) )); }
say() { echo "[device_plan +$(( $(date +%s) - T0 ))s] $*"; }

# run CMD...: print it; run it unless DRY=1 (stdout+stderr appended to $LOG)
run() {
  echo "+ $(printf '%q ' "$@")"
  [ "$DRY" = 1 ] && return 0
  "$@" >>"$LOG" 2>&1
}

env_ready() {  # SGLang from /tmp/site and the plugin's entry point (device_e2e.sh helpers)
  [ "$DRY" = 1 ] && return 0
  # shellcheck disable=SC1091
  source "$REPO/scripts/device_e2e.sh" install >/dev/null 2>&1
  install_plugin >/dev/null 2>&1
  export PYTHONUNBUFFERED=1
}

BENCH=("$PY" scripts/bench_serving.py --models-dir /tmp/bench_models --quiet --min-server-s 60)

step_install() { run bash scripts/device_e2e.sh install; }

step_kernels() { run env OUT="$OUT/kernels" bash scripts/device_kernels.sh tests; }

step_m2_sweep() {
  # The Mamba-2 decode plans (default, the split plans of configs.MAMBA2_DECODE_SWEEP, the chunked
  # tiles of configs.MAMBA2_TILE_SWEEP) and verify tiles at both Mamba-2 shapes, each checked
  # bit-exact on the GPU first.
  run env OUT="$OUT/m2_sweep" BENCH_TIMEOUT=$(( $(left) - 15 )) \
    BENCH_ARGS="--family mamba2 --sweep --batches 256,128,32,8,1" bash scripts/device_kernels.sh bench
}

step_m2_profile() {
  # Where a Mamba-2 decode ring cycle goes at the Super shape, batch 256: non-flush and flush steps
  # per plan and replay unroll depth, and each launch of the split plans alone.
  run env OUT="$OUT/m2_profile" M2PROFILE_TIMEOUT=$(( $(left) - 15 )) bash scripts/device_kernels.sh m2profile
}

step_gdn_profile() {
  # Where a GDN spec step goes at batch 256 (verify + commit 1.57x, target 3x): the default
  # two-launch verify at ring fills 0/8/12 with its prep and state launches each timed alone, the
  # commit fold at 4/12/15 entries, the default decode plan, and a plain read of the state.
  run env OUT="$OUT/gdn_profile" GDNPROFILE_TIMEOUT=$(( $(left) - 15 )) \
    GDNPROFILE_ARGS="--decode-configs 3x16x1x3x8x0x1 --reps 15" bash scripts/device_kernels.sh profile
}

step_gdn_kc() {
  # The chunked-K checkpoint tile of the GDN output-only state launch (configs.gdn_state_kc, new in
  # session 16): the GDN kernel tests on the GPU with the new default, then the verify and decode
  # phases at batch 256 per K chunk (0 = the whole K across the lanes, the old tile), then the
  # kernel benchmark at batches 256 and 64 with the default.
  run env OUT="$OUT/gdn_kc" bash scripts/device_kernels.sh gdntests
  local kc
  for kc in 0 32 16; do
    run env OUT="$OUT/gdn_kc" REPLAYSSM_CONFIG="gdn_state_kc=$kc" GDNPROFILE_TIMEOUT=100 \
      GDNPROFILE_ARGS="--decode-configs 3x16x1x3x8x0x1 --verify-configs 16x1x2x4,8x1x2x4 --verify-fills 0,8 --fold-lens 12 --reps 15" \
      bash scripts/device_kernels.sh profile
    [ "$DRY" = 1 ] || mv "$OUT/gdn_kc/profile_gdn.log" "$OUT/gdn_kc/profile_kc$kc.log"
  done
  run env OUT="$OUT/gdn_kc" BENCH_TIMEOUT=$(( $(left) - 15 )) BENCH_ARGS="--family gdn --batches 256,64" \
    bash scripts/device_kernels.sh bench
}

# profile_per_config DIR "PROFILE_ARGS" CFG...: the GDN phase profile once per REPLAYSSM_CONFIG,
# all of them in DIR/profiles.log (one file: $OUT comes back with at most 8 files).
profile_per_config() {
  local dir=$1 args=$2 cfg
  shift 2
  for cfg in "$@"; do
    run env OUT="$dir" REPLAYSSM_CONFIG="$cfg" GDNPROFILE_TIMEOUT=100 GDNPROFILE_ARGS="$args" \
      bash scripts/device_kernels.sh profile
    [ "$DRY" = 1 ] || { echo "=== REPLAYSSM_CONFIG=$cfg GDNPROFILE_ARGS=$args"; cat "$dir/profile_gdn.log"; } \
      >>"$dir/profiles.log"
  done
  [ "$DRY" = 1 ] || rm -f "$dir/profile_gdn.log"
}

# option_study DIR TESTS_CONFIG TESTS_TIMEOUT PROFILE_ARGS BENCH_CONFIG CFG...: the device step of a
# kernel option prepared without a GPU: the GDN kernel tests under REPLAYSSM_CONFIG=TESTS_CONFIG
# (TESTS_TIMEOUT seconds), the phase profile once per CFG (profile_per_config), then the kernel
# benchmark at batches 256 and 64 under BENCH_CONFIG with what time is left.
option_study() {
  local dir=$1 tests_cfg=$2 tests_timeout=$3 args=$4 bench_cfg=$5
  shift 5
  run env OUT="$dir" REPLAYSSM_CONFIG="$tests_cfg" GDNTESTS_TIMEOUT="$tests_timeout" \
    bash scripts/device_kernels.sh gdntests
  profile_per_config "$dir" "$args" "$@"
  run env OUT="$dir" REPLAYSSM_CONFIG="$bench_cfg" BENCH_TIMEOUT=$(( $(left) - 15 )) \
    BENCH_ARGS="--family gdn --batches 256,64" bash scripts/device_kernels.sh bench
}

step_gdn_rt() {
  # Output-only layouts prepared in session 16 without a GPU (docs/perf.md): the ring history read
  # value-row major (configs.gdn_history_rt; verify 392 -> 144 shuffles per program offline,
  # decode registers 96 -> 80), with the verify's K chunk 32 or 16, and the one-warp chunked prep
  # (configs.gdn_prep). The GDN kernel tests with them on, the spec and decode phases at batch 256
  # per REPLAYSSM_CONFIG (all in profiles.log), then the benchmark with the history option on.
  option_study "$OUT/gdn_rt" gdn_history_rt=1,gdn_prep=1x32 240 \
    "--decode-configs 3x16x1x3x8x0x1 --verify-configs 16x1x2x4 --verify-fills 0,8,12 --fold-lens 12 --reps 15" \
    gdn_history_rt=1 \
    gdn_history_rt=0 gdn_history_rt=1 gdn_history_rt=1,gdn_state_kc=16x0 gdn_history_rt=1,gdn_prep=1x32
}

step_gdn_shfl() {
  # The shuffle form of the GDN exact replay (configs.gdn_k_tree=2, gdn/lanes.py), prepared in
  # session 17 without a GPU: the tree form's order with SGLang's own tile and the cross-lane sums
  # as one reduce-scatter (17 shuffles per entry for 8 columns instead of 45; offline fold loop
  # 272 -> 200 SASS instructions per entry and sub-tile at the same 64 registers). The GDN kernel
  # tests with it on (state torch.equal to SGLang's kernel: the lane layout and the inline PTX are
  # CPU-checked, the bits only here), the decode flush and commit-fold phases at batch 256 with the
  # plain form and with it (profiles.log), then the benchmark at batches 256 and 64 with it.
  option_study "$OUT/gdn_shfl" gdn_k_tree=2 280 \
    "--decode-configs 3x16x1x3x8x0x1 --verify-configs 16x1x2x4 --verify-fills 0,8 --fold-lens 4,12,15 --reps 15" \
    gdn_k_tree=2 \
    gdn_k_tree=0 gdn_k_tree=2
}

step_gdn_dot() {
  # The verify's state launch with its checkpoint and history products on tensor cores in tf32x3
  # (configs.gdn_state_dot), prepared in session 17 without a GPU: offline 1224-1608 warp
  # instructions per 16 value rows against the default's 3032 (kernel_regs.py --state-launch).
  # The GDN kernel tests with it on, the verify phases at batch 256 per state-launch tile with it
  # off and on (profiles.log), then the benchmark at batches 256 and 64 with it on (its verify plans
  # include 64 rows x 4 warps; the 8-row plan keeps the warp reductions).
  option_study "$OUT/gdn_dot" gdn_state_dot=1x0 240 \
    "--decode-configs 3x16x1x3x8x0x1 --verify-configs 16x1x2x4,32x2x2x4,64x4x2x4 --verify-fills 0,8,12 --fold-lens 4 --reps 15" \
    gdn_state_dot=1x0 \
    gdn_state_dot=0 gdn_state_dot=1x0
}

step_gdn_order() {
  # The GDN decode step at batch 256 with rows staggered over the ring, as served requests are
  # (kernel run 10: 201.3 us staggered vs 190.9 us synchronised; target 1.7x = ~175 us). Prepared in
  # session 26 without a GPU: the state launch takes the flush rows early (configs.gdn_flush_spread,
  # cursors.decode_row_order; scheduling only), and the decode's non-flush products with the ring
  # history read value-row major or on tensor cores (gdn_history_rt / gdn_state_dot, so far timed
  # for the verify only). The GDN decode tests with all three on, then whole decode cycles
  # (synchronised, and staggered per row order) per product option (profiles.log), then the kernel
  # benchmark at batch 256 with the row order on.
  local d="$OUT/gdn_order"
  run env OUT="$d" REPLAYSSM_CONFIG=gdn_flush_spread=25,gdn_history_rt=0x1,gdn_state_dot=1x1 GDNTESTS_TIMEOUT=150 \
    GDNTESTS_K="decode or row_order" bash scripts/device_kernels.sh gdntests
  profile_per_config "$d" \
    "--decode-configs 3x16x1x3x8x0x1 --no-verify --fold-lens 15 --cycle-spreads off,0,25,50 --reps 15" \
    gdn_flush_spread=-1 gdn_history_rt=0x1 gdn_state_dot=1x1 gdn_state_dot=1x1,gdn_history_rt=0x1
  run env OUT="$d" REPLAYSSM_CONFIG=gdn_flush_spread=25 BENCH_TIMEOUT=$(( $(left) - 15 )) \
    BENCH_ARGS="--family gdn --batches 256" bash scripts/device_kernels.sh bench
}

step_gdn_pdl() {
  # Session 27: the decode's prep launch runs exposed (24 us of a 153 us non-flush step at batch
  # 256). With gdn_pdl=1 the GDN kernel tests passed on the H200 (eager), but bench_kernels.py, which
  # times CUDA-graph replays, printed nothing within 150 s. The probe names the step that stalls (a
  # stack dump at its watchdog) or times both; only if it passes do the tests and the bench follow.
  local d="$OUT/gdn_pdl"
  run env OUT="$d" PDLPROBE_TIMEOUT=260 PDLPROBE_ARGS="--batches 1,256 --watchdog 240" \
    bash scripts/device_kernels.sh pdlprobe
  [ "$DRY" = 1 ] || grep -q "^| 256 | spec |" "$d/pdl_probe.log" 2>/dev/null || { say "pdl probe did not finish: see $d/pdl_probe.log"; return 1; }
  run env OUT="$d" REPLAYSSM_CONFIG=gdn_pdl=1 GDNTESTS_TIMEOUT=240 GDNTESTS_K="decode or verify" \
    bash scripts/device_kernels.sh gdntests
  run env OUT="$d" REPLAYSSM_CONFIG=gdn_pdl=1 BENCH_TIMEOUT=$(( $(left) - 15 )) BENCH_ARGS="--family gdn --batches 1,256" \
    bash scripts/device_kernels.sh bench
}

step_gdn_prep() {
  # Session 27 (perf.md run 14): the prep launch of the GDN pair runs exposed, 24 us of the decode's
  # 153 us non-flush step at batch 256 (the verify's: 79-96 us in run 9). Its plans
  # (configs.gdn_prep: warps x K chunk) were prepared in session 16 and never timed: the default
  # (4, 0) is 4096 programs of 4 warps at batch 256, two waves on 132 SMs; one warp each fits one.
  # The GDN kernel tests with 1x32, the decode's prep and state launches alone and the verify phases
  # per plan (profiles.log), then the benchmark with 1x32.
  option_study "$OUT/gdn_prep" gdn_prep=1x32 240 \
    "--decode-configs 3x16x1x3x8x0x1 --decode-launches --verify-configs 16x1x2x4 --verify-fills 0,8 --fold-lens 4 --reps 15" \
    gdn_prep=1x32 \
    gdn_prep=4x0 gdn_prep=1x32 gdn_prep=1x0 gdn_prep=2x32 gdn_prep=2x0
}

step_gdn_plan4() {
  # Session 27: decode plan 4 (configs.GDNDecodeConfig split=4) runs plan 3's state launch alone,
  # each program making its own row's ring-key products and gate (the history keys read from the
  # `k` ring in chunks of 4 entries; 96 registers offline against plan 3's 80). Run 14: plan 3's
  # prep launch is 24 us of the 153 us non-flush step. The GDN decode tests (plan 4's included),
  # whole decode cycles of both plans (synchronised and staggered with the row order), then the
  # benchmark (its DECODE_CONFIGS time plan 4 beside plan 3, after its GPU check of every plan).
  # Session 28 adds decode plan 5 (gdn/verify_loop.py: one launch, one program per row and value
  # head, the ring products once per program; 2 of its tilings) to the cycles and the benchmark.
  # Session 29: plan 5 with loop splits 2 and 4 in the cycles (a flush row's exact path over all 128
  # value rows in one program is 8 plan-3 flush programs end to end: a possible tail of the launch).
  # Run 15 confirmed that tail (plan 5: 281.6 us staggered, 217.1 with split 2, plan 3 188.1).
  # Session 31: plan 5 with a flush split (a ninth number): flush rows on 8 programs (one tile each),
  # the others on 1 or 2 (5x16x1x2x8x0x1x1x8, 5x16x1x2x8x0x1x2x8).
  local d="$OUT/gdn_plan4"
  run env OUT="$d" GDNTESTS_TIMEOUT=200 GDNTESTS_K="decode" bash scripts/device_kernels.sh gdntests
  profile_per_config "$d" \
    "--decode-configs 3x16x1x3x8x0x1,4x16x1x3x8x0x1,4x32x1x3x8x0x1,5x16x1x2x8x0x1,5x8x1x2x8x0x1,5x16x1x2x8x0x1x2,5x16x1x2x8x0x1x4,5x16x1x2x8x0x1x1x8,5x16x1x2x8x0x1x2x8 --decode-launches --no-verify --fold-lens 15 --cycle-spreads off,75 --reps 15" \
    gdn_flush_spread=75
  run env OUT="$d" BENCH_TIMEOUT=$(( $(left) - 15 )) BENCH_ARGS="--family gdn --batches 256,128,64" \
    bash scripts/device_kernels.sh bench
}

step_gdn_vloop() {
  # Session 28 (no GPU): the verify's state launch was 240-282 us at batch 256 against a 128.6 us
  # read of the state (runs 10, 14), at 1360-1608 SASS instructions per 16 value rows. Products 5
  # runs it as one program per row and value head: the probe matrix and the prep's scratch once per
  # program, the 16- or 32-row tiles in a loop whose loads Triton pipelines (offline sm_90: ~800
  # instructions per 16 rows, no spills; kernel_regs.py --state-launch); products 6 also makes the
  # prep's products there (one launch; 247 registers, or 168 with gdn_verify_maxnreg: the phases
  # run both ways). The GDN verify tests with the one-launch
  # plan as the verify plan (with the tree-form bits of its ring writes in the tests that compare
  # states), the verify phases per plan at batch 256 (5's state launch alone beside the per-tile
  # one), then the benchmark (VERIFY_CONFIGS time both beside 32x1x2x4, the default from 4 rows
  # since session 28, after the GPU check) at batch 256. Session 29 split the small batches off into
  # gdn_vsmall: the benchmark at batch 256 alone took 166 s in session 27 with fewer plans, so
  # 256/8/1 after the tests and two profiles would not have fitted one call.
  local d="$OUT/gdn_vloop"
  run env OUT="$d" REPLAYSSM_CONFIG=gdn_verify=16x1x2x6 GDNTESTS_TIMEOUT=180 GDNTESTS_K="verify or state_loop" \
    bash scripts/device_kernels.sh gdntests
  profile_per_config "$d" \
    "--decode-configs 3x16x1x3x8x0x1 --verify-configs 32x1x2x4,16x1x2x5,32x2x2x5,16x1x2x6,32x2x2x6 --verify-fills 0,12 --fold-lens 12 --reps 15" \
    gdn_verify_maxnreg=0
  run env OUT="$d" BENCH_TIMEOUT=$(( $(left) - 15 )) BENCH_ARGS="--family gdn --batches 256" \
    bash scripts/device_kernels.sh bench
}

step_gdn_vsmall() {
  # Session 29 (no GPU): the looping plans at small batches, with loop splits (VS programs per row
  # and value head; gdn_verify's fifth number): 16x1x1x6x8 is the whole verify in one launch with
  # one 16-row tile per program (256 programs at batch 1, HV = 32), against the spec step's 0.88x of
  # stock at batch 1 (run 14; four launches against stock's two). The benchmark at batches 8 and 1
  # first (VERIFY_CONFIGS, after its GPU check of every plan), then, with what is left, the verify
  # phases at batch 256 with the looping programs' register cap (gdn_verify_maxnreg=168).
  local d="$OUT/gdn_vsmall"
  run env OUT="$d" BENCH_TIMEOUT=$(( $(left) - 130 )) BENCH_ARGS="--family gdn --batches 8,1" \
    bash scripts/device_kernels.sh bench
  profile_per_config "$d" \
    "--decode-configs 3x16x1x3x8x0x1 --verify-configs 16x1x2x5,16x1x2x6,32x2x2x6 --verify-fills 0,12 --fold-lens 12 --reps 15" \
    gdn_verify_maxnreg=168
}

step_gdn_vtiers() {
  # Session 30 set the verify's three default plans (configs: 16x1x1x6x8 below 4 rows, 32x2x2x6 from
  # 4, 16x1x2x6 from 64) from batches 1, 8 and 256 only (perf.md run 15). Here the three plans and
  # the old 32x1x2x4 at the batches between, the decode timed with its default plan alone (the
  # benchmark's GPU check covers the plans it times). Then the verify tests with the three-plan
  # default (no REPLAYSSM_CONFIG), with what is left. If a threshold is off, move
  # _GDN_VERIFY_WIDE_FROM / _GDN_VERIFY_LARGE_FROM to the crossing.
  local d="$OUT/gdn_vtiers"
  run env OUT="$d" BENCH_TIMEOUT=$(( $(left) - 140 )) BENCH_ARGS="--family gdn --batches 2,4,16,32,64,128 --reps 12 \
--gdn-decode-plans 3x16x1x3x8x0x1 --gdn-verify-plans 16x1x1x6x8,32x2x2x6,16x1x2x6,32x1x2x4" \
    bash scripts/device_kernels.sh bench
  run env OUT="$d" GDNTESTS_TIMEOUT=$(( $(left) - 10 )) GDNTESTS_K="verify or state_loop" \
    bash scripts/device_kernels.sh gdntests
}

step_gdn_ring32() {
  # Session 30: with the one-launch verify, the commit is a third of the spec step at batch 256
  # (run 15: verify alone 218 us of 332): a row folds ~13 entries every ~5.2 steps at L = 16, and
  # each fold reads and writes the checkpoint. A 32-entry ring (`--replayssm-ring-len 32`) folds
  # half as often, for twice the ring memory and longer ring reads in the verify and the decode.
  # The benchmark at 256 with L = 16 and then L = 32, default plans only (decode and verify), in one
  # call so both have the same machine.
  local d="$OUT/gdn_ring32" L
  for L in 16 32; do
    run env OUT="$d/L$L" BENCH_TIMEOUT=$(( $(left) / (L == 16 ? 2 : 1) - 10 )) BENCH_ARGS="--family gdn --batches 256 --reps 12 \
--ring-len $L --gdn-decode-plans 3x16x1x3x8x0x1 --gdn-verify-plans 16x1x2x6,32x2x2x6" \
      bash scripts/device_kernels.sh bench
  done
}

step_gdn_dflush() {
  # Session 31: decode plan 5 with its flush rows on 8 programs per value head (one 16-row tile each,
  # plan 3's flush parallelism) and the rest on 1 or 2 (plan 5's prologue once per value head):
  # gdn_plan4's question narrowed to the candidates for issue 2's decode target (1.7x; run 15: plan 3
  # 188.1 us staggered, 1.58x). The plan-5 decode tests, then the benchmark (staggered and
  # synchronised rows, each plan checked bit-exact on the GPU first) at 256 and 128.
  # Session 32: decode rows only (--gdn-decode-only: run 16's call spent its time on spec rows and
  # never reached 64 rows), with two more plan-5 variants (3 stages; flush split 4); the plan-5
  # decode tests only with DFLUSH_TESTS=1 (they passed on an H100 in run 16; the benchmark checks
  # every timed plan bit-exact first anyway).
  local d="$OUT/gdn_dflush"
  if [ "${DFLUSH_TESTS:-0}" = 1 ]; then
    run env OUT="$d" GDNTESTS_TIMEOUT=150 GDNTESTS_K="plan5 or loop_split_config" bash scripts/device_kernels.sh gdntests
  fi
  run env OUT="$d" BENCH_TIMEOUT=$(( $(left) - 15 )) BENCH_ARGS="--family gdn --batches 256,128,64 --reps 12 --gdn-decode-only \
--gdn-decode-plans ${DFLUSH_PLANS:-3x16x1x3x8x0x1,5x16x1x2x8x0x1x1x8,5x16x1x2x8x0x1x2x8,5x16x1x3x8x0x1x1x8,5x16x1x2x8x0x1x1x4}" \
    bash scripts/device_kernels.sh bench
}

step_gdn_small() {
  # GDN spec below batch 64 (run 10: verify + commit 0.75x of stock at batch 1, 0.87x at 8). Session
  # 20 made the narrow fold the default below 33 rows (run 12) and prepared the one-launch commit
  # (the cursor move inside the fold, gdn_commit_fused_below): the GDN kernel tests with it on
  # below 64 rows (a threshold, so the tests' own overrides still apply), then the benchmark at
  # batches 64, 32, 8 and 1, whose rows time the commit both ways (spec_ours_twolaunch_us /
  # spec_ours_onelaunch_us). Make it the default below the batch where it is faster.
  local d="$OUT/gdn_small"
  run env OUT="$d" REPLAYSSM_CONFIG=gdn_commit_fused_below=64 GDNTESTS_TIMEOUT=240 bash scripts/device_kernels.sh gdntests
  run env OUT="$d" BENCH_TIMEOUT=$(( $(left) - 15 )) BENCH_ARGS="--family gdn --batches 64,32,8,1" \
    bash scripts/device_kernels.sh bench
}

step_gdn_sweep() {
  # GDN kernels: every launch plan plus the exact replay unrolled (configs.GDN_UNROLL_SWEEP) for
  # the decode flush and the commit fold, and the verify plans at small batches (spec at concurrency 1
  # is slower than stock: 0.61x kernel time at batch 1 in run 5), at batches 256, 32, 8, 1, each
  # checked on the GPU first.
  run env OUT="$OUT/gdn_sweep" BENCH_TIMEOUT=$(( $(left) - 15 )) \
    BENCH_ARGS="--family gdn --sweep --batches 256,32,8,1" bash scripts/device_kernels.sh bench
}

step_e2e320() {
  # The stock server gets a long startup allowance: on a fresh machine session 10's first stock
  # Nemotron-H NEXTN server was still in its warm-up request (first-use compiles) after 254 s.
  run env E2E_PROMPTS=320 E2E_GRAPH_BS=320 \
    E2E_SERVER_FLAGS="--mem-fraction-static 0.85 --max-total-tokens 200000 --max-mamba-cache-size 1700 --max-running-requests 320" \
    E2E_PARALLEL=1 E2E_STARTUP_S=330 E2E_DEADLINE_S=$(( $(left) - 20 )) OUT="$OUT/e2e320" \
    bash scripts/device_e2e.sh run nemotron_h:nextn
}

step_e2e_dispatch() {
  env_ready
  local budget=$(( $(left) - 20 ))
  [ "$DRY" = 1 ] || { "$PY" scripts/bench_serving.py --models-dir /tmp/bench_models --model gdn --study spec \
    --only stock --concurrency 1 --min-server-s 99999 --out /tmp/b_build >"$OUT/build_spec_model.log" 2>&1 & }
  echo "+ (background) $PY scripts/bench_serving.py --models-dir /tmp/bench_models --model gdn --study spec --only stock --concurrency 1 --min-server-s 99999 --out /tmp/b_build"
  run env E2E_PARALLEL=5 E2E_DEADLINE_S=$budget OUT="$OUT/e2e32" E2E_WORK=/tmp/e2e_work32 \
    bash scripts/device_e2e.sh run qwen3_next qwen3_next:nextn qwen3_next:ring nemotron_h nemotron_h:nextn &
  [ "$DRY" = 1 ] || sleep 30  # the first run installs the plugin's entry point alone
  run env E2E_PROMPTS=160 E2E_GRAPH_BS=160 \
    E2E_SERVER_FLAGS="--mem-fraction-static 0.85 --max-total-tokens 200000 --max-mamba-cache-size 1700 --max-running-requests 160" \
    E2E_DRIVER_FLAGS="--new-tokens-spread 0.75" E2E_PARALLEL=2 E2E_DEADLINE_S=$(( budget - 30 )) OUT="$OUT/e2e160" \
    E2E_WORK=/tmp/e2e_work160 E2E_PORT_BASE=40000 bash scripts/device_e2e.sh run qwen3_next qwen3_next:nextn
  wait
}

step_e2e_prefix() {
  run env E2E_PARALLEL=2 E2E_DEADLINE_S=$(( $(left) - 20 )) OUT="$OUT/e2e_prefix" \
    bash scripts/device_e2e.sh run qwen3_next:nextn:radix nemotron_h:radix:retract \
    qwen3_next:radix:nobuffer:mixed nemotron_h:nextn:radix
}

c1_order() {  # KNOB ORDER: the run order of a C=1 pair (a: ours first, b: stock first) -> only, n_order
  case $2 in
    a) only=ours,stock; n_order=1 ;;
    b) only=stock,ours; n_order=2 ;;
    *) echo "$1: a and/or b, got $2" >&2; return 2 ;;
  esac
}

step_spec_c1() {
  env_ready
  # 16 requests per case (session 10's 4-request cases moved 0.65x -> 1.11x between runs), both
  # orders: a = ours then stock (/tmp/b1), b = stock then ours (/tmp/b2). SPEC_C1_ORDERS (default
  # "a b") picks them: on a fresh machine one order takes ~410 s (session 21: checkpoint build 96 s,
  # first server start 174 s), so give each order its own call on the same warm machine.
  local orders=(${SPEC_C1_ORDERS:-a b}) o k=0 d diag only
  for o in "${orders[@]}"; do
    c1_order SPEC_C1_ORDERS "$o" || return 2
    d=/tmp/b$n_order; diag=/tmp/d$n_order
    k=$(( k + 1 ))
    run "${BENCH[@]}" --model gdn --study spec --only "$only" --concurrency 1 --min-prompts 16 --diag "$diag" \
      --out "$d" --pack "$OUT/spec_c1_$o.tgz" --time-budget $(( ($(left) - 30) / (${#orders[@]} - k + 1) ))
    [ "$DRY" = 1 ] && continue
    local args=() s
    for s in ours stock; do
      [ -d "$d/diag/gdn-12ssm-knob0__spec__${s}__c1__i512o256" ] && args+=("$s=$d/diag/gdn-12ssm-knob0__spec__${s}__c1__i512o256")
    done
    [ ${#args[@]} -gt 0 ] && "$PY" scripts/diag/summarize.py "${args[@]}" --top 12 >>"$OUT/spec_c1_diag.txt" 2>&1
    # Both sides per verify step (steps = output tokens / accept length of each side's case).
    if [ ${#args[@]} -eq 2 ]; then
      local steps=() ok=1 n
      for s in ours stock; do
        n=$("$PY" -c "import json,sys; m=json.load(open(sys.argv[1]))['metrics']; print(round(m['total_output_tokens'] / m['accept_length']))" \
          "$d/cases/gdn-12ssm-knob0__spec__${s}__c1__i512o256.json" 2>/dev/null) || ok=0
        steps+=("$s=$n")
      done
      [ $ok = 1 ] && { echo "== per step, order $o ($d)"; "$PY" scripts/diag/summarize.py "${args[@]}" --diff ours,stock \
        --steps "$(IFS=,; echo "${steps[*]}")" --top 30; } >>"$OUT/spec_c1_diag.txt" 2>&1
    fi
  done
}

step_decode_c1() {
  # GDN decode at concurrency 1, 16 requests a case, both orders (DECODE_C1_ORDERS, default "a b";
  # a = ours then stock, b = stock then ours), with both servers' host stacks (--diag) and a GPU
  # kernel profile of a short rerun (--gpu-profile-steps) per case. Session 23: ours' decode steps
  # ran at stock's speed at C=1 but its time to first token was ~47 ms longer (142 vs 95 ms), which
  # session 19 had not seen; this step is to find where those 47 ms go. Per order: TTFT / TPOT per
  # side, the scheduler's host profile of each side and the kernels that differ, in decode_c1_diag.txt.
  env_ready
  local orders=(${DECODE_C1_ORDERS:-a b}) o k=0 d diag only s case
  for o in "${orders[@]}"; do
    c1_order DECODE_C1_ORDERS "$o" || return 2
    d=/tmp/c1$o; diag=/tmp/dc1$o
    k=$(( k + 1 ))
    run "${BENCH[@]}" --model gdn --study decode --only "$only" --concurrency 1 --min-prompts 16 --diag "$diag" \
      --gpu-profile-steps 160 \
      --server-args="--max-mamba-cache-size 1300 --max-running-requests 256 --enable-request-time-stats-logging" \
      --out "$d" --pack "$OUT/decode_c1_$o.tgz" --time-budget $(( ($(left) - 30) / (${#orders[@]} - k + 1) ))
    [ "$DRY" = 1 ] && continue
    local args=() cases=()
    echo "== order $o ($only, $d)" >>"$OUT/decode_c1_diag.txt"
    for s in stock ours; do
      case="$d/cases/gdn-24ssm-dummy__decode__${s}__c1__i512o256.json"
      [ -f "$case" ] && { cases+=("$case"); "$PY" -c "import json,sys; m=json.load(open(sys.argv[1]))['metrics'] or {}; \
print(f'c1 {sys.argv[2]:>5}: TTFT mean {m.get(\"mean_ttft_ms\", 0):.1f} ms, median TPOT {m.get(\"median_tpot_ms\", 0):.3f} ms, {m.get(\"output_throughput\", 0):.1f} tok/s')" \
        "$case" "$s" 2>&1 | tee -a "$LOG" >>"$OUT/decode_c1_diag.txt"; }
      [ -d "$d/diag/gdn-24ssm-dummy__decode__${s}__c1__i512o256" ] && args+=("$s=$d/diag/gdn-24ssm-dummy__decode__${s}__c1__i512o256")
      # SGLang's per-request split: queue (arrival to first forward) and forward durations.
      { echo "-- $s: SGLang request time stats (last 24 requests)"
        grep -h "queue_duration" "$d"/logs/gdn-24ssm-dummy__decode__"$s"__*.log 2>/dev/null | tail -24 | cut -c1-220; } \
        >>"$OUT/decode_c1_diag.txt"
    done
    [ ${#args[@]} -gt 0 ] && "$PY" scripts/diag/summarize.py "${args[@]}" --top 15 >>"$OUT/decode_c1_diag.txt" 2>&1
    [ ${#cases[@]} -eq 2 ] && "$PY" scripts/diag/gpu_compare.py "${cases[@]}" --top 25 >>"$OUT/decode_c1_diag.txt" 2>&1
  done
}

step_spec_fit() {
  # Max concurrency with NEXTN on and the radix cache off, probed per side (calibrate, predict,
  # launch at N*, load it); builds the GDN spec checkpoint first if /tmp/bench_models lacks it.
  env_ready
  run "$PY" scripts/fit_probe.py --model gdn --models-dir /tmp/bench_models --out /tmp/fit \
    --time-budget $(( $(left) - 30 ))
  [ "$DRY" = 1 ] || { tar czf "$OUT/spec_fit.tgz" -C /tmp fit; cp /tmp/fit/report.md "$OUT/spec_fit_report.md"; }
}

step_spec_fit2() {
  # FIT2_SIDES (default "stock ours"): one side per call leaves each its startup and load time;
  # the second call resumes in the same /tmp/fit on the warm machine. Ours at N=2540 and
  # --mem-fraction-static 0.707: the pools of session 14's launch at 0.707 balance KV and slots
  # near N=2561, and 0.707 leaves the decode logits (N x 4 drafts x vocab fp32, 6.5 GiB at 2832
  # requests) their room; session 14's 0.807 launch ran out of memory there.
  env_ready
  local side
  for side in ${FIT2_SIDES:-stock ours}; do
    case $side in
      stock) run "$PY" scripts/fit_probe.py --model gdn --models-dir /tmp/bench_models --out /tmp/fit --sides stock \
        --start-n stock=960 --min-side-s 120 --startup-timeout 500 --time-budget $(( $(left) - 30 )) ;;
      ours) run "$PY" scripts/fit_probe.py --model gdn --models-dir /tmp/bench_models --out /tmp/fit --sides ours \
        --start-n ours=${FIT2_OURS_N:-2540} --server-args="--mem-fraction-static ${FIT2_OURS_FRAC:-0.707}" \
        --oom-retries 0 --min-side-s 120 --startup-timeout 500 --time-budget $(( $(left) - 30 )) ;;
      *) echo "FIT2_SIDES: stock and/or ours, got $side" >&2; return 2 ;;
    esac
  done
  [ "$DRY" = 1 ] || { tar czf "$OUT/spec_fit.tgz" -C /tmp fit; cp /tmp/fit/report.md "$OUT/spec_fit_report.md"; }
}

step_decode_fixed() {
  # DECODE_MODELS (default "gdn nano9b") share the time left evenly; on a fresh machine give each
  # model its own call (session 15: the first stock server took 184 s to start and a half budget
  # left no time for ours). DECODE_CONC (default 1,128,256): e.g. 256 alone, so that both servers
  # of one model fit one call. DECODE_ARGS: more bench_serving flags, word-split (e.g.
  # "--output-len 1024", where the queued requests' prefill weighs less in the wall time).
  # DECODE_TAG: a suffix for the bench folder and the packed file (another configuration of the
  # same sides on a warm machine, e.g. DECODE_TAG=_nophase with REPLAYSSM_CONFIG=gdn_flush_phase=0).
  # DECODE_SIDES (default stock,ours): e.g. stock,upstream,ours for SGLang's own
  # --enable-linear-replayssm beside them (GDN only; bench_serving skips it for Nano-9B).
  # DECODE_UPSTREAM_ARGS (default --mem-fraction-static=0.825, given only when upstream runs): SGLang's
  # own ReplaySSM allocates its rings (11.5 GB at 1300 slots) after sizing the KV cache, so at the
  # auto fraction (0.907 on the H200) it died of a CUDA OOM on its first 256 prefills (session 24);
  # 0.825 takes the rings' share of the GPU off (its KV: 3.02M tokens, ours 2.88M, stock 3.77M).
  # qwen35_4b: the dense Qwen3.5-4B look-alike (24 GDN layers, as the real model), the gdn pools.
  # DECODE_POOL_ARGS replaces a model's pool flags (e.g. on an H100, where 1300 slots of 24 GDN
  # layers do not fit: "--disable-radix-cache --max-mamba-cache-size 300 --max-running-requests 256").
  env_ready
  local models=(${DECODE_MODELS:-gdn nano9b}) m k=0 flags up=()
  case ",${DECODE_SIDES:-stock,ours}," in
    *,upstream,*) up=("--upstream-args=${DECODE_UPSTREAM_ARGS---mem-fraction-static=0.825}") ;;
  esac
  for m in "${models[@]}"; do
    case $m in
      gdn|qwen35_4b) flags="--max-mamba-cache-size 1300 --max-running-requests 256" ;;
      # Nano-9B: 600 slots (70 GiB of state) admit only 120 requests with the radix cache on
      # (session 16: SGLang keeps ~5 slots per running request), and 1280 slots do not fit; one
      # slot per request with the radix cache off admits 256.
      nano9b) flags="--disable-radix-cache --max-running-requests 256" ;;
      *) echo "DECODE_MODELS: gdn, qwen35_4b and/or nano9b, got $m" >&2; return 2 ;;
    esac
    flags=${DECODE_POOL_ARGS:-$flags}
    k=$(( k + 1 ))
    run "${BENCH[@]}" --model "$m" --study decode --only "${DECODE_SIDES:-stock,ours}" --concurrency "${DECODE_CONC:-1,128,256}" "${up[@]}" ${DECODE_ARGS:-} \
      --server-args="$flags" --out "/tmp/b_decode_$m${DECODE_TAG:-}" --pack "$OUT/decode_fixed_$m${DECODE_TAG:-}.tgz" \
      --time-budget $(( ($(left) - 30) / (${#models[@]} - k + 1) ))
  done
}

step_spec256() {
  # GDN spec decode at concurrency 256 and 128 against stock spec (target 1.8x at 256; the first
  # runs' 0.960x predates the draft-runner fix), the same fixed pools on both sides (stock's slots
  # also carry intermediate_ssm).
  env_ready
  # 1300 slots (as decode_fixed's GDN case): session 16 ran this step with 600 slots, which
  # SGLang turned into 120 running requests on both sides (C=256 and C=128 both measured ~120).
  # SPEC_SSM_LAYERS (default: bench_serving's) and SPEC_POOL_ARGS: e.g. the real Qwen3-Next count
  # of 36 GDN layers, so that the GDN layers weigh more in a step (docs/serving.md: with 12 layers
  # even a free GDN verify bounds the ratio at ~1.4x); stock's intermediate_ssm is then 288 MiB a
  # request, so 256 running need the radix cache off (SPEC_POOL_ARGS="--disable-radix-cache
  # --max-running-requests 256"). SPEC_SIDES (default stock,ours): e.g. stock,upstream,ours for
  # SGLang's own --enable-linear-replayssm-spec beside them, with SPEC_UPSTREAM_ARGS as
  # DECODE_UPSTREAM_ARGS (its spec rings are allocated after the KV cache too; never run yet: if
  # 0.825 is not low enough, the failed case gives the fraction its log calls for).
  # SPEC_CONC (default 256,128) and SPEC_ARGS (more bench_serving flags, word-split): e.g.
  # SPEC_CONC=256 SPEC_ARGS="--output-len 1024", so that the decode steps outweigh the two waves of
  # prefill (session 25: at output 256 each case logged one decode-only window per side).
  # SPEC_MODEL (default gdn): e.g. qwen35_4b, the dense Qwen3.5-4B look-alike (24 GDN layers).
  # Both sides get a 1 GiB flashinfer workspace (SGLang's default is 384 MiB): on the H200 in session
  # 45, ours' server with --attention-backend flashinfer at 256 running requests died capturing its
  # CUDA graphs ("Buffer overflow when allocating memory for batch_prefill_tmp_s"); with 1 GiB both
  # sides served. A workspace set in the environment is kept.
  export SGLANG_FLASHINFER_WORKSPACE_SIZE=${SGLANG_FLASHINFER_WORKSPACE_SIZE:-1073741824}
  local layers=() up=()
  [ -n "${SPEC_SSM_LAYERS:-}" ] && layers=(--ssm-layers "$SPEC_SSM_LAYERS")
  case ",${SPEC_SIDES:-stock,ours}," in
    *,upstream,*) up=("--upstream-args=${SPEC_UPSTREAM_ARGS---mem-fraction-static=0.825}") ;;
  esac
  run "${BENCH[@]}" --model "${SPEC_MODEL:-gdn}" --study spec "${layers[@]}" --only "${SPEC_SIDES:-stock,ours}" --concurrency "${SPEC_CONC:-256,128}" "${up[@]}" ${SPEC_ARGS:-} \
    --server-args="${SPEC_POOL_ARGS:---max-mamba-cache-size 1300 --max-running-requests 256}" \
    --out /tmp/b_spec256 --pack "$OUT/spec256.tgz" --time-budget $(( $(left) - 30 ))
}

step_decode_prof() {
  # Session 33 (H100): the served decode steps at C=256 saved 127 us per GDN layer (17.73 -> 14.68 ms
  # a step, 24 layers), against the 197 us the kernel benchmark saves per layer (425.8 -> 228.7 us),
  # and ours' decode kernel ran at 214 us in its server's profile. This profiles both servers'
  # steady decode steps and prints the kernels whose time differs most (scripts/diag/gpu_compare.py).
  # Each case is one wave of 256 requests (--rounds 1: the profile is the point here, not the
  # throughput); the profile starts PROF_DELAY_S (default 6) s into a rerun of that wave at output
  # 512, whose prefill chunks take ~2.5 s and its 512 decode steps ~9 s.
  # PROF_MODEL (default gdn), PROF_POOL_ARGS (default the H100-sized pools of session 33).
  # PROF_TAG: a suffix for the bench folder, the packed file and the comparison (another server
  # configuration on a warm machine, e.g. PROF_TAG=_incr with --incremental-streaming-output in
  # PROF_POOL_ARGS: the cases are resumed by name, so without a new folder they would be reused).
  # PROF_ARGS: more bench_serving flags (word-split), e.g. "--attention-backend flashinfer" with
  # PROF_TAG=_fi.
  env_ready
  local m=${PROF_MODEL:-gdn} t=${PROF_TAG:-}
  local d=/tmp/b_prof_$m$t
  run "${BENCH[@]}" --model "$m" --study decode --only "${PROF_SIDES:-stock,ours}" --concurrency 256 --output-len 512 \
    --rounds 1 --gpu-profile-steps "${PROF_STEPS:-24}" --gpu-profile-delay "${PROF_DELAY_S:-6}" ${PROF_ARGS:-} \
    --server-args="${PROF_POOL_ARGS:---disable-radix-cache --max-mamba-cache-size 300 --max-running-requests 256}" \
    --out "$d" --pack "$OUT/decode_prof_$m$t.tgz" --time-budget $(( $(left) - 30 ))
  if [ "$DRY" != 1 ]; then
    "$PY" scripts/diag/gpu_compare.py "$d"/cases/*__decode__stock__c256__*.json "$d"/cases/*__decode__ours__c256__*.json \
      --top 25 >"$OUT/decode_prof_compare$t.txt" 2>&1 || true
    cat "$OUT/decode_prof_compare$t.txt"
  fi
  # The same kernels in the kernel benchmark on this machine (batch 256, the default decode plan, both
  # checkpoint layouts: the servers run the split one),
  # when the time left allows: the in-server kernel times above against the benchmark's.
  if [ "$(left)" -gt "${PROF_BENCH_MIN_S:-150}" ]; then
    run env OUT="$OUT/decode_prof_bench" BENCH_TIMEOUT=$(( $(left) - 15 )) BENCH_ARGS="--family gdn --batches 256 \
--reps 12 --gdn-decode-only --gdn-ckpt-split --gdn-decode-plans ${PROF_BENCH_PLANS:-5x16x1x3x8x0x1x1x8,5x16x1x2x8x0x1x1x8}" bash scripts/device_kernels.sh bench
  fi
}

step_gdn_ncu() {
  # Session 42: the served GDN decode step saves less than the kernel's bytes allow. Ours on split
  # checkpoints moves ~360 MB a layer at batch 256 in ~190 us (~1.9 TB/s), SGLang's packed decode
  # ~1080 MB at ~3 TB/s (perf.md runs 18-19). No hardware counters have been read on it yet:
  # where do ours' cycles go (memory latency, issue, occupancy)? NCU_ARGS: e.g. "--plan 3x16x1x3x8x0x1".
  run env OUT="$OUT/gdn_ncu" NCU_TIMEOUT=$(( $(left) - 30 )) NCU_ARGS="${NCU_ARGS:-}" bash scripts/device_kernels.sh ncu
}

step_jit_cache_pack() {
  local base=${JIT_CACHE_HOME:-${HOME:-/root}/.cache} have=()
  for d in flashinfer tvm-ffi; do [ -d "$base/$d" ] && have+=("$d"); done
  [ "$DRY" = 1 ] && [ ${#have[@]} -eq 0 ] && have=(flashinfer tvm-ffi)
  if [ ${#have[@]} -eq 0 ]; then say "jit_cache_pack: nothing under $base (no flashinfer server ran here)"; return 1; fi
  run "$PY" -c "import sys, tarfile; t = tarfile.open(sys.argv[1], 'w:xz'); [t.add(sys.argv[2] + '/' + d, arcname=d) for d in sys.argv[3:]]; t.close()" \
    "$OUT/jit_cache.tar.xz" "$base" "${have[@]}" || return 1
  [ "$DRY" = 1 ] || say "jit_cache_pack: ${have[*]} -> $(du -sm "$OUT/jit_cache.tar.xz" | cut -f1) MiB"
}

step_aime() {
  env_ready
  run "$PY" scripts/aime_parity.py --data-dir .aime_data --model .tiny/qwen3_next --years 2024 --limit 4 --n 2 \
    --max-tokens 256 --concurrency 8 --server-args="--mem-fraction-static 0.5" --out "$OUT/aime" \
    --time-budget $(( $(left) - 30 ))
}

STEPS=(install kernels m2_profile m2_sweep gdn_profile gdn_kc gdn_rt gdn_shfl gdn_dot gdn_order gdn_pdl gdn_prep gdn_plan4 gdn_vloop gdn_vsmall gdn_vtiers gdn_ring32 gdn_dflush gdn_small gdn_sweep e2e320 e2e_dispatch e2e_prefix spec_c1 decode_c1 spec_fit spec_fit2 decode_fixed spec256 decode_prof aime gdn_ncu jit_cache_pack)
[ $# -gt 0 ] || { echo "usage: $0 STEP [STEP ...]; steps: ${STEPS[*]}" >&2; exit 2; }
for s in "$@"; do
  [[ " ${STEPS[*]} " == *" $s "* ]] || { echo "unknown step $s; steps: ${STEPS[*]}" >&2; exit 2; }
done
rc=0
for s in "$@"; do
  LOG="$OUT/$s.log"
  : >"$LOG"
  say "step $s ($(left) s left)"
  "step_$s" || rc=1
  say "step $s done (rc so far $rc)"
done
# Tables last: each step's own summary lines.
for s in "$@"; do
  [ "$DRY" = 1 ] && continue
  echo "=== $s"
  grep -hE "m2profile rc|ncu rc|^\| (kernel|_|fused)|^[a-z0-9x_]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+x$|RESULT|^\[(PASS|FAIL)\]|ours/stock|^ +[0-9]+ +[0-9]|kernel tests rc|bench rc|passed|verdict|VERDICT|^\| (stock|ours) \||^\| [0-9]+ \||^\*\*Mamba-2|conservative" "$OUT/$s.log" 2>/dev/null | tail -40
done
[ -f "$OUT/spec_c1_diag.txt" ] && grep -E "^== |process:" "$OUT/spec_c1_diag.txt"
[ -f "$OUT/decode_c1_diag.txt" ] && grep -E "^== |^c1 |us of kernels per step" "$OUT/decode_c1_diag.txt"
exit $rc
