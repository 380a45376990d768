"""ReplaySSMMambaPool on CPU against the real SGLang 0.5.17 pool classes.

Shapes and what is (not) allocated, cursor lifecycle through HybridReqToTokenPool (slot reuse,
copy-on-write, clear, extra_buffer donation, CPU offload), and the exactness of copy-on-write of
a slot with pending ring entries: the destination checkpoint must equal SGLang's own recurrent
kernel stepped over the same tokens, bit for bit.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType
from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool, MambaPool

from replayssm_kernels.gdn.rings import gdn_ring_shapes

import sglang_replayssm
from sglang_replayssm import hooks
from sglang_replayssm.pool import (
    GDN_RING_FIELDS,
    MAMBA2_RING_FIELDS,
    RING_FIELD_NAMES,
    PoolBuildContext,
    ReplaySSMCpuCopy,
    ReplaySSMMambaPool,
    pool_build_context,
    ring_bytes_per_slot,
    ring_dims,
)

from pool_helpers import build_pool, gdn_params, mamba2_params

DEV = "cpu"
bf16 = torch.bfloat16




@pytest.fixture
def pool_hooks():
    """The three pool hooks of the runtime tier, removed again afterwards."""
    specs = {s.name: s for s in sglang_replayssm.table().hooks}
    names = ("pool.class", "pool.alloc_reset", "pool.donate_reset")
    for n in names:
        assert hooks.install(specs[n]) in ("applied", "already applied")
    yield
    for n in names:
        hooks.remove(n)
    assert HybridReqToTokenPool.mamba_pool_cls is MambaPool


@pytest.fixture
def cpu_device_ctx(monkeypatch):
    # SGLang's Triton SSU launcher enters torch.get_device_module(dev).device(idx); torch.cpu lacks it.
    monkeypatch.setattr(torch.cpu, "device", lambda index=None: contextlib.nullcontext(), raising=False)


def fake_req():
    return SimpleNamespace(
        req_pool_idx=None, mamba_pool_idx=None, mamba_ping_pong_track_buffer=None, mamba_next_track_idx=None,
        mamba_needs_clear=False, inflight_middle_chunks=0, kv_committed_len=0, rid="r",
    )


def hybrid_pool(family, cp, *, ring_len=4, extra_buffer=False, mamba_size=6, draft=None):
    with pool_build_context(PoolBuildContext(family=family, ring_len=ring_len, act_dtype=bf16, max_draft_tokens=draft)):
        return HybridReqToTokenPool(
            size=4, mamba_size=mamba_size, mamba_spec_state_size=4, max_context_len=16, device=DEV,
            enable_memory_saver=False, cache_params=cp, mamba_layer_ids=cp.layers,
            enable_mamba_extra_buffer=extra_buffer, enable_overlap_schedule=True,
            speculative_num_draft_tokens=draft, speculative_eagle_topk=1 if draft else None,
        )


# ------------------------------------------------------------------------------ layout


@pytest.mark.parametrize("draft", [None, 3], ids=["decode-only", "speculative-D3"])
def test_gdn_pool_layout(draft):
    H, HV, K, V, L, size = 1, 2, 16, 16, 4, 5
    cp = gdn_params(H, HV, K, V)
    pool = build_pool("gdn", cp, size=size, ring_len=L, draft=draft, topk=1 if draft else None)
    S, Lm = size + 1, 2
    c = pool.mamba_cache
    expected = {
        "rssm_d": (Lm, S, HV, L, V),
        "rssm_k": (Lm, S, H, L, K),
        "rssm_g": (Lm, S, HV, L),
        "rssm_rawv": (Lm, S, HV, L, V),
        "rssm_rawk": (Lm, S, H, L, K),
        "rssm_beta": (Lm, S, HV, L),
    }
    fp32 = {GDN_RING_FIELDS[n]: f for n, (_, f) in gdn_ring_shapes(H, HV, K, V, L).items()}
    for name, shape in expected.items():
        t = getattr(c, name)
        assert tuple(t.shape) == shape and t.dtype == (torch.float32 if fp32[name] else bf16), name
    assert c.rssm_rawv.dtype == c.rssm_rawk.dtype == bf16 and c.rssm_g.dtype == c.rssm_beta.dtype == torch.float32
    for name in MAMBA2_RING_FIELDS.values():
        assert getattr(c, name) is None
    # the all-layer ring object is the same storage
    for field, name in GDN_RING_FIELDS.items():
        assert getattr(pool.replayssm_rings, field) is getattr(c, name)
    assert pool.replayssm_family == "gdn" and pool.replayssm_ring_len == L
    for cur in (pool.replayssm_wpos, pool.replayssm_origin):
        assert cur.shape == (S,) and cur.dtype == torch.int32 and int(cur.abs().sum()) == 0
    # SGLang's own ReplaySSM state stays off
    assert pool.enable_linear_replayssm is False and pool.enable_linear_replayssm_spec is False
    assert pool.replayssm_write_pos is None and pool.replayssm_cache_base is None
    for name in ("replayssm_d", "replayssm_k", "replayssm_g", "replayssm_rawv", "replayssm_rawk", "replayssm_beta"):
        assert getattr(c, name) is None
    if draft is None:
        assert type(c) is ReplaySSMMambaPool.State
    else:
        assert isinstance(c, MambaPool.SpeculativeState)
        assert c.intermediate_ssm is None
        (win,) = c.intermediate_conv_window
        assert tuple(win.shape) == (Lm, 3 + 1, draft, *cp.shape.conv[0])
    # per-layer view slices the rings like conv/temporal
    layer = pool.mamba2_layer_cache(1)
    assert tuple(layer.rssm_d.shape) == (S, HV, L, V) and tuple(layer.temporal.shape) == (S, HV, V, K)
    assert layer.rssm_d.data_ptr() == c.rssm_d[1].data_ptr()
    assert pool.replayssm_layer_rings[1].d.data_ptr() == c.rssm_d[1].data_ptr()
    # PD transfer never registers ring tensors
    assert RING_FIELD_NAMES <= ReplaySSMMambaPool._NON_TRANSFER_STATE_FIELDS
    assert sorted({f for f, _, _ in pool._iter_transfer_state_tensors()}) == ["conv", "temporal"]
    # byte counts
    assert pool.replayssm_ring_bytes_per_slot == ring_bytes_per_slot("gdn", cp, L, bf16, Lm)
    assert pool.replayssm_checkpoint_bytes_per_slot == Lm * HV * V * K * 4


def test_mamba2_pool_layout():
    NH, P, G, N, L, size = 4, 16, 2, 16, 8, 3
    cp = mamba2_params(NH, P, G, N)
    assert ring_dims("mamba2", cp) == {"NH": NH, "P": P, "G": G, "N": N}
    pool = build_pool("mamba2", cp, size=size, ring_len=L, draft=4, topk=1)
    S, Lm = size + 1, 2
    c = pool.mamba_cache
    assert tuple(c.rssm_x.shape) == (Lm, S, NH, L, P)
    assert tuple(c.rssm_B.shape) == (Lm, S, G, L, N)
    assert tuple(c.rssm_dt.shape) == (Lm, S, NH, L)
    assert all(getattr(c, n).dtype == bf16 for n in MAMBA2_RING_FIELDS.values())
    assert all(getattr(c, n) is None for n in GDN_RING_FIELDS.values())
    assert c.intermediate_ssm is None and len(c.intermediate_conv_window) == 1
    assert pool.replayssm_rings.x is c.rssm_x
    assert pool.replayssm_ring_bytes_per_slot == Lm * (NH * L * P + G * L * N + NH * L) * 2
    assert pool.replayssm_fold_fn is None  # the Mamba-2 backend registers A/dt_bias


def test_pool_refuses_misuse():
    cp = gdn_params()
    with pytest.raises(RuntimeError, match="build context"):
        ReplaySSMMambaPool(size=2, spec_state_size=2, cache_params=cp, mamba_layer_ids=cp.layers, device=DEV)
    with pool_build_context(PoolBuildContext(family="gdn", ring_len=4, act_dtype=bf16)):
        with pytest.raises(RuntimeError, match="enable-linear-replayssm"):
            ReplaySSMMambaPool(size=2, spec_state_size=2, cache_params=cp, mamba_layer_ids=cp.layers, device=DEV,
                               enable_linear_replayssm=True)
        with pytest.raises(RuntimeError, match="page-major"):
            ReplaySSMMambaPool(size=2, spec_state_size=2, cache_params=cp, mamba_layer_ids=cp.layers, device=DEV,
                               envelope_layout=True)
        with pytest.raises(RuntimeError, match="replayssm-ring-len"):
            ReplaySSMMambaPool(size=2, spec_state_size=2, cache_params=cp, mamba_layer_ids=cp.layers, device=DEV,
                               speculative_num_draft_tokens=5)
    bf16_state = Mamba2CacheParams(shape=cp.shape, layers=cp.layers, dtype=Mamba2StateDType(conv=bf16, temporal=bf16))
    with pool_build_context(PoolBuildContext(family="gdn", ring_len=4, act_dtype=bf16)):
        with pytest.raises(RuntimeError, match="float32"):
            ReplaySSMMambaPool(size=2, spec_state_size=2, cache_params=bf16_state, mamba_layer_ids=cp.layers, device=DEV)
    with pytest.raises(ValueError, match="family"):
        with pool_build_context(PoolBuildContext(family="kda", ring_len=4, act_dtype=bf16)):
            pass


# ------------------------------------------------------------------------------ cursor lifecycle


def test_cursor_reset_on_slot_reuse(pool_hooks):
    rp = hybrid_pool("gdn", gdn_params(), mamba_size=2)
    pool = rp.mamba_pool
    assert isinstance(pool, ReplaySSMMambaPool)
    r1 = fake_req()
    rp.alloc([r1])
    slot = int(r1.mamba_pool_idx)
    pool.replayssm_wpos.fill_(3)
    pool.replayssm_origin.fill_(2)
    rp.free_mamba_cache(r1)
    rp.free(r1)
    r2, r3 = fake_req(), fake_req()
    rp.alloc([r2, r3])  # mamba_size=2: both slots are handed out again, the freed one included
    slots = sorted([int(r2.mamba_pool_idx), int(r3.mamba_pool_idx)])
    assert slot in slots
    for s in slots:
        assert int(pool.replayssm_wpos[s]) == 0 and int(pool.replayssm_origin[s]) == 0
    # a request that already holds its slot (chunked prefill / radix continuation) keeps its cursors
    pool.replayssm_wpos[slots[0]] = 2
    keep = fake_req()
    keep.mamba_pool_idx = torch.tensor(slots[0])
    assert rp.alloc([keep]) is not None
    assert int(pool.replayssm_wpos[slots[0]]) == 2


def test_cursor_reset_on_clear_slots():
    pool = build_pool("gdn", gdn_params())
    pool.mamba_cache.temporal.fill_(1.0)
    pool.replayssm_wpos.fill_(3)
    pool.replayssm_origin.fill_(1)
    pool.clear_slots(torch.tensor([1, 3]))
    assert pool.replayssm_wpos.tolist() == [3, 0, 3, 0, 3]
    assert pool.replayssm_origin.tolist() == [1, 0, 1, 0, 1]
    assert float(pool.mamba_cache.temporal[:, [1, 3]].abs().sum()) == 0.0


def test_cursor_reset_on_extra_buffer_donation(pool_hooks):
    rp = hybrid_pool("gdn", gdn_params(), extra_buffer=True, mamba_size=6)
    pool = rp.mamba_pool
    r = fake_req()
    rp.alloc([r])
    assert r.mamba_ping_pong_track_buffer is not None
    pool.replayssm_wpos.fill_(3)
    pool.replayssm_origin.fill_(2)
    new_slot = rp.mamba_allocator.alloc(1)
    donated = rp.donate_mamba_ping_pong_slot(r, new_slot)
    for s in (int(donated), int(new_slot)):
        assert int(pool.replayssm_wpos[s]) == 0 and int(pool.replayssm_origin[s]) == 0
    # the request's own slot is untouched
    assert int(pool.replayssm_wpos[int(r.mamba_pool_idx)]) == 3


def _gdn_decode_tokens(pool, slot, steps, gen):
    """Run `steps` ReplaySSM decode tokens on `slot` through all layers; returns the inputs."""
    from replayssm_kernels import decode_prepare
    from replayssm_kernels.gdn import gdn_replay_decode

    d = pool.replayssm_dims
    H, HV, K, V = d["H"], d["HV"], d["K"], d["V"]
    idx = torch.tensor([slot], dtype=torch.int32)
    params, tokens = [], []
    for _layer in range(len(pool.mamba_layer_ids)):
        params.append((torch.randn(HV, generator=gen), torch.randn(HV, generator=gen)))
    for _ in range(steps):
        row_wp, row_flush = decode_prepare(idx, pool.replayssm_wpos, pool.replayssm_ring_len)
        per_layer = []
        for layer, (A_log, dt_bias) in enumerate(params):
            q, k = torch.randn(1, H, K, generator=gen).to(bf16), torch.randn(1, H, K, generator=gen).to(bf16)
            v = torch.randn(1, HV, V, generator=gen).to(bf16)
            a, b = torch.randn(1, HV, generator=gen).to(bf16), torch.randn(1, HV, generator=gen).to(bf16)
            gdn_replay_decode(q, k, v, a, b, A_log, dt_bias, pool.mamba_cache.temporal[layer],
                              pool.replayssm_layer_rings[layer], idx, row_wp, row_flush, pool.replayssm_origin)
            per_layer.append((q, k, v, a, b))
        tokens.append(per_layer)
    return params, tokens


def test_copy_on_write_folds_pending_entries_exactly():
    """COW of an un-flushed slot: dst = SGLang's recurrent state over the same tokens, bit-exact."""
    from sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update as sglang_gdn,
    )

    gen = torch.Generator().manual_seed(7)
    pool = build_pool("gdn", gdn_params(), size=4, ring_len=4)
    src, dst = 1, 3
    temporal = pool.mamba_cache.temporal
    temporal[:, src] = torch.randn(temporal[:, src].shape, generator=gen) * 0.1
    S0 = temporal[:, src].clone()
    params, tokens = _gdn_decode_tokens(pool, src, steps=6, gen=gen)  # L=4: a flush at step 4, 2 pending
    assert int(pool.replayssm_wpos[src]) == 2
    ckpt_src = temporal[:, src].clone()
    wpos_src, origin_src = int(pool.replayssm_wpos[src]), int(pool.replayssm_origin[src])
    pool.replayssm_wpos[dst] = 1  # stale cursor on the destination

    pool.copy_from(torch.tensor([src]), torch.tensor([dst]))

    for layer, (A_log, dt_bias) in enumerate(params):
        ref = S0[layer].unsqueeze(0).clone()
        for step in tokens:
            q, k, v, a, b = step[layer]
            sglang_gdn(A_log=A_log, dt_bias=dt_bias, q=q.unsqueeze(0), k=k.unsqueeze(0), v=v.unsqueeze(0), a=a, b=b,
                       initial_state_source=ref, initial_state_indices=torch.tensor([0], dtype=torch.int32),
                       cu_seqlens=torch.tensor([0, 1], dtype=torch.int32), use_qk_l2norm_in_kernel=True,
                       softplus_beta=1.0, softplus_threshold=20.0)
        assert torch.equal(temporal[layer, dst], ref[0]), f"layer {layer}"
    assert int(pool.replayssm_wpos[dst]) == 0 and int(pool.replayssm_origin[dst]) == 0
    # the source is untouched
    assert torch.equal(temporal[:, src], ckpt_src)
    assert (int(pool.replayssm_wpos[src]), int(pool.replayssm_origin[src])) == (wpos_src, origin_src)
    # conv state copied as SGLang does
    assert torch.equal(pool.mamba_cache.conv[0][:, dst], pool.mamba_cache.conv[0][:, src])


