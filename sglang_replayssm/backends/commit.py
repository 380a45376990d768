"""Speculative commit under `--mamba-backend replayssm` (AROUND hooks, installed only then).

After verify, SGLang calls `commit_mamba_states_after_verify` with the accepted count per request
(bonus token included). ReplaySSM commits by moving cursors and, for the rows whose next window
would not fit (or whose radix track boundary was crossed), folding the committed entries into the
checkpoint with the exact fold, all layers in one launch (GDN without a track, below
`gdn_commit_fused_below` rows: the cursor move inside that launch, `pool.replayssm_commit`). The state at
the track boundary is stored into the request's track slot by that same fold. The conv state
keeps SGLang's rollback (per-draft conv windows).
"""

from __future__ import annotations

import torch

from replayssm_kernels import commit_prepare_chain_tracked


def _replayssm_pool(target_worker):
    from sglang_replayssm.backends.common import runner_replayssm_pool

    return runner_replayssm_pool(target_worker.model_runner)


def commit_after_verify(original, target_worker, batch, accept_lens, accept_index, draft_token_num, *args, **kwargs):
    pool = _replayssm_pool(target_worker)
    if pool is None:
        return original(target_worker, batch, accept_lens, accept_index, draft_token_num, *args, **kwargs)
    if batch.forward_mode.is_idle() or accept_index.numel() == 0:
        return None
    from sglang.kernels.ops.mamba.mamba_state_scatter_triton import fused_conv_window_scatter_with_mask
    from sglang.srt.speculative import spec_utils

    req_pool = target_worker.model_runner.req_to_token_pool
    slots = req_pool.get_mamba_indices(batch.req_pool_indices).to(torch.int32).contiguous()  # no-op when int32
    # Early-flush margin: the next window must fit, and the next window may be longer than this
    # one (adaptive speculation switches between step configurations; the pool was sized for
    # the largest, --max-speculative-num-draft-tokens).
    t_max = max(int(draft_token_num), int(pool.replayssm_max_draft_tokens or 0))
    # The draft is a linear chain (topk 1, refused otherwise at startup): row i accepted window
    # steps 0 .. accept_lens[i] - 1. SGLang's tree-general `_verify_commit_step_indices` (two
    # aranges, 2-D gathers, a dozen small launches) gives the same step indices at host time a
    # batch-1 spec step is bound by, so they come from our own launch instead.
    if batch.mamba_track_indices is None:
        last_step, steps_to_track = accept_lens - 1, None
        # Cursor moves and fold; GDN at small batches in one launch.
        pool.replayssm_commit(slots, accept_lens.contiguous(), t_max)
    else:
        # One launch for SGLang's step indices, the cursor moves and the radix track snapshot plan
        # (the state after the crossing step is the one the radix cache keeps, so fold at least
        # through it and store it into the track slot on the way), then one fold for all layers.
        n_fold, origin, snap_at, snap_slot, last_step, steps_to_track = commit_prepare_chain_tracked(
            slots, pool.replayssm_wpos, pool.replayssm_origin, accept_lens.contiguous(), pool.replayssm_ring_len,
            t_max, batch.seq_lens.contiguous(), spec_utils.get_exec().mamba.mamba_track_interval,
            batch.mamba_track_indices.contiguous(),
        )
        pool.replayssm_fold_fn(pool.mamba_cache.temporal, pool.replayssm_rings, slots, n_fold, origin,
                               snap_at=snap_at, snap_slot=snap_slot)
    cache = pool.mamba_cache
    for conv, windows in zip(cache.conv, cache.intermediate_conv_window):
        fused_conv_window_scatter_with_mask(conv, windows, slots, last_step)
        if steps_to_track is not None:
            fused_conv_window_scatter_with_mask(conv, windows, batch.mamba_track_indices, steps_to_track)
    return None


def update_mamba_state_after_mtp_verify(original, self, *args, **kwargs):
    """Reached only by commit paths that bypass `commit_mamba_states_after_verify` (DFlash,
    DSpark); with ReplaySSM there is no per-draft state to scatter, so refuse loudly."""
    from sglang_replayssm.pool import ReplaySSMMambaPool

    pool = getattr(getattr(self, "linear_attn_backend", None), "req_to_token_pool", None)
    pool = getattr(pool, "mamba_pool", None)
    if isinstance(pool, ReplaySSMMambaPool):
        raise RuntimeError(
            "--mamba-backend replayssm supports EAGLE/NEXTN linear-chain speculative decoding only; "
            "this speculative algorithm commits through update_mamba_state_after_mtp_verify, which "
            "needs per-draft states. Use --speculative-algorithm NEXTN (or EAGLE) with "
            "--speculative-eagle-topk 1."
        )
    return original(self, *args, **kwargs)
