"""Memory accounting and pool construction under `--mamba-backend replayssm`.

`KVCacheConfigurator._handle_max_mamba_cache` (kv_cache_configurator.py L1816) decides how many
mamba slots fit and returns the memory left for the KV cache. Under ReplaySSM:

* no `intermediate_ssm` is allocated, so nothing is reserved for it (SGLang reserves
  `per_req * (R + 1) * D` under speculative decoding);
* every slot (the padding slot included) carries the rings and two int32 cursors, so the slot
  size the solver divides by is `per_slot = state_per_req + ring_per_slot + 8`.

The three sizing modes of SGLang are kept: an explicit `--max-mamba-cache-size` (split across
attention-DP ranks), `--disable-radix-cache` with `--max-running-requests` (one slot per running
request), and otherwise the ratio solve
`K = floor((B - per_slot) / per_slot)` with `B = rest * r / (1 + r)` bytes (`r` =
`--mamba-full-memory-ratio`). The charge is `(K + 1) * per_slot`. Pipeline parallelism charges the
largest per-stage share of the SSM layers, as SGLang does. The speculative conv windows stay
uncharged, as in SGLang.
"""

from __future__ import annotations

import logging

from replayssm_kernels.configs import ring_min_batch

from sglang_replayssm import args as _args
from sglang_replayssm.pool import CURSOR_BYTES_PER_SLOT, PoolBuildContext, pool_build_context, ring_bytes_per_slot

logger = logging.getLogger("sglang_replayssm")

_GIB = float(1 << 30)


def build_context_for(configurator) -> PoolBuildContext:
    """Family, ring length and activation dtype for the pool of this configurator."""
    from sglang_replayssm.validation import detect_family

    sa = configurator.server_args
    family = detect_family(configurator.model_config)
    declared = getattr(sa, _args.ATTR_FAMILY, None)
    if declared is not None and declared != family:
        raise RuntimeError(
            f"--mamba-backend replayssm: the launcher validated a {declared} model but this worker "
            f"loads a {family} model."
        )
    return PoolBuildContext(
        family=family,
        # 0: no rings (the solver found that the GDN ring decode can never engage, see plan_rings)
        ring_len=0 if getattr(sa, RINGS_OFF_ATTR, False) else _args.validated_ring_len(sa),
        act_dtype=configurator.model_dtype,
        max_draft_tokens=getattr(sa, "max_speculative_num_draft_tokens", None),
    )


# Carried on the server args: SGLang's KVCacheConfigurator is a slotted dataclass (no new attributes).
RINGS_OFF_ATTR = "_replayssm_rings_off"