def test_mamba2_copy_on_write(cpu_device_ctx):
    from replayssm_kernels import decode_prepare
    from replayssm_kernels.mamba2 import mamba2_replay_decode
    from sglang.kernels.ops.mamba.triton_ops.mamba_ssm import selective_state_update

    gen = torch.Generator().manual_seed(11)
    NH, P, G, N = 2, 16, 1, 16
    pool = build_pool("mamba2", mamba2_params(NH, P, G, N), size=4, ring_len=8)
    src, dst = 2, 4
    with pytest.raises(RuntimeError, match="set_replayssm_mamba2_params"):
        pool.copy_from(torch.tensor([src]), torch.tensor([dst]))
    Lm = 2
    A = -(torch.rand(Lm, NH, generator=gen) * 7.5 + 0.5)
    dt_bias = torch.log(torch.expm1(torch.rand(Lm, NH, generator=gen) * 0.29 + 0.01))
    D = torch.randn(Lm, NH, generator=gen)
    pool.set_replayssm_mamba2_params(A, dt_bias)
    temporal = pool.mamba_cache.temporal
    temporal[:, src] = torch.randn(temporal[:, src].shape, generator=gen) * 0.1
    S0 = temporal[:, src].clone()
    idx = torch.tensor([src], dtype=torch.int32)
    steps = []
    for _ in range(3):
        row_wp, row_flush = decode_prepare(idx, pool.replayssm_wpos, pool.replayssm_ring_len)
        per_layer = []
        for layer in range(Lm):
            x, dt = torch.randn(1, NH, P, generator=gen).to(bf16), (torch.randn(1, NH, generator=gen) * 0.5).to(bf16)
            B, C = torch.randn(1, G, N, generator=gen).to(bf16), torch.randn(1, G, N, generator=gen).to(bf16)
            mamba2_replay_decode(x, dt, B, C, A[layer], D[layer], dt_bias[layer], temporal[layer],
                                 pool.replayssm_layer_rings[layer], idx, row_wp, row_flush, pool.replayssm_origin)
            per_layer.append((x, dt, B, C))
        steps.append(per_layer)
    assert int(pool.replayssm_wpos[src]) == 3
    pool.copy_from(torch.tensor([src]), torch.tensor([dst]))
    for layer in range(Lm):
        ref = S0[layer].unsqueeze(0).clone()
        for per_layer in steps:
            x, dt, B, C = per_layer[layer]
            selective_state_update(
                ref, x, dt[..., None].expand(1, NH, P), A[layer][:, None, None].expand(NH, P, N), B, C,
                D=D[layer][:, None].expand(NH, P), z=None, dt_bias=dt_bias[layer][:, None].expand(NH, P),
                dt_softplus=True, state_batch_indices=torch.tensor([0], dtype=torch.int32),
                out=torch.empty_like(x),
            )
        assert torch.equal(temporal[layer, dst], ref[0]), f"layer {layer}"
    assert int(pool.replayssm_wpos[dst]) == 0 and int(pool.replayssm_wpos[src]) == 3


