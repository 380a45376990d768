"""CPU checks of scripts/make_tiny_model.py: the checkpoints load in transformers, SGLang 0.5.17
parses their configs into the expected mamba cache shapes, MTP tensors are complete, the
section-4.2 construction is in the weights, and the tokenizer round-trips text."""

import json
import os
from pathlib import Path

import pytest

from script_loader import load_script
import torch

os.environ.setdefault("USE_HUB_KERNELS", "NO")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

mtm = load_script("make_tiny_model")

# (preset, mixer_out_scale, knob): knob 0.3 exercises the calibration path.
BUILDS = {"qwen3_next": (300.0, 0.3), "qwen3_5": (300.0, 0.3), "qwen3_5_moe": (300.0, 0.3), "nemotron_h": (10.0, 0.3)}
QWEN = ("qwen3_next", "qwen3_5", "qwen3_5_moe")  # GDN presets: Qwen naming (model.*, mtp.fc, Gemma norms)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = {}
    for preset, (scale, knob) in BUILDS.items():
        d = tmp_path_factory.mktemp("ckpt") / preset
        info = mtm.build(preset, d, seed=1, accept_rate_knob=knob, mixer_out_scale=scale)
        out[preset] = (d, info)
    return out


def _tensors(d):
    from safetensors.torch import load_file

    return load_file(str(Path(d) / "model.safetensors"))


