"""Launch configurations of the kernels whose tile is free to choose, in one place.

The decode kernels' exact (flush) branch and the fold kernels are pinned to the baseline kernel's
tile and warp count (bit identity); only the output-only kernels below are tunable. Entries are
`(block, num_warps, num_stages)`; `scripts/bench_kernels.py --sweep` measures the alternatives.
`override(...)` is for that sweep only.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

_OVERRIDES: dict[str, tuple[int, int, int]] = {}


def _env_overrides() -> None:
    """`REPLAYSSM_CONFIG="gdn_verify=64x4x2x1,gdn_decode=1x64x4x2x8x0x1"` (sweeps and GPU tests)."""
    for item in filter(None, os.environ.get("REPLAYSSM_CONFIG", "").split(",")):
        name, _, val = item.partition("=")
        _OVERRIDES[name.strip()] = tuple(int(x) for x in val.split("x"))


def gdn_verify_config(K: int, V: int, T: int) -> tuple[int, int, int, int]:
    """(BV, num_warps, num_stages, products) of the GDN verify kernel; products: 0 = warp
    reductions, 1 = tf32x3 dots for the committed-state products, 2 = the matrix-form kernel
    (`gdn/verify_mm.py`, every product a tf32x3 GEMM), 3 = the matrix form with the checkpoint
    products as fp32 row reductions of the state tile."""
    if "gdn_verify" in _OVERRIDES:
        bv, w, st, *dot = _OVERRIDES["gdn_verify"]
        return bv, w, st, int(dot[0]) if dot else 0
    # Fastest of the configurations timed on one H200 (2026-11-30, docs/perf.md) from batch 8 up.
    return (32, 1, 2, 1)


@dataclass(frozen=True)
class GDNDecodeConfig:
    """Launch plan of the GDN decode kernel.

    split: 0 = one launch; 1 = flush rows and non-flush rows as two launches (flush first), so
        the non-flush launch gets its own tile (`block_v` columns of V, `num_warps`) and register
        budget; 2 = flush launch, then the non-flush rows through `gdn/verify_split.py`'s two
        kernels with T = 1 (ring products once per key head, then a light state pass). The flush
        launch always uses the baseline's tile (32 columns, one warp).
    flush_cols: V columns replayed at a time by the exact (flush) path (divides 32).
    use_dot: non-flush products on tensor cores (tf32x3) instead of warp reductions.
    evict_first: stream the checkpoint through L2 on non-flush rows.
    """

    split: int = 0
    block_v: int = 32
    num_warps: int = 1
    num_stages: int = 3
    flush_cols: int = 8
    use_dot: bool = False
    evict_first: bool = False


# Default: fused, 32 columns, one warp, warp reductions (the tf32x3 variant was 1.4-1.5x slower on
# one H200, 2026-11-30), flush replayed 8 columns at a time: ptxas (sm_90) reports 128 registers
# per thread instead of 255 with whole-tile replay, and the TTGIR reduction layout of the 8-column
# tile is the baseline's (K over 32 lanes, rows t, t+32, t+64, t+96 per thread, one warp), so every
# column reduces in the same order (docs/perf.md, "Offline analysis"). Bit-exactness of this
# default on the GPU is checked by the GPU test run; the whole-tile plan is `flush_cols=32`.
_GDN_DECODE_DEFAULT = GDNDecodeConfig()


def gdn_decode_config(K: int, V: int) -> GDNDecodeConfig:
    if "gdn_decode" in _OVERRIDES:
        split, bv, warps, stages, fcols, dot, evict = _OVERRIDES["gdn_decode"]
        return GDNDecodeConfig(int(split), bv, warps, stages, fcols, bool(dot), bool(evict))
    return _GDN_DECODE_DEFAULT


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


# Below this many decode rows the backend forces a flush on every step: the ring is not used, and
# the decode kernel runs the exact recurrence (the baseline's arithmetic and cost). At batch 1-4 a
# decode step is latency-bound and the ring saves no time (docs/perf.md, run 2: GDN ring decode
# 0.62x of packed decode at batch 1, 1.02x at 8; Mamba-2 1.09x at batch 1). Switching modes is
# seamless: a forced flush folds whatever is pending.
_RING_MIN_BATCH = {"gdn": 8, "mamba2": 1}


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
