"""Launch configurations of the kernels whose tile is free to choose, in one place.

The decode kernels' exact (flush) branch and the fold kernels are pinned to the baseline kernel's
tile and warp count (bit identity); only the output-only kernels below are tunable. Entries are
`(block, num_warps, num_stages)`; `scripts/bench_kernels.py --sweep` measures the alternatives.
`override(...)` is for that sweep only.
"""

from __future__ import annotations

import contextlib
import os

_OVERRIDES: dict[str, tuple[int, int, int]] = {}


def _env_overrides() -> None:
    """`REPLAYSSM_CONFIG="gdn_verify=64x4x2x1,gdn_decode_dot=1"` (for sweeps and GPU tests)."""
    for item in filter(None, os.environ.get("REPLAYSSM_CONFIG", "").split(",")):
        name, _, val = item.partition("=")
        _OVERRIDES[name.strip()] = tuple(int(x) for x in val.split("x"))


def gdn_verify_config(K: int, V: int, T: int) -> tuple[int, int, int, bool]:
    """(BV, num_warps, num_stages, use_dot) of the GDN verify kernel."""
    if "gdn_verify" in _OVERRIDES:
        bv, w, st, *dot = _OVERRIDES["gdn_verify"]
        return bv, w, st, bool(dot[0]) if dot else False
    return (32, 1, 2, False)


def gdn_decode_use_dot() -> bool:
    """Output-only decode branch on tensor cores (tf32x3) instead of warp reductions."""
    if "gdn_decode_dot" in _OVERRIDES:
        return bool(_OVERRIDES["gdn_decode_dot"][0])
    return False


_env_overrides()


def get_override(name: str):
    return _OVERRIDES.get(name)


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