def test_files_and_config_fixes(built):
    for preset, (d, info) in built.items():
        names = {p.name for p in d.iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "generation_config.json"} <= names, names
        cfg = json.loads((d / "config.json").read_text())
        gen = json.loads((d / "generation_config.json").read_text())
        assert cfg["eos_token_id"] == 2 and gen["eos_token_id"] == 2 and cfg["pad_token_id"] == 0
        assert cfg["tie_word_embeddings"] is False
        if preset in QWEN:
            arch, model_type = {"qwen3_next": ("Qwen3NextForCausalLM", "qwen3_next"),
                                "qwen3_5": ("Qwen3_5ForCausalLM", "qwen3_5_text"),
                                "qwen3_5_moe": ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text")}[preset]
            assert cfg["architectures"] == [arch] and cfg["model_type"] == model_type
            assert cfg["full_attention_interval"] == 4
            assert cfg["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
            assert cfg["rope_theta"] == cfg["rope_parameters"]["rope_theta"]
            assert cfg["mtp_num_hidden_layers"] == 1
            # No mrope_section: SGLang's text-only Qwen3.5 wrapper would switch to mrope positions.
            assert "mrope_section" not in cfg["rope_parameters"]
            if preset == "qwen3_5":
                assert "num_experts" not in cfg  # dense: SGLang builds the MLP from model_type
            if preset != "qwen3_next":
                assert cfg["partial_rotary_factor"] == cfg["rope_parameters"]["partial_rotary_factor"] == 0.25
        else:
            assert cfg["architectures"] == ["NemotronHForCausalLM"]
            assert cfg["hybrid_override_pattern"] == "MEM*E"
            assert cfg["mtp_hybrid_override_pattern"] == "*E"
            assert cfg["mamba_n_groups"] == cfg["n_groups"] == 2
            assert cfg["num_hidden_layers"] == 5 and cfg["num_nextn_predict_layers"] == 1
            for k in ("layers_block_type", "mtp_layers_block_type", "time_step_limit"):
                assert k not in cfg, k
        assert info["bytes"] < 24 * 2**20, info["bytes"]


def _expected_mtp_shapes(preset, cfg):
    """Section 2.1 of the notes, written out independently of the builder."""
    H = cfg["hidden_size"]
    exp = {}
    if preset in QWEN:
        nh, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
        L = "mtp.layers.0."
        exp.update({
            "mtp.fc.weight": (H, 2 * H),
            "mtp.pre_fc_norm_embedding.weight": (H,),
            "mtp.pre_fc_norm_hidden.weight": (H,),
            "mtp.norm.weight": (H,),
            L + "input_layernorm.weight": (H,),
            L + "post_attention_layernorm.weight": (H,),
            L + "self_attn.q_proj.weight": (2 * nh * hd, H),
            L + "self_attn.k_proj.weight": (kv * hd, H),
            L + "self_attn.v_proj.weight": (kv * hd, H),
            L + "self_attn.o_proj.weight": (H, nh * hd),
            L + "self_attn.q_norm.weight": (hd,),
            L + "self_attn.k_norm.weight": (hd,),
        })
        if preset == "qwen3_5":  # dense MLP
            I = cfg["intermediate_size"]
            exp.update({L + "mlp.gate_proj.weight": (I, H), L + "mlp.up_proj.weight": (I, H),
                        L + "mlp.down_proj.weight": (H, I)})
            return exp
        E, I, Ish = cfg["num_experts"], cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"]
        exp.update({
            L + "mlp.gate.weight": (E, H),
            L + "mlp.shared_expert.gate_proj.weight": (Ish, H),
            L + "mlp.shared_expert.up_proj.weight": (Ish, H),
            L + "mlp.shared_expert.down_proj.weight": (H, Ish),
            L + "mlp.shared_expert_gate.weight": (1, H),
        })
        for e in range(E):
            exp[L + f"mlp.experts.{e}.gate_proj.weight"] = (I, H)
            exp[L + f"mlp.experts.{e}.up_proj.weight"] = (I, H)
            exp[L + f"mlp.experts.{e}.down_proj.weight"] = (H, I)
        return exp
    nh, kv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    E, I, Ish = cfg["n_routed_experts"], cfg["moe_intermediate_size"], cfg["moe_shared_expert_intermediate_size"]
    a, m = "mtp.layers.0.", "mtp.layers.1."
    exp.update({
        a + "enorm.weight": (H,),
        a + "hnorm.weight": (H,),
        a + "eh_proj.weight": (H, 2 * H),
        a + "norm.weight": (H,),
        a + "mixer.q_proj.weight": (nh * hd, H),
        a + "mixer.k_proj.weight": (kv * hd, H),
        a + "mixer.v_proj.weight": (kv * hd, H),
        a + "mixer.o_proj.weight": (H, nh * hd),
        m + "norm.weight": (H,),
        m + "mixer.gate.weight": (E, H),
        m + "mixer.gate.e_score_correction_bias": (E,),
        m + "mixer.shared_experts.up_proj.weight": (Ish, H),
        m + "mixer.shared_experts.down_proj.weight": (H, Ish),
        m + "final_layernorm.weight": (H,),
    })
    for e in range(E):
        exp[m + f"mixer.experts.{e}.up_proj.weight"] = (I, H)
        exp[m + f"mixer.experts.{e}.down_proj.weight"] = (H, I)
    return exp


def test_mtp_tensors_complete(built):
    for preset, (d, info) in built.items():
        cfg = json.loads((d / "config.json").read_text())
        t = _tensors(d)
        got = {k: tuple(v.shape) for k, v in t.items() if k.startswith("mtp.")}
        assert got == _expected_mtp_shapes(preset, cfg), sorted(set(got) ^ set(_expected_mtp_shapes(preset, cfg)))
        if preset == "nemotron_h":
            assert t["mtp.layers.1.mixer.gate.e_score_correction_bias"].dtype == torch.float32
            assert "backbone.embeddings.weight" in t and "backbone.embedding.weight" not in t
            assert float(t["mtp.layers.0.enorm.weight"].float().min()) == 1.0  # plain RMSNorm: ones
        else:
            assert float(t["mtp.pre_fc_norm_hidden.weight"].float().abs().max()) == 0.0  # Gemma norm: zeros


def test_accept_construction_in_weights(built):
    for preset, (d, info) in built.items():
        t = _tensors(d)
        cfg = json.loads((d / "config.json").read_text())
        H = cfg["hidden_size"]
        emb = t["model.embed_tokens.weight" if preset in QWEN else "backbone.embeddings.weight"].float()
        head = t["lm_head.weight"].float()
        # Every lm_head row is a scaled copy of exactly one embedding row (a permutation).
        en, hn = emb / emb.norm(dim=1, keepdim=True), head / head.norm(dim=1, keepdim=True)
        sim = hn @ en.T
        best = sim.argmax(1)
        assert torch.equal(best.sort().values, torch.arange(emb.shape[0])), "lm_head is not a row permutation of E"
        assert sim.max(1).values.min() > 0.99
        scale = (head.norm(dim=1) / emb[best].norm(dim=1)).mean().item()
        assert scale == pytest.approx(info["logit"] / H, rel=0.02)
        # MTP mix matrix [(1 - w) I | w I].
        w = info["mtp_mix_w"]
        assert 0.0 < w < 1.0  # knob 0.3 -> an interior, calibrated w
        key = "mtp.fc.weight" if preset in QWEN else "mtp.layers.0.eh_proj.weight"
        eye = torch.eye(H)
        want = torch.cat([(1 - w) * eye, w * eye], 1).to(t[key].dtype).float()
        assert torch.equal(t[key].float(), want)
        # Measurements in the info file: the target follows perm, the calibration lowered acceptance.
        assert info["follows_perm"] > 0.9
        assert info["est_first_draft_accept"] < info["est_first_draft_accept_w0"]
        assert info["history_logprob_delta_mean"] > 0.05, "outputs should depend on the SSM state"
        saved = json.loads((d / "tiny_model_info.json").read_text())
        assert saved["mtp_mix_w"] == w


def test_mixer_scale_changes_state_sensitivity(tmp_path):
    base = mtm.build("nemotron_h", tmp_path / "a", seed=3, mixer_out_scale=1.0)
    scaled = mtm.build("nemotron_h", tmp_path / "b", seed=3, mixer_out_scale=10.0)
    ta, tb = _tensors(tmp_path / "a"), _tensors(tmp_path / "b")
    k = "backbone.layers.0.mixer.out_proj.weight"
    assert torch.allclose(tb[k].float(), ta[k].float() * 10.0, rtol=1e-2, atol=1e-3)
    assert scaled["history_logprob_delta_mean"] > 5 * base["history_logprob_delta_mean"]


def test_fp32_init_gives_a_bf16_build():
    """The builder draws the random init in fp32 (faster) and then casts: every parameter and
    buffer must have the name, shape and dtype that `from_config(cfg, dtype=bf16)` gives it, the
    config must still say bf16, and the init must have the bf16 build's statistics."""
    from transformers import AutoModelForCausalLM

    for preset in ("qwen3_next", "qwen3_5", "qwen3_5_moe", "nemotron_h"):
        cfg, _ = mtm.make_config(preset, mtm.resolve_fields(preset, None, {}, {}))
        ref = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
        got = mtm._random_bf16_model(cfg)  # other draws than `ref`'s whatever the seed (fp32 vs bf16 RNG)
        for kind in ("named_parameters", "named_buffers"):
            want = {n: (t.dtype, tuple(t.shape)) for n, t in getattr(ref, kind)()}
            have = {n: (t.dtype, tuple(t.shape)) for n, t in getattr(got, kind)()}
            assert have == want, (preset, kind, {n: (have.get(n), want.get(n)) for n in set(have) | set(want)
                                                 if have.get(n) != want.get(n)})
        assert got.config.dtype == torch.bfloat16
        ref_p = dict(ref.named_parameters())
        for n, t in got.named_parameters():
            r = ref_p[n].float()
            if r.numel() >= 4096:  # same init distribution (other draws): means and spreads agree
                assert abs(t.float().std().item() - r.std().item()) <= 0.05 * r.std().item() + 1e-6, n
                assert abs(t.float().mean().item() - r.mean().item()) <= 0.05 * r.std().item() + 1e-3, n
            elif r.numel() and (r == r.flatten()[0]).all():  # constant inits (norms, dt_bias): equal
                assert torch.equal(t.float(), r), n


def test_transformers_reload(built):
    from transformers import AutoModelForCausalLM

    for preset, (d, info) in built.items():
        model, load = AutoModelForCausalLM.from_pretrained(str(d), output_loading_info=True, dtype=torch.bfloat16)
        extra = [k for k in load["unexpected_keys"] if not k.startswith("mtp.")]
        assert not load["missing_keys"] and not extra, (load["missing_keys"], extra)
        assert not load["mismatched_keys"] and not load["error_msgs"]
        t = _tensors(d)
        emb_key = "model.embed_tokens.weight" if preset in QWEN else "backbone.embeddings.weight"
        assert torch.equal(model.get_input_embeddings().weight, t[emb_key])
        assert torch.equal(model.lm_head.weight, t["lm_head.weight"])


def test_sglang_config_parsing(built):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.parser.conversation import get_conv_template_by_model_path
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.utils.hf_transformers import get_config

    expect = {
        # preset: (sglang config class, ssm layer ids, attention layer ids, temporal, conv)
        "qwen3_next": ("Qwen3NextConfig", [0, 1, 2], [3], (4, 128, 128), [(2 * 2 * 128 + 4 * 128, 3)]),
        "qwen3_5": ("Qwen3_5TextConfig", [0, 1, 2], [3], (4, 128, 128), [(2 * 2 * 128 + 4 * 128, 3)]),
        "qwen3_5_moe": ("Qwen3_5MoeTextConfig", [0, 1, 2], [3], (4, 128, 128), [(2 * 2 * 128 + 4 * 128, 3)]),
        "nemotron_h": ("NemotronHConfig", [0, 2], [3], (8, 64, 128), [(8 * 64 + 2 * 2 * 128, 3)]),
    }
    for preset, (d, info) in built.items():
        cls, ssm_ids, attn_ids, temporal, conv = expect[preset]
        cfg = get_config(str(d), trust_remote_code=False)
        assert type(cfg).__name__ == cls and type(cfg).__module__.startswith("sglang.")
        text = cfg.get_text_config()
        with get_parallel().override(attn_tp_size=1):
            params = text.mamba2_cache_params
        assert params.layers == ssm_ids
        assert tuple(params.shape.temporal) == temporal
        assert [tuple(c) for c in params.shape.conv] == conv
        assert params.dtype.temporal == torch.float32 and params.dtype.conv == torch.bfloat16
        assert text.full_attention_layer_ids == attn_ids
        if preset == "nemotron_h":
            assert text.mamba_n_groups == text.n_groups == 2  # mixer and cache agree
            assert text.mtp_hybrid_override_pattern == "*E"
        else:
            assert text.rope_theta == 10000.0
        if preset in ("qwen3_5", "qwen3_5_moe"):
            # What SGLang's Qwen3.5 attention reads: RoPE theta and parameters, the partial factor,
            # the output gate, and the MLP kind (dense or MoE, chosen from model_type).
            from sglang.srt.utils.hf_transformers import get_rope_config

            theta, rope = get_rope_config(text)
            assert theta == 10000.0 and rope["rope_type"] == "default" and "mrope_section" not in rope
            assert text.partial_rotary_factor == 0.25 and text.attn_output_gate is True
            assert text.model_type == {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text"}[preset]
        if preset == "qwen3_5_moe":
            # transformers' Qwen3.5 MoE router always renormalises the top-k weights; SGLang's
            # follows norm_topk_prob (not in config.json: its config class default).
            assert (text.num_experts, text.num_experts_per_tok, text.norm_topk_prob) == (8, 2, True)
            assert text.moe_intermediate_size == text.shared_expert_intermediate_size == 128
        target = ModelConfig(str(d), is_draft_model=False)
        draft = ModelConfig(str(d), is_draft_model=True)
        arch = cls.replace("TextConfig", "Config").replace("Config", "ForCausalLM")
        assert target.hf_config.architectures == [arch]
        # SGLang drafts every Qwen3.5 arch with Qwen3_5ForCausalLMMTP.
        assert draft.hf_config.architectures == ["Qwen3_5ForCausalLMMTP" if "Qwen3_5" in arch else arch + "MTP"]
        assert draft.hf_config.num_nextn_predict_layers == 1
        assert get_conv_template_by_model_path(str(d)) is None  # HF chat template is used


def test_tokenizer_roundtrip(built):
    from transformers import AutoTokenizer

    d, _ = built["qwen3_next"]
    tok = AutoTokenizer.from_pretrained(str(d))
    assert len(tok) == 2048
    assert tok.eos_token_id == 2 and tok.pad_token_id == 0
    assert [tok.convert_tokens_to_ids(s) for s in mtm.SPECIAL_TOKENS] == [0, 1, 2, 3, 4]
    samples = [
        "Find the remainder when $2^{2024}$ is divided by 7. \\boxed{2}",
        "Janet's ducks lay 16 eggs per day.\n\tShe eats three for breakfast!",
        "unicode: café, 数学, ∑_{k=1}^n k = n(n+1)/2 ✓  double  spaces",
    ]
    for s in samples:
        ids = tok.encode(s, add_special_tokens=False)
        assert max(ids) < 2048
        assert tok.decode(ids) == s
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_no_weights_real_shapes(tmp_path):
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.utils.hf_transformers import get_config

    cases = [
        (["--preset", "qwen3_next", "--shape", "qwen3-next-80b", "--num-layers", "12"], (32, 128, 128), 9, 151936,
         "Qwen3NextForCausalLM"),
        (["--preset", "nemotron_h", "--shape", "nemotron-3-super", "--pattern", "MEMEMEM*E"], (128, 64, 128), 4, 131072,
         "NemotronHForCausalLM"),
        (["--preset", "qwen3_5", "--shape", "qwen3.5-4b", "--num-layers", "8"], (32, 128, 128), 6, 248320,
         "Qwen3_5ForCausalLM"),
    ]
    for i, (argv, temporal, n_ssm, vocab, arch) in enumerate(cases):
        d = tmp_path / f"m{i}"
        mtm.main(argv + ["--no-weights", "--out", str(d)])
        assert not (d / "model.safetensors").exists()
        assert (d / "tokenizer.json").exists() and (d / "generation_config.json").exists()
        cfg = get_config(str(d), trust_remote_code=False)
        with get_parallel().override(attn_tp_size=1):
            params = cfg.get_text_config().mamba2_cache_params
        assert tuple(params.shape.temporal) == temporal
        assert len(params.layers) == n_ssm
        assert cfg.vocab_size == vocab
        assert json.loads((d / "config.json").read_text())["dtype"] == "bfloat16"
        # SGLang picks the model class from `architectures` (a server on a config without it died
        # in ModelConfig on the H200, 2026-11-30).
        assert json.loads((d / "config.json").read_text())["architectures"] == [arch]


def test_bad_overrides_rejected(tmp_path):
    with pytest.raises(ValueError):
        mtm.build("nemotron_h", tmp_path / "x", flags={"mtp_pattern": "*M"}, no_weights=True)
    with pytest.raises(ValueError):
        mtm.build("qwen3_next", tmp_path / "y", flags={"pattern": "MM*"}, no_weights=True)
    with pytest.raises(ValueError):
        mtm.build("qwen3_next", tmp_path / "z", flags={"ssm_heads": 3}, no_weights=True)
    with pytest.raises(ValueError, match="does not apply to preset qwen3_5"):  # dense: no experts
        mtm.build("qwen3_5", tmp_path / "w", flags={"num_experts": 16}, no_weights=True)
    info = mtm.build("qwen3_5_moe", tmp_path / "v", flags={"num_experts": 16}, no_weights=True)
    assert info["config"]["num_experts"] == 16
