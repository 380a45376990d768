"""`ReplaySSMGDNAttnBackend`: SGLang's GDN backend with ReplaySSM decode and target verify.

Installed in place of `gdn_backend.GDNAttnBackend` (class REPLACE) only in processes serving
`--mamba-backend replayssm`. Without a ReplaySSM pool every method is the parent's.

* decode: causal conv update (SGLang's), then `gdn_replay_decode` on the layer's rings; batches
  below `configs.ring_min_batch("gdn")` rows run the parent's decode on folded checkpoints;
* target verify: causal conv update with SGLang's per-draft conv windows (conv rollback is
  unchanged), then `gdn_replay_verify`; no `intermediate_ssm`;
* prefill / extend: SGLang's chunked kernels, after the batch's pending entries are folded
  (`ReplaySSMBatchState.prepare`).
"""

from __future__ import annotations

import torch

from sglang.kernels.ops.mamba.causal_conv1d_triton import causal_conv1d_update
from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

from replayssm_kernels.gdn import gdn_replay_decode, gdn_replay_verify
from replayssm_kernels.gdn.ckpt import split_ckpt_convert
from sglang_replayssm.backends.common import (
    ReplaySSMBatchState,
    ReplaySSMMetadataMixin,
    is_draft_on_replayssm_pool,
    refuse_draft_linear_forward,
    replayssm_pool_of,
)


class ReplaySSMGDNAttnBackend(ReplaySSMMetadataMixin, GDNAttnBackend):
    def __init__(self, model_runner):
        super().__init__(model_runner)
        pool = replayssm_pool_of(model_runner, "gdn")
        self._rssm = ReplaySSMBatchState(pool, self.device) if pool is not None else None
        self._draft_on_pool = is_draft_on_replayssm_pool(model_runner)

    # -- layers --------------------------------------------------------------------------------
    def _layer(self, layer_id: int):
        cache = self.req_to_token_pool.mamba2_layer_cache(layer_id)
        rings = self._rssm.pool.replayssm_layer_rings[self.req_to_token_pool.mamba_map[layer_id]]
        return cache, rings

    def forward_decode(self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
        if self._draft_on_pool:
            refuse_draft_linear_forward("GDN")
        if self._rssm is None or self._rssm.decode_stock:
            # Stock path, or a decode batch below configs.ring_min_batch("gdn"): SGLang's kernel
            # on checkpoints that `prepare` folded (every ring empty).
            return super().forward_decode(layer, forward_batch, mixed_qkv, a, b, **kwargs)
        cache, rings = self._layer(layer.layer_id)
        conv_states, ssm_states = cache.conv[0], cache.temporal
        cache_indices = self.forward_metadata.mamba_cache_indices
        mixed_qkv = causal_conv1d_update(
            mixed_qkv, conv_states, layer.conv_weights, layer.bias, layer.activation,
            conv_state_indices=cache_indices,
        )
        bs = mixed_qkv.shape[0]
        H, HV, K, V = layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim
        q = mixed_qkv[:, : layer.q_dim].view(bs, H, K)
        k = mixed_qkv[:, layer.q_dim: layer.q_dim + layer.k_dim].view(bs, H, K)
        v = mixed_qkv[:, layer.q_dim + layer.k_dim:].view(bs, HV, V)
        out = gdn_replay_decode(
            q, k, v, a.reshape(bs, HV), b.reshape(bs, HV), layer.A_log, layer.dt_bias, ssm_states, rings,
            cache_indices, self._rssm.row_wp, self._rssm.row_flush, self._rssm.pool.replayssm_origin,
            scale=K ** -0.5, row_order=self._rssm.row_order, split_ckpt=self._rssm.split_ckpt,
            flush_index=self._rssm.flush_index,
        )
        self._track_mamba_state_decode(forward_batch, conv_states, ssm_states, cache_indices, layer.layer_id)
        return out

    def _extend_on_fp32(self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
        """SGLang's prefill/extend on a pool in the split checkpoint layout: this layer's
        checkpoints of the batch's slots go to fp32 for the call (their rings were folded by
        `prepare`), and back to split after it, with the radix track slots the call wrote."""
        ssm_states = self.req_to_token_pool.mamba2_layer_cache(layer.layer_id).temporal
        md = self.forward_metadata
        slots = md.mamba_cache_indices.to(torch.int32)
        split_ckpt_convert(ssm_states, slots, False)
        out = super().forward_extend(layer, forward_batch, mixed_qkv, a, b, **kwargs)
        written = [slots]
        if getattr(md, "has_mamba_track_mask", False):
            written += [t for t in (getattr(md, "track_ssm_h_dst", None), getattr(md, "track_ssm_final_dst", None))
                        if t is not None and t.numel() > 0]
        split_ckpt_convert(ssm_states, torch.cat([w.reshape(-1).to(torch.int32) for w in written]), True)
        return out

    def forward_extend(self, layer, forward_batch, mixed_qkv, a, b, **kwargs):
        if self._draft_on_pool:
            refuse_draft_linear_forward("GDN")
        if self._rssm is None or not forward_batch.forward_mode.is_target_verify():
            if self._rssm is None or not self._rssm.pool.replayssm_ckpt_split:  # the layout of the moment
                return super().forward_extend(layer, forward_batch, mixed_qkv, a, b, **kwargs)
            return self._extend_on_fp32(layer, forward_batch, mixed_qkv, a, b, **kwargs)
        if self.forward_metadata.retrieve_parent_token is not None:
            raise RuntimeError("--mamba-backend replayssm verifies linear draft chains only (topk 1)")
        cache, rings = self._layer(layer.layer_id)
        conv_states, ssm_states = cache.conv[0], cache.temporal
        cache_indices = self.forward_metadata.mamba_cache_indices
        seq_len = mixed_qkv.shape[0]
        T = forward_batch.spec_info.draft_token_num
        bs = seq_len // T
        processed = causal_conv1d_update(
            mixed_qkv.view(bs, T, -1).transpose(1, 2), conv_states, layer.conv_weights, layer.bias,
            layer.activation, conv_state_indices=cache_indices[:bs],
            intermediate_conv_window=cache.intermediate_conv_window[0],
            intermediate_state_indices=self.verify_intermediate_state_indices[:bs],
        )
        mixed_qkv = processed.transpose(1, 2).reshape(bs, T, -1)
        H, HV, K, V = layer.num_k_heads, layer.num_v_heads, layer.head_k_dim, layer.head_v_dim
        q = mixed_qkv[..., : layer.q_dim].view(bs, T, H, K)
        k = mixed_qkv[..., layer.q_dim: layer.q_dim + layer.k_dim].view(bs, T, H, K)
        v = mixed_qkv[..., layer.q_dim + layer.k_dim:].view(bs, T, HV, V)
        out = gdn_replay_verify(
            q, k, v, a.reshape(bs, T, HV), b.reshape(bs, T, HV), layer.A_log, layer.dt_bias, ssm_states, rings,
            cache_indices[:bs], self._rssm.pool.replayssm_wpos, self._rssm.pool.replayssm_origin,
            scale=K ** -0.5, split_ckpt=self._rssm.split_ckpt,
        )
        return out.view(1, seq_len, HV, V)
