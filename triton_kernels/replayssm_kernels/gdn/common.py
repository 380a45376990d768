"""Device helpers shared by the GDN ReplaySSM kernels.

The two helpers that touch the committed state (`gdn_gate`, `gdn_exact_step`) reproduce the
operation order of SGLang 0.5.17's `fused_sigmoid_gating_delta_rule_update_kernel`:

    g    = -exp(A_log) * softplus(a + dt_bias)      (softplus threshold 20)
    beta = 1 / (1 + exp(-b))                         (fp32)
    k    = k / sqrt(sum(k*k) + 1e-6)
    h   *= exp(g);  v -= sum(h*k, 0);  v *= beta;  h += k v^T

on a `[BK, BV]` state tile with K along axis 0. Do not "simplify" these expressions (reciprocal
multiplies, tl.dot, reordering): the committed state must stay bit-identical to that kernel.
"""

import triton
import triton.language as tl


@triton.jit
def gdn_gate(b_a, b_b, b_A_log, b_dt_bias, softplus_beta, softplus_threshold):
    """Per-token log-decay `g` and write strength `beta` (scalars or vectors, fp32)."""
    x = b_a + b_dt_bias
    beta_x = softplus_beta * x
    softplus_x = tl.where(
        beta_x <= softplus_threshold,
        (1.0 / softplus_beta) * tl.log(1.0 + tl.exp(beta_x)),
        x,
    )
    b_g = -tl.exp(b_A_log) * softplus_x
    b_beta = 1.0 / (1.0 + tl.exp(-b_b))
    return b_g, b_beta


@triton.jit
def gdn_tile_ids(H: tl.constexpr, HV: tl.constexpr, V: tl.constexpr, BV: tl.constexpr):
    """(V tile, row, value head, key head) of a program on grid axis 0 = `cdiv(V, BV) * B * HV`."""
    NV = (V + BV - 1) // BV
    i_v, i_nh = tl.program_id(0) % NV, tl.program_id(0) // NV
    i_n, i_hv = i_nh // HV, i_nh % HV
    return i_v, i_n, i_hv, i_hv // (HV // H)


@triton.jit
def gdn_l2norm(b_x):
    """Division-form L2 normalisation with eps inside the sqrt (SGLang's in-kernel norm)."""
    return b_x / (tl.sqrt(tl.sum(b_x * b_x) + 1e-6))


@triton.jit
def gdn_exact_step(b_h, b_k, b_v, b_g, b_beta):
    """One recurrent step on a `[BK, BV]` fp32 tile.

    `b_k` is the raw (pre-norm) key `[BK]` in fp32, `b_v` the raw value block `[BV]` in fp32.
    Returns the updated tile and the normalised key.
    """
    b_k = gdn_l2norm(b_k)
    b_h *= tl.exp(b_g)
    b_v -= tl.sum(b_h * b_k[:, None], 0)
    b_v *= b_beta
    b_h += b_k[:, None] * b_v[None, :]
    return b_h, b_k


@triton.jit
def _gdn_replay_entry(b_h, p_rk, p_rv, p_rg, p_rb, o_k, o_v, mask_k, mask_v, phys, K: tl.constexpr, V: tl.constexpr):
    b_rk = tl.load(p_rk + phys * K + o_k, mask=mask_k, other=0).to(tl.float32)
    b_rv = tl.load(p_rv + phys * V + o_v, mask=mask_v, other=0).to(tl.float32)
    b_rg = tl.load(p_rg + phys)
    b_rb = tl.load(p_rb + phys)
    b_h, b_rk = gdn_exact_step(b_h, b_rk, b_rv, b_rg, b_rb)
    return b_h


@triton.jit
def gdn_replay(b_h, p_rk, p_rv, p_rg, p_rb, o_k, o_v, mask_k, mask_v, org, n, p_snap, snap_at, mask_h,
               K: tl.constexpr, V: tl.constexpr, RL: tl.constexpr, UNROLL: tl.constexpr, HAS_SNAP: tl.constexpr):
    """Replay ring entries `0..n-1` (physical `(org + j) % RL`) into the `[BK, BVF]` tile, exactly.

    `p_rk` / `p_rv` point at this key / value head's raw-k / raw-v ring row 0 (no column offsets),
    `p_rg` / `p_rb` at its g / beta ring. Whole chunks of `UNROLL` entries are straight-line code
    (their loads need not wait on the state chain); the remainder runs one entry at a time. With
    HAS_SNAP the tile after entry `snap_at - 1` is also stored at `p_snap` (radix track).
    """
    n_main = (n // UNROLL) * UNROLL
    for j0 in range(0, n_main, UNROLL):
        for u in tl.static_range(UNROLL):
            b_h = _gdn_replay_entry(b_h, p_rk, p_rv, p_rg, p_rb, o_k, o_v, mask_k, mask_v, (org + j0 + u) % RL, K, V)
            if HAS_SNAP:
                if j0 + u + 1 == snap_at:
                    tl.store(p_snap, b_h.to(p_snap.dtype.element_ty), mask=mask_h)
    if UNROLL > 1:
        for j in range(n_main, n):
            b_h = _gdn_replay_entry(b_h, p_rk, p_rv, p_rg, p_rb, o_k, o_v, mask_k, mask_v, (org + j) % RL, K, V)
            if HAS_SNAP:
                if j + 1 == snap_at:
                    tl.store(p_snap, b_h.to(p_snap.dtype.element_ty), mask=mask_h)
    return b_h
