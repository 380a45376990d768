"""Mamba-2 ReplaySSM decode: one token per row, output from checkpoint + ring.

Index spaces: ring entry `j < wp` (pending, at physical `(origin + j) % L`), current token `w = wp`.
With `a_i = A * softplus(dt_i + dt_bias)` the per-step log-decay and `S0` the checkpoint, the
state after this token is

    S = exp(sum_{i<=w} a_i) S0 + sum_{j<=w} s_j x_j B_j^T,   s_j = dt_j exp(sum_{j<i<=w} a_i)

so the output needs only the inner products `S0 . C` (one pass over the checkpoint tile) and
`B_j . C` (the B ring is per group):

    y = exp(sum_{i<=w} a_i) (S0 . C) + sum_{j<=w} s_j (B_j . C) x_j + D x,   y *= z sigmoid(z)

A non-flush row never writes the state; it appends the raw (x, B, dt) at logical position `wp`
(x by every program for its P-block, dt by P-block 0, B by the first head of the group in P-block 0).
A flush row replays the pending raw entries and then the token with the baseline's exact
expressions (`common.py`), reads the output like the baseline, and stores the state.
Grid: `(B * NH * cdiv(P, BM * NC),)`, `NC` (usually 1) `[BM, BN]` state tiles per program. With a split plan
(`configs.mamba2_decode_plan`) the flush rows run first in a launch with their own tile, then the
non-flush rows; the two launches touch disjoint rows.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..configs import mamba2_decode_plan, mamba2_replay_unroll, mamba2_ring_bc
from .common import (
    MIN_FLUSH_ROWS,
    mamba2_dt,
    mamba2_exact_output,
    mamba2_exact_step,
    mamba2_gate,
    mamba2_replay,
    make_tile,
    tile_config,
)
from .rings import Mamba2Rings, check_mamba2_rings


@triton.jit
def _chunk_loads(p_s, p_x, p_rx, o_m, o_n, phys_j, m_j, mask_n, P: tl.constexpr, N: tl.constexpr):
    """A non-flush chunk's inputs: its `[BM, BN]` checkpoint tile (fp32, streamed through L2), its
    raw x, and the ring's x entries `[RLB, BM]` (fp32)."""
    mask_m = o_m < P
    b_s = tl.load(p_s + o_m[:, None] * N + o_n[None, :], mask=mask_m[:, None] & mask_n[None, :], other=0,
                  eviction_policy="evict_first").to(tl.float32)
    b_x_raw = tl.load(p_x + o_m, mask=mask_m, other=0)
    b_rx = tl.load(p_rx + phys_j[:, None] * P + o_m[None, :], mask=m_j[:, None] & mask_m[None, :], other=0)
    return b_s, b_x_raw, b_rx.to(tl.float32)


@triton.jit
def _mamba2_ring_bc_kernel(
    C, ring_B, slot_idx, row_wp, row_flush, origin, ring_bc,
    stride_C_tok, stride_rB_slot,
    G: tl.constexpr, N: tl.constexpr, BN: tl.constexpr, RL: tl.constexpr, RLB: tl.constexpr,
):
    """`ring_bc[row, g, j] = B_j . C` for the pending ring entries `j < wp` of a non-flush row
    (group g): the inner products every head of the group needs, once per group."""
    i_n, i_g = tl.program_id(0) // G, tl.program_id(0) % G
    slot = tl.load(slot_idx + i_n).to(tl.int64)
    if slot < 0:
        return
    if tl.load(row_flush + i_n) != 0:
        return
    wp = tl.load(row_wp + i_n)
    org = tl.load(origin + slot)
    o_j = tl.arange(0, RLB)
    m_j = o_j < wp
    o_n = tl.arange(0, BN)
    mask_n = o_n < N
    i_n64 = i_n.to(tl.int64)
    b_C = tl.load(C + i_n64 * stride_C_tok + i_g * N + o_n, mask=mask_n, other=0).to(tl.float32)
    b_rB = tl.load(ring_B + slot * stride_rB_slot + i_g * RL * N + ((org + o_j) % RL)[:, None] * N + o_n[None, :],
                   mask=m_j[:, None] & mask_n[None, :], other=0).to(tl.float32)
    tl.store(ring_bc + (i_n64 * G + i_g) * RLB + o_j, tl.sum(b_rB * b_C[None, :], 1))