def test_cpu_copy_round_trip_carries_rings_and_cursors():
    gen = torch.Generator().manual_seed(3)
    pool = build_pool("gdn", gdn_params(), size=4, ring_len=4)
    c = pool.mamba_cache
    for name in GDN_RING_FIELDS.values():
        t = getattr(c, name)
        t.copy_(torch.randn(t.shape, generator=gen).to(t.dtype))
    c.temporal.copy_(torch.randn(c.temporal.shape, generator=gen))
    pool.replayssm_wpos.copy_(torch.tensor([0, 1, 2, 3, 1], dtype=torch.int32))
    pool.replayssm_origin.copy_(torch.tensor([0, 3, 2, 1, 0], dtype=torch.int32))
    idx = torch.tensor([1, 3])
    before = {n: getattr(c, n)[:, idx].clone() for n in GDN_RING_FIELDS.values()}
    tmp_before = c.temporal[:, idx].clone()
    cpu = pool.get_cpu_copy(idx)
    assert isinstance(cpu, ReplaySSMCpuCopy)
    for name in GDN_RING_FIELDS.values():
        getattr(c, name).zero_()
    c.temporal.zero_()
    pool.replayssm_wpos.zero_()
    pool.replayssm_origin.zero_()
    pool.load_cpu_copy(cpu, idx)
    for name, t in before.items():
        assert torch.equal(getattr(c, name)[:, idx], t), name
    assert torch.equal(c.temporal[:, idx], tmp_before)
    assert pool.replayssm_wpos[idx].tolist() == [1, 3] and pool.replayssm_origin[idx].tolist() == [3, 1]
    with pytest.raises(RuntimeError, match="rings/cursors"):
        pool.load_cpu_copy((cpu.conv, cpu.temporal), idx)


