"""Gated DeltaNet ReplaySSM kernels (decode, speculative verify, exact fold)."""

from .ckpt import split_ckpt_convert, split_ckpt_decode, split_ckpt_encode
from .decode import gdn_replay_decode
from .fold import gdn_commit, gdn_replay_fold
from .reference import gdn_gate_ref, gdn_recurrent_ref
from .rings import GDNRings, alloc_gdn_rings, gdn_keeps_raw_keys, gdn_ring_bytes_per_slot, gdn_ring_shapes
from .verify import gdn_replay_verify

__all__ = [
    "GDNRings",
    "alloc_gdn_rings",
    "gdn_recurrent_ref",
    "gdn_gate_ref",
    "gdn_commit",
    "gdn_replay_decode",
    "gdn_replay_fold",
    "gdn_replay_verify",
    "gdn_keeps_raw_keys",
    "gdn_ring_bytes_per_slot",
    "gdn_ring_shapes",
    "split_ckpt_convert",
    "split_ckpt_decode",
    "split_ckpt_encode",
]
