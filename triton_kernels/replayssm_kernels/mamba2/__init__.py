"""Mamba-2 ReplaySSM kernels (decode, speculative verify, exact fold)."""

from .common import TileConfig, tile_config
from .decode import mamba2_replay_decode
from .fold import mamba2_replay_fold
from .reference import mamba2_dt_ref, mamba2_recurrent_ref
from .rings import (
    Mamba2Rings,
    alloc_mamba2_rings,
    check_mamba2_rings,
    mamba2_ring_bytes_per_slot,
    mamba2_ring_shapes,
)
from .verify import mamba2_replay_verify

__all__ = [
    "Mamba2Rings",
    "TileConfig",
    "alloc_mamba2_rings",
    "check_mamba2_rings",
    "mamba2_dt_ref",
    "mamba2_recurrent_ref",
    "mamba2_replay_decode",
    "mamba2_replay_fold",
    "mamba2_replay_verify",
    "mamba2_ring_bytes_per_slot",
    "mamba2_ring_shapes",
    "tile_config",
]
