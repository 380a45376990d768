"""Reference GDN recurrence: a per-token loop in torch (fp64 by default).

    g = -exp(A_log) softplus(a + dt_bias),  beta = sigmoid(b),  alpha = exp(g)
    k, q L2-normalised (eps 1e-6 inside the sqrt), q scaled by `scale`
    S_t = alpha S_{t-1} + beta (v - alpha S_{t-1} k) k^T,    o_t = S_t q

Shapes: q, k `[B, T, H, K]`; v `[B, T, HV, V]`; a, b `[B, T, HV]`; state `[B, HV, V, K]`.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def gdn_gate_ref(a, b, A_log, dt_bias, dtype=torch.float64):
    x = a.to(dtype) + dt_bias.to(dtype)
    sp = torch.where(x <= 20.0, F.softplus(x, threshold=1e9), x)
    g = -torch.exp(A_log.to(dtype)) * sp
    beta = torch.sigmoid(b.to(dtype))
    return g, beta


def gdn_recurrent_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    scale: Optional[float] = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(o [B, T, HV, V], final state [B, HV, V, K])`, both in `dtype`."""
    B, T, H, K = k.shape
    HV, V = v.shape[-2:]
    if scale is None:
        scale = K ** -0.5
    rep = HV // H
    S = state.to(dtype).clone()
    g, beta = gdn_gate_ref(a, b, A_log, dt_bias, dtype)
    qn = q.to(dtype)
    kn = k.to(dtype)
    qn = qn / torch.sqrt((qn * qn).sum(-1, keepdim=True) + 1e-6) * scale
    kn = kn / torch.sqrt((kn * kn).sum(-1, keepdim=True) + 1e-6)
    qn = qn.repeat_interleave(rep, dim=2)
    kn = kn.repeat_interleave(rep, dim=2)
    vv = v.to(dtype)
    out = torch.empty(B, T, HV, V, dtype=dtype, device=v.device)
    for t in range(T):
        alpha = torch.exp(g[:, t])[..., None, None]
        S = S * alpha
        kt = kn[:, t]
        u = beta[:, t][..., None] * (vv[:, t] - torch.einsum("bhvk,bhk->bhv", S, kt))
        S = S + u[..., :, None] * kt[..., None, :]
        out[:, t] = torch.einsum("bhvk,bhk->bhv", S, qn[:, t])
    return out, S
