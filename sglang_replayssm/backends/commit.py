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

from replayssm_kernels import commit_prepare_tracked


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
    from sglang.srt.speculative.spec_utils import _verify_commit_step_indices

    req_pool = target_worker.model_runner.req_to_token_pool
    slots = req_pool.get_mamba_indices(batch.req_pool_indices).to(torch.int32).contiguous()  # no-op when int32
    if batch.mamba_track_indices is None:
        # A linear draft chain (topk 1, refused otherwise at startup): row i accepted window steps
        # 0 .. accept_lens[i] - 1. SGLang's tree-general form (two aranges, a 2-D gather, a
        # subtraction) gives the same numbers at several small launches of host time per verify
        # step, which is what a batch-1 spec step is bound by.
        last_step, steps_to_track = accept_lens - 1, None
    else:
        last_step, steps_to_track = _verify_commit_step_indices(
            batch=batch, accept_index=accept_index, accept_lens=accept_lens, draft_token_num=draft_token_num,
        )
    # Early-flush margin: the next window must fit, and the next window may be longer than this
    # one (adaptive speculation switches between step configurations; the pool was sized for
    # the largest, --max-speculative-num-draft-tokens).
    t_max = max(int(draft_token_num), int(pool.replayssm_max_draft_tokens or 0))
    if steps_to_track is not None:
        # One launch for the cursor moves and the radix track snapshot plan (the state after window
        # step s is the one the radix cache keeps, so fold at least through it and store it into
        # the track slot on the way), then one fold launch for all layers.
        n_fold, origin, snap_at, snap_slot = commit_prepare_tracked(
            slots, pool.replayssm_wpos, pool.replayssm_origin, accept_lens.contiguous(), pool.replayssm_ring_len,
            t_max, steps_to_track.contiguous(), batch.mamba_track_indices.contiguous(),
        )
        pool.replayssm_fold_fn(pool.mamba_cache.temporal, pool.replayssm_rings, slots, n_fold, origin,
                               snap_at=snap_at, snap_slot=snap_slot)
    else:
        # Cursor moves and fold; GDN at small batches in one launch (host work per verify step is
        # what this path costs there).
        pool.replayssm_commit(slots, accept_lens.contiguous(), t_max)
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
