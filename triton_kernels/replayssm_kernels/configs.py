"""Launch configurations of the kernels whose tile is free to choose, in one place.

The decode kernels' exact (flush) branch and the fold kernels are pinned to the baseline kernel's
tile and warp count (bit identity); only the output-only kernels below are tunable. Entries are
`(block, num_warps, num_stages)`; `scripts/bench_kernels.py --sweep` measures the alternatives.
`override(...)` is for that sweep only.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, replace
from typing import Optional

_OVERRIDES: dict[str, tuple[int, int, int]] = {}


# name -> accepted numbers of `x`-separated integers
_OVERRIDE_ARITY = {"gdn_decode": (7, 8, 9, 10, 11), "gdn_verify": (3, 4, 5), "gdn_verify_wide_from": (1,), "gdn_verify_large_from": (1,), "gdn_fold_cols": (1,),
                   "gdn_ring_min_batch": (1,),
                   "mamba2_ring_min_batch": (1,), "mamba2_decode": (4,),
                   "mamba2_decode_tile": (3,), "mamba2_verify_tile": (3,), "mamba2_chunk_min_batch": (1,),
                   "mamba2_replay_unroll": (1,), "gdn_replay_unroll": (1,), "mamba2_ring_bc_min_batch": (1,),
                   "gdn_k_tree": (1,), "gdn_state_kc": (1, 2), "gdn_history_rt": (1, 2), "gdn_prep": (2,),
                   "gdn_state_dot": (1, 2), "gdn_fold_narrow_below": (1,),
                   "gdn_commit_fused_below": (1,), "gdn_flush_spread": (1,),
                   "gdn_flush_phase": (1,), "gdn_pdl": (1,), "gdn_verify_maxnreg": (1,), "gdn_decode_maxnreg": (1,),
                   "gdn_decode_large_from": (1,), "gdn_ckpt_split": (1,)}


def parse_plan(name: str, text: str) -> tuple[int, ...] | None:
    """`text` ("16x1x2x4") as the numbers of tunable `name`, or None when it does not parse or has
    the wrong count for that tunable (or `name` is not one)."""
    try:
        nums = tuple(int(x) for x in text.strip().split("x"))
    except ValueError:
        return None
    return nums if len(nums) in _OVERRIDE_ARITY.get(name, ()) else None


def _env_overrides() -> None:
    """`REPLAYSSM_CONFIG="gdn_verify=16x1x2x4,gdn_decode=2x16x1x3x32x0x1,gdn_ring_min_batch=1"`
    (sweeps, GPU tests, and users who want another dispatch)."""
    for item in filter(None, os.environ.get("REPLAYSSM_CONFIG", "").split(",")):
        name, _, val = item.partition("=")
        name = name.strip()
        nums = parse_plan(name, val)
        if nums is None:
            raise ValueError(
                f"REPLAYSSM_CONFIG: bad entry {item!r}; expected name=NxN... with name one of "
                f"{sorted(_OVERRIDE_ARITY)} (see replayssm_kernels/configs.py); fix or unset REPLAYSSM_CONFIG"
            )
        _OVERRIDES[name] = nums


def describe() -> str:
    """One line per tunable: the launch plans and dispatch thresholds in effect."""
    m2_plan = mamba2_decode_plan()
    return "\n".join([
        "gdn_decode=" + gdn_decode_config(128, 128).key() + " (from gdn_decode_large_from rows: "
        + gdn_decode_config(128, 128, rows=max(1, gdn_decode_large_from())).key() + "; on split checkpoints: "
        + gdn_decode_config(128, 128, rows=max(1, gdn_decode_large_from()), split_ckpt=True).key() + ")",
        f"gdn_decode_large_from={gdn_decode_large_from()} (GDN decode: the batch from which its large-batch plan "
        "runs; 0 = never)",
        "gdn_verify=" + "x".join(map(str, gdn_verify_plan(None))) + " (from gdn_verify_large_from rows; "
        "from gdn_verify_wide_from: " + "x".join(map(str, gdn_verify_plan(gdn_verify_wide_from())))
        + "; below: " + "x".join(map(str, gdn_verify_plan(1))) + ")",
        f"gdn_verify_wide_from={gdn_verify_wide_from()} gdn_verify_large_from={gdn_verify_large_from()} (GDN "
        "verify: the batch thresholds of its three default plans)",
        f"gdn_verify_maxnreg={gdn_verify_maxnreg()} (GDN verify plans 5 and 6: register cap of the looping "
        "programs; 0 = none)",
        f"gdn_decode_maxnreg={gdn_decode_maxnreg() if 'gdn_decode_maxnreg' in _OVERRIDES else 'plan'} "
        "(GDN decode plan 5: register cap of its programs, replacing the plan's own (its eleventh number; "
        "96 in the split layout's large-batch plan) when set; 0 = none)",
        f"gdn_fold_cols={gdn_fold_cols()}",
        f"gdn_fold_narrow_below={gdn_fold_narrow_below()} (GDN fold: "
        "below this many rows one gdn_fold_cols sub-tile per program instead of 32 columns; 0 = never)",
        f"gdn_commit_fused_below={gdn_commit_fused_below()} (GDN spec commit: below this many rows the cursor "
        "move runs inside the fold launch, one launch instead of two; 0 = never)",
        f"gdn_replay_unroll={gdn_replay_unroll()} (ring entries per straight-line chunk of the exact replay)",
        f"gdn_flush_spread={gdn_flush_spread()} (GDN decode: -1 = rows in batch order; 0..100 = flush rows spread "
        "over that percentage of the launch from the front)",
        f"gdn_ckpt_split={int(gdn_ckpt_split())} (GDN checkpoint layout of new pools: 1 = split 16-bit planes, "
        "0 = fp32)",
        f"gdn_flush_phase={int(gdn_flush_phase())} (GDN decode: rows also flush on their slot's phase, so rows that "
        "started together flush on different steps; 0 = only when the ring is full)",
        f"gdn_pdl={int(gdn_pdl())} (GDN two-launch pair: the state launch starts while the prep launch "
        "runs and waits for its products after reading the checkpoint tile; 0 = plain stream order)",
        f"gdn_state_kc={gdn_state_kc(128, False)}x{gdn_state_kc(128, True)} (K chunk of the GDN output-only "
        "state tile, verify x decode; 0 = the whole K across a warp's lanes)",
        f"gdn_history_rt={int(gdn_history_rt(False))}x{int(gdn_history_rt(True))} (committed ring entries read "
        "value-row major in the GDN state launch, verify x decode)",
        "gdn_prep=" + "x".join(map(str, gdn_prep_plan(128))) + " (GDN verify prep launch: warps x K chunk)",
        f"gdn_state_dot={int(gdn_state_dot(False))}x{int(gdn_state_dot(True))} (GDN state launch products on "
        "tensor cores in tf32x3, verify x decode; outputs only)",
        f"gdn_k_tree={gdn_k_tree(128)} (K = 128, exact replay: 0 = the baseline's own expressions, 1 = the K "
        "sums written as the baseline's lane tree, 2 = that order with cross-lane sums by shuffles; gdn/common.py)",
        f"gdn_ring_min_batch={ring_min_batch('gdn')} (below: SGLang's packed decode on folded checkpoints; "
        "a GDN server without speculative decoding that cannot run this many requests allocates no rings)",
        f"mamba2_ring_min_batch={ring_min_batch('mamba2')} (below: exact recurrence every step)",
        f"mamba2_replay_unroll={mamba2_replay_unroll()} (ring entries per straight-line chunk of the exact replay)",
        f"mamba2_ring_bc_min_batch={mamba2_ring_bc_min_batch()} "
        "(decode: the ring's B . C in a launch of its own from this many rows; 0 = never)",
        "mamba2_decode=" + "x".join(map(str, m2_plan))
        + (" (one launch; its tile: mamba2_decode_tile below)" if m2_plan[0] == 0
           else " (flush rows in their own launch: split x BM x warps x stages)"),
        *(f"mamba2_{k}_tile=" + ",".join(
            f"P{P}@{rows}:" + ("x".join(map(str, mamba2_tile(k, P, 128, rows) or ())) or "table")
            for P in (64, 80) for rows in (1, mamba2_chunk_min_batch(), _MAMBA2_DECODE_WIDE_MIN_BATCH))
          + " (BM x chunks x warps at N=128 for a launch of @rows rows and up; "
          "table = mamba2/common.py's one-chunk tile)"
          for k in ("decode", "verify")),
    ])


# The GDN verify's default plans by batch (BV, warps, stages, products[, loop split]), from the
# H200 benchmark of session 30 (docs/perf.md run 15, 2026-12-05, verify + commit, T = 4, HV 32 / 64,
# every plan checked bit-exact on the GPU first): the looping plans (products 6: one launch, no
# prep launch) beat every per-tile plan at 1, 8 and 256 rows.
# * below gdn_verify_wide_from (4) rows: 16x1x1x6x8, eight programs per (row, value head) with one
#   16-row tile each (batch 1: 11.9 / 13.6 us against stock's 15.6 / 17.9 and 17.2 / 17.7 for 32x2x2x6);
# * from there: 32x2x2x6 (batch 8: 25.8 / 33.7 us against stock's 38.8 / 72.1; 16x1x2x6 32.3 / 38.2);
# * from gdn_verify_large_from (64) rows: 16x1x2x6 (batch 256: 332.0 / 612.4 us against stock's
#   976.4 / 1928.9, 2.94x / 3.15x; 32x2x2x6 353.2 / 647.7; the old default 32x1x2x4 444.1 / 785.1).
# The two thresholds were not measured (no batch between 1 and 8, or between 8 and 256, timed these
# plans): 4 is where the batch-1 and batch-8 times of the first two plans cross if each grows
# linearly, 64 a guess between 8 and 256 (docs/runbook.md, next session: the sweep over batches).
_GDN_VERIFY_WIDE_FROM = 4
_GDN_VERIFY_LARGE_FROM = 64
_GDN_VERIFY_SMALL = (16, 1, 1, 6, 8)
_GDN_VERIFY_WIDE = (32, 2, 2, 6)
_GDN_VERIFY_LARGE = (16, 1, 2, 6)


def gdn_verify_wide_from() -> int:
    return _OVERRIDES.get("gdn_verify_wide_from", (_GDN_VERIFY_WIDE_FROM,))[0]


def gdn_verify_large_from() -> int:
    return _OVERRIDES.get("gdn_verify_large_from", (_GDN_VERIFY_LARGE_FROM,))[0]


def gdn_verify_config(K: int, V: int, T: int, rows: Optional[int] = None) -> tuple[int, int, int, int]:
    """(BV, num_warps, num_stages, products) of the GDN verify kernel; products: 0 = warp
    reductions, 1 = tf32x3 dots for the committed-state products, 2 = the matrix-form kernel
    (`gdn/verify_mm.py`, every product a tf32x3 GEMM), 3 = the matrix form with the checkpoint
    products as fp32 row reductions of the state tile, 4 = two launches (`gdn/verify_split.py`:
    a prep launch per row and key head, then the state launch per `BV` value rows), 5 = as 4 with
    the state launch as one program per row and value head that walks its value rows `BV` at a
    time, its tile loads pipelined (tensor-core products; `gdn/verify_loop.py`), 6 = as 5 without
    the prep launch (those programs make the prep's products too: one launch)."""
    bv, w, st, *dot = gdn_verify_plan(rows)[:4]
    return bv, w, st, int(dot[0]) if dot else 0


def gdn_verify_plan(rows: Optional[int]) -> tuple:
    """The whole verify plan for a launch of `rows` rows: the `gdn_verify` override at every batch,
    else _GDN_VERIFY_SMALL below gdn_verify_wide_from() rows, _GDN_VERIFY_WIDE from there and
    _GDN_VERIFY_LARGE from gdn_verify_large_from() rows (`rows` None: a large batch)."""
    if "gdn_verify" in _OVERRIDES:
        return tuple(_OVERRIDES["gdn_verify"])
    if rows is None or rows >= gdn_verify_large_from():
        return _GDN_VERIFY_LARGE
    if rows < gdn_verify_wide_from():
        return _GDN_VERIFY_SMALL
    return _GDN_VERIFY_WIDE


def gdn_verify_loop_split(rows: Optional[int] = None) -> int:
    """Programs per (row, value head) of the looping verify launches (products 5 and 6) for a launch
    of `rows` rows: the fifth number of its plan (`16x1x2x6x8`), 1 when absent. Each program walks
    `1/split` of the value rows' tiles; with 6 every program also makes the prep's products, and the
    first writes the window's gates and keys. More programs for small batches, where `B * HV`
    programs would leave most SMs idle."""
    plan = gdn_verify_plan(rows)
    split = int(plan[4]) if len(plan) == 5 else 1
    if split < 1 or (split != 1 and plan[3] not in (5, 6)):
        raise ValueError(f"gdn_verify: a fifth number (loop split >= 1) is the looping plans' only (products 5 "
                         f"and 6), got {plan}; fix REPLAYSSM_CONFIG")
    return split


@dataclass(frozen=True)
class GDNDecodeConfig:
    """Launch plan of the GDN decode kernel.

    split: 0 = one launch; 1 = flush rows and non-flush rows as two launches (flush first), so
        the non-flush launch gets its own tile (`block_v` columns of V, `num_warps`) and register
        budget; 2 = flush launch, then the non-flush rows through `gdn/verify_split.py`'s two
        kernels with T = 1 (ring products once per key head, then a light state pass). The flush
        launch always uses the baseline's tile (32 columns, one warp). 3 = as 2 without the flush
        launch: the state pass runs the flush rows on the exact path itself (`block_v` columns,
        `flush_cols` at a time; one warp unless the tree form (1) is on). 4 = as 3 without the prep
        launch: each program of the state launch makes its own row's ring-key products and gate
        (read from the `k` ring, L2-resident across the key head's programs), one launch per step.
        5 = one launch with one program per row and value head (`gdn/verify_loop.py`): it makes
        those products once and walks its value rows `block_v` at a time (tile loads pipelined),
        the exact path likewise for flush rows. Plan 5 alone takes `num_stages` 0: the next tile's
        loads issued into registers before this tile's products (no shared-memory staging).
        `loop_split` programs per row and value head, each with `1/loop_split` of the tiles
        (the eighth number of a `gdn_decode` plan; 1 when absent); `flush_split` programs per
        value head of a flush row instead (the ninth number; 0 when absent = `loop_split`), so
        that a flush row's exact path is spread over more programs than a non-flush row needs.
        `flush_cap` (the tenth number; 0 when absent): the grid holds the extra `flush_split -
        loop_split` programs per value head for only about `flush_cap`% of the rows (at least one;
        rounded to whole groups of rows), each flush rank's beside its group of rows' own programs
        (`gdn/verify_loop.py`), instead of for every row (a non-flush row's extra programs exit at
        once: 53,760 of the 65,536 programs of a launch at batch 256, HV 32, perf.md session 43).
        A flush row past the capacity runs on its own `loop_split` programs. Needs the flush index
        of `cursors.decode_row_order` (without it the plan runs its full grid).
        `maxnreg` (the eleventh number; 0 when absent = the compiler's choice): plan 5's register
        cap a program (`gdn_decode_maxnreg`, when set, replaces it).
    flush_cols: V columns replayed at a time by the exact (flush) path (divides 32).
    use_dot: non-flush products on tensor cores (tf32x3) instead of warp reductions. Plan 5: on
        split checkpoints with bf16 activations (the outputs read the bf16 `hi` planes) one bf16
        tensor-core product a tile with the key and query as two bf16 halves each
        (`gdn/verify_loop.py` `_tile_products`; session 46, offline: the tile loop 218 SASS
        instructions instead of 658; H100, perf.md run 23: 31 % fewer instructions issued, 2 %
        faster at batch 256); elsewhere plan 5 keeps the warp reductions.
    evict_first: stream the checkpoint through L2 on non-flush rows.
    """

    split: int = 0
    block_v: int = 32
    num_warps: int = 1
    num_stages: int = 3
    flush_cols: int = 8
    use_dot: bool = False
    evict_first: bool = False
    loop_split: int = 1
    flush_split: int = 0
    flush_cap: int = 0
    maxnreg: int = 0

    @property
    def launch_stages(self) -> int:
        """Triton's `num_stages` for the launch: plan 5's 0 (the register prefetch) compiles with 1."""
        return max(1, self.num_stages)

    def key(self) -> str:
        """The `REPLAYSSM_CONFIG` / benchmark spelling, e.g. `2x16x1x3x32x0x1` (an eighth number only
        for a loop split other than 1, a ninth for a flush split, a tenth for a flush capacity, an
        eleventh for a register cap)."""
        nums = (self.split, self.block_v, self.num_warps, self.num_stages, self.flush_cols, self.use_dot,
                self.evict_first)
        if self.maxnreg:
            nums += (self.loop_split, self.flush_split, self.flush_cap, self.maxnreg)
        elif self.flush_cap:
            nums += (self.loop_split, self.flush_split, self.flush_cap)
        elif self.flush_split:
            nums += (self.loop_split, self.flush_split)
        elif self.loop_split != 1:
            nums += (self.loop_split,)
        return "x".join(str(int(x)) for x in nums)


# Default (H200, 2026-12-01, docs/perf.md run 8, staggered rings): plan 3, i.e. the non-flush rows
# through the two-launch verify pair at 16 columns, one warp, and the flush rows on the exact path
# inside that pair's state launch, 8 columns at a time. The separate flush launch of plan 2 cost
# ~25 us per step even when no row flushed (32768 idle programs at batch 256), and 8-column
# flush sub-tiles beat the 32-column tile by ~230 us per flush step at a full ring (run 3's
# opposite result predates the current flush code). Batch 256, HV=32: 216.9 us vs 266.3 us for
# plan 2 and 299.1 us for SGLang's packed decode (1.38x), same run. Every plan here is checked
# bit-exact on the GPU by the benchmark before it is timed.
_GDN_DECODE_DEFAULT = GDNDecodeConfig(split=3, block_v=16, num_warps=1, num_stages=3, flush_cols=8,
                                      use_dot=False, evict_first=True)


# From _GDN_DECODE_LARGE_FROM rows: decode plan 5 with its flush rows on 8 programs per value head
# (one 16-row tile each) and the rest on one (session 31, H100, 2026-12-05, docs/perf.md run 16:
# staggered 228.7 / 440.5 us at batch 256 against plan 3's 237.5 / 461.1, HV 32 / 64; 122.3 / 225.8
# against 130.6 / 238.8 at 128; synchronised too; every plan checked bit-exact on the GPU first).
# From 64 rows since session 34 (H100, perf.md run 17): staggered 66.0 / 122.2 us at 64 rows against
# plan 3's 77.1 / 127.0 (HV 32 / 64; synchronised plan 3 is 4 % faster at HV 32, but served rows
# flush on their slot's phase, i.e. staggered). Below 64 a GDN batch runs SGLang's packed decode
# (ring_min_batch), so plan 3 serves only forced-ring launches there. Override:
# gdn_decode_large_from=N (0 = never).
_GDN_DECODE_LARGE = GDNDecodeConfig(split=5, block_v=16, num_warps=1, num_stages=2, flush_cols=8,
                                    use_dot=False, evict_first=True, loop_split=1, flush_split=8)
# The same plan with three load stages on split-checkpoint pools (session 38, H100, 2026-12-06,
# docs/perf.md run 19: staggered 190.3 / 353.9 us at batch 256 against two stages' 192.9 / 359.3,
# HV 32 / 64; synchronised 182.3 / 339.3 against 186.6 / 349.5; both plans checked bit-exact on the
# GPU first). On fp32 pools three stages are slower (237.4 / 471.7 against 230.5 / 441.3), so the
# plan follows the layout. A `gdn_decode` override applies to both layouts.
# Since session 44 with a flush capacity of 13 % (H100, 2026-12-06, docs/perf.md run 20: staggered
# 169.0 / 312.3 us at batch 256 against 189.4 / 353.6 without, HV 32 / 64; 7 % gave 165.3 / 314.5, 25 %
# 171.2 / 315.7; each plan checked bit-exact on the GPU first). 13 % keeps room for ~2x the 1/16 of the
# rows that flush on an even spread of slot phases; rows past it flush on their own programs.
# Since session 45 with one load stage and a register cap of 96 (H200, 2026-12-06, docs/perf.md run 21:
# staggered 140.4 / 264.0 us at batch 256 against three stages without a cap 152.0 / 282.7, HV 32 / 64,
# SGLang's packed decode 268.4 / 529.2; three stages at the cap 145.5 / 276.6, the register prefetch
# (stages 0) at the cap 203.3 / 388.4, it spills; each plan checked bit-exact on the GPU first). The cap
# lets 21 one-warp programs share an SM instead of 16 (offline, ptxas for sm_90: 128 registers without
# it, 95 under it with no spills); one stage needs 1 KB of shared memory a program instead of 9.4 KB.
# Since session 53 with the tensor-core products in the non-flush tiles (`use_dot`; H200, 2026-12-07,
# docs/perf.md run 28: staggered 134.7 / 248.6 us at batch 256 against 141.0 / 263.2 without, HV 32 / 64,
# 4.7 % / 5.9 %; 44.5 / 73.9 against 48.3 / 77.0 at 64 rows; every plan checked bit-exact on the GPU
# first). Four H100 runs (perf.md runs 23-25, 27) gave it 1.3-2.5 % at batch 256, never slower. It
# runs only on bf16 activations (`plan5_constexprs`); the flush rows, and so the committed state, are
# the same either way.
_GDN_DECODE_LARGE_SPLIT = replace(_GDN_DECODE_LARGE, num_stages=1, flush_cap=13, maxnreg=96, use_dot=True)
_GDN_DECODE_LARGE_FROM = 64


def gdn_decode_large_from() -> int:
    return _OVERRIDES.get("gdn_decode_large_from", (_GDN_DECODE_LARGE_FROM,))[0]


def gdn_decode_config(K: int, V: int, rows: Optional[int] = None, split_ckpt: bool = False) -> GDNDecodeConfig:
    """The GDN decode plan for a launch of `rows` rows (None: below gdn_decode_large_from) on
    checkpoints in the split layout or not; the `gdn_decode` override at every batch and layout."""
    if "gdn_decode" not in _OVERRIDES:
        large = gdn_decode_large_from()
        if rows is not None and large and rows >= large:
            return _GDN_DECODE_LARGE_SPLIT if split_ckpt else _GDN_DECODE_LARGE
        return _GDN_DECODE_DEFAULT
    split, bv, warps, stages, fcols, dot, evict, *ls = _OVERRIDES["gdn_decode"]
    if stages < 0 or (stages == 0 and split != 5):
        raise ValueError(f"gdn_decode: load stages (the fourth number) >= 1, or 0 (register prefetch) for decode "
                         f"plan 5 only, got {_OVERRIDES['gdn_decode']}; fix REPLAYSSM_CONFIG")
    loop_split = int(ls[0]) if ls else 1
    flush_split = int(ls[1]) if len(ls) > 1 else 0
    flush_cap = int(ls[2]) if len(ls) > 2 else 0
    maxnreg = int(ls[3]) if len(ls) > 3 else 0
    if loop_split < 1 or (loop_split != 1 and split != 5):
        raise ValueError(f"gdn_decode: an eighth number (loop split >= 1) is decode plan 5's only, got "
                         f"{_OVERRIDES['gdn_decode']}; fix REPLAYSSM_CONFIG")
    if len(ls) > 1 and (flush_split < 1 or split != 5):
        raise ValueError(f"gdn_decode: a ninth number (flush rows' programs per value head, >= 1) is decode "
                         f"plan 5's only, got {_OVERRIDES['gdn_decode']}; fix REPLAYSSM_CONFIG")
    if len(ls) > 2 and not (0 <= flush_cap <= 100 and (flush_cap == 0 or flush_split > loop_split)):
        raise ValueError(f"gdn_decode: a tenth number (flush capacity, 0..100 % of the rows) needs a flush split "
                         f"above the loop split, got {_OVERRIDES['gdn_decode']}; fix REPLAYSSM_CONFIG")
    if maxnreg and split != 5:
        raise ValueError(f"gdn_decode: an eleventh number (register cap) is decode plan 5's only, got "
                         f"{_OVERRIDES['gdn_decode']}; fix REPLAYSSM_CONFIG")
    _check_maxnreg("gdn_decode (eleventh number)", maxnreg, _MAXNREG_MIN["decode"])
    return GDNDecodeConfig(int(split), bv, warps, stages, fcols, bool(dot), bool(evict), loop_split, flush_split,
                           flush_cap, maxnreg)


_env_overrides()


@contextlib.contextmanager
def override(name: str, cfg: tuple):
    old = _OVERRIDES.get(name)
    _OVERRIDES[name] = cfg
    try:
        yield
    finally:
        if old is None:
            _OVERRIDES.pop(name, None)
        else:
            _OVERRIDES[name] = old


@contextlib.contextmanager
def overrides(items):
    """Every `(name, cfg)` of `items` at once (`override` each); an empty `items` changes nothing."""
    with contextlib.ExitStack() as stack:
        for name, cfg in items:
            stack.enter_context(override(name, cfg))
        yield


# Below this many decode rows the ring is not used. GDN: the backend runs SGLang's own decode
# kernel (fused_recurrent_gated_delta_rule_packed_decode, through the parent backend) after
# folding every pending entry, because the ring decode is slower than it there (H200,
# 2026-12-01, docs/perf.md run 8, default plan, staggered rings: 0.83x at batch 32 and 1.13x at
# 64 for HV=32; 1.09x / 1.28x for HV=64; 0.55-0.77x at batch 8 and below). Mamba-2: the exact
# recurrence every step (the ring decode was faster than SGLang's SSU from batch 1). Switching is
# seamless: the fold before a stock step, or a forced flush, brings every checkpoint up to date.
_RING_MIN_BATCH = {"gdn": 64, "mamba2": 1}


# The split plans that `bench_kernels.py --sweep` times and `kernel_regs.py` screens (docs/perf.md
# run 6: 1.68-1.79x of SGLang's SSU at batch 256, Super shape, against 2.13x for the one-launch
# default, so none is the default). The 16-row flush plans of session 10 gave flush outputs one bit off SGLang's on the H200 (2026-12-01),
# so every flush tile here has >= 32 rows (mamba2/common.py MIN_FLUSH_ROWS).
MAMBA2_DECODE_SWEEP = ((1, 32, 4, 2), (1, 32, 8, 2), (1, 64, 8, 2))


def mamba2_decode_plan() -> tuple[int, int, int, int]:
    """(split, BM, num_warps, num_stages) of the Mamba-2 decode. split 0: one launch, the tile of
    `mamba2/common.py`'s table for every row. split 1: the flush rows first, in a launch of their
    own with a `[BM, next_pow2(N)]` tile (no sub-tiles) and these warps / stages, then the
    non-flush rows with the table's tile; each launch skips the other kind's rows. The default is
    the one-launch plan (docs/perf.md runs 3 and 6; the split plans were slower in run 6)."""
    if "mamba2_decode" in _OVERRIDES:
        return tuple(int(x) for x in _OVERRIDES["mamba2_decode"])  # type: ignore[return-value]
    return (0, 0, 0, 0)


# Chunked Mamba-2 tiles (BM x NC x warps: a program covers NC chunks of BM rows of P) that
# `bench_kernels.py --sweep` times for the decode and the verify at both Mamba-2 shapes. NC is
# capped at the chunks P needs, so (16, 8, w) is one program per head at P = 64 and P = 80.
MAMBA2_TILE_SWEEP = ((16, 8, 4), (16, 8, 2), (32, 4, 4), (16, 8, 8), (64, 1, 2), (32, 2, 2))


# From this many rows a Mamba-2 launch takes the chunked default tile below. H200, 2026-12-01
# (docs/perf.md run 7, SGLang's kernels in the same run, batches 1-256): 16-row chunks, 2 warps,
# one program per head beat the table tile at every batch from 8 on, verify + commit at T=4
# (batch 128: Super 342.6 vs 420.0 us, Nano 452.9 vs 671.8 us; batch 8: 34.8 vs 38.5, 41.7 vs
# 51.9 us) and decode (batch 128: Super 170.6 vs 179.3 us, Nano 216.8 vs 309.4 us; batch 8: 16.6
# vs 18.5, 20.2 vs 23.4 us); at batch 1 the table tile was faster (Super decode 6.2 vs 7.3 us,
# verify 11.4 vs 13.7 us). Batches 2-7 were not measured, so the threshold sits at the smallest
# measured win.
_MAMBA2_CHUNK_MIN_BATCH = 8
_MAMBA2_CHUNK_DEFAULT = (16, 8, 2)
# From this many rows the decode at a P that is a multiple of 64 (Nemotron-3-Super's P = 64) takes
# 64-row programs of 2 warps instead (docs/perf.md run 7, same run as SGLang's SSU, synchronised /
# staggered ring cycle): batch 256 327.1 / 339.3 us against 345.4 / 369.1 (16x8x2) and 355.8 /
# 369.9 us (table tile, an earlier run); batch 128 163.5 / 180.1 against 170.3 / 191.9 (16x8x2);
# batch 32 46.2 / 55.3 against 47.3 / 54.6 (a tie), batch 8 17.0 / 22.5 against 16.5 / 21.2.
_MAMBA2_DECODE_WIDE_MIN_BATCH = 128
_MAMBA2_DECODE_WIDE = (64, 1, 2)


def mamba2_tile(kernel: str, P: int, N: int, rows: int | None = None):
    """(BM, NC, num_warps) of the Mamba-2 decode / verify program for a launch of `rows` rows, or
    None for the one-chunk tile of `mamba2/common.py`'s table. Default from `mamba2_chunk_min_batch`
    rows on, at any P that is a multiple of 16: 16-row chunks, 2 warps, one program per head; the
    decode at a P that is a multiple of 64 takes 64-row programs of 2 warps from
    `_MAMBA2_DECODE_WIDE_MIN_BATCH` rows. Below the threshold, the table tile."""
    name = f"mamba2_{kernel}_tile"
    if name in _OVERRIDES:
        return tuple(int(x) for x in _OVERRIDES[name])
    bm, nc, warps = _MAMBA2_CHUNK_DEFAULT
    if rows is None or rows < mamba2_chunk_min_batch() or P % bm or bm * _next_pow2(N) < 4 * 32 * warps:
        return None
    if kernel == "decode" and P % 64 == 0 and rows >= _MAMBA2_DECODE_WIDE_MIN_BATCH:
        return _MAMBA2_DECODE_WIDE
    return _MAMBA2_CHUNK_DEFAULT


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def mamba2_chunk_min_batch() -> int:
    if "mamba2_chunk_min_batch" in _OVERRIDES:
        return _OVERRIDES["mamba2_chunk_min_batch"][0]
    return _MAMBA2_CHUNK_MIN_BATCH


# Raw ring entries the Mamba-2 exact replay (decode flush, commit fold) runs as one straight-line
# chunk, so a chunk's loads need not wait on the state chain. 4 is what every run so far measured;
# `bench_kernels.py --sweep` also times MAMBA2_UNROLL_SWEEP (the replay order, hence the bits, is
# the same for any value).
_MAMBA2_REPLAY_UNROLL = 4
MAMBA2_UNROLL_SWEEP = (8, 16)


def mamba2_replay_unroll() -> int:
    if "mamba2_replay_unroll" in _OVERRIDES:
        return _OVERRIDES["mamba2_replay_unroll"][0]
    return _MAMBA2_REPLAY_UNROLL


# Mamba-2 decode from this many rows (0 = never): the ring's B_j . C products in a launch of their
# own, one program per (row, group), instead of in every (row, head, P-tile) program, which then
# reads 16 floats instead of the group's ring of B (4 KiB at N=128, L=16) from L2. Session 12's
# profile (docs/perf.md run 7) put the ring's share of a Super-shape non-flush step at 30-40 us
# of ~285 at ring fills 8-15; not measured yet, so off.
_MAMBA2_RING_BC_MIN_BATCH = 0


def mamba2_ring_bc_min_batch() -> int:
    if "mamba2_ring_bc_min_batch" in _OVERRIDES:
        return _OVERRIDES["mamba2_ring_bc_min_batch"][0]
    return _MAMBA2_RING_BC_MIN_BATCH


def mamba2_ring_bc(rows: int) -> bool:
    n = mamba2_ring_bc_min_batch()
    return n > 0 and rows >= n


# The same for the GDN exact replay (decode flush, commit fold): 1 (one entry per loop iteration)
# is what every run so far measured; `bench_kernels.py --sweep` also times GDN_UNROLL_SWEEP.
# (Session 19's variant with each entry's ring loads issued two entries ahead was removed after
# session 20 on the H200: no faster at batches 1 and 8, and at K = 48 the prefetched key took
# another register layout, so its L2 norm summed in another order and the commit lost bit
# identity; docs/perf.md run 12.)
_GDN_REPLAY_UNROLL = 1
GDN_UNROLL_SWEEP = (4,)


def gdn_replay_unroll() -> int:
    """Replay depth of the GDN exact replay; `gdn_replay_unroll=N` sets it for every launch."""
    if "gdn_replay_unroll" in _OVERRIDES:
        return _OVERRIDES["gdn_replay_unroll"][0]
    return _GDN_REPLAY_UNROLL


# The form of the GDN exact replay (gdn/common.py) on the GPU. 2 = the shuffle form (the tree
# form's order, the baseline's tile, cross-lane sums by gdn/lanes.py): the default since session 18
# (H200, 2026-12-03, docs/perf.md run 10): the 53 GDN kernel tests pass with it (committed state
# torch.equal to SGLang's kernel), decode flush of a full ring 795 -> 604 us and commit fold of 15
# entries 646 -> 483 us at batch 256, HV=32. Under the interpreter the plain form unless asked for
# (the shuffle form's inline PTX cannot run there; the CPU tests check it on a lane model).
_GDN_K_TREE = 2
GDN_K_FORMS = {0: "plain", 1: "tree", 2: "shuffle"}


def interpreted() -> bool:
    """Whether Triton runs under its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def gdn_k_tree(K: int) -> int:
    """The form of the GDN exact replay (decode flush, fold) at this K: 0 = SGLang's own
    expressions, 1 = the tree form, 2 = the shuffle form (gdn/common.py; K = 128 only)."""
    if K != 128:
        return 0
    if "gdn_k_tree" in _OVERRIDES:
        form = _OVERRIDES["gdn_k_tree"][0]
        if form not in GDN_K_FORMS:
            raise ValueError(f"gdn_k_tree={form}: expected one of {sorted(GDN_K_FORMS)} "
                             f"({', '.join(f'{k} = {v}' for k, v in GDN_K_FORMS.items())}); fix REPLAYSSM_CONFIG")
        return form
    return _GDN_K_TREE if not interpreted() else 0


def check_exact_replay_warps(num_warps: int, tree: int, where: str) -> None:
    """A launch that runs the exact replay (decode flush rows) in its programs needs one warp, unless
    the replay is the tree form: the plain and shuffle forms' K sums follow one warp's lanes.
    `where` names the launch in the ValueError, which names the fix."""
    if num_warps != 1 and tree != 1:
        raise ValueError(f"{where} runs the exact replay in its programs: it needs one warp in the "
                         f"{GDN_K_FORMS[tree]} form (its sums follow the warp's lanes), got {num_warps}; use "
                         f"num_warps=1 or the tree form (REPLAYSSM_CONFIG=gdn_k_tree=1)")


def ring_min_batch(family: str) -> int:
    if f"{family}_ring_min_batch" in _OVERRIDES:
        return _OVERRIDES[f"{family}_ring_min_batch"][0]
    return _RING_MIN_BATCH[family]


def gdn_fold_cols() -> int:
    """V columns the GDN fold replays at a time (divides 32): 8 needs 128 registers per thread
    instead of 168 for the whole 32-column tile (ptxas, sm_90), with the same per-column reduction
    order (see the decode default above)."""
    if "gdn_fold_cols" in _OVERRIDES:
        return _OVERRIDES["gdn_fold_cols"][0]
    return 8


# Rows below which a GDN commit fold's program owns one gdn_fold_cols() sub-tile of value columns
# instead of 32 (0 = never). A 32-column program replays its sub-tiles one after another, so at
# small batches (128 programs at batch 1, HV=32) the fold is a chain of 4 x n entry steps on a
# mostly idle GPU (docs/perf.md run 11); one sub-tile per program makes the chain n steps on four
# times the programs. The columns are independent, so the bits are the same. H200, 2026-12-03
# (docs/perf.md run 12): commit fold of 15 entries 23.6 -> 15.7 us at batch 1 and 34.1 -> 25.0 us
# at batch 8 (fold phases, each option alone); the spec benchmark's verify + commit with it (and
# the prefetch since removed) 83.8 -> 74.8 us at batch 32, 44.7 -> 34.6 at 8, 20.8 -> 18.7 at 1
# (against run 10's defaults; stock 135.8 / 39.2 / 15.7 us). 33: every batch it covers was timed.
_GDN_FOLD_NARROW_BELOW = 33


# Rows below which the GDN speculative commit is one launch (gdn/fold.py gdn_commit: the cursor
# move inside the fold, made by the row's last program through a ticket counter) instead of
# commit_prepare + fold (0 = never). At small batches each launch costs a few microseconds of
# latency on an idle GPU, and run 10's spec gap below batch 32 is a handful of them; at large
# batches every fold program's ticket is one more same-address atomic per row. H200, 2026-12-03
# (docs/perf.md run 12, spec verify + commit, T = 4): one launch is faster only at batch 1 (18.55
# -> 17.98 us at HV=32, 22.2 -> 21.9 at HV=64) and slower from batch 8 (34.0 -> 34.8 us at 8,
# 71.7 -> 79.5 at 32, HV=32). Run 12 call 3, after this was set: faster or equal at batch 2, mixed
# at 4 (HV=32 / 64); the threshold was left at batch 1.
_GDN_COMMIT_FUSED_BELOW = 2


def gdn_commit_fused_below() -> int:
    return _OVERRIDES.get("gdn_commit_fused_below", (_GDN_COMMIT_FUSED_BELOW,))[0]


def gdn_fold_narrow_below() -> int:
    return _OVERRIDES.get("gdn_fold_narrow_below", (_GDN_FOLD_NARROW_BELOW,))[0]


def gdn_fold_block_v(rows: int, V: int) -> int:
    """Value columns per program of the GDN fold (`gdn/fold.py`) for a fold over `rows` rows."""
    bv = min(_next_pow2(V), 32)
    return min(bv, gdn_fold_cols()) if rows < gdn_fold_narrow_below() else bv


# The order in which the GDN decode's state launch (plan 3: non-flush and flush rows in one launch)
# takes its rows (cursors.decode_row_order): -1 = the batch's own order; 0..100 = the flush rows
# (each an exact replay of the ring, several times a non-flush row's time) spread evenly over that
# percentage of the order from the front, so they start early instead of forming the launch's tail
# and share the SMs with the memory-bound non-flush rows. Scheduling only, never a result. Timed on
# the H200, 2026-12-04 (docs/perf.md run 13, batch 256, HV = 32, whole decode cycles with the rows
# staggered over the ring, per launch): with the decode's history read value-row major, batch order
# 199.8 us, spread 40 / 50 / 60 / 75 / 100: 189.7 / 188.7 / 188.5 / 187.6 / 199.3 us (all flush rows
# first, spread 0: 199.6); with the vectorised history read no order helped (201.1 vs 201.0-207.3).
_GDN_FLUSH_SPREAD = 75


def gdn_flush_spread() -> int:
    """-1 (rows in batch order) or the spread of `decode_row_order` (REPLAYSSM_CONFIG gdn_flush_spread=N)."""
    n = _OVERRIDES.get("gdn_flush_spread", (_GDN_FLUSH_SPREAD,))[0]
    if not -1 <= n <= 100:
        raise ValueError(f"gdn_flush_spread must be -1 (off) or 0..100, got {n}; fix REPLAYSSM_CONFIG")
    return n


# GDN decode: each slot also flushes on the decode steps of its own phase (cursors.decode_prepare
# `phase_step`), so rows that start decoding together (a prefill batch, a whole wave of requests
# with equal lengths) do not all flush on the same step. Served that way they run the benchmark's
# staggered cycle instead of the synchronised one: H200, 2026-12-04 (docs/perf.md run 13, batch
# 256, HV = 32) 186.9 against 192.1 us per step with this session's defaults, and no step with
# every row's exact replay (~600 us per layer against ~170). The flush is the exact replay whenever
# it runs (no result changes); each request folds once early, in its first cycle. Not yet measured
# in a server. 0 = off, 1 = on.
_GDN_FLUSH_PHASE = 1


# The GDN checkpoint layout (gdn/ckpt.py): 1 = split planes (output-only reads with bf16
# activations take half the bytes; the exact paths unchanged), 0 = fp32 (SGLang's layout). Read
# where a pool or harness is made (the layout is the pool's, fixed for its life). On the GPU the
# split layout needs the tree or shuffle form of the exact replay (K = 128, `gdn_k_tree`): the
# plain form's sums follow the tile layout the compiler derives from the loads, and the split
# load (two 16-bit planes) gives another one (measured on an H100, 2026-12-05: the state then
# differs from SGLang's at K = 32 and 48, while K = 128 in the tree form is bit-exact).
_GDN_CKPT_SPLIT = 1


def gdn_ckpt_split() -> bool:
    """Whether new GDN pools keep their checkpoints in the split layout (REPLAYSSM_CONFIG gdn_ckpt_split=0|1)."""
    return bool(_OVERRIDES.get("gdn_ckpt_split", (_GDN_CKPT_SPLIT,))[0])


def gdn_ckpt_split_form_ok(K: int) -> bool:
    """Whether the exact replay in effect at this K can run on split checkpoints (the tree or
    shuffle form; any form under the interpreter, whose sums are numpy's)."""
    return gdn_k_tree(K) != 0 or interpreted()


def gdn_ckpt_split_for(K: int) -> bool:
    """The layout a new GDN pool or harness with key head size `K` takes: split when
    `gdn_ckpt_split` is on and the replay form allows it. Asked for explicitly
    (REPLAYSSM_CONFIG gdn_ckpt_split=1) where the form does not allow it, this raises; by default
    such a pool keeps fp32 checkpoints."""
    if not gdn_ckpt_split():
        return False
    if gdn_ckpt_split_form_ok(K):
        return True
    if "gdn_ckpt_split" in _OVERRIDES:
        raise ValueError(
            f"REPLAYSSM_CONFIG gdn_ckpt_split=1: the split checkpoint layout needs the tree or shuffle form of "
            f"the exact replay (head_k_dim 128, gdn_k_tree=1 or 2), here head_k_dim={K} with form "
            f"{GDN_K_FORMS[gdn_k_tree(K)]}; set gdn_ckpt_split=0 or unset it"
        )
    return False


def gdn_flush_phase() -> bool:
    """Whether GDN decode batches flush rows on their slot's phase too (REPLAYSSM_CONFIG gdn_flush_phase=0|1)."""
    return bool(_OVERRIDES.get("gdn_flush_phase", (_GDN_FLUSH_PHASE,))[0])


# The GDN two-launch pair (gdn/verify_split.py) with programmatic dependent launch: the prep
# launch lets the state launch start at once, and each state program reads its checkpoint tile
# and ring history (the launch's bytes) before it waits for the prep launch's products
# (`griddepcontrol.wait`). Why: profiled on the H200, 2026-12-04 (docs/perf.md run 14, batch 256,
# HV = 32), the decode's non-flush step was 153.5 us, of which the prep launch alone 23.9 and the
# state launch alone 132.9: the prep runs exposed. Scheduling only, no result changes; sm_90 and
# later, never under the interpreter (no inline PTX there). OFF: on the H200 (same run) the GDN
# kernel tests passed with it (eager launches), but the kernel benchmark, which times CUDA-graph
# replays, gave no result within its 150 s limit with it on (without it, both batch sizes within
# the same limit): a hang or a stall under graph capture or replay is not ruled out, and SGLang
# serves from CUDA graphs. `scripts/pdl_probe.py` checks eager and graph replays with a watchdog.
# 0 = off, 1 = on.
_GDN_PDL = 0


# A register cap for the GDN verify's looping programs (gdn/verify_loop.py, verify plan products 5
# and 6), 0 = the compiler's choice. The one-launch loop (6) uses 247 registers on sm_90 (its
# prep products), so 8 one-warp programs fit an SM; capped at 168, 12 fit, for 456 bytes of spill
# stores (offline, session 28). Never timed; `REPLAYSSM_CONFIG=gdn_verify_maxnreg=N`.
# The same for decode plan 5's programs (`gdn_decode_maxnreg=N`): on the H100 of session 44 (perf.md
# run 20, Nsight Compute) the default plan used 128 registers and 9.4 KB of shared memory a
# one-warp program, 16 programs an SM by either (theoretical occupancy 25 %), where session 43's
# build of the plan without the flush capacity had 96 (20 an SM). Offline (ptxas for sm_90, session
# 44, scripts/kernel_regs.py --decode-plan5, which gives the same 128 / 96) a cap of 96 costs the
# capped plan no spills, 80 costs 8 bytes. Timed in session 45 (H200, perf.md run 21): 96 is the
# split layout's large-batch plan's own cap now (its eleventh number); `gdn_decode_maxnreg`, when set,
# replaces a plan's cap (0 = none). Below 96 a decode cap is refused: at 80 the benchmark's GPU check
# failed (NaN outputs of plan 5 with fp32 activations at batch 2, H200, session 45); 88 passed it
# but ran slower than 96 in both forms (H100, perf.md run 27).
_GDN_MAXNREG = {"verify": 0}
_MAXNREG_MIN = {"verify": 24, "decode": 96}


def _check_maxnreg(name: str, n: int, lo: int) -> None:
    if n and not lo <= n <= 255:
        raise ValueError(f"{name}: 0 or {lo}..255 registers, got {n}; fix REPLAYSSM_CONFIG")


def gdn_verify_maxnreg() -> int:
    """The register cap of the GDN verify's looping programs (0 = none; ignored by the interpreter)."""
    n = _OVERRIDES.get("gdn_verify_maxnreg", (_GDN_MAXNREG["verify"],))[0]
    _check_maxnreg("gdn_verify_maxnreg", n, _MAXNREG_MIN["verify"])
    return 0 if interpreted() else n


def gdn_decode_maxnreg(cfg: Optional[GDNDecodeConfig] = None) -> int:
    """The register cap of GDN decode plan 5's programs for the plan `cfg`: `gdn_decode_maxnreg` when
    set (0 = none), else the plan's own (0 without a plan); ignored by the interpreter."""
    if "gdn_decode_maxnreg" in _OVERRIDES:
        n = _OVERRIDES["gdn_decode_maxnreg"][0]
        _check_maxnreg("gdn_decode_maxnreg", n, _MAXNREG_MIN["decode"])
    else:
        n = cfg.maxnreg if cfg is not None else 0
    return 0 if interpreted() else n


def maxnreg_option(n: int) -> dict:
    """A register cap as a launch's compile option (`maxnreg`); none for 0."""
    return {"maxnreg": n} if n else {}


def gdn_pdl() -> bool:
    """Whether the GDN prep/state pair uses programmatic dependent launch (REPLAYSSM_CONFIG gdn_pdl=0|1)."""
    return bool(_OVERRIDES.get("gdn_pdl", (_GDN_PDL,))[0]) and not interpreted() and _sm90_or_later()


_SM90: bool | None = None


def _sm90_or_later() -> bool:
    global _SM90
    if _SM90 is None:
        import torch

        _SM90 = bool(torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9)
    return _SM90


# K chunk of the checkpoint tile in the output-only GDN state launch (gdn/verify_split.py), for
# the spec verify and for the decode's non-flush rows: the tile is read as [BV, BK // KC, KC],
# which gives a warp's lanes KC // 4 keys and value rows for the rest, so the K sums take
# log2(KC / 4) shuffle steps per few rows instead of 5 per row (ptxas on sm_90, T = 4, BV = 16:
# 1064 shuffles per program with the whole K, 392 at KC = 32). H200, 2026-12-02 (docs/perf.md
# run 9, batch 256, HV = 32): verify state launch 384 -> 339 us (KC 32; 338 at 16), verify +
# commit 1.57x -> 1.76x of SGLang's; the decode step was not faster (non-flush 153-179 us vs
# 157-189, and the flush rows' exact branch in the same launch 794 -> 873 us), so the decode keeps
# the whole-K tile. Outputs only: the exact replay is not affected.
_GDN_STATE_KC = {"verify": 32, "decode": 0}


def gdn_state_kc(K: int, decode: bool) -> int:
    """KC of the GDN state launch at this K for the verify or the decode's non-flush rows (a
    power of two; 0 = the whole K). REPLAYSSM_CONFIG gdn_state_kc=N sets both, =NxM verify x decode."""
    if "gdn_state_kc" in _OVERRIDES:
        nums = _OVERRIDES["gdn_state_kc"]
        kc = nums[-1] if decode and len(nums) > 1 else nums[0]
    else:
        kc = _GDN_STATE_KC["decode" if decode else "verify"]
    if kc < 0 or (kc & (kc - 1)):
        raise ValueError(f"gdn_state_kc must be 0 or a power of two, got {kc}; fix REPLAYSSM_CONFIG")
    return 0 if kc == 0 or kc >= _next_pow2(K) else kc


# How the GDN state launch reads the committed `d` ring entries for the history sums
# `sum_j u_j w_j`: 0 = `[RLB, BV]` with vector loads, whose layout puts the entries across 16 lanes
# (a 4-step butterfly per sum and value pair); 1 = `[BV, RLB]` with scalar loads, the lanes along
# V and 8 entries in each thread (one shuffle step). ptxas on sm_90, T = 4, BV = 16, KC = 32: 392
# shuffles per program with 0, 144 with 1. H200, 2026-12-04 (docs/perf.md run 13, batch 256, HV =
# 32): the verify's state launch is slower with it (282 -> 291 us at fill 0, with the tensor-core
# products), so the verify keeps 0; the decode's non-flush step alone is ~2 us slower, but with the
# flush rows early (gdn_flush_spread) the staggered decode cycle goes 201.1 -> 187.6 us (none of
# the row orders helped without it), so the decode reads value-row major.
_GDN_HISTORY_RT = {"verify": False, "decode": True}


def gdn_history_rt(decode: bool) -> bool:
    """Whether the GDN state launch reads the ring history value-row major (verify or decode).
    REPLAYSSM_CONFIG gdn_history_rt=N sets both, =NxM verify x decode."""
    if "gdn_history_rt" in _OVERRIDES:
        nums = _OVERRIDES["gdn_history_rt"]
        return bool(nums[-1] if decode and len(nums) > 1 else nums[0])
    return _GDN_HISTORY_RT["decode" if decode else "verify"]


# The GDN state launch's checkpoint products `S0 [k_s | q_s]` (and the ring history's) as one
# tensor-core product in tf32x3 instead of 2T warp reductions: outputs only, never the exact
# replay. Offline (sm_90, T = 4): 3032 warp instructions per 16 value rows with the default tile,
# 1224-1608 with tensor cores (kernel_regs.py --state-launch; docs/perf.md "Prepared in session 17").
# On for verify since session 18 (H200, 2026-12-03, docs/perf.md run 10: the verify's state launch
# at batch 256, HV=32, 335 -> 282 us with the 16x1 tile, 443 -> 240 us with 32x2; the GDN kernel tests
# pass with it); decode's non-flush rows not timed with it, so off. GPU only: under the interpreter
# off unless asked for, so that the CPU suite keeps testing the warp-reduction products it always has
# (test_gdn_state_tensor_core_products runs the tensor-core ones there). Decode on the H200,
# 2026-12-04 (run 13): non-flush step 152.6 -> 259.8 us, and at K = 48 the flush rows' plain-form
# replay in the same launch then differed from SGLang's bits (test_gdn_decode_launch_variants
# [plan3-bv16-flushcols16-K48]): keep it off for the decode.
_GDN_STATE_DOT = {"verify": True, "decode": False}


def gdn_state_dot(decode: bool) -> bool:
    """Whether the GDN state launch takes its checkpoint and history products on tensor cores
    (verify or decode's non-flush rows). REPLAYSSM_CONFIG gdn_state_dot=N sets both, =NxM verify x
    decode. It applies to state tiles of 16 or more rows and reads them whole along K
    (gdn_state_kc is then ignored)."""
    if "gdn_state_dot" in _OVERRIDES:
        nums = _OVERRIDES["gdn_state_dot"]
        return bool(nums[-1] if decode and len(nums) > 1 else nums[0])
    return _GDN_STATE_DOT["decode" if decode else "verify"] and not interpreted()


# The GDN two-launch verify's prep launch (per row and key head: the key products, the UT
# transform): (num_warps, KC), KC as gdn_state_kc for its key tiles. (4, 0) is what every run
# measured (79-96 us at batch 256, HV=32, run 9). (1, 32) was prepared in session 16 without a
# GPU run: ptxas on sm_90, T = 4: 33 barriers and 355 shuffles per program against 103 and 321
# for (4, 0); the launch has one program per row and key head (4096 at batch 256).
_GDN_PREP_PLAN = (4, 0)


def gdn_prep_plan(K: int) -> tuple[int, int]:
    """(num_warps, KC) of the GDN verify prep launch at this K (REPLAYSSM_CONFIG gdn_prep=WxKC)."""
    warps, kc = _OVERRIDES["gdn_prep"] if "gdn_prep" in _OVERRIDES else _GDN_PREP_PLAN
    if _next_pow2(K) < 128 and "gdn_prep" not in _OVERRIDES:
        warps = 2
    if warps not in (1, 2, 4, 8) or kc < 0 or (kc & (kc - 1)):
        raise ValueError(f"gdn_prep: warps in 1/2/4/8 and KC 0 or a power of two, got {warps}x{kc}; "
                         "fix REPLAYSSM_CONFIG")
    return warps, (0 if kc == 0 or kc >= _next_pow2(K) else kc)
