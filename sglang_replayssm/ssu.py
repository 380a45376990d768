"""`ssu_dispatch._BACKEND_REGISTRY["replayssm"]`: the selective-state-update entry for
`--mamba-backend replayssm`.

Why it exists: `Scheduler.init_mamba_backend` (scheduler.py L853) resolves
`server_args.mamba_backend` in this registry for *every* model and raises on unknown names, so
the name must be registered even for GDN models (which never call it).

When it is called: only from `MambaMixer2.forward` (mamba.py L704 / L739), i.e. Mamba-2 layers,
for the decode rows of a batch (pure decode, or the decode part of a mixed prefill+decode batch)
and for target-verify rows. Prefill/extend rows use `mamba_chunk_scan_combined`, never the SSU.
Under ReplaySSM the Mamba-2 backend (`sglang_replayssm.backends.mamba2`) owns pure decode and
target verify with the ring kernels, so this entry is reached only for rows the backend hands to
the stock mixer. For those it runs SGLang's Triton SSU, which updates `temporal` in place; that
is correct exactly when the rows' rings are empty (checkpoint materialised), which the backend
must guarantee (flush before delegating). `SGLANG_REPLAYSSM_DEBUG=1` checks it (host sync).

Target verify through this entry is refused: it needs `intermediate_ssm`, which the ReplaySSM
pool does not allocate.
"""

from __future__ import annotations

import os

import torch

from sglang.kernels.ops.mamba.triton_ops.ssu_dispatch import TritonSSUBackend

_DEBUG_ENV = "SGLANG_REPLAYSSM_DEBUG"


class ReplaySSMSSUBackend(TritonSSUBackend):
    """SGLang's Triton SSU for the stock paths, with the ReplaySSM preconditions enforced."""

    @property
    def name(self) -> str:
        return "replayssm (stock rows: triton)"

    def __call__(self, state: torch.Tensor, *args, **kwargs) -> None:
        if kwargs.get("disable_state_update", False):
            raise RuntimeError(
                "--mamba-backend replayssm: a Mamba-2 target-verify batch reached the stock "
                "selective_state_update; ReplaySSM verify must go through the ReplaySSM Mamba-2 "
                "backend (no intermediate_ssm is allocated)."
            )
        if os.environ.get(_DEBUG_ENV, "0") not in ("", "0"):
            _check_rows_flushed(state, kwargs.get("state_batch_indices"))
        return super().__call__(state, *args, **kwargs)


def _check_rows_flushed(state: torch.Tensor, indices) -> None:
    from sglang_replayssm.pool import LIVE_POOLS

    if indices is None:
        return
    for pool in list(LIVE_POOLS):
        temporal = pool.mamba_cache.temporal
        if temporal.untyped_storage().data_ptr() != state.untyped_storage().data_ptr():
            continue
        idx = indices[indices >= 0].long()
        pending = pool.replayssm_wpos[idx]
        if bool((pending != 0).any()):
            raise AssertionError(
                "ReplaySSM: stock SSU called on slots with pending ring entries "
                f"{idx[pending != 0].tolist()}; the backend must flush them first."
            )
