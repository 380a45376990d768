"""Reference Mamba-2 recurrence: a per-token loop in torch (fp64 by default).

    dt_t = softplus(dt_raw_t + dt_bias)   (identity above 20),   a_t = exp(A dt_t)
    S_t  = a_t S_{t-1} + dt_t x_t B_t^T,  y_t = S_t C_t + D x_t,   y_t *= z_t sigmoid(z_t) (if z)

Shapes: x `[B, T, NH, P]`; dt `[B, T, NH]`; B, C `[B, T, G, N]`; z `[B, T, NH, P]`;
A, D, dt_bias `[NH]`; state `[B, NH, P, N]`. Head `h` reads group `h // (NH // G)`.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F


def mamba2_dt_ref(dt: torch.Tensor, dt_bias: torch.Tensor, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    v = dt.to(dtype) + dt_bias.to(dtype)
    return torch.where(v <= 20.0, F.softplus(v, threshold=1e9), v)


def mamba2_recurrent_ref(
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    z: Optional[torch.Tensor] = None,
    dtype: torch.dtype = torch.float64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return `(y [B, T, NH, P], final state [B, NH, P, N])`, both in `dtype`."""
    Bsz, T, NH, P = x.shape
    G = B.shape[2]
    rep = NH // G
    S = state.to(dtype).clone()
    d = mamba2_dt_ref(dt, dt_bias, dtype)                      # [B, T, NH]
    decay = torch.exp(A.to(dtype) * d)                          # [B, T, NH]
    Bh = B.to(dtype).repeat_interleave(rep, dim=2)              # [B, T, NH, N]
    Ch = C.to(dtype).repeat_interleave(rep, dim=2)
    xx = x.to(dtype)
    Dd = D.to(dtype)
    y = torch.empty(Bsz, T, NH, P, dtype=dtype, device=x.device)
    for t in range(T):
        S = S * decay[:, t, :, None, None] + (d[:, t, :, None] * xx[:, t])[..., None] * Bh[:, t, :, None, :]
        yt = torch.einsum("bhpn,bhn->bhp", S, Ch[:, t]) + Dd[:, None] * xx[:, t]
        if z is not None:
            zt = z[:, t].to(dtype)
            yt = yt * zt * torch.sigmoid(zt)
        y[:, t] = yt
    return y, S
