"""`ReplaySSMMamba2AttnBackend`: SGLang's Mamba-2 backend with ReplaySSM decode and verify.

SGLang's `MambaMixer2.forward` keeps doing everything around the SSM (input projection, causal
conv with its per-draft conv windows, mixed prefill+decode batches, gated norm, output
projection); the one SSM call it makes for decode and verify rows goes through
`ssu_dispatch.selective_state_update`, i.e. through the `--mamba-backend` registry. This backend
sets the layer's ReplaySSM context around `mixer.forward`, and the registered `replayssm` SSU
(`sglang_replayssm.ssu`) runs our ring kernels with it:

* decode rows of a decode batch: `mamba2_replay_decode` with this step's row snapshots;
* decode rows inside a mixed prefill+decode batch: the same kernel on the exact path (their rings
  were folded by the batch preparation, so the result is SGLang's recurrence bit for bit);
* target-verify rows: `mamba2_replay_verify` (no `intermediate_ssm`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend

from sglang_replayssm.backends.common import (
    ReplaySSMBatchState,
    ReplaySSMMetadataMixin,
    is_draft_on_replayssm_pool,
    refuse_draft_linear_forward,
    replayssm_pool_of,
)


@dataclass
class Mamba2LayerContext:
    """What the `replayssm` SSU needs for the layer currently running."""

    batch: ReplaySSMBatchState
    rings: object  # Mamba2Rings, one layer
    A: torch.Tensor  # fp32 [NH]
    D: torch.Tensor  # fp32 [NH]
    dt_bias: torch.Tensor  # fp32 [NH]
    mode: str  # "decode" | "verify" | "mixed"

    def decode_rows(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.mode == "decode":
            # The mixer's decode rows are rows 0..n-1 of the batch (no prefill rows). n is smaller
            # than the snapshot when DP attention padded the batch (`_original_batch_size`): the
            # padded rows are slot -1 and the mixer leaves them out.
            row_wp, row_flush = self.batch.row_wp, self.batch.row_flush
            if row_wp is None or row_wp.shape[0] < n:
                raise RuntimeError(f"ReplaySSM: decode snapshot for {None if row_wp is None else row_wp.shape[0]} "
                                   f"rows, SSU called with {n}")
            return row_wp[:n], row_flush[:n]
        return self.batch.exact_rows(n)


_CURRENT: Optional[Mamba2LayerContext] = None


def current_context() -> Optional[Mamba2LayerContext]:
    return _CURRENT


class ReplaySSMMamba2AttnBackend(ReplaySSMMetadataMixin, Mamba2AttnBackend):
    def __init__(self, model_runner):
        super().__init__(model_runner)
        pool = replayssm_pool_of(model_runner, "mamba2")
        self._rssm = ReplaySSMBatchState(pool, self.device) if pool is not None else None
        self._draft_on_pool = is_draft_on_replayssm_pool(model_runner)
        self._params: dict = {}
        if pool is not None:
            # `[Lm, NH]` A and dt_bias of the pool's exact fold (materialize, commit, copy-on-write),
            # filled per layer on the layer's first forward (weights are loaded by then). One pair
            # per pool, shared by every backend built on it (TBO children, adaptive speculative
            # states, PD multiplexing, a draft runner sharing the pool): a second instance must not
            # replace the fold's parameters with buffers that only it fills.
            if pool.replayssm_mamba2_params is None:
                Lm, NH = len(pool.mamba_layer_ids), pool.replayssm_dims["NH"]
                pool.set_replayssm_mamba2_params(
                    torch.zeros(Lm, NH, dtype=torch.float32, device=self.device),
                    torch.zeros(Lm, NH, dtype=torch.float32, device=self.device),
                )
            self._A_all, self._dtb_all = pool.replayssm_mamba2_params

    # -- layers --------------------------------------------------------------------------------
    def _layer_params(self, mixer, layer_id: int):
        p = self._params.get(layer_id)
        if p is None:
            idx = self.req_to_token_pool.mamba_map[layer_id]
            A = mixer.A.detach().float().contiguous()
            D = mixer.D.detach().float().contiguous()
            dtb = mixer.dt_bias.detach().float().contiguous()
            self._A_all[idx].copy_(A)
            self._dtb_all[idx].copy_(dtb)
            p = self._params[layer_id] = (A, D, dtb)
        return p

    def forward(self, mixer, hidden_states, output, layer_id, forward_batch, mup_vector=None,
                use_triton_causal_conv=False):
        if self._draft_on_pool:
            refuse_draft_linear_forward("Mamba-2")
        if self._rssm is None:
            return super().forward(mixer, hidden_states, output, layer_id, forward_batch,
                                   mup_vector=mup_vector, use_triton_causal_conv=use_triton_causal_conv)
        global _CURRENT
        mode = forward_batch.forward_mode
        if mode.is_target_verify():
            if self.forward_metadata.retrieve_parent_token is not None:
                raise RuntimeError("--mamba-backend replayssm verifies linear draft chains only (topk 1)")
            kind = "verify"
        elif mode.is_decode_or_idle():
            kind = "decode"
        else:
            kind = "mixed"
        A, D, dtb = self._layer_params(mixer, layer_id)
        rings = self._rssm.pool.replayssm_layer_rings[self.req_to_token_pool.mamba_map[layer_id]]
        prev = _CURRENT
        _CURRENT = Mamba2LayerContext(self._rssm, rings, A, D, dtb, kind)
        try:
            return super().forward(mixer, hidden_states, output, layer_id, forward_batch,
                                   mup_vector=mup_vector, use_triton_causal_conv=use_triton_causal_conv)
        finally:
            _CURRENT = prev


def replayssm_selective_state_update(
    state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, state_batch_indices=None,
    pad_slot_id=-1, out=None, disable_state_update=False, intermediate_states_buffer=None, cache_steps=None,
    retrieve_parent_token=None, intermediate_state_indices=None,
):
    """The `replayssm` selective-state-update: ring kernels for the layer in `current_context()`."""
    from replayssm_kernels.mamba2 import mamba2_replay_decode, mamba2_replay_verify

    ctx = _CURRENT
    if ctx is None:
        raise RuntimeError(
            "--mamba-backend replayssm: selective_state_update was called outside the ReplaySSM "
            "Mamba-2 attention backend (a model path this plugin does not know); refusing to fall "
            "back to the stock SSU."
        )
    if not dt_softplus or retrieve_parent_token is not None or state_batch_indices is None:
        raise RuntimeError("--mamba-backend replayssm: unsupported selective_state_update call "
                           "(needs dt_softplus, a linear draft chain and state_batch_indices)")
    pool = ctx.batch.pool
    if x.dim() == 3 and not disable_state_update:
        n = x.shape[0]
        row_wp, row_flush = ctx.decode_rows(n)
        mamba2_replay_decode(
            x, dt[..., 0], B, C, ctx.A, ctx.D, ctx.dt_bias, state, ctx.rings, state_batch_indices,
            row_wp, row_flush, pool.replayssm_origin, z=z, out=out.view(x.shape) if out is not None else None,
        )
    elif x.dim() == 4 and disable_state_update and ctx.mode == "verify":
        mamba2_replay_verify(
            x, dt[..., 0], B, C, ctx.A, ctx.D, ctx.dt_bias, state, ctx.rings, state_batch_indices,
            pool.replayssm_wpos, pool.replayssm_origin, z=z, out=out,
        )
    else:
        raise RuntimeError(
            f"--mamba-backend replayssm: unexpected selective_state_update call (x {tuple(x.shape)}, "
            f"disable_state_update={disable_state_update}, mode={ctx.mode})"
        )