@triton.jit
def _mamba2_decode_kernel(
    x, dt, Bm, C, z, A, D, dt_bias, o,
    state, ring_x, ring_B, ring_dt,
    slot_idx, row_wp, row_flush, origin, ring_bc,
    stride_x_tok, stride_dt_tok, stride_B_tok, stride_C_tok, stride_z_tok, stride_o_tok,
    stride_state_slot, stride_rx_slot, stride_rB_slot, stride_rdt_slot,
    NH: tl.constexpr, P: tl.constexpr, G: tl.constexpr, N: tl.constexpr,
    BM: tl.constexpr, BMF: tl.constexpr, BN: tl.constexpr, RL: tl.constexpr, RLB: tl.constexpr,
    HAS_Z: tl.constexpr, UNROLL: tl.constexpr, MODE: tl.constexpr = 0, NC: tl.constexpr = 1,
    RING_BC: tl.constexpr = False,
):
    NP = (P + BM * NC - 1) // (BM * NC)
    i_m, i_nh = tl.program_id(0) % NP, tl.program_id(0) // NP
    i_n, i_h = i_nh // NH, i_nh % NH
    i_g = i_h // (NH // G)

    if MODE == 1:
        # The flush launch of a split plan: most of its programs find a non-flush row, so they
        # leave before any other load.
        if tl.load(row_flush + i_n) == 0:
            return
    o_n = tl.arange(0, BN)
    mask_n = o_n < N

    # Inputs that do not depend on the slot go first, so their latency overlaps the lookup
    # (a padding row loads them for nothing, harmlessly).
    i_n64 = i_n.to(tl.int64)
    b_B_raw = tl.load(Bm + i_n64 * stride_B_tok + i_g * N + o_n, mask=mask_n, other=0)
    b_dt_raw = tl.load(dt + i_n64 * stride_dt_tok + i_h)
    b_C = tl.load(C + i_n64 * stride_C_tok + i_g * N + o_n, mask=mask_n, other=0).to(tl.float32)
    b_A = tl.load(A + i_h).to(tl.float32)
    b_D = tl.load(D + i_h).to(tl.float32)
    b_bias = tl.load(dt_bias + i_h).to(tl.float32)
    p_x = x + i_n64 * stride_x_tok + i_h * P
    p_z = z + i_n64 * stride_z_tok + i_h * P
    p_o = o + i_n64 * stride_o_tok + i_h * P
    wp = tl.load(row_wp + i_n)
    flush = tl.load(row_flush + i_n)

    slot = tl.load(slot_idx + i_n).to(tl.int64)
    if slot < 0:
        return
    # MODE 1 (flush rows only) left above; MODE 2: non-flush rows only (the split plan's two launches).
    if MODE == 2:
        if flush != 0:
            return
    org = tl.load(origin + slot)
    b_B = b_B_raw.to(tl.float32)
    b_dt = mamba2_dt(b_dt_raw, b_bias)
    p_s = state + slot * stride_state_slot + i_h * P * N
    p_rx = ring_x + slot * stride_rx_slot + i_h * RL * P
    p_rB = ring_B + slot * stride_rB_slot + i_g * RL * N
    p_rdt = ring_dt + slot * stride_rdt_slot + i_h * RL
    if flush != 0:
        # Exact replay of the pending raw entries, then of this token, then the baseline's
        # readout; over the program's BM * NC rows in sub-tiles of BMF rows (independent of the
        # chunks), so that this branch does not set the register budget of the (much more
        # frequent) non-flush branch.
        for i_f in range(0, BM * NC, BMF):
            o_f = i_m * (BM * NC) + i_f + tl.arange(0, BMF)
            mask_f = (o_f < P) & (i_f + tl.arange(0, BMF) < BM * NC)
            mask_fs = mask_f[:, None] & mask_n[None, :]
            p_sf = p_s + o_f[:, None] * N + o_n[None, :]
            b_s = tl.load(p_sf, mask=mask_fs, other=0).to(tl.float32)
            b_s = mamba2_replay(b_s, p_rx, p_rB, p_rdt, o_f, o_n, mask_f, mask_n, org, 0, wp, b_A, b_bias,
                                P, N, RL, UNROLL)
            b_x = tl.load(p_x + o_f, mask=mask_f, other=0).to(tl.float32)
            if HAS_Z:
                b_z = tl.load(p_z + o_f, mask=mask_f, other=0).to(tl.float32)
            else:
                b_z = b_x
            b_s = mamba2_exact_step(b_s, b_x, b_B, b_dt, b_A)
            b_y = mamba2_exact_output(b_s, b_C, b_x, b_D, b_z, HAS_Z)
            tl.store(p_o + o_f, b_y.to(p_o.dtype.element_ty), mask=mask_f)
            tl.store(p_sf, b_s.to(p_sf.dtype.element_ty), mask=mask_fs)
    else:
        # The first chunk's loads go out before the ring coefficients (computed once per program:
        # they do not depend on the P row), so their latencies overlap; then the program's NC
        # chunks of BM rows, each loading the next chunk's tiles before its own arithmetic.
        o_j = tl.arange(0, RLB)
        m_j = o_j < wp
        phys_j = (org + o_j) % RL
        o_m = i_m * (BM * NC) + tl.arange(0, BM)
        b_s, b_x_raw, b_rx = _chunk_loads(p_s, p_x, p_rx, o_m, o_n, phys_j, m_j, mask_n, P, N)
        b_rdt = tl.load(p_rdt + phys_j, mask=m_j, other=0)
        if RING_BC:
            # B_j . C of this row's group, from `_mamba2_ring_bc_kernel` (one program per group
            # instead of one ring-B pass per head and P-tile).
            b_bc = tl.load(ring_bc + (i_n64 * G + i_g) * RLB + o_j, mask=m_j, other=0)
        else:
            b_rB = tl.load(
                p_rB + phys_j[:, None] * N + o_n[None, :], mask=m_j[:, None] & mask_n[None, :], other=0,
            ).to(tl.float32)
            b_bc = tl.sum(b_rB * b_C[None, :], 1)
        b_rdt = tl.where(m_j, mamba2_dt(b_rdt, b_bias), 0.0)
        b_ra = b_rdt * b_A
        b_a = b_dt * b_A
        # Decay from entry j to the token: sum_{j<i<wp} a_i + a_w (suffix sums, not differences
        # of a total, so recent entries keep full relative precision).
        b_suffix = tl.cumsum(b_ra, 0, reverse=True) - b_ra + b_a
        b_w = tl.where(m_j, b_rdt * tl.exp(b_suffix), 0.0)
        b_dec = tl.exp(tl.sum(b_ra, 0) + b_a)
        b_wbc = b_w * b_bc
        b_cur = b_dt * tl.sum(b_B * b_C, 0)
        phys = (org + wp) % RL
        for c in tl.static_range(NC):
            mask_m = o_m < P
            if c + 1 < NC:
                o_next = o_m + BM
                b_s_next, b_x_next, b_rx_next = _chunk_loads(p_s, p_x, p_rx, o_next, o_n, phys_j, m_j, mask_n, P, N)
            b_x = b_x_raw.to(tl.float32)
            b_sc = tl.sum(b_s * b_C[None, :], 1)
            b_hist = tl.sum(b_rx * b_wbc[:, None], 0)
            b_y = b_dec * b_sc + b_hist + b_cur * b_x + b_x * b_D
            if HAS_Z:
                b_y = mamba2_gate(b_y, tl.load(p_z + o_m, mask=mask_m, other=0).to(tl.float32), HAS_Z)
            tl.store(p_o + o_m, b_y.to(p_o.dtype.element_ty), mask=mask_m)
            # Append this token at logical position wp.
            tl.store(p_rx + phys * P + o_m, b_x_raw, mask=mask_m)
            if c + 1 < NC:
                o_m = o_next
                b_s, b_x_raw, b_rx = b_s_next, b_x_next, b_rx_next
        if i_m == 0:
            tl.store(p_rdt + phys, b_dt_raw)
            if i_h % (NH // G) == 0:
                tl.store(p_rB + phys * N + o_n, b_B_raw, mask=mask_n)


def _tok_stride(t: torch.Tensor, shape: tuple, name: str) -> int:
    """Token stride of a `[B, ...inner]` activation whose inner dims are contiguous."""
    if tuple(t.shape) != shape:
        raise ValueError(f"`{name}` must have shape {shape}, got {tuple(t.shape)}")
    inner = 1
    for d in range(t.dim() - 1, 0, -1):
        if t.shape[d] > 1 and t.stride(d) != inner:
            raise ValueError(f"`{name}` must have contiguous dims after the token dim")
        inner *= t.shape[d]
    return t.stride(0)


def _check_params(A, D, dt_bias, NH):
    for name, t in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        if tuple(t.shape) != (NH,) or t.stride(0) != 1 or t.dtype != torch.float32:
            raise ValueError(f"`{name}` must be a contiguous fp32 [{NH}] tensor, got {t.dtype} {tuple(t.shape)}")


def _check_state(state: torch.Tensor, NH: int, P: int, N: int) -> None:
    if state.dtype != torch.float32 or state.dim() != 4 or tuple(state.shape[1:]) != (NH, P, N):
        raise ValueError(f"state must be fp32 [S, {NH}, {P}, {N}], got {state.dtype} {tuple(state.shape)}")
    if state.shape[0] > 0 and state[0].stride() != (P * N, N, 1):
        raise ValueError("state must be contiguous after the slot dimension")


def _check_layer_inputs(op: str, x, dt, B, A, D, dt_bias, state, rings, NH: int, P: int, G: int, N: int) -> None:
    """The checks decode and verify share: head and group counts, the checkpoint, the parameters, and
    one layer's rings in the activation dtype of `x`, `dt` and `B`."""
    if NH % G != 0:
        raise ValueError(f"num_heads={NH} must be a multiple of num_groups={G}")
    _check_state(state, NH, P, N)
    _check_params(A, D, dt_bias, NH)
    check_mamba2_rings(rings, NH, P, G, N)
    if not rings.per_layer:
        raise ValueError(f"{op} takes one layer's rings (`rings.layer(i)`)")
    for name, t in (("x", x), ("dt", dt), ("B", B)):
        if t.dtype != rings.dtype:
            raise ValueError(f"`{name}` is {t.dtype}; the rings hold the activation dtype {rings.dtype}")


def mamba2_replay_decode(
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
    row_wp: torch.Tensor,
    row_flush: torch.Tensor,
    origin: torch.Tensor,
    z: Optional[torch.Tensor] = None,
    out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One Mamba-2 decode step for every row (`dt_softplus=True`, head dim tied).

    Args:
        x (torch.Tensor): `[B, NH, P]` post-conv x (activation dtype).
        dt (torch.Tensor): `[B, NH]` raw dt (before bias and softplus), activation dtype.
        B, C (torch.Tensor): `[B, G, N]` post-conv B and C.
        A, D, dt_bias (torch.Tensor): `[NH]` fp32.
        state (torch.Tensor): `[S, NH, P, N]` fp32 checkpoints; written only by flush rows.
        rings (Mamba2Rings): one layer's rings (`[S, ...]`), activation dtype; appended to by
            non-flush rows.
        slot_idx (torch.Tensor): `[B]` slot per row, `< 0` = padding (writes nothing, output included).
        row_wp, row_flush (torch.Tensor): `[B]` int32 from `decode_prepare`.
        origin (torch.Tensor): `[S]` int32 ring origins.
        z (torch.Tensor, optional): `[B, NH, P]` gate; `y *= z * sigmoid(z)`.
        out (torch.Tensor, optional): `[B, NH, P]` output buffer (inner dims contiguous).

    Returns:
        `[B, NH, P]` outputs in the dtype of `x`.
    """
    Bsz, NH, P = x.shape
    G, N = B.shape[1], B.shape[2]
    _check_layer_inputs("decode", x, dt, B, A, D, dt_bias, state, rings, NH, P, G, N)
    strides = (
        _tok_stride(x, (Bsz, NH, P), "x"), _tok_stride(dt, (Bsz, NH), "dt"),
        _tok_stride(B, (Bsz, G, N), "B"), _tok_stride(C, (Bsz, G, N), "C"),
        _tok_stride(z, (Bsz, NH, P), "z") if z is not None else 0,
    )
    if out is None:
        out = torch.empty((Bsz, NH, P), dtype=x.dtype, device=x.device)
    stride_o = _tok_stride(out, (Bsz, NH, P), "out")
    if Bsz == 0:
        return out
    RLB = triton.next_power_of_2(rings.ring_len)
    ring_bc = None
    if mamba2_ring_bc(Bsz):
        ring_bc = torch.empty(Bsz * G * RLB, dtype=torch.float32, device=x.device)
        _mamba2_ring_bc_kernel[(Bsz * G,)](
            C, rings.B, slot_idx, row_wp, row_flush, origin, ring_bc, strides[3], rings.B.stride(0),
            G=G, N=N, BN=triton.next_power_of_2(N), RL=rings.ring_len, RLB=RLB, num_warps=4,
        )
    for mode, tile in decode_launches(P, N, Bsz):
        _mamba2_decode_kernel[(Bsz * NH * triton.cdiv(P, tile.rows),)](
            x, dt, B, C, z if z is not None else x, A, D, dt_bias, out,
            state, rings.x, rings.B, rings.dt,
            slot_idx, row_wp, row_flush, origin, ring_bc if ring_bc is not None else state,
            *strides, stride_o,
            state.stride(0), rings.x.stride(0), rings.B.stride(0), rings.dt.stride(0),
            NH=NH, P=P, G=G, N=N, BM=tile.BM, BMF=tile.BMF, BN=tile.BN, RL=rings.ring_len, RLB=RLB,
            HAS_Z=z is not None, UNROLL=mamba2_replay_unroll(), MODE=mode, NC=tile.NC, RING_BC=ring_bc is not None,
            **tile.launch,
        )
    return out


def decode_launches(P: int, N: int, rows: int) -> list:
    """`(MODE, TileConfig)` of each launch of a decode step of `rows` rows: `[(0, tile)]` for the
    one-launch plan, `[(1, flush tile), (2, tile)]` for a split plan (`configs.mamba2_decode_plan`)."""
    cfg = tile_config("decode", P, N, rows)
    split, f_bm, f_warps, f_stages = mamba2_decode_plan()
    if not split:
        return [(0, cfg)]
    if f_bm < MIN_FLUSH_ROWS:
        raise ValueError(
            f"Mamba-2 split decode plan: the flush launch needs at least {MIN_FLUSH_ROWS} rows per tile "
            f"(got {f_bm}; smaller flush tiles were not bit-exact on the H200); fix mamba2_decode= in "
            "REPLAYSSM_CONFIG or unset it")
    return [(1, make_tile(f_bm, f_bm, f_warps, f_stages, P, N)), (2, cfg)]

