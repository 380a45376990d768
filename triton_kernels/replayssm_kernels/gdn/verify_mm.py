"""GDN ReplaySSM speculative verify, matrix form (tensor cores, tf32x3).

Same mathematics and ring protocol as `verify.py` (read its docstring), written so that every
product is one small GEMM instead of one warp reduction per draft. The draft axis is padded to
16 (`BT16`), the smallest `tl.dot` dimension; rows `s >= T` are zero and masked on store. In the
transposed orientation used here (value rows, draft columns):

    HK^T = dec S0 K^T + U_r^T (w * (K_r K^T)),  HQ^T likewise with Q   (committed-state products)
    KK = K K^T,  KQ = K Q^T                                              (window Gram matrices)
    u_i = beta_i (v_i - exp(Gw_i) hk_i) - sum_{j<i} beta_i exp(Gw_i - Gw_j) KK_ij u_j
    O^T = HQ^T diag(exp(Gw)) + U^T C,   C_js = exp(Gw_s - Gw_j) KQ_js (j <= s)

All dots use `input_precision="tf32x3"` (fp32-accurate). Grid: `(cdiv(V, BV) * B * HV,)`.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .common import ckpt_load, gdn_l2norm_rows, gdn_tile_ids, history_gate_weights, history_rows
from .verify_split import window_gates


@triton.jit
def _col(x, o_c, c):
    """Column `c` of a `[R, 16]` tile."""
    return tl.sum(tl.where(o_c[None, :] == c, x, 0.0), 1)


@triton.jit(do_not_specialize=["T"])
def _gdn_verify_mm_kernel(
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
    S0_DOT: tl.constexpr = True, TREE: tl.constexpr = False, RAW_K: tl.constexpr = True, SPLIT: tl.constexpr = False,
    HALF: tl.constexpr = False,
):
    i_v, i_n, i_hv, i_h = gdn_tile_ids(H, HV, V, BV)

    slot = tl.load(slot_idx + i_n).to(tl.int64)
    if slot < 0:
        return
    wp = tl.load(wpos + slot)
    org = tl.load(origin + slot)

    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    o_c = tl.arange(0, 16)
    mask_k = o_k < K
    mask_v = o_v < V
    m_c = o_c < T

    # Window inputs, draft rows padded to 16.
    m_ck = m_c[:, None] & mask_k[None, :]
    b_kraw = tl.load(k + i_n * stride_k_row + o_c[:, None] * stride_k_tok + i_h * K + o_k[None, :], mask=m_ck, other=0)
    b_qw = tl.load(q + i_n * stride_q_row + o_c[:, None] * stride_q_tok + i_h * K + o_k[None, :], mask=m_ck,
                   other=0).to(tl.float32)
    b_vraw = tl.load(v + i_n * stride_v_row + o_c[None, :] * stride_v_tok + i_hv * V + o_v[:, None],
                     mask=mask_v[:, None] & m_c[None, :], other=0)  # [BV, 16]
    b_g, b_beta = window_gates(a, b, A_log, dt_bias, i_n, i_hv, stride_a_row, stride_a_tok, stride_b_row,
                               stride_b_tok, softplus_beta, softplus_threshold, T, 16)
    b_kw = b_kraw.to(tl.float32)
    b_kw = gdn_l2norm_rows(b_kw, TREE)  # into the `k` ring (exact fold reads it)
    b_qw = b_qw / tl.sqrt(tl.sum(b_qw * b_qw, 1) + 1e-6)[:, None] * scale

    # Ring write of the window (positions wp..wp+T-1 of the circular ring).
    phys_c = (org + wp + o_c) % RL
    tl.store(ring_rawv + slot * stride_rawv_slot + (i_hv * RL + phys_c)[None, :] * V + o_v[:, None], b_vraw,
             mask=mask_v[:, None] & m_c[None, :])
    if i_v == 0:
        tl.store(ring_g + slot * stride_g_slot + i_hv * RL + phys_c, b_g, mask=m_c)
        tl.store(ring_beta + slot * stride_beta_slot + i_hv * RL + phys_c, b_beta, mask=m_c)
        if i_hv % (HV // H) == 0:
            p_rk = (i_h * RL + phys_c)[:, None] * K + o_k[None, :]
            tl.store(ring_k + slot * stride_k_slot + p_rk, b_kw.to(ring_k.dtype.element_ty), mask=m_ck)
            if RAW_K:
                tl.store(ring_rawk + slot * stride_rawk_slot + p_rk, b_kraw, mask=m_ck)

    # Committed history.
    o_j = tl.arange(0, RLB)
    m_j = o_j < wp
    phys_j = (org + o_j) % RL
    b_w, b_gtot = history_gate_weights(ring_g, slot, i_hv, stride_g_slot, phys_j, m_j, RL)
    b_kr = history_rows(ring_k, slot, stride_k_slot, i_h, phys_j, m_j, o_k, mask_k, K, RL)
    b_urT = tl.load(ring_d + slot * stride_d_slot + (i_hv * RL + phys_j)[None, :] * V + o_v[:, None],
                    mask=mask_v[:, None] & m_j[None, :], other=0).to(tl.float32)  # [BV, RLB]
    b_dec = tl.exp(b_gtot)

    b_h = ckpt_load(state + slot * stride_state_slot + i_hv * K * V, o_v[:, None] * K + o_k[None, :],
                    mask_v[:, None] & mask_k[None, :], K * V, SPLIT, HALF)  # [BV, BK]
    b_kT = tl.trans(b_kw)
    b_qT = tl.trans(b_qw)
    if S0_DOT:
        b_s0k = tl.dot(b_h, b_kT, input_precision="tf32x3")
        b_s0q = tl.dot(b_h, b_qT, input_precision="tf32x3")
    else:
        # Checkpoint products as per-probe row reductions of the [BV, BK] tile (fp32 FMAs): the
        # tf32x3 operand split of the whole tile is what sets the register budget otherwise.
        b_s0k = tl.zeros([BV, 16], dtype=tl.float32)
        b_s0q = tl.zeros([BV, 16], dtype=tl.float32)
        for s in tl.static_range(BT):
            m_s = mask_k & (s < T)
            b_ks = tl.load(k + i_n * stride_k_row + s * stride_k_tok + i_h * K + o_k, mask=m_s, other=0)
            b_ks = b_ks.to(tl.float32)
            b_ks = b_ks / tl.sqrt(tl.sum(b_ks * b_ks, 0) + 1e-6)
            b_qs = tl.load(q + i_n * stride_q_row + s * stride_q_tok + i_h * K + o_k, mask=m_s, other=0)
            b_qs = b_qs.to(tl.float32)
            b_qs = b_qs / tl.sqrt(tl.sum(b_qs * b_qs, 0) + 1e-6) * scale
            b_s0k = tl.where(o_c[None, :] == s, tl.sum(b_h * b_ks[None, :], 1)[:, None], b_s0k)
            b_s0q = tl.where(o_c[None, :] == s, tl.sum(b_h * b_qs[None, :], 1)[:, None], b_s0q)
    b_hkT = b_dec * b_s0k + tl.dot(
        b_urT, tl.dot(b_kr, b_kT, input_precision="tf32x3") * b_w[:, None], input_precision="tf32x3")
    b_hqT = b_dec * b_s0q + tl.dot(
        b_urT, tl.dot(b_kr, b_qT, input_precision="tf32x3") * b_w[:, None], input_precision="tf32x3")
    b_kk = tl.dot(b_kw, b_kT, input_precision="tf32x3")  # [16, 16], KK[i, j] = k_i . k_j
    b_kq = tl.dot(b_kw, b_qT, input_precision="tf32x3")  # [16, 16], KQ[j, s] = k_j . q_s

    # Window: forward substitution for u (columns of U^T), then outputs.
    b_gc = tl.cumsum(b_g, 0)
    b_vT = b_vraw.to(tl.float32)
    b_uT = tl.zeros([BV, 16], dtype=tl.float32)
    for i in tl.static_range(BT):
        b_gi = tl.sum(tl.where(o_c == i, b_gc, 0.0), 0)
        b_betai = tl.sum(tl.where(o_c == i, b_beta, 0.0), 0)
        b_kki = tl.sum(tl.where(o_c[:, None] == i, b_kk, 0.0), 0)  # row i of KK over j
        b_aij = tl.where(o_c < i, b_betai * tl.exp(b_gi - b_gc) * b_kki, 0.0)
        b_ui = b_betai * (_col(b_vT, o_c, i) - tl.exp(b_gi) * _col(b_hkT, o_c, i)) - tl.sum(b_uT * b_aij[None, :], 1)
        b_uT = tl.where(o_c[None, :] == i, b_ui[:, None], b_uT)
    b_coef = tl.where((o_c[:, None] <= o_c[None, :]) & m_c[None, :],
                      tl.exp(b_gc[None, :] - b_gc[:, None]) * b_kq, 0.0)  # C[j, s]
    b_oT = b_hqT * tl.exp(b_gc)[None, :] + tl.dot(b_uT, b_coef, input_precision="tf32x3")
    m_vc = mask_v[:, None] & m_c[None, :]
    p_o = o + ((i_n * T + o_c[None, :]) * HV + i_hv) * V + o_v[:, None]
    tl.store(p_o, b_oT.to(o.dtype.element_ty), mask=m_vc)
    tl.store(ring_d + slot * stride_d_slot + (i_hv * RL + phys_c)[None, :] * V + o_v[:, None],
             b_uT.to(ring_d.dtype.element_ty), mask=m_vc)
