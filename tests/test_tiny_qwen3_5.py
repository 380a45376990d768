"""The tiny text-only Qwen3.5 checkpoints, dense (`make_tiny_model.py --preset qwen3_5`) and MoE
(`--preset qwen3_5_moe`), against SGLang 0.5.17's own code on CPU, before any GPU serves them:

* SGLang's model classes for the target (`Qwen3_5ForCausalLM` / `Qwen3_5MoeForCausalLM`) and the
  NEXTN draft (`Qwen3_5ForCausalLMMTP`, MoE or dense after the config) are built and load the
  checkpoint with their own `load_weights`: every tensor reaches a parameter (fused ones included:
  `in_proj_qkv` + `in_proj_z` -> `in_proj_qkvz`, `q/k/v_proj` -> `qkv_proj`, `gate/up_proj` ->
  `gate_up_proj`, and each expert's `gate/up_proj` / `down_proj` -> its slice of the MoE layer's
  `experts.w13_weight` / `w2_weight`: SGLang's FusedMoE layer builds on CPU, and its own expert
  weight loader runs), every parameter is written, and the values land unchanged;
* the tensor shapes follow the config;
* the plugin sees a GDN hybrid;
* ServerArgs leaves the radix-cache strategy of these archs unresolved (they are missing from SGLang's
  mamba radix-cache arch sets), which is why the e2e cases pick one (e2e_parity.radix_cache_args)
  and why our server refuses the unresolved pair (no buffer, overlap scheduler on), naming the fixes.
"""

import importlib.util
import json
import logging
import re
import sys
import types
from pathlib import Path

import pytest
import torch

from script_loader import load_script

mtm = load_script("make_tiny_model")

# The draft shares the target's embedding and head (SGLang's set_embed_and_head); the draft loader
# skips every name without "mtp".
DRAFT_SHARED = {"model.embed_tokens.weight", "lm_head.weight"}
# preset: (target arch, SGLang config class in sglang.srt.configs.qwen3_5)
PRESETS = {
    "qwen3_5": ("Qwen3_5ForCausalLM", "Qwen3_5TextConfig"),
    "qwen3_5_moe": ("Qwen3_5MoeForCausalLM", "Qwen3_5MoeTextConfig"),
}
EXPERT = re.compile(r"\.experts\.(\d+)\.")  # a per-expert checkpoint key


@pytest.fixture(scope="module", params=sorted(PRESETS))
def preset(request):
    return request.param


@pytest.fixture(scope="module")
def ckpt(preset, tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt") / preset
    # knob 0: mtp.fc = [I | 0]; no CPU measurements (test_tiny_model covers them).
    mtm.build(preset, d, seed=2, accept_rate_knob=0.0, mixer_out_scale=300.0, measure_outputs=False)
    return d


@pytest.fixture(scope="module")
def tensors(ckpt):
    from safetensors.torch import load_file

    return load_file(str(ckpt / "model.safetensors"))


@pytest.fixture(scope="module")
def sglang_cpu(ckpt, tmp_path_factory):
    """What building SGLang model classes on CPU needs: a one-rank gloo group (get_pp_group),
    attention TP/DP sizes, a published ServerArgs, and an import SGLang's RotaryEmbedding makes on
    a platform that is neither CUDA nor its CPU engine (vllm's rotary kernel, never called here:
    nothing runs a forward)."""
    from sglang.srt.distributed import parallel_state as ps
    from sglang.srt.runtime_context import get_context, get_parallel, publish
    from sglang.srt.server_args import ServerArgs

    mp = pytest.MonkeyPatch()
    if importlib.util.find_spec("vllm") is None:
        vllm = types.ModuleType("vllm")
        vllm.__path__ = []
        ops = types.ModuleType("vllm._custom_ops")
        ops.rotary_embedding = None
        mp.setitem(sys.modules, "vllm", vllm)
        mp.setitem(sys.modules, "vllm._custom_ops", ops)
    own_dist = not ps.model_parallel_is_initialized()
    if own_dist:
        init = tmp_path_factory.mktemp("dist") / "init"
        ps.init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                        distributed_init_method=f"file://{init}")
        ps.initialize_model_parallel(1)
    try:
        with get_context().preserve_config(), get_parallel().override(
                attn_tp_size=1, attn_tp_rank=0, attn_dp_size=1, attn_dp_rank=0):
            publish(ServerArgs(model_path=str(ckpt), device="cpu", skip_tokenizer_init=True, disable_radix_cache=True),
                    role="test")
            yield
    finally:
        if own_dist:
            ps.destroy_model_parallel()
            ps.destroy_distributed_environment()
        mp.undo()


