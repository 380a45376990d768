"""Launch configurations of the kernels whose tile is free to choose, in one place.

The decode kernels' exact (flush) branch and the fold kernels are pinned to the baseline kernel's
tile and warp count (bit identity); only the output-only kernels below are tunable. Entries are
`(block, num_warps, num_stages)`; `scripts/bench_kernels.py --sweep` measures the alternatives.
`override(...)` is for that sweep only.
"""

from __future__ import annotations

import contextlib

_OVERRIDES: dict[str, tuple[int, int, int]] = {}


def gdn_verify_config(K: int, V: int, T: int) -> tuple[int, int, int]:
    """(BV, num_warps, num_stages) of the GDN verify kernel."""
    if "gdn_verify" in _OVERRIDES:
        return _OVERRIDES["gdn_verify"]
    return (32, 1, 2)


def get_override(name: str):
    return _OVERRIDES.get(name)


@contextlib.contextmanager
def override(name: str, cfg: tuple[int, int, int]):
    old = _OVERRIDES.get(name)
    _OVERRIDES[name] = cfg
    try:
        yield
    finally:
        if old is None:
            _OVERRIDES.pop(name, None)
        else:
            _OVERRIDES[name] = old
