"""Mamba-2 ring storage: three rings per slot and layer, all raw inputs in the activation dtype.

Shapes (all layers; index `[layer]` for one layer's view):

    x   [Lm, S, NH, L, P]   activation dtype   raw (post-conv) x
    B   [Lm, S, G,  L, N]   activation dtype   raw (post-conv) B, one entry per group
    dt  [Lm, S, NH, L]      activation dtype   raw dt (bias and softplus are applied on load)

Nothing is rounded on the way in, so the same three rings serve the outputs and the exact fold.
The slot dimension may be strided (pool views); everything after it must be contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass(frozen=True)
class Mamba2Rings:
    x: torch.Tensor
    B: torch.Tensor
    dt: torch.Tensor

    @property
    def ring_len(self) -> int:
        return self.dt.shape[-1]

    @property
    def per_layer(self) -> bool:
        return self.dt.dim() == 3

    @property
    def dtype(self) -> torch.dtype:
        return self.x.dtype

    def layer(self, i: int) -> "Mamba2Rings":
        """One layer's view (`[S, ...]` tensors)."""
        assert not self.per_layer
        return Mamba2Rings(**{f.name: getattr(self, f.name)[i] for f in fields(self)})

    def all_layers(self) -> "Mamba2Rings":
        """A per-layer view as a one-layer stack (`[1, S, ...]`)."""
        if not self.per_layer:
            return self
        return Mamba2Rings(**{f.name: getattr(self, f.name).unsqueeze(0) for f in fields(self)})

    def tensors(self) -> list[torch.Tensor]:
        return [getattr(self, f.name) for f in fields(self)]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


def mamba2_ring_shapes(num_heads: int, head_dim: int, num_groups: int, state_size: int, ring_len: int):
    """Per-slot, per-layer shapes in `Mamba2Rings` field order (all in the activation dtype)."""
    NH, P, G, N, L = num_heads, head_dim, num_groups, state_size, ring_len
    return {"x": (NH, L, P), "B": (G, L, N), "dt": (NH, L)}


def mamba2_ring_bytes_per_slot(
    num_heads: int, head_dim: int, num_groups: int, state_size: int, ring_len: int,
    act_dtype: torch.dtype, num_layers: int = 1,
) -> int:
    """Bytes of the three rings for one slot (times `num_layers`)."""
    act = torch.empty((), dtype=act_dtype).element_size()
    total = 0
    for shape in mamba2_ring_shapes(num_heads, head_dim, num_groups, state_size, ring_len).values():
        n = 1
        for s in shape:
            n *= s
        total += n * act
    return total * num_layers


def alloc_mamba2_rings(
    num_layers: int, num_slots: int, num_heads: int, head_dim: int, num_groups: int,
    state_size: int, ring_len: int, act_dtype: torch.dtype, device,
) -> Mamba2Rings:
    """Allocate `[Lm, S, ...]` rings. Contents are irrelevant until the cursors say otherwise,
    but they are zeroed so that no uninitialised value (NaN) can ever reach a masked lane."""
    out = {
        name: torch.zeros((num_layers, num_slots, *shape), dtype=act_dtype, device=device)
        for name, shape in mamba2_ring_shapes(num_heads, head_dim, num_groups, state_size, ring_len).items()
    }
    return Mamba2Rings(**out)


def check_mamba2_rings(rings: Mamba2Rings, NH: int, P: int, G: int, N: int) -> None:
    """Validate a per-layer or all-layer ring set against the head geometry."""
    lead = 1 if rings.per_layer else 2
    L = rings.ring_len
    for name, shape in mamba2_ring_shapes(NH, P, G, N, L).items():
        t = getattr(rings, name)
        if tuple(t.shape[lead:]) != shape:
            raise ValueError(f"ring `{name}` has per-slot shape {tuple(t.shape[lead:])}, expected {shape}")
        if t.dtype != rings.x.dtype:
            raise ValueError(f"all rings share the activation dtype: `{name}` is {t.dtype}, x is {rings.x.dtype}")
        if t.dim() != lead + len(shape):
            raise ValueError(f"ring `{name}` has {t.dim()} dims, expected {lead + len(shape)}")
        inner = t[(0,) * lead] if t.numel() > 0 else None
        if inner is not None and not inner.is_contiguous():
            raise ValueError(f"ring `{name}` must be contiguous after the slot dimension")
    if not rings.per_layer:
        if not (rings.x.shape[:2] == rings.B.shape[:2] == rings.dt.shape[:2]):
            raise ValueError("rings must agree on [Lm, S]")
    elif not (rings.x.shape[0] == rings.B.shape[0] == rings.dt.shape[0]):
        raise ValueError("rings must agree on the slot count")