def _load(model, tensors):
    """Fill every parameter with NaN, then run the model's own `load_weights` on all checkpoint
    tensors. Returns (the names load_weights reports, {checkpoint name: parameters it reached})."""
    from sglang.srt.model_loader.weight_utils import default_weight_loader

    owner = {t.untyped_storage().data_ptr(): name for name, t in tensors.items()}
    reached = {}
    with torch.no_grad():
        for pname, p in model.named_parameters():
            p.fill_(float("nan"))
            loader = getattr(p, "weight_loader", default_weight_loader)

            def spy(param, w, *args, _loader=loader, _pname=pname, **kwargs):
                # Fused loaders get views (split chunks) of the checkpoint tensor: same storage.
                reached.setdefault(owner.get(w.untyped_storage().data_ptr(), "?"), set()).add(_pname)
                return _loader(param, w, *args, **kwargs)

            p.weight_loader = spy
    loaded = model.load_weights(iter(tensors.items()))
    return set(loaded), reached


def _holds(param: torch.Tensor, w: torch.Tensor) -> bool:
    """`w` is a block of whole rows of `param` (a fused parameter holds its shards stacked)."""
    p = param.detach().float().reshape(param.shape[0], -1)
    x = w.float().reshape(w.shape[0], -1)
    if x.shape[1] != p.shape[1]:
        return False
    return any(torch.equal(p[r:r + x.shape[0]], x) for r in range(p.shape[0] - x.shape[0] + 1))


def _check_loaded(model, tensors, want_names, want_params, caplog):
    with caplog.at_level(logging.WARNING):
        loaded, reached = _load(model, tensors)
    params = dict(model.named_parameters())
    assert "?" not in reached, "a loader got a tensor that is not a checkpoint tensor"
    assert set(reached) == want_names, (sorted(want_names - set(reached)), sorted(set(reached) - want_names))
    assert loaded == want_params, (sorted(want_params - loaded), sorted(loaded - want_params))
    for name in sorted(want_params):
        assert not torch.isnan(params[name]).any(), f"{name}: rows left unwritten"
    for name, pnames in sorted(reached.items()):
        expert = EXPERT.search(name)
        for pname in pnames:
            # An expert's tensor lands in its own slice of the MoE layer's 3-D parameter.
            param = params[pname] if expert is None else params[pname][int(expert.group(1))]
            assert _holds(param, tensors[name]), f"{name} is not a row block of {pname}"
    assert not [r.getMessage() for r in caplog.records if "not found" in r.getMessage()]
    return reached


def _assert_mlp_fused(reached, moe: bool, ckpt_prefix: str, param_prefix: str):
    """The split checkpoint MLP projections of one layer land in SGLang's fused parameters."""
    c, p = ckpt_prefix + "mlp.", param_prefix + "mlp."
    if not moe:
        assert reached[c + "gate_proj.weight"] == reached[c + "up_proj.weight"] == {p + "gate_up_proj.weight"}
        return
    assert reached[c + "experts.3.gate_proj.weight"] == reached[c + "experts.3.up_proj.weight"] \
        == {p + "experts.w13_weight"}
    assert reached[c + "experts.3.down_proj.weight"] == {p + "experts.w2_weight"}
    assert reached[c + "shared_expert.up_proj.weight"] == {p + "shared_expert.gate_up_proj.weight"}
    assert reached[c + "gate.weight"] == {p + "gate.weight"}


