"""Memory accounting under --mamba-backend replayssm: ring bytes per slot (from first principles),
the solver in SGLang's three sizing modes, no intermediate_ssm reservation under speculative
decoding, agreement with what the pool really allocates, and the pass-through for other backends.

Models: tiny Qwen3-Next (3 GDN layers, HV=4, H=2, K=V=128) and Nemotron-H (2 Mamba-2 layers,
NH=8, P=64, G=2, N=128) config.json files; SGLang computes their cache params itself.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
import json
from types import SimpleNamespace

import pytest
import torch

from sglang.srt.configs.hybrid_arch import hybrid_gdn_config, mambaish_config
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
from sglang.srt.runtime_context import get_context, get_memory, get_parallel, get_schedule, publish
from sglang.srt.server_args import ServerArgs
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

from replayssm_kernels.gdn.rings import gdn_ring_shapes

from sglang_replayssm import memory
from sglang_replayssm.pool import PoolBuildContext, ReplaySSMMambaPool, pool_build_context, ring_bytes_per_slot

GIB = 1 << 30
bf16 = torch.bfloat16

QWEN3_NEXT = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 256, "vocab_size": 2048, "max_position_embeddings": 4096,
    "full_attention_interval": 4,
    "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 128,
    "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 8, "num_experts_per_tok": 2,
    "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128, "norm_topk_prob": True,
    "decoder_sparse_step": 1, "rope_theta": 10000000.0, "partial_rotary_factor": 0.25, "torch_dtype": "bfloat16",
    "rms_norm_eps": 1e-6, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": False,
}
NEMOTRON_H = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
    "hidden_size": 256, "vocab_size": 2048, "hybrid_override_pattern": "MEM*E", "num_hidden_layers": 5,
    "mamba_num_heads": 8, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 2, "mamba_n_groups": 2,
    "conv_kernel": 4, "expand": 2, "chunk_size": 128, "use_conv_bias": True, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 512, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "moe_intermediate_size": 256, "moe_shared_expert_intermediate_size": 256,
    "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0, "norm_topk_prob": True,
    "mtp_hybrid_override_pattern": "*E", "num_nextn_predict_layers": 1, "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16", "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": False,
}

# Hand-computed per-slot bytes (TP1, fp32 state, bf16 conv, ring_len 16). Element counts are
# derived here from the model geometry; which GDN rings are kept in fp32 is the kernels' choice
# (replayssm_kernels.gdn.rings.gdn_ring_shapes), the rest are in the activation dtype (bf16).
L = 16
GDN_STATE = 3 * (4 * 128 * 128 * 4 + 1024 * 3 * 2)  # 804,864
_GDN_ELEMS = {"d": 4 * L * 128, "k": 2 * L * 128, "g": 4 * L, "rawv": 4 * L * 128, "rawk": 2 * L * 128, "beta": 4 * L}
_GDN_FP32 = {name: fp32 for name, (_, fp32) in gdn_ring_shapes(2, 4, 128, 128, L).items()}
assert _GDN_FP32["g"] and _GDN_FP32["beta"] and not _GDN_FP32["rawv"] and not _GDN_FP32["rawk"]
GDN_RINGS = 3 * sum(n * (4 if _GDN_FP32[name] else 2) for name, n in _GDN_ELEMS.items())
M2_STATE = 2 * (8 * 64 * 128 * 4 + (8 * 64 + 2 * 2 * 128) * 3 * 2)  # 536,576
M2_RINGS = 2 * (8 * L * 64 * 2 + 2 * L * 128 * 2 + 8 * L * 2)  # x, B, dt in bf16: 49,664
CURSORS = 12  # wpos, origin, tickets


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_models_mem")
    out = {}
    for name, cfg in (("qwen3_next", QWEN3_NEXT), ("nemotron_h", NEMOTRON_H)):
        d = root / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        out[name] = str(d)
    return out


@pytest.fixture
def published(models):
    """A published (triton) ServerArgs for get_schedule()/get_memory(), restored afterwards."""
    with get_context().preserve_config(), get_parallel().override(attn_tp_size=1):
        sa = ServerArgs(model_path=models["qwen3_next"], device="cpu", skip_tokenizer_init=True,
                        disable_radix_cache=False, mamba_radix_cache_strategy="no_buffer",
                        disable_overlap_schedule=True, max_running_requests=8)
        publish(sa, role="test")
        yield sa


def configurator(models, name, *, replayssm=True, ring_len=L, draft=None, spec=SpeculativeAlgorithm.NONE):
    sa = ServerArgs(model_path=models[name], device="cpu", skip_tokenizer_init=True, disable_radix_cache=True)
    mc = sa.get_model_config()
    fake_sa = SimpleNamespace(
        mamba_backend="replayssm" if replayssm else "triton",
        _replayssm_ring_len=ring_len, _replayssm_family="gdn" if name == "qwen3_next" else "mamba2",
        _replayssm_validated="test", max_speculative_num_draft_tokens=draft,
    )
    return SlottedConfigurator(
        server_args=fake_sa, model_config=mc, mambaish_config=mambaish_config(mc),
        hybrid_gdn_config=hybrid_gdn_config(mc), model_dtype=bf16, spec_algorithm=spec,
        ps=SimpleNamespace(pp_size=1, attn_dp_size=1),
    )


@dataclass(slots=True, kw_only=True)
class SlottedConfigurator:
    """Stands in for SGLang's KVCacheConfigurator, slotted like it: the plugin cannot add attributes
    to it (a server died on exactly that, see test_configurator_is_slotted)."""

    server_args: object
    model_config: object
    mambaish_config: object
    hybrid_gdn_config: object
    model_dtype: object
    spec_algorithm: object
    ps: object

    def _calculate_mamba_ratio(self):
        return 1


def test_configurator_is_slotted():
    # The real class takes no new attributes, and neither does the stand-in the memory tests use.
    for cls in (KVCacheConfigurator, SlottedConfigurator):
        obj = object.__new__(cls)
        with pytest.raises(AttributeError):
            obj._replayssm_anything = True


def test_ring_bytes_from_first_principles(models, published):
    for name, state, rings in (("qwen3_next", GDN_STATE, GDN_RINGS), ("nemotron_h", M2_STATE, M2_RINGS)):
        cfg = configurator(models, name)
        sizes = memory.slot_bytes(cfg)
        assert sizes == {"state": state, "rings": rings, "cursors": CURSORS, "total": state + rings + CURSORS}, name
    # ring length scales the rings linearly
    assert memory.slot_bytes(configurator(models, "qwen3_next", ring_len=4))["rings"] == GDN_RINGS // 4
    assert memory.slot_bytes(configurator(models, "nemotron_h", ring_len=8))["rings"] == M2_RINGS // 2


@pytest.mark.parametrize("name", ["qwen3_next", "nemotron_h"])
def test_ratio_solve(models, published, name):
    cfg = configurator(models, name)
    per_slot = memory.slot_bytes(cfg)["total"]
    rest = 10.0
    r = get_schedule().mamba_full_memory_ratio
    assert get_schedule().max_mamba_cache_size is None and not get_memory().disable_radix_cache
    budget = rest * r / (1 + r) * GIB
    slots, left = memory.solve_max_mamba_cache(cfg, rest)
    assert slots == int((budget - per_slot) // per_slot)
    assert (slots + 1) * per_slot <= budget < (slots + 2) * per_slot
    assert left == pytest.approx(rest - (slots + 1) * per_slot / GIB, abs=1e-12)


def test_explicit_sizes(models, published):
    cfg = configurator(models, "qwen3_next", draft=4, spec=SpeculativeAlgorithm.EAGLE)
    per_slot = GDN_STATE + GDN_RINGS + CURSORS
    with get_schedule().override(max_mamba_cache_size=100):
        slots, left = memory.solve_max_mamba_cache(cfg, 10.0)
        assert slots == 100 and left == pytest.approx(10.0 - 101 * per_slot / GIB, abs=1e-12)
    with get_memory().override(disable_radix_cache=True), get_schedule().override(max_running_requests=48):
        slots, left = memory.solve_max_mamba_cache(cfg, 10.0)
        assert slots == 48 and left == pytest.approx(10.0 - 49 * per_slot / GIB, abs=1e-12)
    with get_schedule().override(max_mamba_cache_size=0):
        with pytest.raises(RuntimeError, match="replayssm-ring-len"):
            memory.solve_max_mamba_cache(cfg, 10.0)


def test_no_intermediate_ssm_reservation_under_speculation(models, published):
    """SGLang reserves per_req * (R + 1) * D for intermediate_ssm; ReplaySSM does not."""
    from sglang.srt.runtime_context import get_spec

    D = 4
    stock_fn = inspect.unwrap(KVCacheConfigurator._handle_max_mamba_cache)
    ours = configurator(models, "qwen3_next", draft=D, spec=SpeculativeAlgorithm.EAGLE)
    stock = configurator(models, "qwen3_next", replayssm=False, draft=D, spec=SpeculativeAlgorithm.EAGLE)
    with get_spec().override(speculative_num_draft_tokens=D), get_memory().override(disable_radix_cache=True), \
            get_schedule().override(max_running_requests=48):
        with get_context().preserve_config():
            stock_left = stock_fn(stock, 10.0)
            assert get_schedule().max_mamba_cache_size == 48
        intermediate = GDN_STATE * (48 + 1) * D
        assert stock_left == pytest.approx(10.0 - intermediate / GIB - 49 * GDN_STATE / GIB, abs=1e-9)
        slots, left = memory.solve_max_mamba_cache(ours, 10.0)
        assert slots == 48
        assert left == pytest.approx(10.0 - 49 * (GDN_STATE + GDN_RINGS + CURSORS) / GIB, abs=1e-12)
        assert left - stock_left == pytest.approx((intermediate - 49 * (GDN_RINGS + CURSORS)) / GIB, abs=1e-9)
    # ratio mode: SGLang's joint solve shrinks the slot count for the scratch, ours does not
    with get_spec().override(speculative_num_draft_tokens=D):
        with get_context().preserve_config():
            stock_fn(stock, 10.0)
            stock_slots = get_schedule().max_mamba_cache_size
        slots, _ = memory.solve_max_mamba_cache(ours, 10.0)
        r = get_schedule().mamba_full_memory_ratio
        budget = 10.0 * r / (1 + r) * GIB
        assert stock_slots == int((budget - GDN_STATE * (1 + D)) // (GDN_STATE * (1 + D / 1)))
        assert slots == int((budget - (GDN_STATE + GDN_RINGS + CURSORS)) // (GDN_STATE + GDN_RINGS + CURSORS))
        assert slots > stock_slots


def test_hook_overrides_pool_size_and_passes_other_backends_through(models, published):
    cfg = configurator(models, "qwen3_next")
    calls = []

    def original(self, rest):
        calls.append(rest)
        return "stock"

    with get_context().preserve_config():
        left = memory.around_handle_max_mamba_cache(original, cfg, 10.0)
        slots, expect_left = memory.solve_max_mamba_cache(cfg, 10.0)
        assert calls == [] and left == expect_left
        assert get_schedule().max_mamba_cache_size == slots
    stock = configurator(models, "qwen3_next", replayssm=False)
    assert memory.around_handle_max_mamba_cache(original, stock, 10.0) == "stock" and calls == [10.0]


@pytest.mark.parametrize("name, draft", [("qwen3_next", None), ("qwen3_next", 4), ("nemotron_h", 4)])
def test_pool_allocates_what_the_solver_charges(models, published, name, draft):
    cfg = configurator(models, name, draft=draft)
    sizes = memory.slot_bytes(cfg)
    with get_parallel().override(attn_tp_size=1):
        params = cfg.mambaish_config.mamba2_cache_params
    ctx = memory.build_context_for(cfg)
    assert ctx == PoolBuildContext(family=cfg.server_args._replayssm_family, ring_len=L, act_dtype=bf16,
                                   max_draft_tokens=draft)
    with pool_build_context(ctx):
        pool = ReplaySSMMambaPool(size=3, spec_state_size=2, cache_params=params, mamba_layer_ids=params.layers,
                                  device="cpu", speculative_num_draft_tokens=draft, speculative_eagle_topk=1)
    S = 3 + 1
    ring_total = pool.replayssm_rings.nbytes()
    assert ring_total == S * sizes["rings"]
    assert ring_total == S * ring_bytes_per_slot(ctx.family, params, L, bf16, len(params.layers))
    state = sum(t.numel() * t.element_size() for t in [pool.mamba_cache.temporal, *pool.mamba_cache.conv])
    assert state == S * sizes["state"]
    cursors = (pool.replayssm_wpos.numel() + pool.replayssm_origin.numel() + pool.replayssm_tickets.numel()) * 4
    assert cursors == S * sizes["cursors"]
    if draft is not None:
        assert pool.mamba_cache.intermediate_ssm is None


@pytest.mark.parametrize("form", [1, 2], ids=["tree", "shuffle"])
def test_solver_charges_no_raw_key_ring_in_the_tree_forms(models, published, form):
    """With the tree or shuffle replay form in effect (the GPU default at K = 128), the GDN rings
    keep no raw keys: the solver's per-slot ring bytes drop by exactly the raw-key ring's (three
    layers of H x L x K bf16), and the pool built under the same setting allocates what it charges."""
    from replayssm_kernels.configs import override

    cfg = configurator(models, "qwen3_next", draft=4)
    with override("gdn_k_tree", (0,)):
        plain = memory.slot_bytes(cfg)
    with override("gdn_k_tree", (form,)):
        lean = memory.slot_bytes(cfg)
        with get_parallel().override(attn_tp_size=1):
            params = cfg.mambaish_config.mamba2_cache_params
        with pool_build_context(memory.build_context_for(cfg)):
            pool = ReplaySSMMambaPool(size=3, spec_state_size=2, cache_params=params, mamba_layer_ids=params.layers,
                                      device="cpu", speculative_num_draft_tokens=4, speculative_eagle_topk=1)
    assert plain["rings"] == GDN_RINGS
    assert plain["rings"] - lean["rings"] == 3 * _GDN_ELEMS["rawk"] * 2
    assert lean["total"] == plain["total"] - 3 * _GDN_ELEMS["rawk"] * 2 and lean["state"] == plain["state"]
    assert not pool.replayssm_rings.has_raw_keys and pool.replayssm_rings.nbytes() == 4 * lean["rings"]


def test_gdn_decode_only_server_below_the_ring_threshold_gets_no_rings(models, published, caplog):
    """A GDN server without speculative decoding that can never run `ring_min_batch("gdn")` requests
    (here --max-running-requests 8) would only pay memory for rings: none are allocated, the pool gets
    stock SGLang's slot count, every decode batch runs SGLang's kernel, and the log says so. With the
    threshold lowered, with speculative decoding, or for Mamba-2, the rings stay."""
    import logging

    from replayssm_kernels.configs import override

    from sglang_replayssm.backends.common import ReplaySSMBatchState

    stock_fn = inspect.unwrap(KVCacheConfigurator._handle_max_mamba_cache)
    cfg = configurator(models, "qwen3_next")
    with get_context().preserve_config():
        stock_fn(configurator(models, "qwen3_next", replayssm=False), 10.0)
        stock_slots = get_schedule().max_mamba_cache_size
    with get_context().preserve_config(), caplog.at_level(logging.INFO, logger="sglang_replayssm"):
        memory.around_handle_max_mamba_cache(None, cfg, 10.0)
        assert get_schedule().max_mamba_cache_size == stock_slots  # cursors (12 B/slot) fit the slack
    assert "no rings allocated" in caplog.text and "at most 8 running requests" in caplog.text
    assert memory.slot_bytes(cfg)["rings"] == 0
    ctx = memory.build_context_for(cfg)
    assert ctx.ring_len == 0
    with get_parallel().override(attn_tp_size=1):
        params = cfg.mambaish_config.mamba2_cache_params
    with pool_build_context(ctx):
        pool = ReplaySSMMambaPool(size=3, spec_state_size=2, cache_params=params, mamba_layer_ids=params.layers,
                                  device="cpu", speculative_num_draft_tokens=None, speculative_eagle_topk=1)
    assert pool.replayssm_rings.nbytes() == 0
    st = ReplaySSMBatchState(pool, "cpu")
    st.prepare(SimpleNamespace(forward_mode=ForwardMode.DECODE), torch.arange(4, dtype=torch.int32),
               graph=False, in_capture=False)
    assert st.decode_stock and pool.replayssm_wpos.tolist() == [0, 0, 0, 0]

    with override("gdn_ring_min_batch", (8,)):
        assert memory.plan_rings(cfg, 10.0) == (True, 8)
    assert memory.plan_rings(configurator(models, "qwen3_next", draft=4, spec=SpeculativeAlgorithm.EAGLE), 10.0)[0]
    assert memory.plan_rings(configurator(models, "nemotron_h"), 10.0)[0]
    with get_schedule().override(max_running_requests=4096):  # only the slots cap the requests
        ok, cap = memory.plan_rings(cfg, 200.0)
        assert ok and cap >= 256
    # so little memory that not one slot fits with rings, but one does without
    per_slot = memory.slot_bytes(configurator(models, "qwen3_next"))
    r = get_schedule().mamba_full_memory_ratio
    tight = (2 * (per_slot["state"] + per_slot["cursors"]) + 64) * (1 + r) / r / GIB  # 2 slots w/o rings
    assert memory.plan_rings(cfg, tight) == (False, 0)
    assert memory.solve_max_mamba_cache(cfg, tight)[0] >= 1
