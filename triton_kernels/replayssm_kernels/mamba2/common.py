"""Device helpers and launch configuration shared by the Mamba-2 ReplaySSM kernels.

The helpers that touch the committed state reproduce SGLang 0.5.17's `_selective_scan_update_kernel`
(`dt_softplus=True`, tied head dim) operation for operation:

    dt = softplus(float(dt_raw) + dt_bias)        (threshold 20: log(exp(dt) + 1) below, dt above)
    dA = exp(A * dt);  dB = B * dt
    S  = fma(S, dA, dB * x[:, None])              (the baseline's `S * dA + dB * x` as compiled)
    y  = sum(S * C[None, :], axis=1);  y += x * D;  y *= z * sigmoid(z)

The update is elementwise over the tile, so any P-tile gives the same bits. The readout reduces
along N; it matches the baseline's bits when the N axis is laid out the same way (see
`tile_config`). Do not "simplify" these expressions (log1p, reciprocal multiplies, tl.dot,
reordering, letting the compiler pick the fma).
"""

from __future__ import annotations

from dataclasses import dataclass

import triton
import triton.language as tl


@triton.jit
def mamba2_dt(b_dt_raw, b_dt_bias):
    """Post-softplus step size from the raw dt (any dtype) and the fp32 bias; scalar or vector."""
    b_dt = b_dt_raw.to(tl.float32)
    b_dt += b_dt_bias
    b_dt = tl.where(b_dt <= 20.0, tl.math.log(tl.math.exp(b_dt) + 1), b_dt)
    return b_dt


@triton.jit
def mamba2_exact_step(b_s, b_x, b_B, b_dt, b_A):
    """One recurrent step on a `[BM, BN]` fp32 tile; `b_x` `[BM]`, `b_B` `[BN]` fp32, `b_dt` the
    post-softplus step (scalar), `b_A` scalar.

    The baseline writes `state * dA + dB * x` and LLVM contracts it to `fma(state, dA, dB * x)`
    (checked in its PTX for every (N, z) variant it compiles). Which product gets fused is an
    LLVM operand-ranking accident that differs from kernel to kernel, so the fma is spelled out.
    The interpreter evaluates `tl.fma` as `a * b + c`, which is again what the baseline computes there.
    """
    b_dA = tl.exp(b_A * b_dt)
    b_dB = b_B * b_dt
    return tl.fma(b_s, b_dA, b_dB * b_x[:, None])


@triton.jit
def _replay_entry(b_s, p_x, p_B, p_dt, o_m, o_n, mask_m, mask_n, phys, b_A, b_bias,
                  P: tl.constexpr, N: tl.constexpr):
    b_x = tl.load(p_x + phys * P + o_m, mask=mask_m, other=0).to(tl.float32)
    b_B = tl.load(p_B + phys * N + o_n, mask=mask_n, other=0).to(tl.float32)
    b_dt = mamba2_dt(tl.load(p_dt + phys), b_bias)
    return mamba2_exact_step(b_s, b_x, b_B, b_dt, b_A)


