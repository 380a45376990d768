"""GDN ReplaySSM speculative verify: state launches with one program per (row, value head).

Same mathematics, products and ring protocol as `verify_split.py` (read its docstring); the
tensor-core (tf32x3) form of its state launch. `verify_split.py`'s state launch gives each
program `BV` value rows of one (row, value head), so everything that does not depend on the
value row (the probe matrix of the window's keys and queries, with its loads, norms and tf32x3
split; the history weights; the window's `M`, `C`, `exp(Gw)`, `beta`) is redone by every one of
the `V / BV` programs of a value head, and each program has a single tile to read. Here one
program owns a whole (row, value head): it makes those once and walks its value rows `BV` at a
time, the checkpoint tile loads software-pipelined by Triton (`tl.range(num_stages=NSTG)`:
asynchronous copies into shared memory, the next tiles in flight while one is used).

* `_gdn_verify_state_loop_kernel` (verify plan products 5): the state launch after
  `verify_split.py`'s prep launch, reading the prep's scratch.
* `_gdn_verify_fused_kernel` (products 6): no prep launch. Each program also makes the prep's
  products for its value head, on tensor cores: the ring-key products `W = (K_r P) * w` and the
  window's Gram matrix `P^T P` (its `k . k` and `k . q` blocks), then `M`, `C` with the prep's
  expressions (`window_algebra`). It writes the window's `g` and `beta` into its value head's
  rings, and the key head's first value head writes the window's keys (normalised and raw) as
  the prep does (`gdn_l2norm_rows`, `window_gates_to_ring`): the exact fold reads those bits. The
  ring-key products of a key head are made by each of its `HV / H` value heads (the prep makes
  them once).

* `_gdn_decode_loop_kernel` (decode plan 5): a decode step in one launch, the decode's form of
  products 6 (T = 1, CUDA-core products as decode plans 3 and 4). A non-flush row's program makes
  its ring-key products, gate and `k . q` once (decode plan 4 makes them once per `BV` rows: 16
  times per value head at `BV` = 16) and writes the token's `g`, `beta` and keys into the rings
  with plan 4's expressions; a flush row's program runs the exact path over its value rows `BV`
  at a time. With `ORDER` the rows go in `row_order`'s order (the flush rows early). With
  `NSTG` = 0 a non-flush row's tile loads are prefetched into registers by hand, one tile ahead,
  instead of Triton's pipeline through shared memory. With `DOT` (the plan's sixth number, on
  split checkpoints read in halves) a tile's `S k` and `S q` are one bf16 tensor-core product
  (`_tile_products`) instead of two warp reductions.

Grid: `(B * HV * VS,)`: with a loop split (`VS` > 1, `configs.gdn_verify_loop_split`, decode plan 5's
`loop_split`) each (row, value head) has `VS` programs, each walking a consecutive share of the
tiles; the prologue (products, gates) is made by each, the ring writes of gates and keys by the first.
A row on the exact path (a decode flush row) may have its own number `VSF` of programs per value
head: the grid has `max(VS, VSF)`, and a row's programs past its own number exit at once. With a
flush capacity (decode plan 5's `flush_cap`, `_capped_flush_pid`) the grid holds the extra
`VSF - VS` programs for that many flush rows only, each flush rank's beside a group of rows.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from .common import (ckpt_load, gdn_decode_flush, gdn_l2norm_rows, gdn_l2norm_vec, gdn_ring_append_gate_keys,
                     gdn_token_gate, history_gate_weights, history_rows)
from .verify_split import (history_dot, history_mma, history_weights, probe_matrix,
                           ring_key_products, scratch_dec, scratch_window, split_hk_hq, window_algebra,
                           window_gates_to_ring, window_outputs, window_probe)


def loop_programs(V: int, BV: int, split: int) -> int:
    """The programs per (row, value head) of a looping launch asked for `split`: at most one per
    `BV`-row tile, and no empty share (`_split_tiles`: 8 tiles in 5 shares would leave the fifth
    empty, so 4)."""
    tiles = triton.cdiv(V, BV)
    per = triton.cdiv(tiles, max(1, min(split, tiles)))
    return triton.cdiv(tiles, per)


@triton.jit
def _split_tiles(i_s, V: tl.constexpr, BV: tl.constexpr, VS: tl.constexpr):
    """The `[lo, hi)` range of `BV`-row tiles that program `i_s` of a (row, value head)'s `VS`
    walks: consecutive shares of `ceil(tiles / VS)` tiles (the launcher makes every share non-empty,
    `loop_programs`)."""
    NT: tl.constexpr = (V + BV - 1) // BV
    NTS: tl.constexpr = (NT + VS - 1) // VS
    if VS == 1:
        return 0, NT
    else:
        return i_s * NTS, tl.minimum(i_s * NTS + NTS, NT)


@triton.jit
def _share_of_row(i_s, exact, V: tl.constexpr, BV: tl.constexpr, VS: tl.constexpr, VSF: tl.constexpr):
    """`(lo, hi, idle)` of program `i_s` of a row: its share of the tiles among `VSF` programs when
    the row is on the exact path (`exact`: a decode flush row), else among `VS`; `idle` when `i_s`
    is past that row's number of programs (the grid has the larger)."""
    v_lo, v_hi = _split_tiles(i_s, V, BV, VS)
    if VSF != VS:
        f_lo, f_hi = _split_tiles(i_s, V, BV, VSF)
        v_lo = tl.where(exact, f_lo, v_lo)
        v_hi = tl.where(exact, f_hi, v_hi)
        idle = i_s >= tl.where(exact, VSF, VS)
    else:
        idle = False
    return v_lo, v_hi, idle


