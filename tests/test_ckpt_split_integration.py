"""The split checkpoint layout in the pool and the GDN backend (CPU, Triton interpreter).

A split pool keeps its checkpoints split while the ring kernels run and fp32 while SGLang's own
kernels read them: the decode switch to SGLang's kernel (small batches) converts every slot, the
switch back converts them again, SGLang's prefill/extend sees the batch's slots (and the radix
track slots it writes) in fp32 for the length of its call, and copies (copy-on-write, CPU copies)
keep the committed values.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from sglang.srt.model_executor.forward_batch_info import ForwardMode

from replayssm_kernels.configs import override
from replayssm_kernels.gdn import split_ckpt_decode, split_ckpt_encode
from sglang_replayssm.backends.common import ReplaySSMBatchState

from pool_helpers import build_pool, gdn_params


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def _split_pool(size=4, ring_len=4, seed=0):
    with override("gdn_ckpt_split", (1,)):
        pool = build_pool("gdn", gdn_params(), size=size, ring_len=ring_len)
    gen = torch.Generator().manual_seed(seed)
    pool.mamba_cache.temporal.copy_(torch.randn(pool.mamba_cache.temporal.shape, generator=gen))
    return pool


def test_pool_layout_follows_the_decode_kernel_in_use():
    """fp32 at allocation; the first ring decode converts every slot to split, a decode batch on
    SGLang's kernel converts them back (after folding their pending entries), values intact."""
    pool = _split_pool()
    assert pool.replayssm_ckpt_split_enabled and not pool.replayssm_ckpt_split
    with override("gdn_ckpt_split", (0,)):
        assert not build_pool("gdn", gdn_params(), size=4, ring_len=4).replayssm_ckpt_split_enabled
    values = pool.mamba_cache.temporal.clone()
    st = ReplaySSMBatchState(pool, "cpu")
    st.flush_phase = False
    st.ring_min_batch = 2
    decode = SimpleNamespace(forward_mode=ForwardMode.DECODE, mamba_track_mask=None)
    # CUDA-graph capture comes first and converts nothing, but the captured ring kernels must read
    # the split layout every later ring batch converts the pool to.
    st.init_graph_buffers(4)
    st.prepare(decode, torch.tensor([2, 0], dtype=torch.int32), graph=True, in_capture=True)
    assert st.split_ckpt and not pool.replayssm_ckpt_split
    assert torch.equal(_bits(pool.mamba_cache.temporal), _bits(values))
    st.prepare(decode, torch.tensor([2, 0], dtype=torch.int32), graph=False, in_capture=False)
    assert not st.decode_stock and st.split_ckpt and pool.replayssm_ckpt_split
    assert torch.equal(_bits(pool.mamba_cache.temporal), _bits(split_ckpt_encode(values)))
    pool.replayssm_wpos.zero_()  # no ring kernel ran: nothing is really pending
    st.prepare(decode, torch.tensor([2], dtype=torch.int32), graph=False, in_capture=False)
    assert st.decode_stock and not pool.replayssm_ckpt_split and st.split_ckpt
    assert torch.equal(_bits(pool.mamba_cache.temporal), _bits(values))
    # a verify batch runs the ring kernels: split again
    st.prepare(SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY), torch.tensor([1], dtype=torch.int32),
               graph=False, in_capture=False)
    assert pool.replayssm_ckpt_split
    assert torch.equal(_bits(pool.mamba_cache.temporal), _bits(split_ckpt_encode(values)))


def _pending_entries(pool, slot, n, seed=1):
    gen = torch.Generator().manual_seed(seed)
    for t in pool.replayssm_rings.tensors():
        t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype) * (0.1 if t.dtype == torch.float32 else 1.0))
    pool.replayssm_rings.g.copy_(-pool.replayssm_rings.g.abs())
    pool.replayssm_wpos[slot], pool.replayssm_origin[slot] = n, 1


def test_copy_on_write_in_the_split_layout_equals_the_fp32_pools():
    split_pool, fp32_pool = _split_pool(seed=3), _split_pool(seed=3)
    split_pool.replayssm_set_ckpt_layout(True)
    for p in (split_pool, fp32_pool):
        _pending_entries(p, 2, 3)
        p.copy_from(torch.tensor([2]), torch.tensor([4]))
    assert not fp32_pool.replayssm_ckpt_split
    got = split_ckpt_decode(split_pool.mamba_cache.temporal[:, 4])
    assert torch.equal(_bits(got), _bits(fp32_pool.mamba_cache.temporal[:, 4]))
    assert split_pool.replayssm_wpos[4] == 0