def test_gdn_pool_without_raw_keys():
    """A GDN pool built while the tree or shuffle replay form is in effect (K = 128; the GPU
    default) keeps no raw-key ring: `rssm_rawk` has no elements, the rings and the byte count the
    solver charges both drop by exactly its bytes, and decode, the CPU copy round trip and
    copy-on-write work on it and end in the bits of a pool that keeps raw keys (same form)."""
    from replayssm_kernels.configs import override

    H, HV, K, V, L, Lm, S = 1, 2, 128, 16, 4, 2, 5
    cp = gdn_params(H, HV, K, V)
    src, dst, idx = 1, 3, torch.tensor([1, 2])
    pools, results = [], []
    for alloc_form in (0, 2):
        with override("gdn_k_tree", (alloc_form,)):
            pool = build_pool("gdn", cp, size=S - 1, ring_len=L)
            assert pool.replayssm_ring_bytes_per_slot == ring_bytes_per_slot("gdn", cp, L, bf16, Lm)
        gen = torch.Generator().manual_seed(7)
        temporal = pool.mamba_cache.temporal
        temporal.copy_(torch.randn(temporal.shape, generator=gen) * 0.1)
        with override("gdn_k_tree", (2,)):
            _gdn_decode_tokens(pool, src, steps=6, gen=gen)  # a flush at step 4, 2 pending
            cpu = pool.get_cpu_copy(idx)
            for name in GDN_RING_FIELDS.values():
                getattr(pool.mamba_cache, name).zero_()
            pool.load_cpu_copy(cpu, idx)
            pool.copy_from(torch.tensor([src]), torch.tensor([dst]))
        pools.append(pool)
        results.append((temporal.clone(), [t.clone() for t in pool.replayssm_rings.tensors()]))
    kept, lean = pools
    assert kept.replayssm_rings.has_raw_keys and not lean.replayssm_rings.has_raw_keys
    assert tuple(lean.mamba_cache.rssm_rawk.shape) == (Lm, S, H, 0, K) and lean.mamba_cache.rssm_rawk.numel() == 0
    assert lean.replayssm_rings.rawk is lean.mamba_cache.rssm_rawk
    assert tuple(lean.mamba2_layer_cache(1).rssm_rawk.shape) == (S, H, 0, K)
    raw = Lm * H * L * K * 2
    assert kept.replayssm_ring_bytes_per_slot - lean.replayssm_ring_bytes_per_slot == raw
    assert int(lean.replayssm_wpos[src]) == 2 and int(lean.replayssm_wpos[dst]) == 0
    (t_kept, r_kept), (t_lean, r_lean) = results
    assert torch.equal(t_lean, t_kept) and not torch.equal(t_lean[:, dst], t_lean[:, src])
    for name, a, b in zip(GDN_RING_FIELDS, r_kept, r_lean):
        if name != "rawk":
            assert torch.equal(a, b), name


