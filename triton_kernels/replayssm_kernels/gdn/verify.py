"""GDN ReplaySSM speculative verify: outputs for `T` drafts from one frozen checkpoint.

Index spaces: history entry `j < wp` (committed, in the ring at `(origin + j) % L`), window
position `s < T` (this verify's drafts, written at `(origin + wp + s) % L`).

With `S_c = exp(G) S0 + sum_j exp(G - G_j) u_j k_j^T` the committed state (never formed),
`hk_s = S_c k_s`, `hq_s = S_c q_s`, and `Gw_s` the inclusive cumsum of the window gates:

    A_ij = beta_i exp(Gw_i - Gw_j) (k_i . k_j)            for j < i
    u    = (I + A)^-1 R,   R_i = beta_i (v_i - exp(Gw_i) hk_i)     (forward substitution)
    o_s  = exp(Gw_s) hq_s + sum_{j<=s} exp(Gw_s - Gw_j) (k_j . q_s) u_j

All dot products are fp32 on CUDA cores (no tf32). The window's (u, k, g) and raw (v, k, beta)
are written into the ring (raw k only where the rings keep it, `RAW_K`); the checkpoint is read
only; rejected drafts are overwritten later.
Grid: `(cdiv(V, BV) * B * HV,)`.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..configs import (check_exact_replay_warps, gdn_history_rt, gdn_k_tree, gdn_pdl, gdn_prep_plan, gdn_replay_unroll,
                       gdn_state_dot, gdn_state_kc, gdn_verify_config, gdn_verify_loop_split, gdn_verify_maxnreg,
                       maxnreg_option)
from .ckpt import check_split_form, ckpt_half_reads
from .common import ckpt_load, gdn_gate, gdn_l2norm, gdn_l2norm_vec, gdn_tile_ids, history_gate_weights, history_rows
from .verify_mm import _gdn_verify_mm_kernel
from .verify_loop import _gdn_verify_fused_kernel, _gdn_verify_state_loop_kernel, loop_programs
from .verify_split import _gdn_verify_prep_kernel, _gdn_verify_state_kernel, scratch_floats
from .rings import GDNRings, check_gdn_rings


@triton.jit
def _row(x, o_t, s):
    """Row `s` of a `[BT, X]` tile."""
    return tl.sum(tl.where((o_t == s)[:, None], x, 0.0), 0)


@triton.jit
def _elem(x, o_t, s):
    """Element `s` of a `[BT]` vector."""
    return tl.sum(tl.where(o_t == s, x, 0.0), 0)


@triton.jit
def _set_row(x, o_t, s, val):
    return tl.where((o_t == s)[:, None], val[None, :], x)


@triton.jit
def _set_elem(x, o_t, s, val):
    return tl.where(o_t == s, val, x)


@triton.jit(do_not_specialize=["T"])
def _gdn_verify_kernel(
    q, k, v, a, b, A_log, dt_bias, o,
    state, ring_d, ring_k, ring_g, ring_rawv, ring_rawk, ring_beta,
    slot_idx, wpos, origin,
    scale, softplus_beta, softplus_threshold,
    T,
    stride_q_row, stride_q_tok, stride_k_row, stride_k_tok, stride_v_row, stride_v_tok,
    stride_a_row, stride_a_tok, stride_b_row, stride_b_tok,
    stride_state_slot, stride_d_slot, stride_k_slot, stride_g_slot,
    stride_rawv_slot, stride_rawk_slot, stride_beta_slot,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, RL: tl.constexpr, RLB: tl.constexpr,
    USE_DOT: tl.constexpr, TREE: tl.constexpr = False, RAW_K: tl.constexpr = True, SPLIT: tl.constexpr = False,
    HALF: tl.constexpr = False,
):
    i_v, i_n, i_hv, i_h = gdn_tile_ids(H, HV, V, BV)
    first_of_group = i_hv % (HV // H) == 0

    slot = tl.load(slot_idx + i_n).to(tl.int64)
    if slot < 0:
        return
    wp = tl.load(wpos + slot)
    org = tl.load(origin + slot)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    mask_k = o_k < K
    mask_v = o_v < V

    p_hs = state + slot * stride_state_slot + i_hv * K * V
    if USE_DOT:
        b_hv = ckpt_load(p_hs, o_v[:, None] * K + o_k[None, :], mask_v[:, None] & mask_k[None, :], K * V, SPLIT, HALF)
        o_c = tl.arange(0, 16)
        b_p = tl.zeros([BK, 16], dtype=tl.float32)
    else:
        b_h = ckpt_load(p_hs, o_v[None, :] * K + o_k[:, None], mask_k[:, None] & mask_v[None, :], K * V, SPLIT, HALF)

    # Committed history.
    o_j = tl.arange(0, RLB)
    m_j = o_j < wp
    phys_j = (org + o_j) % RL
    b_w, b_gtot = history_gate_weights(ring_g, slot, i_hv, stride_g_slot, phys_j, m_j, RL)
    b_kr = history_rows(ring_k, slot, stride_k_slot, i_h, phys_j, m_j, o_k, mask_k, K, RL)
    b_ur = history_rows(ring_d, slot, stride_d_slot, i_hv, phys_j, m_j, o_v, mask_v, V, RL)
    b_dec = tl.exp(b_gtot)
    b_A_log = tl.load(A_log + i_hv).to(tl.float32)
    b_dt_bias = tl.load(dt_bias + i_hv).to(tl.float32)

    # Window: per draft, gates, normalised k/q, committed-state products, ring write.
    b_kw = tl.zeros([BT, BK], dtype=tl.float32)
    b_qw = tl.zeros([BT, BK], dtype=tl.float32)
    b_vw = tl.zeros([BT, BV], dtype=tl.float32)
    b_hk = tl.zeros([BT, BV], dtype=tl.float32)
    b_hq = tl.zeros([BT, BV], dtype=tl.float32)
    b_gw = tl.zeros([BT], dtype=tl.float32)
    b_betaw = tl.zeros([BT], dtype=tl.float32)
    for s in tl.static_range(BT):
        valid = s < T
        b_q_s = tl.load(q + i_n * stride_q_row + s * stride_q_tok + i_h * K + o_k,
                        mask=mask_k & valid, other=0).to(tl.float32)
        b_k_raw = tl.load(k + i_n * stride_k_row + s * stride_k_tok + i_h * K + o_k,
                          mask=mask_k & valid, other=0)
        b_v_raw = tl.load(v + i_n * stride_v_row + s * stride_v_tok + i_hv * V + o_v,
                          mask=mask_v & valid, other=0)
        b_a_s = tl.load(a + i_n * stride_a_row + s * stride_a_tok + i_hv, mask=valid, other=0).to(tl.float32)
        b_b_s = tl.load(b + i_n * stride_b_row + s * stride_b_tok + i_hv, mask=valid, other=0).to(tl.float32)
        b_g_s, b_beta_s = gdn_gate(b_a_s, b_b_s, b_A_log, b_dt_bias, softplus_beta, softplus_threshold)
        b_k_s = gdn_l2norm_vec(b_k_raw.to(tl.float32), TREE)  # into the `k` ring (exact fold reads it)
        b_q_s = gdn_l2norm(b_q_s) * scale
        if USE_DOT:
            b_p = tl.where(o_c[None, :] == s, b_k_s[:, None], b_p)
            b_p = tl.where(o_c[None, :] == BT + s, b_q_s[:, None], b_p)
        else:
            b_hk_s = b_dec * tl.sum(b_h * b_k_s[:, None], 0) + tl.sum(
                b_ur * (tl.sum(b_kr * b_k_s[None, :], 1) * b_w)[:, None], 0)
            b_hq_s = b_dec * tl.sum(b_h * b_q_s[:, None], 0) + tl.sum(
                b_ur * (tl.sum(b_kr * b_q_s[None, :], 1) * b_w)[:, None], 0)
            b_hk = _set_row(b_hk, o_t, s, b_hk_s)
            b_hq = _set_row(b_hq, o_t, s, b_hq_s)
        b_kw = _set_row(b_kw, o_t, s, b_k_s)
        b_qw = _set_row(b_qw, o_t, s, b_q_s)
        b_vw = _set_row(b_vw, o_t, s, b_v_raw.to(tl.float32))
        b_gw = _set_elem(b_gw, o_t, s, tl.where(valid, b_g_s, 0.0))
        b_betaw = _set_elem(b_betaw, o_t, s, b_beta_s)
        if valid:
            phys = (org + wp + s) % RL
            tl.store(ring_rawv + slot * stride_rawv_slot + (i_hv * RL + phys) * V + o_v, b_v_raw, mask=mask_v)
            if i_v == 0:
                tl.store(ring_g + slot * stride_g_slot + i_hv * RL + phys, b_g_s)
                tl.store(ring_beta + slot * stride_beta_slot + i_hv * RL + phys, b_beta_s)
                if first_of_group:
                    tl.store(ring_k + slot * stride_k_slot + (i_h * RL + phys) * K + o_k,
                             b_k_s.to(ring_k.dtype.element_ty), mask=mask_k)
                    if RAW_K:
                        tl.store(ring_rawk + slot * stride_rawk_slot + (i_h * RL + phys) * K + o_k,
                                 b_k_raw, mask=mask_k)

    if USE_DOT:
        # Committed-state products for all probes at once: S_c P = dec S0 P + U^T (w * (K_ring P)).
        b_sp = tl.dot(b_hv, b_p, input_precision="tf32x3")
        b_kp = tl.dot(b_kr, b_p, input_precision="tf32x3") * b_w[:, None]
        b_sp = b_dec * b_sp + tl.dot(tl.trans(b_ur), b_kp, input_precision="tf32x3")
        for s in tl.static_range(BT):
            b_hk = _set_row(b_hk, o_t, s, tl.sum(tl.where(o_c[None, :] == s, b_sp, 0.0), 1))
            b_hq = _set_row(b_hq, o_t, s, tl.sum(tl.where(o_c[None, :] == BT + s, b_sp, 0.0), 1))

    # Chunked delta rule inside the window: u = (I + A)^-1 R by forward substitution.
    b_gcw = tl.cumsum(b_gw, 0)
    b_u = tl.zeros([BT, BV], dtype=tl.float32)
    for i in tl.static_range(BT):
        b_gi = _elem(b_gcw, o_t, i)
        b_betai = _elem(b_betaw, o_t, i)
        b_ki = _row(b_kw, o_t, i)
        b_r = b_betai * (_row(b_vw, o_t, i) - tl.exp(b_gi) * _row(b_hk, o_t, i))
        b_aij = tl.where(o_t < i, b_betai * tl.exp(b_gi - b_gcw) * tl.sum(b_kw * b_ki[None, :], 1), 0.0)
        b_u = _set_row(b_u, o_t, i, b_r - tl.sum(b_u * b_aij[:, None], 0))
    for s in tl.static_range(BT):
        if s < T:
            b_gs = _elem(b_gcw, o_t, s)
            b_qs = _row(b_qw, o_t, s)
            b_coef = tl.where(o_t <= s, tl.exp(b_gs - b_gcw) * tl.sum(b_kw * b_qs[None, :], 1), 0.0)
            b_o = tl.exp(b_gs) * _row(b_hq, o_t, s) + tl.sum(b_u * b_coef[:, None], 0)
            p_o = o + ((i_n * T + s) * HV + i_hv) * V + o_v
            tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=mask_v)
            phys = (org + wp + s) % RL
            tl.store(ring_d + slot * stride_d_slot + (i_hv * RL + phys) * V + o_v,
                     _row(b_u, o_t, s).to(ring_d.dtype.element_ty), mask=mask_v)


def _strides4(t: torch.Tensor, inner: int, name: str) -> tuple[int, int]:
    if t.dim() != 4 or t.stride(-1) != 1 or t.stride(-2) != inner:
        raise ValueError(f"`{name}` must be [B, T, heads, dim] with contiguous heads and dim")
    return t.stride(0), t.stride(1)


def gdn_replay_verify(
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
    wpos: torch.Tensor,
    origin: torch.Tensor,
    scale: Optional[float] = None,
    out: Optional[torch.Tensor] = None,
    split_ckpt: bool = False,
) -> torch.Tensor:
    """Outputs for every draft of every row; writes the window into the ring.

    Args:
        q, k (torch.Tensor): `[B, T, H, K]` raw queries/keys.
        v (torch.Tensor): `[B, T, HV, V]`.
        a, b (torch.Tensor): `[B, T, HV]`.
        A_log, dt_bias (torch.Tensor): `[HV]` fp32.
        state (torch.Tensor): `[S, HV, V, K]` fp32 checkpoints, read only.
        rings (GDNRings): one layer's rings; window entries are written at
            `(origin + wpos + s) % L`. The caller guarantees `wpos + T <= L` (commit's early flush).
        slot_idx (torch.Tensor): `[B]` slots, `< 0` = padding (writes nothing).
        wpos, origin (torch.Tensor): `[S]` int32 cursors (not modified).
        split_ckpt (bool): the checkpoints are in the split layout (`gdn/ckpt.py`); with bf16
            activations only their `hi` planes (bf16 values) are read.

    Returns:
        `[B, T, HV, V]` outputs in the dtype of `q`.
    """
    B, T, H, K = k.shape
    S, HV, V, K2 = state.shape
    if K2 != K or q.shape != k.shape or v.shape != (B, T, HV, V):
        raise ValueError(f"shape mismatch: q {tuple(q.shape)} k {tuple(k.shape)} v {tuple(v.shape)} state {tuple(state.shape)}")
    if HV % H != 0:
        raise ValueError(f"num_v_heads={HV} must be a multiple of num_k_heads={H}")
    if state.dtype != torch.float32 or state[0].stride() != (V * K, K, 1):
        raise ValueError("state must be fp32 [S, HV, V, K] with contiguous inner dims")
    if a.shape != (B, T, HV) or b.shape != (B, T, HV) or a.stride(-1) != 1 or b.stride(-1) != 1:
        raise ValueError("a and b must be [B, T, HV] with a contiguous last dim")
    check_gdn_rings(rings, H, HV, K, V)
    if rings.rawk.dtype != k.dtype:
        raise ValueError(f"raw ring dtype {rings.rawk.dtype} must match the activation dtype {k.dtype}")
    if T > rings.ring_len:
        raise ValueError(f"{T} drafts do not fit a ring of {rings.ring_len} entries")
    if scale is None:
        scale = K ** -0.5
    if out is None:
        out = torch.empty((B, T, HV, V), dtype=q.dtype, device=q.device)
    elif out.shape != (B, T, HV, V) or not out.is_contiguous():
        raise ValueError("out must be a contiguous [B, T, HV, V] tensor")
    check_split_form(split_ckpt, K)
    if B == 0 or T == 0:
        return out
    BK = triton.next_power_of_2(K)
    BV, num_warps, num_stages, use_dot = gdn_verify_config(K, V, T, rows=B)
    BV = min(triton.next_power_of_2(V), BV)
    BT = triton.next_power_of_2(T)
    RL = rings.ring_len
    RLB = triton.next_power_of_2(RL)
    if use_dot in (4, 5, 6) and T <= 16:
        _verify_split(q, k, v, a, b, A_log, dt_bias, state, rings, slot_idx, wpos, origin, scale, out,
                      BK, min(triton.next_power_of_2(V), BV), num_warps, num_stages, vloop=use_dot >= 5,
                      fused=use_dot == 6, split_ckpt=split_ckpt)
        return out
    kernel = _gdn_verify_kernel
    extra = {}
    if use_dot in (2, 3) and T <= 16 and K >= 16:
        # Matrix form (verify_mm.py): window and ring products as tf32x3 GEMMs; the checkpoint
        # products too (2) or as row reductions of the state tile (3).
        kernel, BV, RLB = _gdn_verify_mm_kernel, max(BV, 16), max(RLB, 16)
        extra = {"S0_DOT": use_dot == 2}
        use_dot = None
    elif use_dot:
        # tl.dot needs every dimension >= 16; 2 * BT probes share one 16-column operand.
        use_dot = BT <= 8 and K >= 16
        BV, RLB = max(BV, 16), max(RLB, 16)
    grid = (triton.cdiv(V, BV) * B * HV,)
    if use_dot is not None:
        extra = {"USE_DOT": bool(use_dot)}
    extra.update(SPLIT=bool(split_ckpt), HALF=bool(split_ckpt) and ckpt_half_reads(q.dtype))
    kernel[grid](
        q, k, v, a, b, A_log, dt_bias, out,
        state, rings.d, rings.k, rings.g, rings.rawv, rings.rawk, rings.beta,
        slot_idx, wpos, origin,
        scale, 1.0, 20.0,
        T,
        *_strides4(q, K, "q"), *_strides4(k, K, "k"), *_strides4(v, V, "v"),
        a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        state.stride(0), rings.d.stride(0), rings.k.stride(0), rings.g.stride(0),
        rings.rawv.stride(0), rings.rawk.stride(0), rings.beta.stride(0),
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, BT=BT, RL=RL, RLB=RLB, TREE=gdn_k_tree(K),
        RAW_K=rings.has_raw_keys, num_warps=num_warps, num_stages=num_stages, **extra,
    )
    return out


def _verify_split(q, k, v, a, b, A_log, dt_bias, state, rings, slot_idx, wpos, origin, scale, out,
                  BK, BV, num_warps, num_stages, row_wp=None, row_flush=None, flush_cols=0, row_order=None,
                  inline_prep=False, vloop=False, fused=False, split_ckpt=False):
    """Two-launch verify (verify_split.py): per-head window algebra, then one pass over the state.
    With `row_wp`/`row_flush` (decode, T = 1) only the non-flush rows are computed, unless
    `flush_cols` > 0: then the state launch also runs the flush rows exactly, `flush_cols`
    columns at a time (decode plan 3), in the order of `row_order` if given. `inline_prep`
    (decode plan 4) leaves out the prep launch: each state program makes its row's products.
    `vloop` (verify plan products 5) runs the state launch as one program per row and value
    head that walks the value rows `BV` at a time, its tile loads pipelined (verify_loop.py);
    tensor-core products (its tiles are at least 16 x 16). `fused` (products 6, with `vloop`)
    leaves out the prep launch: those programs make the prep's products themselves. `split_ckpt`:
    the checkpoint layout (`gdn/ckpt.py`; output reads of the `hi` plane only with bf16 activations)."""
    B, T, H, K = k.shape
    HV, V = state.shape[1], state.shape[2]
    layout = {"SPLIT": bool(split_ckpt), "HALF": bool(split_ckpt) and ckpt_half_reads(q.dtype)}
    BT = triton.next_power_of_2(T)
    RL = rings.ring_len
    RLB = triton.next_power_of_2(RL)
    decode = row_wp is not None
    if inline_prep and (not decode or T != 1):
        raise ValueError("inline_prep is decode plan 4's (T = 1 with row_wp/row_flush)")
    if vloop and (decode or inline_prep):
        raise ValueError("vloop is a verify state launch (no decode rows, with the prep launch)")
    if fused and not vloop:
        raise ValueError("fused is the looping state launch (vloop) without the prep launch")
    if vloop:
        BV, BK = max(BV, 16), max(BK, 16)
    # Tensor-core products need tiles of 16+ rows and keys (a launch-plan choice: both paths give
    # the outputs within the baseline's error, and neither touches the committed state).
    dot = vloop or (gdn_state_dot(decode) and BV >= 16 and BK >= 16 and not inline_prep)
    if dot:
        RLB = max(RLB, 16)  # the history product's inner dimension (prep and state share the scratch layout)
    NS = scratch_floats(BT, RLB)
    scratch = torch.empty((1,) if inline_prep or fused else (B, HV, NS), dtype=torch.float32, device=state.device)
    sq, sk, sv = _strides4(q, K, "q"), _strides4(k, K, "k"), _strides4(v, V, "v")
    rows = (row_wp, row_flush) if row_wp is not None else (slot_idx, slot_idx)  # unused without ROWS
    tree = gdn_k_tree(K)
    if flush_cols:
        check_exact_replay_warps(num_warps, tree, "the GDN decode's state launch")
    ring_fk = rings.replay_keys(tree)
    prep_warps, prep_kc = gdn_prep_plan(K)
    pdl = gdn_pdl() and not inline_prep
    kc = 0 if dot or inline_prep else gdn_state_kc(K, decode=decode)
    # A register cap for the looping programs (configs.gdn_verify_maxnreg), a compile option.
    cap = maxnreg_option(gdn_verify_maxnreg()) if vloop else {}
    VS = loop_programs(V, BV, gdn_verify_loop_split(rows=B)) if vloop else 1
    if fused:
        _gdn_verify_fused_kernel[(B * HV * VS,)](
            q, k, v, a, b, A_log, dt_bias, out, state, rings.d, rings.rawv, rings.k, rings.g, rings.rawk, rings.beta,
            slot_idx, wpos, origin,
            scale, 1.0, 20.0,
            T,
            *sq, *sk, *sv, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            state.stride(0), rings.d.stride(0), rings.rawv.stride(0), rings.k.stride(0), rings.g.stride(0),
            rings.rawk.stride(0), rings.beta.stride(0),
            H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, BT=BT, RL=RL, RLB=RLB, NP=max(16, 2 * BT), EVICT=True,
            RT=gdn_history_rt(decode=False), TREE=tree, RAW_K=rings.has_raw_keys, NSTG=num_stages, VS=VS,
            num_warps=num_warps, num_stages=num_stages, **cap, **layout,
        )
        return
    if not inline_prep:
        _gdn_verify_prep_kernel[(B * H,)](
            q, k, a, b, A_log, dt_bias, rings.k, rings.g, rings.rawk, rings.beta,
            slot_idx, wpos, origin, scratch, rows[0], rows[1],
            scale, 1.0, 20.0,
            T,
            *sq, *sk, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            rings.k.stride(0), rings.g.stride(0), rings.rawk.stride(0), rings.beta.stride(0),
            H=H, HV=HV, K=K, BK=BK, BT=BT, RL=RL, RLB=RLB, NS=NS, ROWS=row_wp is not None, TREE=tree,
            KC=prep_kc, RAW_K=rings.has_raw_keys, PDL=pdl, num_warps=prep_warps,
        )
    if vloop:
        _gdn_verify_state_loop_kernel[(B * HV * VS,)](
            q, k, v, out, state, rings.d, rings.rawv,
            slot_idx, wpos, origin, scratch,
            scale,
            T,
            *sq, *sk, *sv,
            state.stride(0), rings.d.stride(0), rings.rawv.stride(0),
            H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, BT=BT, RL=RL, RLB=RLB, NS=NS, NP=max(16, 2 * BT), EVICT=True,
            RT=gdn_history_rt(decode=False), PDL=pdl, NSTG=num_stages, VS=VS,
            num_warps=num_warps, num_stages=num_stages, **cap, **layout, **({"launch_pdl": True} if pdl else {}),
        )
        return
    _gdn_verify_state_kernel[(triton.cdiv(V, BV) * B * HV,)](
        q, k, v, out, state, rings.d, rings.rawv,
        slot_idx, wpos, origin, scratch, rows[0], rows[1],
        scale,
        T,
        *sq, *sk, *sv,
        state.stride(0), rings.d.stride(0), rings.rawv.stride(0),
        a, b, A_log, dt_bias, ring_fk, rings.g, rings.beta,
        1.0, 20.0, a.stride(0), b.stride(0),
        ring_fk.stride(0), rings.g.stride(0), rings.beta.stride(0),
        H=H, HV=HV, K=K, V=V, BK=BK, BV=BV, BT=BT, RL=RL, RLB=RLB, NS=NS, EVICT=True, ROWS=row_wp is not None,
        FLUSH=flush_cols > 0, BVF=min(max(flush_cols, 1), BV), UNROLL=gdn_replay_unroll(), TREE=tree,
        KC=kc, RT=gdn_history_rt(decode=decode),
        DOT=dot, NP=max(16, 2 * BT), row_order=row_order, ORDER=row_order is not None, PDL=pdl,
        ring_kn=rings.k, ring_kraw=rings.rawk, stride_kn_slot=rings.k.stride(0), stride_kraw_slot=rings.rawk.stride(0),
        INLINE=inline_prep, RAW_K=rings.has_raw_keys, **layout,
        num_warps=num_warps, num_stages=num_stages, **({"launch_pdl": True} if pdl else {}),
    )