def test_cpu_copy_restores_values_across_a_layout_switch():
    pool = _split_pool(seed=4)
    values = pool.mamba_cache.temporal.clone()
    pool.replayssm_set_ckpt_layout(True)
    saved = pool.get_cpu_copy(torch.tensor([1, 3]))
    assert saved.ckpt_split
    pool.replayssm_set_ckpt_layout(False)
    pool.mamba_cache.temporal[:, [1, 3]] = 0
    pool.load_cpu_copy(saved, torch.tensor([1, 3]))
    assert torch.equal(_bits(pool.mamba_cache.temporal), _bits(values))


def test_gdn_extend_sees_fp32_and_leaves_split(monkeypatch):
    """SGLang's forward_extend on a split pool: it reads the batch's checkpoints as fp32 values,
    and what it writes (the batch's slots, a radix track slot) ends split; other slots untouched."""
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

    from sglang_replayssm.backends import gdn as gdn_mod

    pool = _split_pool(seed=5)
    values = pool.mamba_cache.temporal.clone()
    pool.replayssm_set_ckpt_layout(True)
    layer_id = 1
    seen = {}
    new = torch.randn(values.shape[2:], generator=torch.Generator().manual_seed(9))

    def stock_extend(self, layer, fb, mixed_qkv, a, b, **kw):
        ssm = pool.mamba_cache.temporal[layer_id]
        seen["in"] = ssm[[2, 0]].clone()
        ssm[2] = new
        ssm[0] = new * 2
        ssm[3] = new * 3  # the radix track slot of the batch (track_ssm_final_dst)
        return "out"

    def stub_init(self, model_runner):
        self.device = "cpu"
        self.req_to_token_pool = model_runner.req_to_token_pool

    monkeypatch.setattr(GDNAttnBackend, "__init__", stub_init)
    monkeypatch.setattr(GDNAttnBackend, "forward_extend", stock_extend)
    req_pool = SimpleNamespace(mamba_pool=pool, mamba2_layer_cache=lambda lid: SimpleNamespace(
        temporal=pool.mamba_cache.temporal[lid]))
    backend = gdn_mod.ReplaySSMGDNAttnBackend(SimpleNamespace(req_to_token_pool=req_pool))
    backend.forward_metadata = SimpleNamespace(
        mamba_cache_indices=torch.tensor([2, 0], dtype=torch.int32), has_mamba_track_mask=True,
        track_ssm_h_dst=torch.tensor([], dtype=torch.int64), track_ssm_final_dst=torch.tensor([3]))
    fb = SimpleNamespace(forward_mode=ForwardMode.EXTEND)
    assert backend.forward_extend(SimpleNamespace(layer_id=layer_id), fb, None, None, None) == "out"
    assert torch.equal(_bits(seen["in"]), _bits(values[layer_id][[2, 0]]))
    ssm = pool.mamba_cache.temporal
    assert torch.equal(_bits(split_ckpt_decode(ssm[layer_id, 2])), _bits(new))
    assert torch.equal(_bits(split_ckpt_decode(ssm[layer_id, 0])), _bits(new * 2))
    assert torch.equal(_bits(split_ckpt_decode(ssm[layer_id, 3])), _bits(new * 3))
    others = [s for s in range(ssm.shape[1]) if s not in (0, 2, 3)]
    assert torch.equal(_bits(split_ckpt_decode(ssm[layer_id, others])), _bits(values[layer_id, others]))
    assert torch.equal(_bits(split_ckpt_decode(ssm[0])), _bits(values[0])), "other layers untouched"


def test_pool_warm_up_changes_nothing(monkeypatch):
    """The kernel warm-up a split pool runs at creation on a GPU (conversions there and back, folds
    of nothing) leaves every checkpoint bit, cursor and the layout flag as they were."""
    from sglang_replayssm import pool as pool_mod

    pool = _split_pool(seed=6)
    before = pool.mamba_cache.temporal.clone()
    pool.replayssm_origin[3] = 2
    monkeypatch.setattr(pool_mod, "_compiles_kernels", lambda t: True)
    pool._warm_ckpt_kernels()
    assert torch.equal(_bits(pool.mamba_cache.temporal), _bits(before))
    assert pool.replayssm_wpos.tolist() == [0] * 5 and pool.replayssm_origin.tolist() == [0, 0, 0, 2, 0]
    assert not pool.replayssm_ckpt_split
