"""Streaming-read ceiling of a recurrent state: what a kernel that only reads the checkpoint once
(and writes one number per row) reaches on this GPU, the bound for a ring decode's non-flush step.
Used by `profile_mamba2_phases.py --ceiling` and `profile_gdn_phases.py --ceiling`."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _read_rows(state, slot_idx, out, ROWS_PER_SLOT: tl.constexpr, R: tl.constexpr, N: tl.constexpr,
               INDIRECT: tl.constexpr):
    """Streaming-read ceiling: each program reads R rows of N fp32 of one slot's state (through the
    slot index when INDIRECT) and stores their row sums."""
    PPS: tl.constexpr = ROWS_PER_SLOT // R
    i_p = tl.program_id(0)
    i_b, i_r = i_p // PPS, i_p % PPS
    if INDIRECT:
        slot = tl.load(slot_idx + i_b).to(tl.int64)
    else:
        slot = i_b.to(tl.int64)
    o_r = i_r * R + tl.arange(0, R)
    o_n = tl.arange(0, N)
    b = tl.load(state + slot * ROWS_PER_SLOT * N + o_r[:, None] * N + o_n[None, :], eviction_policy="evict_first")
    tl.store(out + i_b.to(tl.int64) * ROWS_PER_SLOT + o_r, tl.sum(b, 1))


def read_ceiling(state, slots, t):
    """Time, with `t(name, fn)`, `_read_rows` over the whole `[S, A, R, N]` fp32 state (A x R rows
    of N per slot: Mamba-2 `[NH, P, N]`, GDN `[HV, V, K]`) at several rows per program and warps."""
    B, NH, P, N = state.shape
    out = torch.empty(B * NH * P, device=state.device)
    for R, warps in ((32, 4), (64, 4), (64, 8), (128, 4), (128, 8), (256, 8)):
        if (NH * P) % R:
            continue
        for ind in (0, 1):
            grid = (B * NH * P // R,)
            t(f"read_ceiling_R{R}_w{warps}{'_slot' if ind else ''}", lambda: _read_rows[grid](
                state, slots, out, ROWS_PER_SLOT=NH * P, R=R, N=N, INDIRECT=ind, num_warps=warps))