def test_target_loader_takes_every_target_tensor(preset, ckpt, tensors, sglang_cpu, caplog):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.models import qwen3_5_text

    arch = PRESETS[preset][0]
    mc = ModelConfig(str(ckpt), is_draft_model=False)
    assert mc.hf_config.architectures == [arch]
    model = getattr(qwen3_5_text, arch)(mc.hf_config)
    target_names = {n for n in tensors if not n.startswith("mtp.")}
    reached = _check_loaded(model, tensors, target_names, {n for n, _ in model.named_parameters()}, caplog)
    # The split checkpoint projections land in SGLang's fused parameters.
    L = "model.layers.0."
    assert reached[L + "linear_attn.in_proj_qkv.weight"] == reached[L + "linear_attn.in_proj_z.weight"] \
        == {L + "linear_attn.in_proj_qkvz.weight"}
    assert reached[L + "linear_attn.in_proj_b.weight"] == {L + "linear_attn.in_proj_ba.weight"}
    assert reached["model.layers.3.self_attn.q_proj.weight"] == {"model.layers.3.qkv_proj.weight"}
    for L in ("model.layers.0.", "model.layers.3."):  # a GDN and the attention layer
        _assert_mlp_fused(reached, preset == "qwen3_5_moe", L, L)


def test_draft_loader_takes_every_mtp_tensor(preset, ckpt, tensors, sglang_cpu, caplog):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.models.qwen3_5_mtp import Qwen3_5ForCausalLMMTP

    mc = ModelConfig(str(ckpt), is_draft_model=True)
    assert mc.hf_config.architectures == ["Qwen3_5ForCausalLMMTP"]
    model = Qwen3_5ForCausalLMMTP(mc.hf_config)
    mtp_names = {n for n in tensors if n.startswith("mtp.")}
    want = {n for n, _ in model.named_parameters()} - DRAFT_SHARED
    reached = _check_loaded(model, tensors, mtp_names, want, caplog)
    assert reached["mtp.fc.weight"] == {"fc.weight"}
    H = mc.hf_config.hidden_size
    assert torch.equal(dict(model.named_parameters())["fc.weight"].float(),
                       torch.cat([torch.eye(H), torch.zeros(H, H)], 1))  # knob 0: draft from the next token
    # The single MTP layer is a full-attention layer with the target's kind of MLP.
    assert reached["mtp.layers.0.self_attn.k_proj.weight"] == {"model.layers.0.qkv_proj.weight"}
    _assert_mlp_fused(reached, preset == "qwen3_5_moe", "mtp.layers.0.", "model.layers.0.")


def test_target_tensor_shapes_from_config(ckpt, tensors):
    """Shapes written out from config.json alone (H_k/H_v key/value heads, K/V head dims, the
    dense MLP or E experts with a gated shared expert)."""
    cfg = json.loads((ckpt / "config.json").read_text())
    H, V_ = cfg["hidden_size"], cfg["vocab_size"]
    Hk, Hv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    K, V, conv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"], cfg["linear_conv_kernel_dim"]
    nh, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    interval, n = cfg["full_attention_interval"], cfg["num_hidden_layers"]
    want = {"model.embed_tokens.weight": (V_, H), "lm_head.weight": (V_, H), "model.norm.weight": (H,)}
    for i in range(n):
        p = f"model.layers.{i}."
        want.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,)})
        if "num_experts" in cfg:
            E, I, Ish = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
            m = p + "mlp."
            want.update({m + "gate.weight": (E, H), m + "shared_expert_gate.weight": (1, H)})
            mlps = [(m + f"experts.{e}.", I) for e in range(E)] + [(m + "shared_expert.", Ish)]
        else:
            mlps = [(p + "mlp.", cfg["intermediate_size"])]
        for m, I in mlps:
            want.update({m + "gate_proj.weight": (I, H), m + "up_proj.weight": (I, H), m + "down_proj.weight": (H, I)})
        if (i + 1) % interval == 0:
            a = p + "self_attn."
            want.update({a + "q_proj.weight": (2 * nh * hd, H), a + "k_proj.weight": (kv * hd, H),
                         a + "v_proj.weight": (kv * hd, H), a + "o_proj.weight": (H, nh * hd),
                         a + "q_norm.weight": (hd,), a + "k_norm.weight": (hd,)})
        else:
            g = p + "linear_attn."
            want.update({g + "in_proj_qkv.weight": (2 * Hk * K + Hv * V, H), g + "in_proj_z.weight": (Hv * V, H),
                         g + "in_proj_b.weight": (Hv, H), g + "in_proj_a.weight": (Hv, H),
                         g + "conv1d.weight": (2 * Hk * K + Hv * V, 1, conv), g + "A_log": (Hv,),
                         g + "dt_bias": (Hv,), g + "norm.weight": (V,), g + "out_proj.weight": (H, Hv * V)})
    got = {k: tuple(v.shape) for k, v in tensors.items() if not k.startswith("mtp.")}
    assert got == want, {k: (got.get(k), want.get(k)) for k in set(got) | set(want) if got.get(k) != want.get(k)}


