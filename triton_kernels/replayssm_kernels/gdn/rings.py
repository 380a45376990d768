"""GDN ring storage: six rings per slot and layer.

Shapes (all layers; index `[layer]` for one layer's view):

    d     [Lm, S, HV, L, V]  activation dtype   u = beta (v - alpha S k), output path
    k     [Lm, S, H,  L, K]  fp32               L2-normalised key, output path
    g     [Lm, S, HV, L]     fp32               log-decay gate
    rawv  [Lm, S, HV, L, V]  activation dtype   raw value, exact fold
    rawk  [Lm, S, H,  L, K]  activation dtype   raw (pre-norm) key, exact fold (plain form only)
    beta  [Lm, S, HV, L]     fp32               sigmoid(b), exact fold

The slot dimension may be strided (pool views); everything after it must be contiguous.

Only the plain form of the exact replay (`configs.gdn_k_tree` = 0) reads raw keys; the tree and
shuffle forms (the GPU default at K = 128) read the normalised `k` ring. Rings allocated while a
non-plain form is in effect therefore keep no raw keys: `rawk` is `[Lm, S, H, 0, K]` (no memory,
valid strides), the kernels skip its stores (`RAW_K`), and a plain-form replay on them is refused.
The form is read once, at allocation (and by the memory planner, which must count the same bytes).

Why `k` is fp32 and `d` is not: with both rounded to bf16 the one-shot outputs drift past twice
the baseline kernel's own error (measured on CPU: +1.1e-3 over 2x the baseline error at L=16,
T=4); keeping either one in fp32 brings them within 2.5e-4 of it, and the `k` ring is the
cheaper one (one per key head, `HV / H` times smaller than `d`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional

import torch

from ..configs import gdn_k_tree


@dataclass(frozen=True)
class GDNRings:
    d: torch.Tensor
    k: torch.Tensor
    g: torch.Tensor
    rawv: torch.Tensor
    rawk: torch.Tensor
    beta: torch.Tensor

    @property
    def ring_len(self) -> int:
        return self.g.shape[-1]

    @property
    def per_layer(self) -> bool:
        return self.g.dim() == 3

    def layer(self, i: int) -> "GDNRings":
        """One layer's view (`[S, ...]` tensors)."""
        assert not self.per_layer
        return GDNRings(**{f.name: getattr(self, f.name)[i] for f in fields(self)})

    def all_layers(self) -> "GDNRings":
        """A per-layer view as a one-layer stack (`[1, S, ...]`)."""
        if not self.per_layer:
            return self
        return GDNRings(**{f.name: getattr(self, f.name).unsqueeze(0) for f in fields(self)})

    @property
    def has_raw_keys(self) -> bool:
        """Whether `rawk` is kept (else it has a zero-length ring axis and is never written)."""
        return self.rawk.shape[-2] != 0 or self.ring_len == 0

    def replay_keys(self, tree: int) -> torch.Tensor:
        """The key ring the exact replay reads: raw pre-norm keys, or in the tree form
        (`configs.gdn_k_tree`) the normalised `k` ring, written in the baseline's order."""
        if tree:
            return self.k
        if not self.has_raw_keys:
            raise ValueError(
                "these GDN rings keep no raw keys (allocated for the tree or shuffle replay form, "
                "REPLAYSSM_CONFIG gdn_k_tree=1 or 2), but the plain form (gdn_k_tree=0) replays from them; "
                "to run it, set REPLAYSSM_CONFIG=gdn_k_tree=0 before the rings are allocated (pool, harness) "
                "or allocate them with alloc_gdn_rings(..., raw_keys=True)"
            )
        return self.rawk

    def tensors(self) -> list[torch.Tensor]:
        return [getattr(self, f.name) for f in fields(self)]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def gdn_keeps_raw_keys(head_k_dim: int) -> bool:
    """Whether rings allocated now keep raw keys: only the plain replay form reads them."""
    return gdn_k_tree(head_k_dim) == 0


def gdn_ring_shapes(num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int, ring_len: int,
                    raw_keys: Optional[bool] = None):
    """Per-slot, per-layer shapes and whether each ring is fp32, in `GDNRings` field order.
    `raw_keys` (default: `gdn_keeps_raw_keys`) False gives `rawk` a zero-length ring axis."""
    H, HV, K, V, L = num_k_heads, num_v_heads, head_k_dim, head_v_dim, ring_len
    if raw_keys is None:
        raw_keys = gdn_keeps_raw_keys(K)
    return {
        "d": ((HV, L, V), False),
        "k": ((H, L, K), True),
        "g": ((HV, L), True),
        "rawv": ((HV, L, V), False),
        "rawk": ((H, L if raw_keys else 0, K), False),
        "beta": ((HV, L), True),
    }


def gdn_ring_bytes_per_slot(
    num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int, ring_len: int,
    act_dtype: torch.dtype, num_layers: int = 1, raw_keys: Optional[bool] = None,
) -> int:
    """Bytes of the rings `alloc_gdn_rings` allocates for one slot (times `num_layers`)."""
    act = torch.empty((), dtype=act_dtype).element_size()
    total = 0
    for shape, is_fp32 in gdn_ring_shapes(num_k_heads, num_v_heads, head_k_dim, head_v_dim, ring_len,
                                          raw_keys).values():
        n = 1
        for s in shape:
            n *= s
        total += n * (4 if is_fp32 else act)
    return total * num_layers


def alloc_gdn_rings(
    num_layers: int, num_slots: int, num_k_heads: int, num_v_heads: int, head_k_dim: int,
    head_v_dim: int, ring_len: int, act_dtype: torch.dtype, device, raw_keys: Optional[bool] = None,
) -> GDNRings:
    """Allocate `[Lm, S, ...]` rings. Contents are irrelevant until the cursors say otherwise,
    but they are zeroed so that no uninitialised value (NaN) can ever reach a masked lane.
    `raw_keys`: keep the `rawk` ring (default: only if the replay form in effect now is plain)."""
    out = {}
    for name, (shape, is_fp32) in gdn_ring_shapes(
        num_k_heads, num_v_heads, head_k_dim, head_v_dim, ring_len, raw_keys
    ).items():
        dtype = torch.float32 if is_fp32 else act_dtype
        out[name] = torch.zeros((num_layers, num_slots, *shape), dtype=dtype, device=device)
    return GDNRings(**out)


def check_gdn_rings(rings: GDNRings, H: int, HV: int, K: int, V: int) -> None:
    """Validate a per-layer or all-layer ring set against the head geometry."""
    lead = 1 if rings.per_layer else 2
    L = rings.ring_len
    for name, (shape, is_fp32) in gdn_ring_shapes(H, HV, K, V, L, rings.has_raw_keys).items():
        t = getattr(rings, name)
        if tuple(t.shape[lead:]) != shape:
            raise ValueError(f"ring `{name}` has per-slot shape {tuple(t.shape[lead:])}, expected {shape}")
        if is_fp32 and t.dtype != torch.float32:
            raise ValueError(f"ring `{name}` must be float32, got {t.dtype}")
        inner = t[(0,) * lead] if t.shape[0] > 0 else None
        if inner is not None and not inner.is_contiguous():
            raise ValueError(f"ring `{name}` must be contiguous after the slot dimension")
    if rings.rawv.dtype != rings.rawk.dtype:
        raise ValueError("rawv and rawk must share the activation dtype")
    if rings.d.dtype not in (rings.rawk.dtype, torch.float32):
        raise ValueError("ring `d` must be fp32 or the activation dtype")
