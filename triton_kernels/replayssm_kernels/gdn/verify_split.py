"""GDN ReplaySSM speculative verify in two launches: per-head window algebra, then the state pass.

Same mathematics and ring protocol as `verify.py` (read its docstring). Everything that does not
depend on the value index is computed once per (row, key head) by a small prep kernel and left
in a scratch buffer, per (row, value head):

    WK[s, j] = w_j (k_j . k_s),  WQ[s, j] = w_j (k_j . q_s)     (ring history, j < wp)
    M = (I + A)^-1                                               (UT transform, [T, T])
    C[j, s] = exp(Gw_s - Gw_j) (k_j . q_s)  for j <= s           (window readout)
    exp(Gw_s), beta_s, dec = exp(G)

The prep kernel also writes the window's k, raw k (`RAW_K`: where the rings keep it), g and
beta into the ring. The state kernel then streams each `[BV, BK]` checkpoint tile once, with a
handful of `[BV]` vectors beside it:

    hk_s = dec S0 k_s + U_r^T WK[s],  hq_s likewise
    R = beta (V - exp(Gw) hk),  U = R M^T,  O = exp(Gw) hq + U C

and writes the window's u and raw v into the ring. All products are fp32 on CUDA cores, or with
`DOT` (configs.gdn_state_dot) the checkpoint and history products on tensor cores in tf32x3.
Grids: prep `(B * H,)`, state `(cdiv(V, BV) * B * HV,)`.

With `ROWS` the pair serves the non-flush rows of a decode step (T = 1; `row_wp`/`row_flush` from
`decode_prepare`). The prep kernel skips flush rows; the state kernel either skips them too (the
decode kernel's exact branch runs them in a launch of its own, decode plan 2) or, with `FLUSH`,
runs them itself on the exact path (plan 3: one launch fewer per step, whose idle programs cost
tens of microseconds at batch 256). With `ORDER` plan 3's state launch takes its rows in the order
of `row_order` (cursors.decode_row_order: the long flush rows early), which changes no result.
With `INLINE` (decode plan 4) there is no prep launch: each state program makes its own row's
history products, gate and `M`, `C` (`_decode_inline_prep`) and writes the token's g, beta and
keys into the rings as the prep kernel would (the same gate and norm expressions, so the exact
fold reads the same bits). With `PDL` the pair uses programmatic dependent launch (configs.gdn_pdl).
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from .common import (ckpt_load, gdn_decode_flush, gdn_gate, gdn_l2norm, gdn_l2norm_rows, gdn_l2norm_vec, gdn_ring_append_gate_keys,
                     gdn_tile_ids, gdn_token_gate, history_gate_weights, history_rows)


@triton.jit
def window_probe(q, k, i_n, i_h, s, T, stride_q_row, stride_q_tok, stride_k_row, stride_k_tok, scale, o_k, mask_k,
                 K: tl.constexpr):
    """Normalised key and scaled normalised query of draft `s` (zeros for `s >= T`), fp32 `[BK]`."""
    m_s = mask_k & (s < T)
    b_ks = gdn_l2norm(tl.load(k + i_n * stride_k_row + s * stride_k_tok + i_h * K + o_k, mask=m_s, other=0)
                      .to(tl.float32))
    b_qs = gdn_l2norm(tl.load(q + i_n * stride_q_row + s * stride_q_tok + i_h * K + o_k, mask=m_s, other=0)
                      .to(tl.float32))
    return b_ks, b_qs * scale


@triton.jit
def _state_tile_offsets(BK: tl.constexpr, KC: tl.constexpr):
    """K offsets of the checkpoint tile: `[BK]` (KC = 0: the whole K across a warp's lanes), or
    `[BK // KC, KC]`, K in KC-wide chunks. Read as `[BV, BK // KC, KC]`, the chunked tile gives
    the lanes KC // 4 keys and value rows for the rest, so a K sum adds the chunks inside each
    thread and then takes log2(KC / 4) shuffle steps for several rows at once (five per row for
    the whole-K tile)."""
    if KC == 0:
        return tl.arange(0, BK)
    else:
        return tl.arange(0, BK // KC)[:, None] * KC + tl.arange(0, KC)[None, :]


@triton.jit
def _state_tile_probe(q, k, i_n, i_h, s, T, stride_q_row, stride_q_tok, stride_k_row, stride_k_tok, scale, o_k,
                      mask_k, K: tl.constexpr, KC: tl.constexpr):
    """`window_probe` (draft `s`'s normalised key and scaled query) shaped as `o_k`, for either tile
    form of `_state_tile_offsets`."""
    if KC == 0:
        return window_probe(q, k, i_n, i_h, s, T, stride_q_row, stride_q_tok, stride_k_row, stride_k_tok, scale,
                            o_k, mask_k, K)
    else:
        m_s = mask_k & (s < T)
        b_ks = tl.load(k + i_n * stride_k_row + s * stride_k_tok + i_h * K + o_k, mask=m_s, other=0).to(tl.float32)
        b_qs = tl.load(q + i_n * stride_q_row + s * stride_q_tok + i_h * K + o_k, mask=m_s, other=0).to(tl.float32)
        b_ks = b_ks / tl.sqrt(tl.sum(tl.sum(b_ks * b_ks, 1), 0) + 1e-6)
        b_qs = b_qs / tl.sqrt(tl.sum(tl.sum(b_qs * b_qs, 1), 0) + 1e-6)
        return b_ks, b_qs * scale


@triton.jit
def _state_tile_dot(b_h, b_x, KC: tl.constexpr):
    """`S0 x` per value row of the tile (`[BV]`) for a probe `b_x` from `_state_tile_probe`; in the
    chunked form the chunk axis is summed first (inside each thread), then the KC lanes."""
    if KC == 0:
        return tl.sum(b_h * b_x[None, :], 1)
    else:
        return tl.sum(tl.sum(b_h * b_x[None, :, :], 1), 1)


@triton.jit
def history_dot(b_ur, b_w, RT: tl.constexpr):
    """`sum_j u_j[v] w[j]` per value row (`[BV]`) over the committed ring entries, `b_ur` read
    as `[BV, RLB]` (RT) or `[RLB, BV]`."""
    if RT:
        return tl.sum(b_ur * b_w[None, :], 1)
    else:
        return tl.sum(b_ur * b_w[:, None], 0)


@triton.jit
def probe_matrix(q, k, i_n, i_h, T, stride_q_row, stride_q_tok, stride_k_row, stride_k_tok, scale,
                 K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr, NP: tl.constexpr):
    """The probe matrix `P = [k_0 .. | q_0 .. | 0]` (`[BK, NP]`) of the tensor-core state
    products: the window's keys and queries, normalised (and the queries scaled) as `window_probe`."""
    o_n = tl.arange(0, NP)
    o_k = tl.arange(0, BK)
    is_k = o_n < BT
    s_n = tl.where(is_k, o_n, o_n - BT)
    m = (o_k < K)[:, None] & ((o_n < 2 * BT) & (s_n < T))[None, :]
    b_p = tl.load(k + i_n * stride_k_row + s_n[None, :] * stride_k_tok + i_h * K + o_k[:, None],
                  mask=m & is_k[None, :], other=0).to(tl.float32)
    b_p += tl.load(q + i_n * stride_q_row + s_n[None, :] * stride_q_tok + i_h * K + o_k[:, None],
                   mask=m & (o_n >= BT)[None, :], other=0).to(tl.float32)
    b_p = b_p / tl.sqrt(tl.sum(b_p * b_p, 0) + 1e-6)[None, :]
    return tl.where(is_k[None, :], b_p, b_p * scale)


@triton.jit
def history_mma(b_acc, b_ur, b_w, RT: tl.constexpr):
    """`b_acc + U_r^T W` on tensor cores (tf32x3): `b_ur` the committed `d` entries as
    `history_dot` reads them, `b_w[j, n]` (`[RLB, NP]`) the prep kernel's history weights."""
    if RT:
        return b_acc + tl.dot(b_ur, b_w, input_precision="tf32x3")
    else:
        return b_acc + tl.dot(tl.trans(b_ur), b_w, input_precision="tf32x3")


@triton.jit
def split_hk_hq(b_acc, BT: tl.constexpr, NP: tl.constexpr):
    """`(hk, hq)` (`[BV, BT]` each): the key and query column groups of a `[BV, NP]` product
    with the probe matrix (column n = group * BT + draft)."""
    BG: tl.constexpr = NP // BT
    b_acc3 = tl.reshape(b_acc, [b_acc.shape[0], BG, BT])
    o_g = tl.arange(0, BG)
    b_hk = tl.sum(tl.where(o_g[None, :, None] == 0, b_acc3, 0.0), 1)
    b_hq = tl.sum(tl.where(o_g[None, :, None] == 1, b_acc3, 0.0), 1)
    return b_hk, b_hq


@triton.jit
def history_weights(p_sc, BT: tl.constexpr, RLB: tl.constexpr, NP: tl.constexpr):
    """The prep kernel's history weights as the `[RLB, NP]` operand of `history_mma`
    (WK then WQ are contiguous in the scratch; columns from 2 BT on are zero)."""
    o_n = tl.arange(0, NP)
    return tl.load(p_sc + o_n[None, :] * RLB + tl.arange(0, RLB)[:, None], mask=(o_n < 2 * BT)[None, :], other=0)


@triton.jit
def _state_products_dot(q, k, b_h, b_ur, p_sc, b_dec, i_n, i_h, T, stride_q_row, stride_q_tok, stride_k_row,
                        stride_k_tok, scale, K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr,
                        RLB: tl.constexpr, NP: tl.constexpr, RT: tl.constexpr):
    """`(hk, hq)` (`[BV, BT]` each) of the state launch from two tf32x3 tensor-core products
    (configs.gdn_state_dot): `dec S0 P + U_r^T W` with the probe matrix `P` (`probe_matrix`) and
    the history weights `W` of this row and value head; `b_h` is the whole-K `[BV, BK]` tile."""
    b_p = probe_matrix(q, k, i_n, i_h, T, stride_q_row, stride_q_tok, stride_k_row, stride_k_tok, scale,
                       K, BK, BT, NP)
    b_acc = b_dec * tl.dot(b_h, b_p, input_precision="tf32x3")
    # The weights are loaded after the checkpoint product (their registers are not live across it).
    b_acc = history_mma(b_acc, b_ur, history_weights(p_sc, BT, RLB, NP), RT)
    return split_hk_hq(b_acc, BT, NP)


@triton.jit
def window_gates(a, b, A_log, dt_bias, i_n, i_hv, stride_a_row, stride_a_tok, stride_b_row, stride_b_tok,
                 softplus_beta, softplus_threshold, T, BT: tl.constexpr):
    """The window's gates of value head `i_hv`, `[BT]` each: `g` (zero past `T`) and `beta`."""
    o_t = tl.arange(0, BT)
    m_t = o_t < T
    b_a = tl.load(a + i_n * stride_a_row + o_t * stride_a_tok + i_hv, mask=m_t, other=0).to(tl.float32)
    b_b = tl.load(b + i_n * stride_b_row + o_t * stride_b_tok + i_hv, mask=m_t, other=0).to(tl.float32)
    b_A_log = tl.load(A_log + i_hv).to(tl.float32)
    b_dt_bias = tl.load(dt_bias + i_hv).to(tl.float32)
    b_gw, b_betaw = gdn_gate(b_a, b_b, b_A_log, b_dt_bias, softplus_beta, softplus_threshold)
    return tl.where(m_t, b_gw, 0.0), b_betaw


@triton.jit
def window_gates_to_ring(a, b, A_log, dt_bias, ring_g, ring_beta, slot, i_n, i_hv, stride_a_row, stride_a_tok,
                         stride_b_row, stride_b_tok, stride_g_slot, stride_beta_slot, phys_t, softplus_beta,
                         softplus_threshold, T, BT: tl.constexpr, RL: tl.constexpr, write=True):
    """`window_gates`, written into the value head's `g` and `beta` rings at `phys_t` (the exact
    fold replays these bits) where `write` holds."""
    m_t = (tl.arange(0, BT) < T) & write
    b_gw, b_betaw = window_gates(a, b, A_log, dt_bias, i_n, i_hv, stride_a_row, stride_a_tok, stride_b_row,
                                 stride_b_tok, softplus_beta, softplus_threshold, T, BT)
    tl.store(ring_g + slot * stride_g_slot + i_hv * RL + phys_t, b_gw, mask=m_t)
    tl.store(ring_beta + slot * stride_beta_slot + i_hv * RL + phys_t, b_betaw, mask=m_t)
    return b_gw, b_betaw


@triton.jit
def window_algebra(b_gw, b_betaw, b_kk, b_kq, T, BT: tl.constexpr):
    """`(M, C, Gw)` of the window from its gates and key products (`b_kk[j, s] = k_j . k_s`,
    `b_kq[j, s] = k_j . q_s`): the UT transform `M = (I + A)^-1` with `A[i, j] = beta_i
    exp(Gw_i - Gw_j) (k_i . k_j)` for `j < i` (forward substitution, row by row), the readout
    `C[j, s] = exp(Gw_s - Gw_j) (k_j . q_s)` for `j <= s < T`, and `Gw` the cumulative log-decay."""
    o_t = tl.arange(0, BT)
    m_t = o_t < T
    eye = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0)
    b_gc = tl.cumsum(b_gw, 0)
    b_A = tl.where(o_t[:, None] > o_t[None, :],
                   b_betaw[:, None] * tl.exp(b_gc[:, None] - b_gc[None, :]) * b_kk, 0.0)
    b_M = tl.zeros([BT, BT], dtype=tl.float32)
    for i in tl.static_range(BT):
        b_ai = tl.sum(tl.where(o_t[:, None] == i, b_A, 0.0), 0)
        b_mi = tl.sum(tl.where(o_t[:, None] == i, eye, 0.0), 0) - tl.sum(b_M * b_ai[:, None], 0)
        b_M = tl.where(o_t[:, None] == i, b_mi[None, :], b_M)
    b_C = tl.where((o_t[:, None] <= o_t[None, :]) & m_t[None, :],
                   tl.exp(b_gc[None, :] - b_gc[:, None]) * b_kq, 0.0)
    return b_M, b_C, b_gc


@triton.jit
def scratch_dec(p_sc, BT: tl.constexpr, RLB: tl.constexpr):
    """`exp(G)` of the committed entries, from the prep kernel's scratch (layout: its stores)."""
    return tl.load(p_sc + 2 * BT * RLB + 2 * BT * BT + 2 * BT)


@triton.jit
def scratch_window(p_sc, BT: tl.constexpr, RLB: tl.constexpr):
    """`(exp(Gw), beta, M, C)` of the window from the prep kernel's scratch: `[BT]`, `[BT]`,
    `M[i, j]` and `C[j, s]` (`[BT, BT]`)."""
    o_t = tl.arange(0, BT)
    p_tt = o_t[:, None] * BT + o_t[None, :]
    OFF_M: tl.constexpr = 2 * BT * RLB
    OFF_EG: tl.constexpr = OFF_M + 2 * BT * BT
    return (tl.load(p_sc + OFF_EG + o_t), tl.load(p_sc + OFF_EG + BT + o_t), tl.load(p_sc + OFF_M + p_tt),
            tl.load(p_sc + OFF_M + BT * BT + p_tt))


@triton.jit
def window_outputs(b_hk, b_hq, b_vraw, b_eg, b_beta, b_M, b_C):
    """The window's `u` and outputs (`[BV, BT]` each) from the committed-state products `hk`, `hq`
    and the prep's `exp(Gw)`, `beta`, `M`, `C`: `R = beta (V - exp(Gw) hk)`, `U = R M^T`,
    `O = exp(Gw) hq + U C`."""
    b_r = b_beta[None, :] * (b_vraw.to(tl.float32) - b_eg[None, :] * b_hk)  # [BV, BT]
    b_u = tl.sum(b_r[:, None, :] * b_M[None, :, :], 2)  # U[v, i] = sum_j R[v, j] M[i, j]
    b_o = b_hq * b_eg[None, :] + tl.sum(b_u[:, :, None] * b_C[None, :, :], 1)  # O[v, s]
    return b_u, b_o


@triton.jit
def ring_key_products(ring_kn, slot, org, wp, i_h, stride_kn_slot, b_ks, b_qs, o_k, mask_k, o_j, K: tl.constexpr,
                      RL: tl.constexpr, RLB: tl.constexpr):
    """`(k_j . k, k_j . q)` (`[RLB]` each, zero from `wp` on) of a decode token's normalised key
    and scaled query with the key head's committed ring keys (the `k` ring), the keys read JC
    entries at a time (JC x BK floats live at once, not RLB x BK)."""
    JC: tl.constexpr = 4 if RLB >= 4 else RLB
    o_c = tl.arange(0, JC)
    b_kk = tl.zeros([RLB], dtype=tl.float32)
    b_kq = tl.zeros_like(b_kk)
    for c in tl.static_range(RLB // JC):
        m_c = (c * JC + o_c) < wp
        b_krc = tl.load(ring_kn + slot * stride_kn_slot + (i_h * RL + (org + c * JC + o_c) % RL)[:, None] * K
                        + o_k[None, :], mask=m_c[:, None] & mask_k[None, :], other=0).to(tl.float32)  # [JC, BK]
        p_k = tl.sum(b_krc * b_ks[None, :], 1)
        p_q = tl.sum(b_krc * b_qs[None, :], 1)
        for e in tl.static_range(JC):
            b_kk = tl.where(o_j == c * JC + e, tl.sum(tl.where(o_c == e, p_k, 0.0), 0), b_kk)
            b_kq = tl.where(o_j == c * JC + e, tl.sum(tl.where(o_c == e, p_q, 0.0), 0), b_kq)
    return b_kk, b_kq


@triton.jit
def _decode_inline_prep(q, k, a, b, A_log, dt_bias, ring_kn, ring_g, b_h, b_ur, slot, org, wp, i_n, i_h, i_hv,
                        stride_q_row, stride_k_row, stride_a_row, stride_b_row, stride_kn_slot, stride_g_slot,
                        scale, softplus_beta, softplus_threshold, o_k, mask_k, o_j, m_j, phys_j, o_t,
                        K: tl.constexpr, RL: tl.constexpr, RLB: tl.constexpr, RT: tl.constexpr):
    """What the prep launch gives a decode row's state program (T = 1, so `BT` = 1), made by the
    program itself: `(hk, hq)` (`[BV, 1]`) from the whole-K checkpoint tile `b_h` and the committed
    `d` entries `b_ur`, the token's gate `g` and `beta` (scalars, the gate's bits: the ring keeps
    them for the exact fold), and `M = I`, `C = k . q` (`[1, 1]`). The history keys are read from
    the `k` ring (L2: every value head and V tile of the key head reads them)."""
    b_ks, b_qs = window_probe(q, k, i_n, i_h, 0, 1, stride_q_row, 0, stride_k_row, 0, scale, o_k, mask_k, K)
    # The checkpoint products first, so that the tile's registers are free for the history keys.
    b_sk = tl.sum(b_h * b_ks[None, :], 1)
    b_sq = tl.sum(b_h * b_qs[None, :], 1)
    b_kk, b_kq = ring_key_products(ring_kn, slot, org, wp, i_h, stride_kn_slot, b_ks, b_qs, o_k, mask_k, o_j,
                                   K, RL, RLB)
    b_w, b_gtot = history_gate_weights(ring_g, slot, i_hv, stride_g_slot, phys_j, m_j, RL)
    b_dec = tl.exp(b_gtot)
    b_wk = b_kk * b_w
    b_wq = b_kq * b_w
    b_hk = (b_dec * b_sk + history_dot(b_ur, b_wk, RT))[:, None]
    b_hq = (b_dec * b_sq + history_dot(b_ur, b_wq, RT))[:, None]
    b_g, b_beta = gdn_token_gate(a, b, A_log, dt_bias, i_n, i_hv, stride_a_row, stride_b_row, softplus_beta,
                                 softplus_threshold)
    eye = tl.where(o_t[:, None] == o_t[None, :], 1.0, 0.0)
    b_C = eye * tl.sum(b_ks * b_qs)
    return b_hk, b_hq, b_g, b_beta, eye, b_C


@triton.jit(do_not_specialize=["T"])
def _gdn_verify_prep_kernel(
    q, k, a, b, A_log, dt_bias, ring_k, ring_g, ring_rawk, ring_beta,
    slot_idx, wpos, origin, scratch, row_wp, row_flush,
    scale, softplus_beta, softplus_threshold,
    T,
    stride_q_row, stride_q_tok, stride_k_row, stride_k_tok, stride_a_row, stride_a_tok, stride_b_row, stride_b_tok,
    stride_k_slot, stride_g_slot, stride_rawk_slot, stride_beta_slot,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, BK: tl.constexpr, BT: tl.constexpr,
    RL: tl.constexpr, RLB: tl.constexpr, NS: tl.constexpr, ROWS: tl.constexpr = False, TREE: tl.constexpr = False,
    KC: tl.constexpr = 0, RAW_K: tl.constexpr = True, PDL: tl.constexpr = False,
):
    if PDL:
        gdc_launch_dependents()  # the state launch may start now; it waits before reading `scratch`
    i_n, i_h = tl.program_id(0) // H, tl.program_id(0) % H
    slot = tl.load(slot_idx + i_n).to(tl.int64)
    if slot < 0:
        return
    if ROWS:
        # Decode (T = 1): the row's snapshot from decode_prepare; flush rows are done elsewhere.
        if tl.load(row_flush + i_n) != 0:
            return
        wp = tl.load(row_wp + i_n)
    else:
        wp = tl.load(wpos + slot)
    org = tl.load(origin + slot)

    o_k = tl.arange(0, BK)
    o_t = tl.arange(0, BT)
    o_j = tl.arange(0, RLB)
    mask_k = o_k < K
    m_t = o_t < T
    m_j = o_j < wp
    m_tk = m_t[:, None] & mask_k[None, :]

    # Window keys: normalised into the ring (outputs), raw into the fold ring.
    b_kraw = tl.load(k + i_n * stride_k_row + o_t[:, None] * stride_k_tok + i_h * K + o_k[None, :], mask=m_tk, other=0)
    b_kw = b_kraw.to(tl.float32)
    b_kw = gdn_l2norm_rows(b_kw, TREE)  # into the `k` ring (exact fold reads it)
    phys_t = (org + wp + o_t) % RL
    p_rk = (i_h * RL + phys_t)[:, None] * K + o_k[None, :]
    tl.store(ring_k + slot * stride_k_slot + p_rk, b_kw.to(ring_k.dtype.element_ty), mask=m_tk)
    if RAW_K:
        tl.store(ring_rawk + slot * stride_rawk_slot + p_rk, b_kraw, mask=m_tk)

    # History keys (positions j < wp, disjoint from the window's).
    phys_j = (org + o_j) % RL
    b_krk = tl.zeros([RLB, BT], dtype=tl.float32)
    b_krq = tl.zeros([RLB, BT], dtype=tl.float32)
    b_kk = tl.zeros([BT, BT], dtype=tl.float32)
    b_kq = tl.zeros([BT, BT], dtype=tl.float32)
    if KC == 0:
        b_kr = history_rows(ring_k, slot, stride_k_slot, i_h, phys_j, m_j, o_k, mask_k, K, RL)

        # Key-head products, one draft column at a time.
        for s in tl.static_range(BT):
            b_ks, b_qs = window_probe(q, k, i_n, i_h, s, T, stride_q_row, stride_q_tok, stride_k_row, stride_k_tok,
                                      scale, o_k, mask_k, K)
            b_krk = tl.where(o_t[None, :] == s, tl.sum(b_kr * b_ks[None, :], 1)[:, None], b_krk)
            b_krq = tl.where(o_t[None, :] == s, tl.sum(b_kr * b_qs[None, :], 1)[:, None], b_krq)
            b_kk = tl.where(o_t[None, :] == s, tl.sum(b_kw * b_ks[None, :], 1)[:, None], b_kk)  # KK[j, s]
            b_kq = tl.where(o_t[None, :] == s, tl.sum(b_kw * b_qs[None, :], 1)[:, None], b_kq)  # KQ[j, s]
    else:
        # The same products with the keys in K chunks (`_state_tile_offsets`): the history and
        # window key tiles as [rows, BK // KC, KC], the window keys normalised again in that form
        # (outputs only; the rings hold the values written above).
        o_k2 = _state_tile_offsets(BK, KC)
        mask_k2 = o_k2 < K
        b_kr3 = tl.load(ring_k + slot * stride_k_slot + (i_h * RL + phys_j)[:, None, None] * K + o_k2[None, :, :],
                        mask=m_j[:, None, None] & mask_k2[None, :, :], other=0).to(tl.float32)
        b_kw3 = tl.load(k + i_n * stride_k_row + o_t[:, None, None] * stride_k_tok + i_h * K + o_k2[None, :, :],
                        mask=m_t[:, None, None] & mask_k2[None, :, :], other=0).to(tl.float32)
        b_kw3 = b_kw3 / tl.sqrt(tl.sum(tl.sum(b_kw3 * b_kw3, 2), 1) + 1e-6)[:, None, None]
        for s in tl.static_range(BT):
            b_ks, b_qs = _state_tile_probe(q, k, i_n, i_h, s, T, stride_q_row, stride_q_tok, stride_k_row,
                                           stride_k_tok, scale, o_k2, mask_k2, K, KC)
            b_krk = tl.where(o_t[None, :] == s, _state_tile_dot(b_kr3, b_ks, KC)[:, None], b_krk)
            b_krq = tl.where(o_t[None, :] == s, _state_tile_dot(b_kr3, b_qs, KC)[:, None], b_krq)
            b_kk = tl.where(o_t[None, :] == s, _state_tile_dot(b_kw3, b_ks, KC)[:, None], b_kk)  # KK[j, s]
            b_kq = tl.where(o_t[None, :] == s, _state_tile_dot(b_kw3, b_qs, KC)[:, None], b_kq)  # KQ[j, s]

    OFF_WQ: tl.constexpr = BT * RLB
    OFF_M: tl.constexpr = 2 * BT * RLB
    OFF_C: tl.constexpr = OFF_M + BT * BT
    OFF_EG: tl.constexpr = OFF_C + BT * BT
    OFF_BETA: tl.constexpr = OFF_EG + BT
    OFF_DEC: tl.constexpr = OFF_BETA + BT
    for g in tl.static_range(HV // H):
        i_hv = i_h * (HV // H) + g
        b_gw, b_betaw = window_gates_to_ring(a, b, A_log, dt_bias, ring_g, ring_beta, slot, i_n, i_hv,
                                             stride_a_row, stride_a_tok, stride_b_row, stride_b_tok, stride_g_slot,
                                             stride_beta_slot, phys_t, softplus_beta, softplus_threshold, T, BT, RL)
        b_w, b_gtot = history_gate_weights(ring_g, slot, i_hv, stride_g_slot, phys_j, m_j, RL)
        b_M, b_C, b_gc = window_algebra(b_gw, b_betaw, b_kk, b_kq, T, BT)

        p_sc = scratch + (i_n * HV + i_hv).to(tl.int64) * NS
        p_w = o_t[None, :] * RLB + o_j[:, None]
        tl.store(p_sc + p_w, b_krk * b_w[:, None])
        tl.store(p_sc + OFF_WQ + p_w, b_krq * b_w[:, None])
        p_tt = o_t[:, None] * BT + o_t[None, :]
        tl.store(p_sc + OFF_M + p_tt, b_M)
        tl.store(p_sc + OFF_C + p_tt, b_C)
        tl.store(p_sc + OFF_EG + o_t, tl.exp(b_gc))
        tl.store(p_sc + OFF_BETA + o_t, tl.where(m_t, b_betaw, 0.0))
        tl.store(p_sc + OFF_DEC, tl.exp(b_gtot))


@triton.jit(do_not_specialize=["T"])
def _gdn_verify_state_kernel(
    q, k, v, o, state, ring_d, ring_rawv,
    slot_idx, wpos, origin, scratch, row_wp, row_flush,
    scale,
    T,
    stride_q_row, stride_q_tok, stride_k_row, stride_k_tok, stride_v_row, stride_v_tok,
    stride_state_slot, stride_d_slot, stride_rawv_slot,
    a, b, A_log, dt_bias, ring_fk, ring_g, ring_beta,
    softplus_beta, softplus_threshold, stride_a_row, stride_b_row,
    stride_fk_slot, stride_g_slot, stride_beta_slot,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, RL: tl.constexpr, RLB: tl.constexpr,
    NS: tl.constexpr, EVICT: tl.constexpr, ROWS: tl.constexpr = False, FLUSH: tl.constexpr = False,
    BVF: tl.constexpr = 8, UNROLL: tl.constexpr = 1, TREE: tl.constexpr = False, KC: tl.constexpr = 0,
    RT: tl.constexpr = False, DOT: tl.constexpr = False, NP: tl.constexpr = 16, row_order=None,
    ORDER: tl.constexpr = False, PDL: tl.constexpr = False, ring_kn=None, ring_kraw=None, stride_kn_slot=0,
    stride_kraw_slot=0, INLINE: tl.constexpr = False, RAW_K: tl.constexpr = True, SPLIT: tl.constexpr = False,
    HALF: tl.constexpr = False,
):
    i_v, i_n, i_hv, i_h = gdn_tile_ids(H, HV, V, BV)
    if ORDER:
        # Decode: the rows in cursors.decode_row_order's order (scheduling only).
        i_n = tl.load(row_order + i_n)

    slot = tl.load(slot_idx + i_n).to(tl.int64)
    if slot < 0:
        return
    if ROWS:
        wp = tl.load(row_wp + i_n)
        if tl.load(row_flush + i_n) != 0:
            if FLUSH:
                # Decode plan 3: this launch also runs the flush rows, on the exact path (no
                # launch of their own; `ring_fk` is the raw-k ring, or with TREE the `k` ring).
                org = tl.load(origin + slot)
                b_g, b_beta = gdn_token_gate(a, b, A_log, dt_bias, i_n, i_hv, stride_a_row, stride_b_row, softplus_beta,
                                 softplus_threshold)
                gdn_decode_flush(
                    state + slot * stride_state_slot + i_hv * K * V, v + i_n * stride_v_row + i_hv * V,
                    o + (i_n * HV + i_hv) * V, q + i_n * stride_q_row + i_h * K, k + i_n * stride_k_row + i_h * K,
                    ring_fk + slot * stride_fk_slot + i_h * RL * K, ring_rawv + slot * stride_rawv_slot + i_hv * RL * V,
                    ring_g + slot * stride_g_slot + i_hv * RL, ring_beta + slot * stride_beta_slot + i_hv * RL,
                    b_g, b_beta, wp, org, i_v, scale, K, V, BK, BV, BVF, RL, UNROLL, TREE, SPLIT,
                )
            return
    else:
        wp = tl.load(wpos + slot)
    org = tl.load(origin + slot)

    o_k = _state_tile_offsets(BK, KC)  # [BK] or [BK // KC, KC]
    o_v = i_v * BV + tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    o_j = tl.arange(0, RLB)
    mask_k = o_k < K
    mask_v = o_v < V
    m_t = o_t < T
    m_j = o_j < wp

    p_h = state + slot * stride_state_slot + i_hv * K * V
    if KC == 0:
        b_h = ckpt_load(p_h, o_v[:, None] * K + o_k[None, :], mask_v[:, None] & mask_k[None, :], K * V, SPLIT,
                        HALF, EVICT)  # [BV, BK]
    else:
        b_h = ckpt_load(p_h, o_v[:, None, None] * K + o_k[None, :, :], mask_v[:, None, None] & mask_k[None, :, :],
                        K * V, SPLIT, HALF, EVICT)  # [BV, BK // KC, KC]
    phys_j = (org + o_j) % RL
    if RT:
        # [BV, RLB], read with scalar loads (contiguity hidden from the compiler): the lanes go
        # along V and each thread holds RLB / 2 history entries, so the history sums below add
        # inside a thread and take one shuffle step (four with the vectorised [RLB, BV] read).
        o_vs = tl.max_contiguous(o_v, 1)
        b_ur = tl.load(ring_d + slot * stride_d_slot + (i_hv * RL + phys_j)[None, :] * V + o_vs[:, None],
                       mask=m_j[None, :] & mask_v[:, None], other=0).to(tl.float32)
    else:
        b_ur = history_rows(ring_d, slot, stride_d_slot, i_hv, phys_j, m_j, o_v, mask_v, V, RL)  # [RLB, BV]

    if PDL:
        # Launched while the prep launch may still run: the tile and ring history above do not
        # come from it (nor does anything a flush row reads); its scratch below does.
        gdc_wait()
    p_sc = scratch + (i_n * HV + i_hv).to(tl.int64) * NS

    if INLINE:
        # Decode plan 4 (T = 1, whole-K tile, CUDA-core products): no prep launch; this program
        # makes the prep's products for its own row and value head (`_decode_inline_prep`).
        b_hk, b_hq, b_g, b_gb, b_M, b_C = _decode_inline_prep(
            q, k, a, b, A_log, dt_bias, ring_kn, ring_g, b_h, b_ur, slot, org, wp, i_n, i_h, i_hv,
            stride_q_row, stride_k_row, stride_a_row, stride_b_row, stride_kn_slot, stride_g_slot,
            scale, softplus_beta, softplus_threshold, o_k, mask_k, o_j, m_j, phys_j, o_t, K, RL, RLB, RT)
        b_eg = tl.zeros([BT], tl.float32) + tl.exp(b_g)
        b_beta = tl.zeros([BT], tl.float32) + b_gb
    elif DOT:
        b_dec = scratch_dec(p_sc, BT, RLB)
        b_hk, b_hq = _state_products_dot(q, k, b_h, b_ur, p_sc, b_dec, i_n, i_h, T, stride_q_row, stride_q_tok,
                                         stride_k_row, stride_k_tok, scale, K, BK, BT, RLB, NP, RT)
    else:
        b_dec = scratch_dec(p_sc, BT, RLB)
        b_hk = tl.zeros([BV, BT], dtype=tl.float32)
        b_hq = tl.zeros([BV, BT], dtype=tl.float32)
        for s in tl.static_range(BT):
            b_ks, b_qs = _state_tile_probe(q, k, i_n, i_h, s, T, stride_q_row, stride_q_tok, stride_k_row,
                                           stride_k_tok, scale, o_k, mask_k, K, KC)
            b_wk = tl.load(p_sc + s * RLB + o_j)
            b_wq = tl.load(p_sc + BT * RLB + s * RLB + o_j)  # WQ follows WK
            b_hks = b_dec * _state_tile_dot(b_h, b_ks, KC) + history_dot(b_ur, b_wk, RT)
            b_hqs = b_dec * _state_tile_dot(b_h, b_qs, KC) + history_dot(b_ur, b_wq, RT)
            b_hk = tl.where(o_t[None, :] == s, b_hks[:, None], b_hk)
            b_hq = tl.where(o_t[None, :] == s, b_hqs[:, None], b_hq)

    m_vt = mask_v[:, None] & m_t[None, :]
    b_vraw = tl.load(v + i_n * stride_v_row + o_t[None, :] * stride_v_tok + i_hv * V + o_v[:, None], mask=m_vt, other=0)
    phys_t = (org + wp + o_t) % RL
    tl.store(ring_rawv + slot * stride_rawv_slot + (i_hv * RL + phys_t)[None, :] * V + o_v[:, None], b_vraw, mask=m_vt)

    if not INLINE:
        b_eg, b_beta, b_M, b_C = scratch_window(p_sc, BT, RLB)
    else:
        # The prep's ring writes for this token (the normalised key in the replay form's bits).
        b_kraw = tl.load(k + i_n * stride_k_row + i_h * K + o_k, mask=mask_k, other=0)
        gdn_ring_append_gate_keys(ring_g, ring_beta, ring_kn, ring_kraw, stride_g_slot, stride_beta_slot,
                                  stride_kn_slot, stride_kraw_slot, slot, (org + wp) % RL, i_v, i_hv, i_h, b_g, b_gb,
                                  gdn_l2norm_vec(b_kraw.to(tl.float32), TREE), b_kraw, o_k, mask_k, H, HV, K, RL,
                                  RAW_K)
    b_u, b_o = window_outputs(b_hk, b_hq, b_vraw, b_eg, b_beta, b_M, b_C)
    tl.store(o + ((i_n * T + o_t[None, :]) * HV + i_hv) * V + o_v[:, None], b_o.to(o.dtype.element_ty), mask=m_vt)
    tl.store(ring_d + slot * stride_d_slot + (i_hv * RL + phys_t)[None, :] * V + o_v[:, None],
             b_u.to(ring_d.dtype.element_ty), mask=m_vt)


def scratch_floats(BT: int, RLB: int) -> int:
    """Floats of prep-kernel output per (row, value head)."""
    return 2 * BT * RLB + 2 * BT * BT + 2 * BT + 1