@pytest.mark.parametrize("kernel", [True, False])
def test_reset_cursors_on_slot_tensors_as_sglang_passes_them(kernel, monkeypatch):
    """Slot tensors straight from SGLang's allocator (int64, 0-d or 1-d, padding -1) reset exactly
    their slots, through the one-launch kernel (GPU, interpreter) or the torch fallback (CPU)."""
    from sglang_replayssm import pool as pool_mod
    from pool_helpers import build_pool, gdn_params

    monkeypatch.setattr(pool_mod, "_triton_interpret", lambda: kernel)
    pool = build_pool("gdn", gdn_params(), size=6, ring_len=4)
    pool.replayssm_wpos.copy_(torch.arange(1, 8, dtype=torch.int32))
    pool.replayssm_origin.copy_(torch.arange(2, 9, dtype=torch.int32))
    pool.replayssm_reset_cursors(torch.tensor([4, -1, 1], dtype=torch.int64))
    pool.replayssm_reset_cursors(torch.tensor(5, dtype=torch.int64))  # 0-d, as `mid[0]`
    pool.replayssm_reset_cursors([2])
    # -1 is padding: the last slot (6) keeps its cursors
    assert pool.replayssm_wpos.tolist() == [1, 0, 0, 4, 0, 0, 7]
    assert pool.replayssm_origin.tolist() == [2, 0, 0, 5, 0, 0, 8]


def test_kernel_tests_do_not_import_sglang_configs():
    """The GPU machine runs the kernel tests against a newer transformers, where importing
    sglang.srt.configs fails (it registers configs transformers already has): the kernel test
    modules and the helper they share must not import it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tests = Path(__file__).parent
    code = (
        "import sys; sys.path[:0] = [%r]\n"
        "import conftest, test_gdn_kernels, test_mamba2_kernels, pool_helpers\n"
        "pool_helpers.pending_cursor_case(8, 'cpu')\n"
        "print(sorted(m for m in sys.modules if m.startswith('sglang.srt.configs')))\n" % str(tests)
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
