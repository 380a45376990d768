"""Mamba-2 ReplaySSM speculative verify: outputs for `T` drafts from one frozen checkpoint.

Index spaces: history entry `j < wp` (committed, in the ring at `(origin + j) % L`), window
position `s < T` (this verify's drafts, written at `(origin + wp + s) % L`).

With `a = A * softplus(dt + dt_bias)` per entry, `Hs = sum_j a_j` over the history and `c_s` the
inclusive cumsum of the window's `a`, the state after draft `s` is a linear chain from the
checkpoint, so every draft's output is a set of inner products (a causal masked product):

    y_s = exp(Hs + c_s) (S0 . C_s)
        + sum_{j<wp}  dt_j exp(sum_{j<i<wp} a_i + c_s) (B_j . C_s) x_j
        + sum_{t<=s}  dt_t exp(c_s - c_t)              (B_t . C_s) x_t
        + D x_s,      y_s *= z_s sigmoid(z_s)

Per program, one pass over the drafts collects the coefficient matrices `CH[j, s]` (history) and
`CW[t, s]` (window, causal), which do not depend on the P row; then, per chunk of `BM` rows, one
pass collects the checkpoint readouts `SC[s, :]`, the x contributions of all drafts come from one
broadcast-reduce each (`sum_j CH[j, s] x_j`), and the `[T, BM]` output tile is stored at once. Reducing once per program rather than once per draft keeps the
cross-warp reductions (shared memory + barrier) out of the draft loop.

All dot products are fp32 on CUDA cores. The window's raw (x, B, dt) are written into the ring
(x per P-block, dt by P-block 0, B by the first head of each group in P-block 0); the checkpoint
is read only; there is no per-draft state. Rejected drafts are overwritten later.
Grid: `(B * NH * cdiv(P, BM * NC),)`, `NC` (usually 1) chunks of `BM` rows per program.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from .common import mamba2_dt, mamba2_gate, tile_config
from .decode import _check_layer_inputs
from .rings import Mamba2Rings


@triton.jit(do_not_specialize=["T"])
def _mamba2_verify_kernel(
    x, dt, Bm, C, z, A, D, dt_bias, o,
    state, ring_x, ring_B, ring_dt,
    slot_idx, wpos, origin,
    T,
    stride_x_row, stride_x_tok, stride_dt_row, stride_dt_tok, stride_B_row, stride_B_tok,
    stride_C_row, stride_C_tok, stride_z_row, stride_z_tok, stride_o_row, stride_o_tok,
    stride_state_slot, stride_rx_slot, stride_rB_slot, stride_rdt_slot,
    NH: tl.constexpr, P: tl.constexpr, G: tl.constexpr, N: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, RL: tl.constexpr, RLB: tl.constexpr,
    HAS_Z: tl.constexpr, NC: tl.constexpr = 1,
):
    NP = (P + BM * NC - 1) // (BM * NC)
    i_m, i_nh = tl.program_id(0) % NP, tl.program_id(0) // NP
    i_n, i_h = i_nh // NH, i_nh % NH
    i_g = i_h // (NH // G)
    first_of_group = (i_m == 0) & (i_h % (NH // G) == 0)

    o_n = tl.arange(0, BN)
    o_t = tl.arange(0, BT)
    mask_n = o_n < N
    m_t = o_t < T

    i_n64 = i_n.to(tl.int64)
    b_A = tl.load(A + i_h).to(tl.float32)
    b_D = tl.load(D + i_h).to(tl.float32)
    b_bias = tl.load(dt_bias + i_h).to(tl.float32)
    p_x = x + i_n64 * stride_x_row + i_h * P
    p_dt = dt + i_n64 * stride_dt_row + i_h
    p_B = Bm + i_n64 * stride_B_row + i_g * N
    p_C = C + i_n64 * stride_C_row + i_g * N
    p_z = z + i_n64 * stride_z_row + i_h * P
    b_wdt_raw = tl.load(p_dt + o_t * stride_dt_tok, mask=m_t, other=0)
    b_wB_raw = tl.load(
        p_B + o_t[:, None] * stride_B_tok + o_n[None, :], mask=m_t[:, None] & mask_n[None, :], other=0,
    )

    slot = tl.load(slot_idx + i_n).to(tl.int64)
    if slot < 0:
        return
    wp = tl.load(wpos + slot)
    org = tl.load(origin + slot)
    p_s = state + slot * stride_state_slot + i_h * P * N
    o_m = i_m * (BM * NC) + tl.arange(0, BM)
    b_s = tl.load(p_s + o_m[:, None] * N + o_n[None, :], mask=(o_m < P)[:, None] & mask_n[None, :], other=0,
                  eviction_policy="evict_first").to(tl.float32)

    p_rx = ring_x + slot * stride_rx_slot + i_h * RL * P
    p_rB = ring_B + slot * stride_rB_slot + i_g * RL * N
    p_rdt = ring_dt + slot * stride_rdt_slot + i_h * RL
    o_j = tl.arange(0, RLB)
    m_j = o_j < wp
    phys_j = (org + o_j) % RL
    b_hdt = tl.load(p_rdt + phys_j, mask=m_j, other=0)
    b_hdt = tl.where(m_j, mamba2_dt(b_hdt, b_bias), 0.0)
    b_ha = b_hdt * b_A
    b_hsuf = tl.cumsum(b_ha, 0, reverse=True) - b_ha
    b_hsum = tl.sum(b_ha, 0)
    b_hB = tl.load(
        p_rB + phys_j[:, None] * N + o_n[None, :], mask=m_j[:, None] & mask_n[None, :], other=0,
    ).to(tl.float32)

    b_wdt = tl.where(m_t, mamba2_dt(b_wdt_raw, b_bias), 0.0)
    b_wc = tl.cumsum(b_wdt * b_A, 0)
    b_wB = b_wB_raw.to(tl.float32)

    # Per draft s, the coefficient of every ring / window entry (independent of the P row: once
    # per program) and the checkpoint decay.
    b_ch = tl.zeros([RLB, BT], dtype=tl.float32)
    b_cw = tl.zeros([BT, BT], dtype=tl.float32)
    for s in tl.static_range(BT):
        b_C = tl.load(p_C + s * stride_C_tok + o_n, mask=mask_n & (s < T), other=0).to(tl.float32)
        b_cs = tl.sum(tl.where(o_t == s, b_wc, 0.0), 0)
        b_hw = tl.where(m_j, b_hdt * tl.exp(b_hsuf + b_cs), 0.0) * tl.sum(b_hB * b_C[None, :], 1)
        b_ch = tl.where(o_t[None, :] == s, b_hw[:, None], b_ch)
        b_ww = tl.where(o_t <= s, b_wdt * tl.exp(b_cs - b_wc), 0.0) * tl.sum(b_wB * b_C[None, :], 1)
        b_cw = tl.where(o_t[None, :] == s, b_ww[:, None], b_cw)
    b_dec = tl.exp(b_hsum + b_wc)
    phys_t = (org + wp + o_t) % RL

    # The program's NC chunks of BM rows (the next chunk's checkpoint tile loaded first).
    for c in tl.static_range(NC):
        mask_m = o_m < P
        mask_tm = m_t[:, None] & mask_m[None, :]
        if c + 1 < NC:
            o_next = o_m + BM
            b_s_next = tl.load(p_s + o_next[:, None] * N + o_n[None, :],
                               mask=(o_next < P)[:, None] & mask_n[None, :], other=0,
                               eviction_policy="evict_first").to(tl.float32)
        b_wx_raw = tl.load(p_x + o_t[:, None] * stride_x_tok + o_m[None, :], mask=mask_tm, other=0)
        b_wx = b_wx_raw.to(tl.float32)
        b_hx = tl.load(
            p_rx + phys_j[:, None] * P + o_m[None, :], mask=m_j[:, None] & mask_m[None, :], other=0,
        ).to(tl.float32)
        b_sc = tl.zeros([BT, BM], dtype=tl.float32)
        for s in tl.static_range(BT):
            b_C = tl.load(p_C + s * stride_C_tok + o_n, mask=mask_n & (s < T), other=0).to(tl.float32)
            b_sc = tl.where(o_t[:, None] == s, tl.sum(b_s * b_C[None, :], 1)[None, :], b_sc)
        # y[s, m] = dec[s] sc[s, m] + sum_j ch[j, s] xh[j, m] + sum_t cw[t, s] xw[t, m] + D xw[s, m]
        b_y = b_dec[:, None] * b_sc + tl.sum(b_hx[:, None, :] * b_ch[:, :, None], 0)
        b_y += tl.sum(b_wx[:, None, :] * b_cw[:, :, None], 0)
        b_y += b_wx * b_D
        if HAS_Z:
            b_wz = tl.load(p_z + o_t[:, None] * stride_z_tok + o_m[None, :], mask=mask_tm, other=0).to(tl.float32)
            b_y = mamba2_gate(b_y, b_wz, HAS_Z)
        p_o = o + i_n64 * stride_o_row + o_t[:, None] * stride_o_tok + i_h * P + o_m[None, :]
        tl.store(p_o, b_y.to(p_o.dtype.element_ty), mask=mask_tm)
        # The window goes to logical positions wp + t.
        tl.store(p_rx + phys_t[:, None] * P + o_m[None, :], b_wx_raw, mask=mask_tm)
        if c + 1 < NC:
            o_m = o_next
            b_s = b_s_next
    if i_m == 0:
        tl.store(p_rdt + phys_t, b_wdt_raw, mask=m_t)
    if first_of_group:
        tl.store(p_rB + phys_t[:, None] * N + o_n[None, :], b_wB_raw, mask=m_t[:, None] & mask_n[None, :])


def _strides(t: torch.Tensor, shape: tuple, name: str) -> tuple[int, int]:
    """(row, draft) strides of a `[B, T, ...inner]` activation whose inner dims are contiguous."""
    if tuple(t.shape) != shape:
        raise ValueError(f"`{name}` must have shape {shape}, got {tuple(t.shape)}")
    inner = 1
    for d in range(t.dim() - 1, 1, -1):
        if t.shape[d] > 1 and t.stride(d) != inner:
            raise ValueError(f"`{name}` must have contiguous dims after the draft dim")
        inner *= t.shape[d]
    return t.stride(0), t.stride(1)


def mamba2_replay_verify(
    x: torch.Tensor,
    dt: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    A: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    rings: Mamba2Rings,
    slot_idx: torch.Tensor,
    wpos: torch.Tensor,
    origin: torch.Tensor,
    z: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Outputs for every draft of every row; writes the window into the ring.

    Args:
        x (torch.Tensor): `[B, T, NH, P]` post-conv x (activation dtype).
        dt (torch.Tensor): `[B, T, NH]` raw dt, activation dtype.
        B, C (torch.Tensor): `[B, T, G, N]`.
        A, D, dt_bias (torch.Tensor): `[NH]` fp32.
        state (torch.Tensor): `[S, NH, P, N]` fp32 checkpoints, read only.
        rings (Mamba2Rings): one layer's rings; window entries are written at
            `(origin + wpos + s) % L`. The caller guarantees `wpos + T <= L` (commit's early flush).
        slot_idx (torch.Tensor): `[B]` slots, `< 0` = padding (writes nothing).
        wpos, origin (torch.Tensor): `[S]` int32 cursors (not modified).
        z (torch.Tensor, optional): `[B, T, NH, P]` gate.
        out (torch.Tensor, optional): `[B, T, NH, P]` output buffer (inner dims contiguous).

    Returns:
        `[B, T, NH, P]` outputs in the dtype of `x`.
    """
    Bsz, T, NH, P = x.shape
    G, N = B.shape[2], B.shape[3]
    _check_layer_inputs("verify", x, dt, B, A, D, dt_bias, state, rings, NH, P, G, N)
    if T > rings.ring_len:
        raise ValueError(f"{T} drafts do not fit a ring of {rings.ring_len} entries")
    strides = (
        *_strides(x, (Bsz, T, NH, P), "x"), *_strides(dt, (Bsz, T, NH), "dt"),
        *_strides(B, (Bsz, T, G, N), "B"), *_strides(C, (Bsz, T, G, N), "C"),
        *(_strides(z, (Bsz, T, NH, P), "z") if z is not None else (0, 0)),
    )
    if out is None:
        out = torch.empty((Bsz, T, NH, P), dtype=x.dtype, device=x.device)
    strides_o = _strides(out, (Bsz, T, NH, P), "out")
    if Bsz == 0 or T == 0:
        return out
    cfg = tile_config("verify", P, N, Bsz)
    RL = rings.ring_len
    grid = (Bsz * NH * triton.cdiv(P, cfg.rows),)
    _mamba2_verify_kernel[grid](
        x, dt, B, C, z if z is not None else x, A, D, dt_bias, out,
        state, rings.x, rings.B, rings.dt,
        slot_idx, wpos, origin,
        T,
        *strides, *strides_o,
        state.stride(0), rings.x.stride(0), rings.B.stride(0), rings.dt.stride(0),
        NH=NH, P=P, G=G, N=N, BM=cfg.BM, BN=cfg.BN, BT=triton.next_power_of_2(T),
        RL=RL, RLB=triton.next_power_of_2(RL), HAS_Z=z is not None, NC=cfg.NC,
        **cfg.launch,
    )
    return out
