"""GDN ReplaySSM decode: one token per row, output from checkpoint + ring.

Let `S0` be the checkpoint, `j < wp` the pending ring entries (u_j, k_j, g_j), `G_j` the
inclusive cumulative sum of `g` over them and `G = G_{wp-1}`. The state before the token is

    S = exp(G) S0 + sum_j exp(G - G_j) u_j k_j^T

so the token needs only `S k` and `S q`, built from `S0 k`, `S0 q`, `k_j . k`, `k_j . q`:

    u = beta (v - alpha S k),   o = alpha S q + u (k . q),   alpha = exp(g)

A non-flush row never writes the state; it appends (u, k, g) for outputs and (raw v, raw k, beta)
for the exact fold at logical position `wp` (raw k only where the rings keep it, `RAW_K`: the
plain replay form's; the tree and shuffle forms replay from `k`). A flush row replays the pending
raw entries and the token with the baseline's exact recurrence, reads the output like the
baseline, and stores the state. Grid: `(cdiv(V, BV) * B * HV,)`, one `[BK, BV]` state tile per
program.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..configs import (check_exact_replay_warps, gdn_decode_config, gdn_decode_maxnreg, gdn_history_rt, gdn_k_tree,
                       gdn_replay_unroll, interpreted, maxnreg_option)
from .common import (ckpt_load, gdn_decode_flush, gdn_l2norm, gdn_l2norm_vec, gdn_ring_append_gate_keys, gdn_tile_ids,
                     gdn_token_gate, history_gate_weights, history_rows)
from .ckpt import check_split_form, ckpt_half_reads
from .rings import GDNRings, check_gdn_rings
from .verify import _verify_split
from .verify_loop import _gdn_decode_loop_kernel, loop_programs

# The exact-recurrence (flush) branch must use the baseline kernel's tile: K whole on axis 0, one
# warp, 4 consecutive K per thread; its V extent (BVF) does not change any column's reduction.
_BV_EXACT = 32
_NUM_WARPS = 1

# PHASE: 0 = one launch for all rows; 1 = non-flush rows only; 2 = flush rows only (split mode runs
# 2 then 1, so the non-flush launch gets its own tile, warps and register budget).
_FUSED, _NONFLUSH, _FLUSH = 0, 1, 2


@triton.jit
def _decode_nonflush(
    p_hs, p_vin, p_o, ring_d, ring_k, ring_g, ring_rawv, ring_rawk, ring_beta,
    b_q, b_k, b_k_raw, b_g, b_beta, wp, org, slot, i_v, i_h, i_hv, scale,
    stride_d_slot, stride_k_slot, stride_g_slot, stride_rawv_slot, stride_rawk_slot, stride_beta_slot,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, RL: tl.constexpr, RLB: tl.constexpr, USE_DOT: tl.constexpr, EVICT: tl.constexpr,
    TREE: tl.constexpr, RAW_K: tl.constexpr, SPLIT: tl.constexpr, HALF: tl.constexpr,
):
    """Output from checkpoint + pending entries by inner products; append this token."""
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    mask_k = o_k < K
    mask_v = o_v < V
    b_v_raw = tl.load(p_vin + o_v, mask=mask_v, other=0)
    b_v = b_v_raw.to(tl.float32)
    b_q = gdn_l2norm(b_q)
    b_k = gdn_l2norm_vec(b_k, TREE)  # stored in the `k` ring, which the tree-form replay reads
    b_q = b_q * scale
    o_j = tl.arange(0, RLB)
    m_j = o_j < wp
    phys_j = (org + o_j) % RL
    b_w, b_gtot = history_gate_weights(ring_g, slot, i_hv, stride_g_slot, phys_j, m_j, RL)
    b_kr = history_rows(ring_k, slot, stride_k_slot, i_h, phys_j, m_j, o_k, mask_k, K, RL)
    b_ur = history_rows(ring_d, slot, stride_d_slot, i_hv, phys_j, m_j, o_v, mask_v, V, RL)
    b_dec = tl.exp(b_gtot)
    if USE_DOT:
        # Probe matrix P = [k | q | 0 ...] and S_c P = dec S0 P + U^T (w * (K_ring P)).
        o_c = tl.arange(0, 16)
        b_p = tl.where(o_c[None, :] == 0, b_k[:, None], tl.where(o_c[None, :] == 1, b_q[:, None], 0.0))
        b_hv = ckpt_load(p_hs, o_v[:, None] * K + o_k[None, :], mask_v[:, None] & mask_k[None, :], K * V, SPLIT,
                         HALF, EVICT)
        b_sp = tl.dot(b_hv, b_p, input_precision="tf32x3")
        b_kp = tl.dot(b_kr, b_p, input_precision="tf32x3") * b_w[:, None]
        b_sp = b_dec * b_sp + tl.dot(tl.trans(b_ur), b_kp, input_precision="tf32x3")
        b_hk = tl.sum(tl.where(o_c[None, :] == 0, b_sp, 0.0), 1)
        b_hq = tl.sum(tl.where(o_c[None, :] == 1, b_sp, 0.0), 1)
    else:
        # [BV, BK] with K contiguous along axis 1 (the output-only path has no order to keep).
        b_hs = ckpt_load(p_hs, o_v[:, None] * K + o_k[None, :], mask_v[:, None] & mask_k[None, :], K * V, SPLIT,
                         HALF, EVICT)
        b_kk = tl.sum(b_kr * b_k[None, :], 1) * b_w
        b_kq = tl.sum(b_kr * b_q[None, :], 1) * b_w
        b_hk = b_dec * tl.sum(b_hs * b_k[None, :], 1) + tl.sum(b_ur * b_kk[:, None], 0)
        b_hq = b_dec * tl.sum(b_hs * b_q[None, :], 1) + tl.sum(b_ur * b_kq[:, None], 0)
    b_alpha = tl.exp(b_g)
    b_u = b_beta * (b_v - b_alpha * b_hk)
    b_o = b_alpha * b_hq + b_u * tl.sum(b_k * b_q)
    tl.store(p_o + o_v, b_o.to(p_o.dtype.element_ty), mask=mask_v)
    # Append this token at logical position wp.
    phys = (org + wp) % RL
    tl.store(ring_d + slot * stride_d_slot + (i_hv * RL + phys) * V + o_v, b_u.to(ring_d.dtype.element_ty),
             mask=mask_v)
    tl.store(ring_rawv + slot * stride_rawv_slot + (i_hv * RL + phys) * V + o_v, b_v_raw, mask=mask_v)
    gdn_ring_append_gate_keys(ring_g, ring_beta, ring_k, ring_rawk, stride_g_slot, stride_beta_slot, stride_k_slot,
                              stride_rawk_slot, slot, phys, i_v, i_hv, i_h, b_g, b_beta, b_k, b_k_raw, o_k, mask_k,
                              H, HV, K, RL, RAW_K)


@triton.jit(do_not_specialize=["B"])
def _gdn_decode_kernel(
    q, k, v, a, b, A_log, dt_bias, o,
    state, ring_d, ring_k, ring_g, ring_rawv, ring_rawk, ring_beta,
    slot_idx, row_wp, row_flush, origin,
    scale, softplus_beta, softplus_threshold,
    B,
    stride_q_tok, stride_k_tok, stride_v_tok, stride_a_tok, stride_b_tok,
    stride_state_slot, stride_d_slot, stride_k_slot, stride_g_slot,
    stride_rawv_slot, stride_rawk_slot, stride_beta_slot,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BVF: tl.constexpr, RL: tl.constexpr, RLB: tl.constexpr,
    USE_DOT: tl.constexpr, EVICT: tl.constexpr, PHASE: tl.constexpr, UNROLL: tl.constexpr = 1,
    TREE: tl.constexpr = False, RAW_K: tl.constexpr = True, SPLIT: tl.constexpr = False, HALF: tl.constexpr = False,
):
    i_v, i_n, i_hv, i_h = gdn_tile_ids(H, HV, V, BV)

    slot = tl.load(slot_idx + i_n).to(tl.int64)
    if slot < 0:
        return
    flush = tl.load(row_flush + i_n)
    if PHASE == 1:
        if flush != 0:
            return
    if PHASE == 2:
        if flush == 0:
            return
    wp = tl.load(row_wp + i_n)
    org = tl.load(origin + slot)

    o_k = tl.arange(0, BK)
    mask_k = o_k < K
    p_hs = state + slot * stride_state_slot + i_hv * K * V
    p_vin = v + i_n * stride_v_tok + i_hv * V
    p_o = o + (i_n * HV + i_hv) * V
    b_q = tl.load(q + i_n * stride_q_tok + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_k_raw = tl.load(k + i_n * stride_k_tok + i_h * K + o_k, mask=mask_k, other=0)
    b_k = b_k_raw.to(tl.float32)
    b_g, b_beta = gdn_token_gate(a, b, A_log, dt_bias, i_n, i_hv, stride_a_tok, stride_b_tok, softplus_beta,
                                 softplus_threshold)

    if PHASE != 1:
        if flush != 0:
            if TREE:
                p_rk = ring_k + slot * stride_k_slot + i_h * RL * K  # normalised keys (gdn/common.py)
            else:
                p_rk = ring_rawk + slot * stride_rawk_slot + i_h * RL * K
            gdn_decode_flush(
                p_hs, p_vin, p_o, q + i_n * stride_q_tok + i_h * K, k + i_n * stride_k_tok + i_h * K, p_rk,
                ring_rawv + slot * stride_rawv_slot + i_hv * RL * V, ring_g + slot * stride_g_slot + i_hv * RL,
                ring_beta + slot * stride_beta_slot + i_hv * RL, b_g, b_beta, wp, org, i_v, scale,
                K, V, BK, BV, BVF, RL, UNROLL, TREE, SPLIT,
            )
    if PHASE != 2:
        if flush == 0:
            _decode_nonflush(
                p_hs, p_vin, p_o, ring_d, ring_k, ring_g, ring_rawv, ring_rawk, ring_beta,
                b_q, b_k, b_k_raw, b_g, b_beta, wp, org, slot, i_v, i_h, i_hv, scale,
                stride_d_slot, stride_k_slot, stride_g_slot, stride_rawv_slot, stride_rawk_slot, stride_beta_slot,
                H, HV, K, V, BK, BV, RL, RLB, USE_DOT, EVICT, TREE, RAW_K, SPLIT, HALF,
            )


def _tok_stride(t: torch.Tensor, inner: tuple[int, int], name: str) -> int:
    if t.dim() != 3 or t.stride(-1) != 1 or t.stride(-2) != inner[1]:
        raise ValueError(f"`{name}` must be [B, heads, dim] with contiguous heads and dim")
    return t.stride(0)


def plan5_constexprs(cfg, H: int, HV: int, K: int, V: int, RL: int, *, tree: int, split: bool, half: bool,
                     ordered: bool, raw_k: bool, capped: bool = True) -> dict:
    """The compile-time arguments of decode plan 5's launch (`_gdn_decode_loop_kernel`) for a decode
    config `cfg`: one place for the tile, program-count and flag arithmetic, shared by the launch
    below and by scripts/kernel_regs.py's offline register screen. `capped=False` leaves the flush
    capacity off (the launch passes whether it has a flush index); `FCAP` is on only where the config
    has a capacity and a flush row gets more programs than a non-flush row."""
    bv = min(triton.next_power_of_2(V), cfg.block_v)
    vs = loop_programs(V, bv, cfg.loop_split)
    vsf = loop_programs(V, bv, cfg.flush_split) if cfg.flush_split else 0  # 0: as VS
    return dict(
        H=H, HV=HV, K=K, V=V, BK=triton.next_power_of_2(K), BV=bv, BVF=min(cfg.flush_cols, bv), RL=RL,
        RLB=triton.next_power_of_2(RL), EVICT=cfg.evict_first, UNROLL=gdn_replay_unroll(), TREE=tree,
        RT=gdn_history_rt(decode=True), ORDER=ordered, RAW_K=raw_k, NSTG=cfg.num_stages, VS=vs, VSF0=vsf,
        SPLIT=split, HALF=half, FCAP=bool(capped and cfg.flush_cap and vsf > vs),
        DOT=(2 if interpreted() else 1) if cfg.use_dot and split and half and K >= 16 and bv >= 16 else 0,
    )


def gdn_replay_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    rings: GDNRings,
    slot_idx: torch.Tensor,
    row_wp: torch.Tensor,
    row_flush: torch.Tensor,
    origin: torch.Tensor,
    scale: Optional[float] = None,
    out: Optional[torch.Tensor] = None,
    row_order: Optional[torch.Tensor] = None,
    split_ckpt: bool = False,
    flush_index: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One GDN decode step for every row.

    Args:
        q, k (torch.Tensor): `[B, H, K]` raw queries/keys (L2 norm is done in the kernel).
        v (torch.Tensor): `[B, HV, V]`.
        a, b (torch.Tensor): `[B, HV]` gate inputs.
        A_log, dt_bias (torch.Tensor): `[HV]` fp32.
        state (torch.Tensor): `[S, HV, V, K]` fp32 checkpoints (K-last); written only by flush rows.
        rings (GDNRings): one layer's rings (`[S, ...]`); appended to by non-flush rows.
        slot_idx (torch.Tensor): `[B]` slot per row, `< 0` = padding (writes nothing).
        row_wp, row_flush (torch.Tensor): `[B]` int32 from `decode_prepare`.
        origin (torch.Tensor): `[S]` int32 ring origins.
        scale (float, optional): query scale, default `K ** -0.5`.
        out (torch.Tensor, optional): `[B, HV, V]` output buffer (activation dtype).
        row_order (torch.Tensor, optional): `[B]` int32 permutation of the rows from
            `cursors.decode_row_order`: the order in which decode plan 3 or 4's state launch takes
            them (scheduling only; other plans ignore it). Results are the same either way.
        split_ckpt (bool): the checkpoints are in the split layout (`gdn/ckpt.py`): flush rows
            read and write them exactly; with bf16 activations the other rows read only their
            `hi` planes (the bf16 value of each element) for their outputs.
        flush_index (torch.Tensor, optional): `[2B]` int32 from `cursors.decode_row_order` (the
            same call as `row_order`, which it needs): a decode plan with a flush capacity
            (`flush_cap`) sizes its grid with it; other plans ignore it. Scheduling only.

    Returns:
        `[B, HV, V]` outputs in the dtype of `q`.
    """
    B, H, K = k.shape
    S, HV, V, K2 = state.shape
    if K2 != K or v.shape != (B, HV, V) or q.shape != k.shape:
        raise ValueError(f"shape mismatch: q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)} state {tuple(state.shape)}")
    if HV % H != 0:
        raise ValueError(f"num_v_heads={HV} must be a multiple of num_k_heads={H}")
    if state.dtype != torch.float32 or state[0].stride() != (V * K, K, 1):
        raise ValueError("state must be fp32 [S, HV, V, K] with contiguous inner dims")
    if a.shape != (B, HV) or b.shape != (B, HV) or a.stride(-1) != 1 or b.stride(-1) != 1:
        raise ValueError("a and b must be [B, HV] with a contiguous last dim")
    check_gdn_rings(rings, H, HV, K, V)
    if rings.rawk.dtype != k.dtype:
        raise ValueError(f"raw ring dtype {rings.rawk.dtype} must match the activation dtype {k.dtype}")
    tree = gdn_k_tree(K)
    rings.replay_keys(tree)  # any row may flush: the plain form needs the raw keys
    if scale is None:
        scale = K ** -0.5
    if out is None:
        out = torch.empty((B, HV, V), dtype=q.dtype, device=q.device)
    elif out.shape != (B, HV, V) or not out.is_contiguous():
        raise ValueError("out must be a contiguous [B, HV, V] tensor")
    if row_order is not None and (row_order.shape != (B,) or row_order.dtype != torch.int32
                                  or not row_order.is_contiguous()):
        raise ValueError("row_order must be a contiguous [B] int32 tensor (cursors.decode_row_order)")
    if flush_index is not None and (row_order is None or flush_index.shape != (2 * B,)
                                    or flush_index.dtype != torch.int32 or not flush_index.is_contiguous()):
        raise ValueError("flush_index must be a contiguous [2B] int32 tensor from the decode_row_order call that "
                         "made row_order")
    if B == 0:
        return out
    BK = triton.next_power_of_2(K)
    RL = rings.ring_len
    split = bool(split_ckpt)
    cfg = gdn_decode_config(K, V, rows=B, split_ckpt=split)
    check_split_form(split, K)
    half = split and ckpt_half_reads(q.dtype)
    bv_exact = min(triton.next_power_of_2(V), _BV_EXACT)
    bvf = min(cfg.flush_cols, bv_exact)
    args = (
        q, k, v, a, b, A_log, dt_bias, out,
        state, rings.d, rings.k, rings.g, rings.rawv, rings.rawk, rings.beta,
        slot_idx, row_wp, row_flush, origin,
        scale, 1.0, 20.0,
        B,
        _tok_stride(q, (H, K), "q"), _tok_stride(k, (H, K), "k"), _tok_stride(v, (HV, V), "v"),
        a.stride(0), b.stride(0),
        state.stride(0), rings.d.stride(0), rings.k.stride(0), rings.g.stride(0),
        rings.rawv.stride(0), rings.rawk.stride(0), rings.beta.stride(0),
    )

    def launch(phase, BV, num_warps, BVF):
        use_dot = cfg.use_dot and BK >= 16 and BV >= 16
        RLB = triton.next_power_of_2(RL)
        if use_dot:
            RLB = max(RLB, 16)
        _gdn_decode_kernel[(triton.cdiv(V, BV) * B * HV,)](
            *args, H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, BVF=BVF, RL=RL, RLB=RLB, USE_DOT=use_dot,
            EVICT=cfg.evict_first, PHASE=phase, UNROLL=gdn_replay_unroll(), TREE=tree,
            RAW_K=rings.has_raw_keys, SPLIT=split, HALF=half, num_warps=num_warps, num_stages=cfg.num_stages,
        )

    bv_cfg = min(triton.next_power_of_2(V), cfg.block_v)
    if cfg.split == 5:
        # One launch, one program per row and value head (verify_loop.py).
        check_exact_replay_warps(cfg.num_warps, tree, "decode plan 5 (gdn_decode's third number: its warps)")
        ring_fk = rings.replay_keys(tree)
        meta = plan5_constexprs(cfg, H, HV, K, V, RL, tree=tree, split=split, half=half,
                                ordered=row_order is not None, raw_k=rings.has_raw_keys,
                                capped=flush_index is not None)
        VS, VSF, capped = meta["VS"], meta["VSF0"], meta["FCAP"]
        if capped:
            # flush_cap % of the rows (at least one) get the extra programs, in groups of grp rows
            grp = triton.cdiv(B, max(1, triton.cdiv(B * cfg.flush_cap, 100)))
            n_groups = triton.cdiv(B, grp)
            grid = n_groups * HV * (VSF - VS) + B * HV * VS
        else:
            grp = n_groups = 0
            grid = B * HV * max(VS, VSF)
        _gdn_decode_loop_kernel[(grid,)](
            q, k, v, a, b, A_log, dt_bias, out, state, rings.d, rings.rawv, ring_fk, rings.k, rings.rawk, rings.g,
            rings.beta,
            slot_idx, origin, row_wp, row_flush, row_order if row_order is not None else row_wp,
            flush_index if capped else row_wp,
            scale, 1.0, 20.0,
            _tok_stride(q, (H, K), "q"), _tok_stride(k, (H, K), "k"), _tok_stride(v, (HV, V), "v"),
            a.stride(0), b.stride(0),
            state.stride(0), rings.d.stride(0), rings.rawv.stride(0), ring_fk.stride(0), rings.k.stride(0),
            rings.rawk.stride(0), rings.g.stride(0), rings.beta.stride(0),
            B, grp, n_groups,
            **meta, num_warps=cfg.num_warps, num_stages=cfg.launch_stages,
            **maxnreg_option(gdn_decode_maxnreg(cfg)),
        )
    elif cfg.split in (3, 4):
        # One launch fewer: the state launch of the two-launch pair also runs the flush rows; plan 4
        # also leaves out the prep launch (each state program makes its row's ring products).
        _verify_split(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), a.unsqueeze(1), b.unsqueeze(1), A_log, dt_bias,
                      state, rings, slot_idx, row_wp, origin, scale, out.view(B, 1, HV, V), BK, bv_cfg,
                      cfg.num_warps, cfg.num_stages, row_wp=row_wp, row_flush=row_flush,
                      flush_cols=min(cfg.flush_cols, bv_cfg), row_order=row_order, inline_prep=cfg.split == 4,
                      split_ckpt=split)
    elif cfg.split == 2:
        # Flush rows on the exact branch; non-flush rows through the two-launch verify pair with
        # T = 1 (per-head ring products first, then a light pass over each checkpoint tile).
        launch(_FLUSH, bv_exact, _NUM_WARPS, bvf)
        _verify_split(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1), a.unsqueeze(1), b.unsqueeze(1), A_log, dt_bias,
                      state, rings, slot_idx, row_wp, origin, scale, out.view(B, 1, HV, V), BK, bv_cfg,
                      cfg.num_warps, cfg.num_stages, row_wp=row_wp, row_flush=row_flush, split_ckpt=split)
    elif cfg.split:
        launch(_FLUSH, bv_exact, _NUM_WARPS, bvf)
        launch(_NONFLUSH, bv_cfg, cfg.num_warps, bvf)
    else:
        # The fused launch stays at one warp: with several warps the flush branch's state
        # differed from SGLang's kernel on the H200 (2026-11-30, docs/perf.md run 4).
        launch(_FUSED, bv_exact, _NUM_WARPS, bvf)
    return out
