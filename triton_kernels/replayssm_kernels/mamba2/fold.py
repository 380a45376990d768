"""Mamba-2 closed-loop exact fold: replay raw ring entries into the checkpoint.

For each row and layer, the first `n_fold` pending entries (logical `0..n_fold-1`, physical
`(origin + j) % L`) are replayed from raw x, B and dt with the expressions of SGLang's
`_selective_scan_update_kernel` (`common.mamba2_exact_step`), so the result is bit-identical to that
kernel stepped over the same tokens. The update is elementwise, so the tile is free to choose.

Grid: `(Lm * B * NH * cdiv(P, BM),)`, flattened; rows with `n_fold == 0` exit at once unless a
separate destination is given (then the checkpoint is copied there unchanged).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..cursors import load_fold_plan
from ..configs import mamba2_replay_unroll
from .common import mamba2_replay, tile_config
from .rings import Mamba2Rings, check_mamba2_rings


@triton.jit(do_not_specialize=["B"])
def _mamba2_fold_kernel(
    state, dst, ring_x, ring_B, ring_dt, A, dt_bias,
    slot_idx, dst_idx, row_nfold, row_origin, snap_at, snap_slot,
    B,
    stride_state_layer, stride_state_slot, stride_dst_layer, stride_dst_slot,
    stride_rx_layer, stride_rx_slot, stride_rB_layer, stride_rB_slot,
    stride_rdt_layer, stride_rdt_slot, stride_A_layer, stride_bias_layer,
    NH: tl.constexpr, P: tl.constexpr, G: tl.constexpr, N: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, RL: tl.constexpr, HAS_DST: tl.constexpr, HAS_SNAP: tl.constexpr,
    UNROLL: tl.constexpr, FROM_CURSORS: tl.constexpr,
):
    NP = (P + BM - 1) // BM
    i_m, i_lnh = tl.program_id(0) % NP, tl.program_id(0) // NP
    i_ln, i_h = i_lnh // NH, i_lnh % NH
    i_l, i_n = i_ln // B, i_ln % B
    i_g = i_h // (NH // G)
    i_l = i_l.to(tl.int64)

    slot = tl.load(slot_idx + i_n).to(tl.int64)
    if slot < 0:
        return
    n_fold, org = load_fold_plan(row_nfold, row_origin, i_n, slot, FROM_CURSORS)
    if not HAS_DST:
        if n_fold <= 0:
            return

    o_m = i_m * BM + tl.arange(0, BM)
    o_n = tl.arange(0, BN)
    mask_m = o_m < P
    mask_n = o_n < N
    mask_s = mask_m[:, None] & mask_n[None, :]

    o_s = (i_h * P + o_m[:, None]) * N + o_n[None, :]
    p_s = state + i_l * stride_state_layer + slot * stride_state_slot + o_s
    b_s = tl.load(p_s, mask=mask_s, other=0).to(tl.float32)
    b_A = tl.load(A + i_l * stride_A_layer + i_h).to(tl.float32)
    b_bias = tl.load(dt_bias + i_l * stride_bias_layer + i_h).to(tl.float32)

    p_rx = ring_x + i_l * stride_rx_layer + slot * stride_rx_slot + i_h * RL * P
    p_rB = ring_B + i_l * stride_rB_layer + slot * stride_rB_slot + i_g * RL * N
    p_rdt = ring_dt + i_l * stride_rdt_layer + slot * stride_rdt_slot + i_h * RL
    if HAS_SNAP:
        # Radix track slot: also store the state after the first `snap_at` entries.
        b_snap_at = tl.load(snap_at + i_n)
        b_snap_slot = tl.load(snap_slot + i_n).to(tl.int64)
        do_snap = (b_snap_at > 0) & (b_snap_at <= n_fold) & (b_snap_slot >= 0)
        n_first = tl.where(do_snap, b_snap_at, 0)
        b_s = mamba2_replay(b_s, p_rx, p_rB, p_rdt, o_m, o_n, mask_m, mask_n, org, 0, n_first, b_A, b_bias,
                            P, N, RL, UNROLL)
        if do_snap:
            p_snap = state + i_l * stride_state_layer + b_snap_slot * stride_state_slot + o_s
            tl.store(p_snap, b_s.to(p_snap.dtype.element_ty), mask=mask_s)
    else:
        n_first = 0
    b_s = mamba2_replay(b_s, p_rx, p_rB, p_rdt, o_m, o_n, mask_m, mask_n, org, n_first, n_fold, b_A, b_bias,
                        P, N, RL, UNROLL)

    if HAS_DST:
        d_slot = tl.load(dst_idx + i_n).to(tl.int64)
        p_s = dst + i_l * stride_dst_layer + d_slot * stride_dst_slot + o_s
    tl.store(p_s, b_s.to(p_s.dtype.element_ty), mask=mask_s)


def mamba2_replay_fold(
    state: torch.Tensor,
    rings: Mamba2Rings,
    A: torch.Tensor,
    dt_bias: torch.Tensor,
    slot_idx: torch.Tensor,
    row_nfold: Optional[torch.Tensor],
    row_origin: Optional[torch.Tensor],
    dst: Optional[torch.Tensor] = None,
    dst_idx: Optional[torch.Tensor] = None,
    snap_at: Optional[torch.Tensor] = None,
    snap_slot: Optional[torch.Tensor] = None,
    cursors: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
) -> None:
    """Fold the first `row_nfold[i]` pending entries of each row into its checkpoint, all layers.

    Args:
        state (torch.Tensor): `[Lm, S, NH, P, N]` (all layers) or `[S, NH, P, N]` fp32 checkpoints.
            Updated in place unless `dst` is given.
        rings (Mamba2Rings): the matching all-layer (`[Lm, S, ...]`) or one-layer rings.
        A, dt_bias (torch.Tensor): fp32 `[Lm, NH]` (or `[NH]` with one-layer `state`); the layer
            stride may be anything, the head stride must be 1.
        slot_idx (torch.Tensor): `[B]` slots, `< 0` = padding.
        row_nfold, row_origin (torch.Tensor): `[B]` int32 from `commit_prepare`
            (or `pending_fold_plan`).
        dst, dst_idx (torch.Tensor, optional): write the folded state to `dst[:, dst_idx[i]]`
            instead (same layout as `state`); rows with nothing to fold are copied.
        snap_at, snap_slot (torch.Tensor, optional): `[B]` int32; after folding `snap_at[i]`
            entries (`0 < snap_at[i] <= row_nfold[i]`), also store the state into slot
            `snap_slot[i]` (>= 0) of `state` (radix-cache track slot). Not combined with `dst`.
        cursors ((wpos, origin), optional): instead of `row_nfold` / `row_origin` (pass None),
            fold every pending entry of each slot as the `[S]` int32 cursors say (what
            `pending_fold_plan` would compute, without its launches); cursors are not changed.
    """
    if state.dim() == 4:
        state = state.unsqueeze(0)
        dst = dst.unsqueeze(0) if dst is not None else None
        A = A.unsqueeze(0) if A.dim() == 1 else A
        dt_bias = dt_bias.unsqueeze(0) if dt_bias.dim() == 1 else dt_bias
    rings = rings.all_layers()
    if state.dim() != 5:
        raise ValueError(f"state must be [Lm, S, NH, P, N] or [S, NH, P, N], got {tuple(state.shape)}")
    Lm, S, NH, P, N = state.shape
    G = rings.B.shape[2]
    if NH % G != 0:
        raise ValueError(f"num_heads={NH} must be a multiple of num_groups={G}")
    check_mamba2_rings(rings, NH, P, G, N)
    if state.dtype != torch.float32 or (S > 0 and state[0, 0].stride() != (P * N, N, 1)):
        raise ValueError("state must be fp32 [.., S, NH, P, N] with contiguous inner dims")
    if rings.x.shape[0] != Lm:
        raise ValueError(f"rings hold {rings.x.shape[0]} layers, state holds {Lm}")
    for name, t in (("A", A), ("dt_bias", dt_bias)):
        if t.dtype != torch.float32 or tuple(t.shape) != (Lm, NH) or (NH > 1 and t.stride(1) != 1):
            raise ValueError(f"`{name}` must be fp32 [{Lm}, {NH}] with a contiguous head dim")
    has_dst = dst is not None
    has_snap = snap_at is not None
    if has_snap and (has_dst or snap_slot is None):
        raise ValueError("snap_at needs snap_slot and cannot be combined with dst")
    if has_dst:
        if (dst_idx is None or dst.dim() != 5 or dst.shape[0] != Lm or dst.shape[2:] != state.shape[2:]
                or dst.dtype != torch.float32 or dst[0, 0].stride() != (P * N, N, 1)):
            raise ValueError("dst must be fp32 [Lm, S', NH, P, N] with contiguous inner dims, and dst_idx given")
    Bsz = slot_idx.shape[0]
    if Bsz == 0 or Lm == 0:
        return
    cfg = tile_config("fold", P, N)
    out = dst if has_dst else state
    from_cursors = cursors is not None
    if from_cursors:
        row_nfold, row_origin = cursors
    grid = (Lm * Bsz * NH * triton.cdiv(P, cfg.BM),)
    _mamba2_fold_kernel[grid](
        state, out, rings.x, rings.B, rings.dt, A, dt_bias,
        slot_idx, dst_idx if has_dst else slot_idx, row_nfold, row_origin,
        snap_at if has_snap else row_nfold, snap_slot if has_snap else slot_idx,
        Bsz,
        state.stride(0), state.stride(1), out.stride(0), out.stride(1),
        rings.x.stride(0), rings.x.stride(1), rings.B.stride(0), rings.B.stride(1),
        rings.dt.stride(0), rings.dt.stride(1), A.stride(0), dt_bias.stride(0),
        NH=NH, P=P, G=G, N=N, BM=cfg.BM, BN=cfg.BN, RL=rings.ring_len, HAS_DST=has_dst, HAS_SNAP=has_snap,
        UNROLL=mamba2_replay_unroll(), FROM_CURSORS=from_cursors,
        **cfg.launch,
    )