@triton.jit
def _capped_flush_pid(row_order, flush_index, n_rows, grp_rows, HV: tl.constexpr, VS: tl.constexpr,
                      VSF: tl.constexpr, ORDER: tl.constexpr):
    """`(row, i_hv, i_s, extra)` of this program in a grid with a flush capacity (decode plan 5's
    `flush_cap`). The grid is groups of `HV * (VSF - VS)` extra programs of one flush rank (shares
    `VS..VSF-1` of each value head of that flush row: `flush_index[rank]`, -1 = no such row) and
    then the `VS` programs per value head of `grp_rows` rows (row positions in `row_order`'s order),
    the last group with the rows left: `n_groups * HV * (VSF - VS) + n_rows * HV * VS` programs,
    flush rank g's extra programs beside the rows of group g."""
    NE: tl.constexpr = HV * (VSF - VS)
    pid = tl.program_id(0)
    gsz = NE + grp_rows * (HV * VS)
    g = pid // gsz
    off = pid - g * gsz
    extra = off < NE
    m = tl.maximum(off - NE, 0)
    r = g * grp_rows + m // (HV * VS)
    if ORDER:
        r = tl.load(row_order + r)
    row = tl.where(extra, tl.load(flush_index + g, mask=extra, other=-1), r)
    i_hv = tl.where(extra, off // (VSF - VS), (m // VS) % HV)
    i_s = tl.where(extra, VS + off % (VSF - VS), m % VS)
    return row, i_hv, i_s, extra


@triton.jit
def _split_pid(HV: tl.constexpr, VS: tl.constexpr):
    """`(r, i_hv, i_s)` of this program: row position `r` (the batch row, or its place in a row
    order), value head, and share of the value rows; grid `(B * HV * VS,)`, the `VS` programs of a
    (row, value head) adjacent."""
    pid = tl.program_id(0)
    if VS == 1:
        return pid // HV, pid % HV, 0
    else:
        rh = pid // VS
        return rh // HV, rh % HV, pid % VS


@triton.jit
def _tile_and_history(p_h, p_d, o_v, mask_v, o_k, mask_k, phys_j, m_j, K: tl.constexpr, V: tl.constexpr,
                      EVICT: tl.constexpr, RT: tl.constexpr, SPLIT: tl.constexpr, HALF: tl.constexpr,
                      DOT: tl.constexpr = 0):
    """One step of a looping program: the checkpoint tile of value rows `o_v` (`[BV, BK]`; in the
    layout `SPLIT`, `HALF` as `ckpt_load`; with `DOT` the `hi` plane as bf16, the tensor cores'
    operand) and their committed `d` entries (`[BV, RLB]` with RT, else `[RLB, BV]`;
    `history_dot`'s forms)."""
    o_h = o_v[:, None] * K + o_k[None, :]
    m_h = mask_v[:, None] & mask_k[None, :]
    b_h = ckpt_load(p_h, o_h, m_h, K * V, SPLIT, HALF, EVICT, WIDEN=DOT == 0)
    if RT:
        b_ur = tl.load(p_d + phys_j[None, :] * V + tl.max_contiguous(o_v, 1)[:, None],
                       mask=m_j[None, :] & mask_v[:, None], other=0).to(tl.float32)
    else:
        b_ur = tl.load(p_d + phys_j[:, None] * V + o_v[None, :], mask=m_j[:, None] & mask_v[None, :],
                       other=0).to(tl.float32)
    return b_h, b_ur


@triton.jit
def _decode_probe_halves(p_k, p_q, r_k, r_q, K: tl.constexpr, BK: tl.constexpr, NP: tl.constexpr):
    """The tensor-core form's probe operand (`[BK, NP]` bf16): the token's key and query (`p_k`,
    `p_q`, raw) times `r_k`, `r_q` (the norms' reciprocals, the query's with its scale), each as
    two bf16 halves, `x = hi + lo` to ~2^-17 (columns 0-1 the key, 2-3 the query, the rest zero),
    so that bf16 products with the checkpoint's `hi` plane, summed in fp32, give `S k` and `S q`
    as exactly as fp32 products of that plane would up to rounding order. Loaded in this layout
    rather than widened from the `[BK]` vectors: the compiler would otherwise redo their norms'
    divisions in it, 64 a thread (session 46, offline: 254 registers instead of ~128)."""
    o_k = tl.arange(0, BK)[:, None]
    o_n = tl.arange(0, NP)[None, :]
    m_k = o_k < K
    b_x = tl.load(p_k + o_k + 0 * o_n, mask=m_k & (o_n < 2), other=0).to(tl.float32) * r_k
    b_x += tl.load(p_q + o_k + 0 * o_n, mask=m_k & (o_n >= 2) & (o_n < 4), other=0).to(tl.float32) * r_q
    b_hi = b_x.to(tl.bfloat16)
    return tl.where(o_n % 2 == 0, b_hi, (b_x - b_hi.to(tl.float32)).to(tl.bfloat16))


@triton.jit
def _tile_products(b_h, b_ks, b_qs, b_p, DOT: tl.constexpr, NP: tl.constexpr):
    """`(S k, S q)` per value row of the checkpoint tile `b_h`: warp reductions of fp32 products
    (`DOT` 0), or one tensor-core product of the bf16 tile with the probe halves `b_p`
    (`_decode_probe_halves`; `DOT` 1). `DOT` 2 is 1 for Triton's CPU interpreter, whose `tl.dot`
    takes bf16 operands for their bit patterns: the same operands widened to fp32, where their
    products are exact, so only the order of the fp32 sums can differ from 1's."""
    if DOT > 0:
        if DOT == 1:
            b_sp = tl.dot(b_h, b_p, out_dtype=tl.float32)  # [BV, NP]: k_hi, k_lo, q_hi, q_lo, 0 ...
        else:
            b_sp = tl.dot(b_h.to(tl.float32), b_p.to(tl.float32), input_precision="ieee")
        o_n = tl.arange(0, NP)[None, :]
        return tl.sum(tl.where(o_n < 2, b_sp, 0.0), 1), tl.sum(tl.where(o_n >= 2, b_sp, 0.0), 1)
    else:
        return tl.sum(b_h * b_ks[None, :], 1), tl.sum(b_h * b_qs[None, :], 1)


@triton.jit
def _decode_tile_outputs(b_h, b_ur, o_v, p_v, p_o, p_rv, p_d, phys, b_dec, b_ks, b_qs, b_wk, b_wq, b_beta, b_eg, b_c,
                         V: tl.constexpr, RT: tl.constexpr, b_p, DOT: tl.constexpr = 0, NP: tl.constexpr = 16):
    """Decode plan 5, a non-flush row: value rows `o_v` from their checkpoint tile `b_h` and
    committed `d` entries `b_ur` (`_tile_and_history`): `hk`, `hq` (`_tile_products`), then the
    token's `u` and output, and its raw `v` and `u` into the rings at `phys`."""
    mask_v = o_v < V
    b_sk, b_sq = _tile_products(b_h, b_ks, b_qs, b_p, DOT, NP)
    b_hk = b_dec * b_sk + history_dot(b_ur, b_wk, RT)
    b_hq = b_dec * b_sq + history_dot(b_ur, b_wq, RT)
    b_vraw = tl.load(p_v + o_v, mask=mask_v, other=0)
    tl.store(p_rv + phys * V + o_v, b_vraw, mask=mask_v)
    b_u = b_beta * (b_vraw.to(tl.float32) - b_eg * b_hk)
    tl.store(p_o + o_v, (b_hq * b_eg + b_u * b_c).to(p_o.dtype.element_ty), mask=mask_v)
    tl.store(p_d + phys * V + o_v, b_u.to(p_d.dtype.element_ty), mask=mask_v)


@triton.jit
def _state_tiles(v, o, state, ring_d, ring_rawv, slot, i_n, i_hv, wp, org, T, stride_v_tok, stride_v_row,
                 stride_state_slot, stride_d_slot, stride_rawv_slot, b_p, b_w, b_dec, b_eg, b_beta, b_M, b_C,
                 HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                 BT: tl.constexpr, RL: tl.constexpr, RLB: tl.constexpr, NP: tl.constexpr, EVICT: tl.constexpr,
                 RT: tl.constexpr, NSTG: tl.constexpr, v_lo, v_hi, SPLIT: tl.constexpr, HALF: tl.constexpr):
    """The value rows of one (row, value head), `BV` at a time: `hk`, `hq` from the checkpoint
    tile and the committed `d` entries (`history_mma`), then the window's `u` and outputs, the
    raw `v` and `u` into the rings. The program walks tiles `v_lo .. v_hi - 1` (its share,
    `_split_tiles`)."""
    o_k = tl.arange(0, BK)
    o_b = tl.arange(0, BV)
    o_t = tl.arange(0, BT)
    o_j = tl.arange(0, RLB)
    mask_k = o_k < K
    m_t = o_t < T
    m_j = o_j < wp
    phys_j = (org + o_j) % RL
    phys_t = (org + wp + o_t) % RL
    p_h = state + slot * stride_state_slot + i_hv * K * V
    p_d = ring_d + slot * stride_d_slot + i_hv * RL * V
    p_rv = ring_rawv + slot * stride_rawv_slot + i_hv * RL * V
    p_v = v + i_n * stride_v_row + i_hv * V
    p_o = o + (i_n * T * HV + i_hv) * V
    for i_v in tl.range(v_lo, v_hi, num_stages=NSTG):
        o_v = i_v * BV + o_b
        mask_v = o_v < V
        b_h, b_ur = _tile_and_history(p_h, p_d, o_v, mask_v, o_k, mask_k, phys_j, m_j, K, V, EVICT, RT, SPLIT,
                                       HALF)
        b_hk, b_hq = split_hk_hq(history_mma(b_dec * tl.dot(b_h, b_p, input_precision="tf32x3"), b_ur, b_w, RT),
                                  BT, NP)
        m_vt = mask_v[:, None] & m_t[None, :]
        b_vraw = tl.load(p_v + o_t[None, :] * stride_v_tok + o_v[:, None], mask=m_vt, other=0)
        tl.store(p_rv + phys_t[None, :] * V + o_v[:, None], b_vraw, mask=m_vt)
        b_u, b_o = window_outputs(b_hk, b_hq, b_vraw, b_eg, b_beta, b_M, b_C)
        tl.store(p_o + o_t[None, :] * (HV * V) + o_v[:, None], b_o.to(o.dtype.element_ty), mask=m_vt)
        tl.store(p_d + phys_t[None, :] * V + o_v[:, None], b_u.to(ring_d.dtype.element_ty), mask=m_vt)


@triton.jit(do_not_specialize=["T"])
def _gdn_verify_state_loop_kernel(
    q, k, v, o, state, ring_d, ring_rawv,
    slot_idx, wpos, origin, scratch,
    scale,
    T,
    stride_q_row, stride_q_tok, stride_k_row, stride_k_tok, stride_v_row, stride_v_tok,
    stride_state_slot, stride_d_slot, stride_rawv_slot,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, RL: tl.constexpr, RLB: tl.constexpr,
    NS: tl.constexpr, NP: tl.constexpr, EVICT: tl.constexpr, RT: tl.constexpr = False, PDL: tl.constexpr = False,
    NSTG: tl.constexpr = 2, VS: tl.constexpr = 1, SPLIT: tl.constexpr = False, HALF: tl.constexpr = False,
):
    """Products 5: the state launch after the prep launch (its scratch). With `PDL` the program
    builds its probe matrix before the wait, and reads the scratch and the tiles after it.
    Offline sm_90 build (`scripts/kernel_regs.py --state-launch`): the loop body is ~800 SASS
    instructions per 16 value rows, against 1360-1608 per 16 rows for the per-tile programs.
    `VS` programs per (row, value head), each with its share of the tiles."""
    i_n, i_hv, i_s = _split_pid(HV, VS)
    slot = tl.load(slot_idx + i_n).to(tl.int64)
    if slot < 0:
        return
    b_p = probe_matrix(q, k, i_n, i_hv // (HV // H), T, stride_q_row, stride_q_tok, stride_k_row, stride_k_tok,
                        scale, K, BK, BT, NP)
    if PDL:
        gdc_wait()  # the prep launch's scratch below
    p_sc = scratch + (i_n * HV + i_hv).to(tl.int64) * NS
    b_eg, b_beta, b_M, b_C = scratch_window(p_sc, BT, RLB)
    v_lo, v_hi = _split_tiles(i_s, V, BV, VS)
    _state_tiles(v, o, state, ring_d, ring_rawv, slot, i_n, i_hv, tl.load(wpos + slot), tl.load(origin + slot), T,
                 stride_v_tok, stride_v_row, stride_state_slot, stride_d_slot, stride_rawv_slot, b_p,
                 history_weights(p_sc, BT, RLB, NP), scratch_dec(p_sc, BT, RLB), b_eg, b_beta, b_M, b_C,
                 HV, K, V, BK, BV, BT, RL, RLB, NP, EVICT, RT, NSTG, v_lo, v_hi, SPLIT, HALF)


@triton.jit
def _gram_block(b_gram, r: tl.constexpr, c: tl.constexpr, BT: tl.constexpr, NP: tl.constexpr):
    """Block `(r, c)` (`[BT, BT]`) of an `[NP, NP]` Gram matrix of the probe matrix's columns
    (group 0: keys, 1: queries)."""
    BG: tl.constexpr = NP // BT
    b4 = tl.reshape(b_gram, [BG, BT, BG, BT])
    o_g = tl.arange(0, BG)
    sel = (o_g[:, None, None, None] == r) & (o_g[None, None, :, None] == c)
    return tl.sum(tl.sum(tl.where(sel, b4, 0.0), 2), 0)


@triton.jit(do_not_specialize=["T"])
def _gdn_verify_fused_kernel(
    q, k, v, a, b, A_log, dt_bias, o, state, ring_d, ring_rawv, ring_k, ring_g, ring_rawk, ring_beta,
    slot_idx, wpos, origin,
    scale, softplus_beta, softplus_threshold,
    T,
    stride_q_row, stride_q_tok, stride_k_row, stride_k_tok, stride_v_row, stride_v_tok,
    stride_a_row, stride_a_tok, stride_b_row, stride_b_tok,
    stride_state_slot, stride_d_slot, stride_rawv_slot, stride_k_slot, stride_g_slot, stride_rawk_slot,
    stride_beta_slot,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BK: tl.constexpr, BV: tl.constexpr, BT: tl.constexpr, RL: tl.constexpr, RLB: tl.constexpr,
    NP: tl.constexpr, EVICT: tl.constexpr, RT: tl.constexpr = False, TREE: tl.constexpr = False,
    RAW_K: tl.constexpr = True, NSTG: tl.constexpr = 2, VS: tl.constexpr = 1, SPLIT: tl.constexpr = False,
    HALF: tl.constexpr = False,
):
    """Products 6: the whole verify in one launch (module docstring). With `VS` programs per
    (row, value head) each makes the products and walks its share of the tiles; the first writes
    the window's gates and keys."""
    i_n, i_hv, i_s = _split_pid(HV, VS)
    i_h = i_hv // (HV // H)
    slot = tl.load(slot_idx + i_n).to(tl.int64)
    if slot < 0:
        return
    wp = tl.load(wpos + slot)
    org = tl.load(origin + slot)
    v_lo, v_hi = _split_tiles(i_s, V, BV, VS)
    o_k = tl.arange(0, BK)
    o_t = tl.arange(0, BT)
    o_j = tl.arange(0, RLB)
    mask_k = o_k < K
    m_j = o_j < wp
    phys_j = (org + o_j) % RL
    phys_t = (org + wp + o_t) % RL

    # The window's keys into the key head's rings (the prep's expressions), by its first value head.
    if (i_hv % (HV // H) == 0) & (i_s == 0):
        m_tk = (o_t < T)[:, None] & mask_k[None, :]
        b_kraw = tl.load(k + i_n * stride_k_row + o_t[:, None] * stride_k_tok + i_h * K + o_k[None, :], mask=m_tk,
                         other=0)
        p_rk = (i_h * RL + phys_t)[:, None] * K + o_k[None, :]
        tl.store(ring_k + slot * stride_k_slot + p_rk,
                 gdn_l2norm_rows(b_kraw.to(tl.float32), TREE).to(ring_k.dtype.element_ty), mask=m_tk)
        if RAW_K:
            tl.store(ring_rawk + slot * stride_rawk_slot + p_rk, b_kraw, mask=m_tk)
    b_gw, b_betaw = window_gates_to_ring(a, b, A_log, dt_bias, ring_g, ring_beta, slot, i_n, i_hv,
                                         stride_a_row, stride_a_tok, stride_b_row, stride_b_tok, stride_g_slot,
                                         stride_beta_slot, phys_t, softplus_beta, softplus_threshold, T, BT, RL,
                                         i_s == 0)

    # The prep's products, on tensor cores: ring-key products with the probes, the window's Gram matrix.
    b_p = probe_matrix(q, k, i_n, i_h, T, stride_q_row, stride_q_tok, stride_k_row, stride_k_tok, scale,
                        K, BK, BT, NP)
    b_kr = history_rows(ring_k, slot, stride_k_slot, i_h, phys_j, m_j, o_k, mask_k, K, RL)  # [RLB, BK]
    b_w, b_gtot = history_gate_weights(ring_g, slot, i_hv, stride_g_slot, phys_j, m_j, RL)
    b_w = tl.dot(b_kr, b_p, input_precision="tf32x3") * b_w[:, None]  # [RLB, NP]: WK then WQ
    b_gram = tl.dot(tl.trans(b_p), b_p, input_precision="tf32x3")  # [NP, NP]
    b_M, b_C, b_gc = window_algebra(b_gw, b_betaw, _gram_block(b_gram, 0, 0, BT, NP), _gram_block(b_gram, 0, 1, BT, NP),
                                    T, BT)
    _state_tiles(v, o, state, ring_d, ring_rawv, slot, i_n, i_hv, wp, org, T, stride_v_tok, stride_v_row,
                 stride_state_slot, stride_d_slot, stride_rawv_slot, b_p, b_w, tl.exp(b_gtot), tl.exp(b_gc),
                 tl.where(o_t < T, b_betaw, 0.0), b_M, b_C, HV, K, V, BK, BV, BT, RL, RLB, NP, EVICT, RT, NSTG,
                 v_lo, v_hi, SPLIT, HALF)


@triton.jit(do_not_specialize=["n_rows", "grp_rows", "n_groups"])
def _gdn_decode_loop_kernel(
    q, k, v, a, b, A_log, dt_bias, o, state, ring_d, ring_rawv, ring_fk, ring_kn, ring_kraw, ring_g, ring_beta,
    slot_idx, origin, row_wp, row_flush, row_order, flush_index,
    scale, softplus_beta, softplus_threshold,
    stride_q_row, stride_k_row, stride_v_row, stride_a_row, stride_b_row,
    stride_state_slot, stride_d_slot, stride_rawv_slot, stride_fk_slot, stride_kn_slot, stride_kraw_slot,
    stride_g_slot, stride_beta_slot,
    n_rows, grp_rows, n_groups,
    H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    BVF: tl.constexpr, RL: tl.constexpr, RLB: tl.constexpr, EVICT: tl.constexpr, UNROLL: tl.constexpr = 1,
    TREE: tl.constexpr = False, RT: tl.constexpr = False, ORDER: tl.constexpr = False, RAW_K: tl.constexpr = True,
    NSTG: tl.constexpr = 2, VS: tl.constexpr = 1, VSF0: tl.constexpr = 0, SPLIT: tl.constexpr = False,
    HALF: tl.constexpr = False, FCAP: tl.constexpr = False, DOT: tl.constexpr = 0,
):
    """Decode plan 5 (module docstring). With `VS` programs per (row, value head) each walks its
    share of the tiles; the first writes the token's gates and keys. A flush row has `VSF0` programs
    per value head instead when given (> 0; the grid has the larger number, and a row's programs
    past its own number exit at once). With `FCAP` (`_capped_flush_pid`) only `n_groups` flush rows
    have the extra programs. `DOT` > 0 (split checkpoints read in halves only): a non-flush row's
    `S k` and `S q` on tensor cores (`_tile_products`)."""
    VSF: tl.constexpr = VSF0 if VSF0 > 0 else VS
    VSG: tl.constexpr = VS if VS > VSF else VSF
    if FCAP:
        i_n, i_hv, i_s, extra = _capped_flush_pid(row_order, flush_index, n_rows, grp_rows, HV, VS, VSF, ORDER)
        if i_n < 0:
            return
    else:
        i_n, i_hv, i_s = _split_pid(HV, VSG)
        if ORDER:
            i_n = tl.load(row_order + i_n)  # scheduling only (cursors.decode_row_order)
    i_h = i_hv // (HV // H)
    slot = tl.load(slot_idx + i_n).to(tl.int64)
    if slot < 0:
        return
    flush = tl.load(row_flush + i_n) != 0
    if FCAP:
        # a flush row within the capacity: its share of VSF (the extra programs hold the rest);
        # past it, or a non-flush row: its share of VS
        capped = extra | (flush & (tl.load(flush_index + n_rows + i_n) < n_groups))
        v_lo, v_hi, idle = _share_of_row(i_s, capped, V, BV, VS, VSF)
    else:
        v_lo, v_hi, idle = _share_of_row(i_s, flush, V, BV, VS, VSF)
    if idle:
        return
    wp = tl.load(row_wp + i_n)
    org = tl.load(origin + slot)
    b_g, b_beta = gdn_token_gate(a, b, A_log, dt_bias, i_n, i_hv, stride_a_row, stride_b_row, softplus_beta,
                                 softplus_threshold)
    p_h = state + slot * stride_state_slot + i_hv * K * V
    p_rv = ring_rawv + slot * stride_rawv_slot + i_hv * RL * V
    p_v = v + i_n * stride_v_row + i_hv * V
    p_o = o + (i_n * HV + i_hv) * V
    if flush:
        # The exact path (decode plan 3's flush rows), BV value rows at a time.
        for i_v in range(v_lo, v_hi):
            gdn_decode_flush(p_h, p_v, p_o, q + i_n * stride_q_row + i_h * K, k + i_n * stride_k_row + i_h * K,
                             ring_fk + slot * stride_fk_slot + i_h * RL * K, p_rv,
                             ring_g + slot * stride_g_slot + i_hv * RL, ring_beta + slot * stride_beta_slot + i_hv * RL,
                             b_g, b_beta, wp, org, i_v, scale, K, V, BK, BV, BVF, RL, UNROLL, TREE, SPLIT)
        return

    o_k = tl.arange(0, BK)
    o_j = tl.arange(0, RLB)
    mask_k = o_k < K
    m_j = o_j < wp
    b_ks, b_qs = window_probe(q, k, i_n, i_h, 0, 1, stride_q_row, 0, stride_k_row, 0, scale, o_k, mask_k, K)
    b_kk, b_kq = ring_key_products(ring_kn, slot, org, wp, i_h, stride_kn_slot, b_ks, b_qs, o_k, mask_k, o_j,
                                   K, RL, RLB)
    b_w, b_gtot = history_gate_weights(ring_g, slot, i_hv, stride_g_slot, (org + o_j) % RL, m_j, RL)
    b_wk = b_kk * b_w
    b_wq = b_kq * b_w
    b_dec = tl.exp(b_gtot)
    b_eg = tl.exp(b_g)
    b_c = tl.sum(b_ks * b_qs)
    # The token's ring entries (decode plan 4's writes: the normalised key in the replay form's bits).
    b_kraw = tl.load(k + i_n * stride_k_row + i_h * K + o_k, mask=mask_k, other=0)
    phys = (org + wp) % RL
    gdn_ring_append_gate_keys(ring_g, ring_beta, ring_kn, ring_kraw, stride_g_slot, stride_beta_slot, stride_kn_slot,
                              stride_kraw_slot, slot, phys, i_s, i_hv, i_h, b_g, b_beta,
                              gdn_l2norm_vec(b_kraw.to(tl.float32), TREE), b_kraw, o_k, mask_k, H, HV, K, RL, RAW_K)
    p_d = ring_d + slot * stride_d_slot + i_hv * RL * V
    phys_j = (org + o_j) % RL
    o_b = tl.arange(0, BV)
    NP: tl.constexpr = 16
    if DOT > 0:
        b_kf = b_kraw.to(tl.float32)
        b_qf = tl.load(q + i_n * stride_q_row + i_h * K + o_k, mask=mask_k, other=0).to(tl.float32)
        b_p = _decode_probe_halves(k + i_n * stride_k_row + i_h * K, q + i_n * stride_q_row + i_h * K,
                                   1.0 / tl.sqrt(tl.sum(b_kf * b_kf) + 1e-6),
                                   scale / tl.sqrt(tl.sum(b_qf * b_qf) + 1e-6), K, BK, NP)
    else:
        b_p = b_ks
    if NSTG == 0:
        # Register prefetch: the next tile's checkpoint and `d` loads go out before this tile's
        # products, straight into registers (no shared-memory staging: with Triton's pipeline the
        # tile is read back from shared memory in 16-bit loads, perf.md "Prepared in session 44").
        # The prefetched `d` entries are committed ones (before `wp`), never the `phys` this loop
        # writes, so the order of the loads and stores does not matter.
        o_n = v_lo * BV + o_b  # a program's share is never empty (loop_programs)
        b_h_n, b_ur_n = _tile_and_history(p_h, p_d, o_n, o_n < V, o_k, mask_k, phys_j, m_j, K, V, EVICT, RT, SPLIT,
                                          HALF, DOT)
        for i_v in range(v_lo, v_hi):
            b_h = b_h_n
            b_ur = b_ur_n
            o_n = (i_v + 1) * BV + o_b
            m_n = (o_n < V) & (i_v + 1 < v_hi)
            b_h_n, b_ur_n = _tile_and_history(p_h, p_d, o_n, m_n, o_k, mask_k, phys_j, m_j, K, V, EVICT, RT, SPLIT,
                                              HALF, DOT)
            _decode_tile_outputs(b_h, b_ur, i_v * BV + o_b, p_v, p_o, p_rv, p_d, phys, b_dec, b_ks, b_qs, b_wk, b_wq,
                                 b_beta, b_eg, b_c, V, RT, b_p, DOT, NP)
    else:
        for i_v in tl.range(v_lo, v_hi, num_stages=NSTG):
            o_v = i_v * BV + o_b
            b_h, b_ur = _tile_and_history(p_h, p_d, o_v, o_v < V, o_k, mask_k, phys_j, m_j, K, V, EVICT, RT, SPLIT,
                                           HALF, DOT)
            _decode_tile_outputs(b_h, b_ur, o_v, p_v, p_o, p_rv, p_d, phys, b_dec, b_ks, b_qs, b_wk, b_wq, b_beta,
                                 b_eg, b_c, V, RT, b_p, DOT, NP)