def plan_rings(configurator, total_rest_memory: float) -> tuple[bool, int]:
    """Whether this server needs rings at all, and the running-request cap with them.

    A GDN server without speculative decoding uses its rings only for decode batches of at least
    `configs.ring_min_batch("gdn")` rows (64 by default: below that SGLang's packed decode is
    faster on the H200). If the scheduler could never run that many requests (the cap SGLang
    derives from the slots, `slots // mamba ratio`, or --max-running-requests), the rings would
    only take memory, so none are allocated: the pool is the size stock SGLang gives it and every
    decode step runs SGLang's kernel. Mamba-2 (ring decode at every batch size) and speculative
    decoding (the rings replace `intermediate_ssm`) always keep them."""
    from sglang.srt.runtime_context import get_schedule

    setattr(configurator.server_args, RINGS_OFF_ATTR, False)
    ctx = build_context_for(configurator)
    spec = getattr(configurator, "spec_algorithm", None)
    speculative = (spec is not None and not spec.is_none()) or ctx.max_draft_tokens is not None
    try:
        slots, _ = solve_max_mamba_cache(configurator, total_rest_memory)
    except RuntimeError:
        if ctx.family != "gdn" or speculative:
            raise
        slots = 0  # not even one slot with rings: without them it may fit
    cap = slots // max(int(configurator._calculate_mamba_ratio()), 1)
    user = get_schedule().max_running_requests
    if user is not None:
        cap = min(cap, user // configurator.ps.attn_dp_size)
    needed = ctx.family != "gdn" or speculative or cap >= ring_min_batch("gdn")
    setattr(configurator.server_args, RINGS_OFF_ATTR, not needed)
    return needed, cap


def around_build_hybrid_req_pool(original, self, *args, **kwargs):
    """AROUND `KVCacheConfigurator._build_hybrid_req_pool`: provide the pool build context."""
    if not _args.is_selected(self.server_args):
        return original(self, *args, **kwargs)
    with pool_build_context(build_context_for(self)):
        return original(self, *args, **kwargs)


def _stage_layer_scale(configurator) -> float:
    """Largest per-PP-stage share of the SSM layers (1.0 without PP)."""
    layers = configurator.mambaish_config.mamba2_cache_params.layers
    pp = configurator.ps.pp_size
    if pp <= 1 or not layers:
        return 1.0
    from sglang.srt.distributed.utils import get_pp_indices

    n = configurator.model_config.num_hidden_layers
    most = max(
        sum(1 for i in layers if start <= i < end)
        for start, end in (get_pp_indices(n, rank, pp) for rank in range(pp))
    )
    return most / len(layers)


def slot_bytes(configurator) -> dict:
    """Per-slot byte counts the solver charges: state, rings, cursors, total."""
    params = configurator.mambaish_config.mamba2_cache_params
    ctx = build_context_for(configurator)
    scale = _stage_layer_scale(configurator)
    state = int(params.mamba_cache_per_req * scale)
    rings = 0
    if ctx.ring_len > 0:
        rings = int(ring_bytes_per_slot(ctx.family, params, ctx.ring_len, ctx.act_dtype, len(params.layers)) * scale)
    return {
        "state": state,
        "rings": rings,
        "cursors": CURSOR_BYTES_PER_SLOT,
        "total": state + rings + CURSOR_BYTES_PER_SLOT,
    }


def solve_max_mamba_cache(configurator, total_rest_memory: float) -> tuple[int, float]:
    """Return `(max_mamba_cache_size per DP rank, GiB left for the KV cache)`; no side effects."""
    from sglang.srt.runtime_context import get_memory, get_schedule

    sched = get_schedule()
    per_slot = slot_bytes(configurator)["total"]
    dp = configurator.ps.attn_dp_size
    if sched.max_mamba_cache_size is not None:
        slots = sched.max_mamba_cache_size // dp
    elif get_memory().disable_radix_cache and sched.max_running_requests is not None:
        slots = sched.max_running_requests // dp
    else:
        ratio = sched.mamba_full_memory_ratio
        budget = total_rest_memory * ratio / (1 + ratio) * _GIB
        slots = int((budget - per_slot) // per_slot)
    if slots <= 0:
        raise RuntimeError(
            f"--mamba-backend replayssm: not enough GPU memory for the hybrid state cache "
            f"(max_mamba_cache_size={slots}, {per_slot / (1 << 20):.2f} MiB per slot incl. rings, "
            f"{total_rest_memory:.2f} GiB available). Try a smaller --replayssm-ring-len, fewer "
            f"--max-running-requests, a larger --mem-fraction-static, or more GPU memory."
        )
    return slots, total_rest_memory - (slots + 1) * per_slot / _GIB


def around_handle_max_mamba_cache(original, self, total_rest_memory, *args, **kwargs):
    """AROUND `KVCacheConfigurator._handle_max_mamba_cache`."""
    if not _args.is_selected(self.server_args):
        return original(self, total_rest_memory, *args, **kwargs)
    from sglang.srt.runtime_context import get_context, get_schedule

    rings, cap = plan_rings(self, total_rest_memory)
    slots, rest = solve_max_mamba_cache(self, total_rest_memory)
    if not rings:
        logger.info(
            "sglang-replayssm: no rings allocated. This GDN server without speculative decoding admits at "
            "most %d running requests with rings, and its ring decode starts at %d rows (below that "
            "SGLang's own decode kernel is faster, docs/perf.md), so every decode step runs SGLang's "
            "kernel and the pool keeps stock SGLang's size (%d slots). To use the ring decode, allow >= %d "
            "running requests (more memory, --max-mamba-cache-size, --disable-radix-cache) or set "
            "REPLAYSSM_CONFIG=gdn_ring_min_batch=N.",
            cap, ring_min_batch("gdn"), slots, ring_min_batch("gdn"),
        )
    if get_schedule().max_mamba_cache_size != slots:
        get_context().override("replayssm.mamba_pool", max_mamba_cache_size=slots)
    sizes = slot_bytes(self)
    logger.info(
        "ReplaySSM memory: %d mamba slots (+1 padding) x %.2f MiB (state %.2f + rings %.2f MiB); "
        "no per-draft state scratch reserved; %.2f GiB left for the KV cache.",
        slots, sizes["total"] / (1 << 20), sizes["state"] / (1 << 20), sizes["rings"] / (1 << 20), rest,
    )
    return rest