@triton.jit
def mamba2_replay(b_s, p_x, p_B, p_dt, o_m, o_n, mask_m, mask_n, org, j_start, n, b_A, b_bias,
                  P: tl.constexpr, N: tl.constexpr, RL: tl.constexpr, UNROLL: tl.constexpr):
    """Replay ring entries `j_start..n-1` (physical `(org + j) % RL`) into the tile, exactly.

    `p_x`, `p_B`, `p_dt` point at this head's (group's) ring row 0. Whole chunks of `UNROLL`
    entries are straight-line code, so a chunk's loads and softplus need not wait on the state
    chain; the remainder runs one entry at a time.
    """
    n_main = j_start + ((n - j_start) // UNROLL) * UNROLL
    for j0 in range(j_start, n_main, UNROLL):
        for u in tl.static_range(UNROLL):
            b_s = _replay_entry(b_s, p_x, p_B, p_dt, o_m, o_n, mask_m, mask_n, (org + j0 + u) % RL,
                                b_A, b_bias, P, N)
    if UNROLL > 1:
        for j in range(n_main, n):
            b_s = _replay_entry(b_s, p_x, p_B, p_dt, o_m, o_n, mask_m, mask_n, (org + j) % RL,
                                b_A, b_bias, P, N)
    return b_s


@triton.jit
def mamba2_exact_output(b_s, b_C, b_x, b_D, b_z, HAS_Z: tl.constexpr):
    """The baseline's output readout from the (replayed) state tile."""
    b_y = tl.sum(b_s * b_C[None, :], axis=1)
    b_y += b_x * b_D
    if HAS_Z:
        b_y *= b_z * tl.sigmoid(b_z)
    return b_y


@triton.jit
def mamba2_gate(b_y, b_z, HAS_Z: tl.constexpr):
    if HAS_Z:
        b_y *= b_z * tl.sigmoid(b_z)
    return b_y


# -- launch configuration ---------------------------------------------------------------------
#
# One table for every per-config choice, so that a GPU sweep can retune it in one place.
# Keys: kernel -> list of (max BN, BM, BMF, num_warps, num_stages); the first row with
# BN <= max BN wins. BMF is the decode flush branch's sub-tile (rows replayed at a time): keeping it
# small keeps that rare branch from setting the register budget of the non-flush branch.
#
# Rules that `tile_config` enforces on top of the table:
# * BN = next_pow2(N), the whole state row in one program, and at least 4 fp32 per thread
#   (BM * BN >= 4 * 32 * num_warps, BMF too). Triton then lays the tile out as the baseline lays out
#   its own (4 consecutive N per thread, min(32, BN/4) lanes along N, the rest along P), so the
#   flush readout `sum(S * C, axis=1)` reduces in the same order and the decode flush output is
#   bit-identical to the baseline's. (State updates are elementwise: any tile is exact.)
# * BM is a power of two, at most next_pow2(P), halved while more than a quarter of the padded
#   P rows would be masked (P = 80 -> BM 32).
# * dot products stay on fp32 CUDA cores (no tl.dot / tf32).
#
# Values: a first sweep on one H200 (triton 3.6, torch 2.11, 2026-11-30; NH=128 P=64 N=128 G=8,
# B=256, L=16, T=4, bf16 activations; SGLang's SSU decode 719 us = 2.99 TB/s). Decode BM 64 / BMF
# 32 / 4 warps: non-flush rows 280-315 us (state read 3.4-3.7 TB/s), all rows flushing ~1160 us,
# (15 * non-flush + flush) / 16 ~ 345-370 us = 1.95-2.09x across runs; stages 1/2/3 equal.
# BM 32: 1.7x; BM 16: 1.1x; 8 warps: 1.1-1.7x; BMF 16: 1.85x, BMF 64: 1.66x. Verify BM 64:
# ~555 us (BM 32: 625, BM 16: 1000); one verify + commit_prepare + fold step ~775 us against
# ~2475 us for SSU verify with intermediate states (~1945) + scatter (531): 3.2x. Fold BM 32 ~ 64.
_TILE_TABLE = {
    #            max BN,  BM, BMF, warps, stages
    "decode": [(1 << 30, 64, 32, 4, 2)],
    "verify": [(1 << 30, 64, 16, 4, 2)],
    "fold": [(1 << 30, 32, 16, 4, 2)],
}
# Rows of a decode flush sub-tile, at least. On the H200 (2026-12-01, docs/perf.md) every plan whose
# flush readout ran on 16-row tiles (4 or 2 warps, N=128) gave flush outputs that differed from
# SGLang's SSU in the last bit (state still bit-exact); 32-row tiles (4 or 8 warps) matched. The
# CPU interpreter cannot see this (no layouts there).
MIN_FLUSH_ROWS = 32


@dataclass(frozen=True)
class TileConfig:
    BM: int
    BMF: int
    BN: int
    num_warps: int
    num_stages: int
    NC: int = 1  # P-chunks of BM rows per program (decode and verify): a program covers BM * NC rows

    @property
    def rows(self) -> int:
        return self.BM * self.NC

    @property
    def launch(self) -> dict:
        return {"num_warps": self.num_warps, "num_stages": self.num_stages}


def tile_config(kernel: str, P: int, N: int, rows: int | None = None) -> TileConfig:
    """Tile of one program (`BM` rows of P, all `BN = next_pow2(N)` columns) and launch options;
    `NC` chunks of such tiles per program where `configs.mamba2_tile` asks for it (a launch of
    `rows` rows: large decode / verify batches)."""
    from ..configs import mamba2_tile

    plan = mamba2_tile(kernel, P, N, rows) if kernel in ("decode", "verify") else None
    BN = triton.next_power_of_2(N)
    for max_bn, BM, BMF, warps, stages in _TILE_TABLE[kernel]:
        if BN <= max_bn:
            break
    if plan is not None:
        bm, nc, warps = plan
        return chunked_tile(bm, nc, BMF, warps, stages, P, N)
    return make_tile(BM, BMF, warps, stages, P, N)


def _min_rows(warps: int, BN: int) -> int:
    """Fewest rows of a `[rows, BN]` fp32 tile that give every thread at least 4 elements."""
    return max(1, (4 * 32 * warps) // BN)


def make_tile(BM: int, BMF: int, warps: int, stages: int, P: int, N: int) -> TileConfig:
    """A requested tile, adjusted by the rules above (whole N row, >= 4 fp32 per thread, power-of-two BM
    shrunk while P padding exceeds a quarter)."""
    BN = triton.next_power_of_2(N)
    min_bm = _min_rows(warps, BN)
    BM = max(min(BM, triton.next_power_of_2(P)), min_bm)
    while BM // 2 >= min_bm and 4 * (triton.cdiv(P, BM) * BM - P) > triton.cdiv(P, BM) * BM:
        BM //= 2
    BMF = min(BM, max(BMF, min_bm))
    return TileConfig(BM=BM, BMF=BMF, BN=BN, num_warps=warps, num_stages=stages)


def chunked_tile(BM: int, NC: int, BMF: int, warps: int, stages: int, P: int, N: int) -> TileConfig:
    """A program of `NC` chunks of `BM` rows (power of two, at least 4 fp32 per thread), for heads whose
    P is not a power of two: P = 80 as 5 x 16 rows is one program per head with no padded rows and
    one pass over the ring's B . C per head instead of one per 32-row tile. `NC` is capped at the
    chunks P needs. The decode's flush branch walks the program's rows in sub-tiles of
    `BMF >= MIN_FLUSH_ROWS` rows, independent of the chunks."""
    BN = triton.next_power_of_2(N)
    min_bm = _min_rows(warps, BN)
    if BM < min_bm or BM & (BM - 1):
        raise ValueError(f"Mamba-2 chunked tile: BM={BM} must be a power of two >= {min_bm} for {warps} warps "
                         f"and N={N}; fix mamba2_decode_tile / mamba2_verify_tile in REPLAYSSM_CONFIG or unset it")
    NC = max(1, min(NC, triton.cdiv(P, BM)))
    return TileConfig(BM=BM, BMF=max(BMF, MIN_FLUSH_ROWS, min_bm), BN=BN, num_warps=warps, num_stages=stages, NC=NC)
