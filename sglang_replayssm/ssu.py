"""`ssu_dispatch._BACKEND_REGISTRY["replayssm"]`: the selective-state-update entry for
`--mamba-backend replayssm`.

Why it exists: `Scheduler.init_mamba_backend` (scheduler.py L853) resolves
`server_args.mamba_backend` in this registry for *every* model and raises on unknown names, so
the name must be registered even for GDN models (which never call it).

When it is called: only from `MambaMixer2.forward` (mamba.py L704 / L739), i.e. Mamba-2 layers,
once per layer for the decode rows of a batch (a pure decode batch, or the decode part of a mixed
prefill+decode batch) and once per layer for target-verify rows. Prefill/extend rows use
`mamba_chunk_scan_combined` and never reach it. GDN models never call it.

What it does: it forwards every call to
`sglang_replayssm.backends.mamba2:replayssm_selective_state_update`, which runs the ReplaySSM ring
kernels with the context the ReplaySSM Mamba-2 backend sets around `mixer.forward`, and refuses
calls outside that context. There is no delegation to SGLang's Triton SSU: a call the ReplaySSM
backend does not own is an error, never a silent fallback. The backend module is imported at the
first call, so a GDN-only deployment does not need it at scheduler start-up (for Mamba-2 models
the `backend.mamba2` runtime hook already requires it).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from sglang.kernels.ops.mamba.triton_ops.ssu_dispatch import MambaSSUBackend

IMPL = "sglang_replayssm.backends.mamba2:replayssm_selective_state_update"


class ReplaySSMSSUBackend(MambaSSUBackend):
    """Forwards SGLang's selective_state_update calls to the ReplaySSM Mamba-2 backend."""

    def __init__(self, *, enable_stochastic_rounding: bool = False, cache_philox_rounds: int = 0) -> None:
        if enable_stochastic_rounding:
            raise ValueError(
                "--mamba-backend replayssm keeps a float32 SSM state; "
                "--enable-mamba-cache-stochastic-rounding does not apply. Drop it."
            )
        self._impl: Optional[Callable] = None

    @property
    def name(self) -> str:
        return "replayssm"

    def _kernel(self) -> Callable:
        if self._impl is None:
            import pkgutil

            self._impl = pkgutil.resolve_name(IMPL)
        return self._impl

    def __call__(
        self,
        state: torch.Tensor,
        x: torch.Tensor,
        dt: torch.Tensor,
        A: torch.Tensor,
        B: torch.Tensor,
        C: torch.Tensor,
        D: Optional[torch.Tensor] = None,
        z: Optional[torch.Tensor] = None,
        dt_bias: Optional[torch.Tensor] = None,
        dt_softplus: bool = False,
        state_batch_indices: Optional[torch.Tensor] = None,
        pad_slot_id: int = -1,
        out: Optional[torch.Tensor] = None,
        disable_state_update: bool = False,
        intermediate_states_buffer: Optional[torch.Tensor] = None,
        cache_steps: Optional[int] = None,
        retrieve_parent_token: Optional[torch.Tensor] = None,
        intermediate_state_indices: Optional[torch.Tensor] = None,
    ) -> None:
        return self._kernel()(
            state, x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias, dt_softplus=dt_softplus,
            state_batch_indices=state_batch_indices, pad_slot_id=pad_slot_id, out=out,
            disable_state_update=disable_state_update, intermediate_states_buffer=intermediate_states_buffer,
            cache_steps=cache_steps, retrieve_parent_token=retrieve_parent_token,
            intermediate_state_indices=intermediate_state_indices,
        )
