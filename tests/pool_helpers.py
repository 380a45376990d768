"""Small ReplaySSM pools on the CPU for the pool and integration tests (SGLang's own cache params)."""

import torch

# SGLang and the pool module are imported inside the helpers that need them: the kernel tests use
# pending_cursor_case only, and on the GPU machine importing sglang.srt.configs can fail against a
# newer transformers (it registers configs transformers already has).

bf16 = torch.bfloat16


def _cache_params(**dims):
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape

    layers = dims.pop("layers")
    shape = Mamba2StateShape.create(tp_world_size=1, conv_kernel=4, **dims)
    return Mamba2CacheParams(shape=shape, layers=list(layers), dtype=Mamba2StateDType(conv=bf16, temporal=torch.float32))


def gdn_params(H=1, HV=2, K=16, V=16, layers=(0, 2)):
    return _cache_params(intermediate_size=HV * V, n_groups=H, num_heads=HV, head_dim=V, state_size=K, layers=layers)


def mamba2_params(NH=2, P=16, G=1, N=16, layers=(1, 3)):
    return _cache_params(intermediate_size=NH * P, n_groups=G, num_heads=NH, head_dim=P, state_size=N, layers=layers)


def build_pool(family, cp, *, size=4, ring_len=4, draft=None, topk=None, act=bf16):
    from sglang_replayssm.pool import PoolBuildContext, ReplaySSMMambaPool, pool_build_context

    with pool_build_context(PoolBuildContext(family=family, ring_len=ring_len, act_dtype=act, max_draft_tokens=draft)):
        return ReplaySSMMambaPool(
            size=size, spec_state_size=3, cache_params=cp, mamba_layer_ids=cp.layers, device="cpu",
            speculative_num_draft_tokens=draft, speculative_eagle_topk=topk,
        )


def pending_cursor_case(num_slots: int, device):
    """Rows `[5, -1, 0, 2]` (one padding row) over `num_slots` slots whose cursors hold 4, 0 and 3
    pending entries from origins 1, 2 and 3: `(slot_idx int64, wpos, origin)`."""
    slot = torch.tensor([5, -1, 0, 2], dtype=torch.int64, device=device)
    wpos = torch.zeros(num_slots, dtype=torch.int32, device=device)
    origin = torch.zeros(num_slots, dtype=torch.int32, device=device)
    wpos[[5, 0, 2]] = torch.tensor([4, 0, 3], dtype=torch.int32, device=device)
    origin[[5, 0, 2]] = torch.tensor([1, 2, 3], dtype=torch.int32, device=device)
    return slot, wpos, origin
