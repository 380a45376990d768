"""GDN closed-loop exact fold: replay raw ring entries into the checkpoint.

For each row and layer, the first `n_fold` pending entries (logical `0..n_fold-1`, physical
`(origin + j) % L`) are replayed from raw `v`, raw pre-norm `k`, `g` and `beta` with the operation
order of SGLang's `fused_sigmoid_gating_delta_rule_update_kernel` (same `[BK, BV]` tile, one warp),
so the result is bit-identical to that kernel stepped over the same tokens. In the tree form
(K = 128 on the GPU, `configs.gdn_k_tree`) the reductions are written out in that kernel's order
instead, and the keys come normalised from the fp32 `k` ring (gdn/common.py); rings allocated
for that form keep no raw keys (gdn/rings.py), and a plain-form fold on them is refused.

Grid: `(cdiv(V, BV) * B * HV, Lm)`; rows with `n_fold == 0` exit at once unless a separate
destination is given (then the checkpoint is copied there unchanged).

`gdn_commit` is the speculative commit: `commit_prepare`'s cursor move and this fold, in one
launch below `configs.gdn_commit_fused_below()` rows (the cursors moved by the row's last program,
`cursors.commit_in_fold`), else the two launches.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..configs import gdn_commit_fused_below, gdn_fold_block_v, gdn_fold_cols, gdn_k_tree, gdn_replay_unroll
from ..cursors import commit_in_fold, commit_prepare, load_fold_plan
from .ckpt import check_split_form
from .common import ckpt_load, ckpt_store, gdn_k_offsets, gdn_replay, gdn_state_offsets, gdn_tile_ids
from .rings import GDNRings, check_gdn_rings


@triton.jit
def _gdn_fold_kernel(
    state, dst, ring_rawv, ring_rawk, ring_g, ring_beta,
    slot_idx, dst_idx, row_nfold, row_origin, snap_at, snap_slot, num_accepted, tickets,
    stride_state_layer, stride_state_slot, stride_dst_layer, stride_dst_slot,
    stride_rawv_layer, stride_rawv_slot, stride_rawk_layer, stride_rawk_slot,
    stride_g_layer, stride_g_slot, stride_beta_layer, stride_beta_slot,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BVF: tl.constexpr, RL: tl.constexpr, HAS_DST: tl.constexpr,
    HAS_SNAP: tl.constexpr, FROM_CURSORS: tl.constexpr, UNROLL: tl.constexpr = 1, TREE: tl.constexpr = False,
    COMMIT: tl.constexpr = False, T_MAX: tl.constexpr = 0, SPLIT: tl.constexpr = False,
):
    i_v, i_n, i_hv, i_h = gdn_tile_ids(H, HV, V, BV)
    i_l = tl.program_id(1)
    i_l = i_l.to(tl.int64)

    slot = tl.load(slot_idx + i_n).to(tl.int64)
    if slot < 0:
        return
    if COMMIT:
        # row_nfold / row_origin are the [S] cursors (wpos, origin), moved here by the row's last program.
        n_fold, org = commit_in_fold(row_nfold, row_origin, num_accepted, tickets, i_n, slot,
                                     ((V + BV - 1) // BV) * HV * tl.num_programs(1), RL, T_MAX)
    else:
        n_fold, org = load_fold_plan(row_nfold, row_origin, i_n, slot, FROM_CURSORS)
    if not HAS_DST:
        if n_fold <= 0:
            return
    if HAS_SNAP:
        b_snap_at = tl.load(snap_at + i_n)
        b_snap_slot = tl.load(snap_slot + i_n).to(tl.int64)

    o_k = gdn_k_offsets(BK, TREE)
    mask_k = o_k < K
    p_rk = ring_rawk + i_l * stride_rawk_layer + slot * stride_rawk_slot + i_h * RL * K
    p_rg = ring_g + i_l * stride_g_layer + slot * stride_g_slot + i_hv * RL
    p_rb = ring_beta + i_l * stride_beta_layer + slot * stride_beta_slot + i_hv * RL
    if HAS_DST:
        d_slot = tl.load(dst_idx + i_n).to(tl.int64)
    # One BVF-column sub-tile at a time: each column's arithmetic does not depend on BVF, and a
    # narrow tile keeps the register budget (and so the occupancy) of this replay loop low.
    for i_f in tl.static_range(BV // BVF):
        o_v = i_v * BV + i_f * BVF + tl.arange(0, BVF)
        mask_v = o_v < V
        o_h, mask_h = gdn_state_offsets(o_k, o_v, mask_k, mask_v, K, TREE)
        p_h = state + i_l * stride_state_layer + slot * stride_state_slot + i_hv * K * V  # the head block
        b_h = ckpt_load(p_h, o_h, mask_h, K * V, SPLIT).to(tl.float32)
        p_rv = ring_rawv + i_l * stride_rawv_layer + slot * stride_rawv_slot + i_hv * RL * V
        if HAS_SNAP:
            # A row without a track slot this step stores no snapshot (entry index 0 never matches).
            p_s = state + i_l * stride_state_layer + tl.maximum(b_snap_slot, 0) * stride_state_slot + i_hv * K * V
            b_h = gdn_replay(b_h, p_rk, p_rv, p_rg, p_rb, o_k, o_v, mask_k, mask_v, org, n_fold, p_s, o_h,
                             tl.where(b_snap_slot >= 0, b_snap_at, 0), mask_h, K, V, RL, UNROLL, True, TREE, SPLIT)
        else:
            b_h = gdn_replay(b_h, p_rk, p_rv, p_rg, p_rb, o_k, o_v, mask_k, mask_v, org, n_fold, p_h, o_h, 0, mask_h,
                             K, V, RL, UNROLL, False, TREE)
        if HAS_DST:
            p_h = dst + i_l * stride_dst_layer + d_slot * stride_dst_slot + i_hv * K * V
        ckpt_store(p_h, o_h, b_h, mask_h, K * V, SPLIT)


def gdn_replay_fold(
    state: torch.Tensor,
    rings: GDNRings,
    slot_idx: torch.Tensor,
    row_nfold: Optional[torch.Tensor],
    row_origin: Optional[torch.Tensor],
    dst: Optional[torch.Tensor] = None,
    dst_idx: Optional[torch.Tensor] = None,
    snap_at: Optional[torch.Tensor] = None,
    snap_slot: Optional[torch.Tensor] = None,
    cursors: Optional[tuple[torch.Tensor, torch.Tensor]] = None,
    commit: Optional[tuple[torch.Tensor, torch.Tensor, int]] = None,
    split_ckpt: bool = False,
) -> None:
    """Fold the first `row_nfold[i]` pending entries of each row into its checkpoint.

    Args:
        state (torch.Tensor): `[Lm, S, HV, V, K]` (all layers) or `[S, HV, V, K]` fp32 checkpoints.
            Updated in place unless `dst` is given.
        rings (GDNRings): the matching all-layer (`[Lm, S, ...]`) or one-layer rings.
        slot_idx (torch.Tensor): `[B]` slots, `< 0` = padding.
        row_nfold, row_origin (torch.Tensor): `[B]` int32 from `commit_prepare`
            (or `pending_fold_plan`).
        dst, dst_idx (torch.Tensor, optional): write the folded state to `dst[:, dst_idx[i]]`
            instead (same layout as `state`); rows with nothing to fold are copied.
        snap_at, snap_slot (torch.Tensor, optional): `[B]` int32; after folding `snap_at[i]`
            entries (> 0), also store the state into slot `snap_slot[i]` (>= 0) of `state`
            (radix-cache track slot). Not combined with `dst`.
        cursors ((wpos, origin), optional): instead of `row_nfold` / `row_origin` (pass None),
            fold every pending entry of each slot as the `[S]` int32 cursors say (what
            `pending_fold_plan` would compute, without its launches); cursors are not changed.
        commit ((num_accepted, tickets, max_draft_tokens), optional): with `cursors`, first commit
            `num_accepted[i]` entries per row as `commit_prepare` would (no fold window), in this
            launch, and fold what its early-flush rule says; `tickets` is an `[S]` int32 counter
            that starts at 0 and is left at 0. Not combined with `dst` or `snap_at`.
        split_ckpt (bool): the checkpoints (and `dst`, snapshots) are in the split layout
            (`gdn/ckpt.py`) instead of fp32; read and written exactly either way.
    """
    if state.dim() == 4:
        state = state.unsqueeze(0)
        dst = dst.unsqueeze(0) if dst is not None else None
    rings = rings.all_layers()
    Lm, S, HV, V, K = state.shape
    H = rings.rawk.shape[2]
    check_gdn_rings(rings, H, HV, K, V)
    if state.dtype != torch.float32 or state[0, 0].stride() != (V * K, K, 1):
        raise ValueError("state must be fp32 [.., S, HV, V, K] with contiguous inner dims")
    if rings.rawv.shape[0] != Lm:
        raise ValueError(f"rings hold {rings.rawv.shape[0]} layers, state holds {Lm}")
    has_dst = dst is not None
    has_snap = snap_at is not None
    if has_snap and (has_dst or snap_slot is None):
        raise ValueError("snap_at needs snap_slot and cannot be combined with dst")
    if has_dst:
        if dst_idx is None or dst.shape[0] != Lm or dst.shape[2:] != state.shape[2:] or dst[0, 0].stride() != (V * K, K, 1):
            raise ValueError("dst must be [Lm, S', HV, V, K] with contiguous inner dims, and dst_idx given")
    if commit is not None and (cursors is None or has_dst or has_snap):
        raise ValueError("commit needs cursors and cannot be combined with dst or snap_at")
    tree = gdn_k_tree(K)
    check_split_form(split_ckpt, K)
    ring_key = rings.replay_keys(tree)  # refuses the plain form on rings without raw keys
    B = slot_idx.shape[0]
    if B == 0 or Lm == 0:
        return
    BK = triton.next_power_of_2(K)
    BV = gdn_fold_block_v(B, V)
    out = dst if has_dst else state
    from_cursors = cursors is not None
    if from_cursors:
        row_nfold, row_origin = cursors
    grid = (triton.cdiv(V, BV) * B * HV, Lm)
    num_accepted, tickets, t_max = commit if commit is not None else (slot_idx, slot_idx, 0)
    _gdn_fold_kernel[grid](
        state, out, rings.rawv, ring_key, rings.g, rings.beta,
        slot_idx, dst_idx if has_dst else slot_idx, row_nfold, row_origin,
        snap_at if has_snap else row_nfold, snap_slot if has_snap else slot_idx, num_accepted, tickets,
        state.stride(0), state.stride(1), out.stride(0), out.stride(1),
        rings.rawv.stride(0), rings.rawv.stride(1), ring_key.stride(0), ring_key.stride(1),
        rings.g.stride(0), rings.g.stride(1), rings.beta.stride(0), rings.beta.stride(1),
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, BVF=min(BV, gdn_fold_cols()), RL=rings.ring_len, HAS_DST=has_dst,
        HAS_SNAP=has_snap, FROM_CURSORS=from_cursors, UNROLL=gdn_replay_unroll(), TREE=tree,
        COMMIT=commit is not None, T_MAX=t_max, SPLIT=bool(split_ckpt), num_warps=1, num_stages=3,
    )


def gdn_commit(state: torch.Tensor, rings: GDNRings, slot_idx: torch.Tensor, wpos: torch.Tensor,
               origin: torch.Tensor, num_accepted: torch.Tensor, max_draft_tokens: int,
               tickets: torch.Tensor, split_ckpt: bool = False) -> None:
    """Speculative commit of all layers: move the cursors by `num_accepted` (as `commit_prepare`,
    no fold window) and fold what the early-flush rule says, in one launch below
    `gdn_commit_fused_below()` rows, else `commit_prepare` and `gdn_replay_fold`.

    `wpos`, `origin`, `tickets`: `[S]` int32, `tickets` all 0 (and left so); `num_accepted` `[B]`.
    The ring length is the rings'. `split_ckpt`: the checkpoint layout (`gdn_replay_fold`).
    """
    ring_len = rings.ring_len
    if ring_len < max_draft_tokens:
        raise ValueError(f"ring_len={ring_len} is smaller than max_draft_tokens={max_draft_tokens}")
    rings.replay_keys(gdn_k_tree(state.shape[-1]))  # refused before commit_prepare moves the cursors
    if slot_idx.shape[0] < gdn_commit_fused_below():
        if tickets.dtype != torch.int32 or tickets.shape != wpos.shape:
            raise ValueError(f"tickets must be int32 {tuple(wpos.shape)}")
        gdn_replay_fold(state, rings, slot_idx, None, None, cursors=(wpos, origin),
                        commit=(num_accepted, tickets, max_draft_tokens), split_ckpt=split_ckpt)
        return
    row_nfold, row_origin = commit_prepare(slot_idx, wpos, origin, num_accepted, ring_len, max_draft_tokens)
    gdn_replay_fold(state, rings, slot_idx, row_nfold, row_origin, split_ckpt=split_ckpt)