def test_plugin_sees_a_gdn_hybrid(preset, ckpt):
    from sglang.srt.configs import qwen3_5 as configs
    from sglang.srt.configs.hybrid_arch import hybrid_gdn_config
    from sglang.srt.configs.model_config import ModelConfig

    from sglang_replayssm.validation import detect_family

    for draft in (False, True):
        mc = ModelConfig(str(ckpt), is_draft_model=draft)
        assert type(hybrid_gdn_config(mc)) is getattr(configs, PRESETS[preset][1])
    assert detect_family(ModelConfig(str(ckpt))) == "gdn"


@pytest.fixture
def qwen3_next_config(tmp_path):
    d = tmp_path / "qwen3_next"
    mtm.build("qwen3_next", d, no_weights=True)
    return d


def test_radix_cache_strategy_left_unresolved(preset, ckpt, qwen3_next_config, plugin_env):
    """SGLang resolves the hybrid-mamba radix cache for Qwen3-Next but not for the text-only
    Qwen3.5 archs (dense and MoE): the strategy stays "auto" (no extra buffer, i.e. the no_buffer
    path) and the overlap scheduler stays on, the pair SGLang refuses for every arch it resolves.
    Our server refuses it, naming the three fixes, and starts with each of them (family gdn). If a
    later SGLang lists the arch, this fails, and the e2e cases' radix flags
    (e2e_parity.radix_cache_args) can go."""
    from sglang.srt.arg_groups.overrides import resolved_view
    from sglang.srt.server_args import ServerArgs

    from sglang_replayssm import args as rargs
    from sglang_replayssm import runtime

    base = dict(device="cpu", skip_tokenizer_init=True)
    # CPU stand-in for a GPU default: with the overlap scheduler off Qwen3-Next resolves to no_buffer
    # (on a GPU, with it on, to extra_buffer, which SGLang refuses without CUDA).
    v = resolved_view(ServerArgs(model_path=str(qwen3_next_config), disable_overlap_schedule=True, **base))
    assert v.uses_mamba_radix_cache and v.mamba_radix_cache_strategy == "no_buffer"
    sa = ServerArgs(model_path=str(ckpt), mamba_backend="triton", **base)
    v = resolved_view(sa)
    assert not v.disable_radix_cache
    assert not v.uses_mamba_radix_cache and v.mamba_radix_cache_strategy == "auto"
    assert not v.disable_overlap_schedule and not sa.enable_mamba_extra_buffer()
    # Our server refuses that pair with the flags that fix it, and takes each of them.
    with pytest.raises(ValueError, match="--mamba-radix-cache-strategy auto .*--disable-radix-cache") as e:
        ServerArgs(model_path=str(ckpt), mamba_backend="replayssm", **base)
    assert PRESETS[preset][0] in str(e.value)
    runtime.deactivate()
    # An explicit no_buffer with the overlap scheduler on: the same refusal, not called unresolved.
    with pytest.raises(ValueError, match="strategy no_buffer .*--disable-radix-cache") as e:
        ServerArgs(model_path=str(ckpt), mamba_backend="replayssm", mamba_radix_cache_strategy="no_buffer", **base)
    assert "unresolved" not in str(e.value)
    runtime.deactivate()
    for fix in (dict(disable_radix_cache=True), dict(mamba_radix_cache_strategy="extra_buffer"),
                dict(mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True)):
        sa = ServerArgs(model_path=str(ckpt), mamba_backend="replayssm", **base, **fix)
        assert rargs.validated_family(sa) == "gdn", fix
        runtime.deactivate()
    # An explicit extra_buffer is taken without SGLang's extra_buffer validation (which refuses
    # Qwen3-Next on CPU above): the e2e `:radix` cases rely on it being the GPU path Qwen3-Next takes.
    sa = ServerArgs(model_path=str(ckpt), mamba_radix_cache_strategy="extra_buffer", **base)
    assert sa.enable_mamba_extra_buffer() and not resolved_view(sa).uses_mamba_radix_cache
