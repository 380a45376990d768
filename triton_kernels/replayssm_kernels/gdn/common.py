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
