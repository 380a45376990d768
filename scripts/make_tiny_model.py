#!/usr/bin/env python3
"""Build random-weight hybrid-SSM checkpoints that SGLang 0.5.17 serves, with an MTP (NEXTN) head.

Presets (tiny, real per-head shapes, a few MB):

  qwen3_next  Qwen3NextForCausalLM (GDN): hidden 256, H_k=2, H_v=4, K=V=128, conv 4,
              4 layers = 3 GDN + 1 attention (full_attention_interval 4), MoE 8 experts top-2,
              one MTP layer (full attention + MoE).
  qwen3_5     Qwen3_5ForCausalLM (text-only Qwen3.5, model_type qwen3_5_text, GDN): the same
              layer and head shapes as qwen3_next with a dense MLP (intermediate 512), one MTP
              layer (full attention + dense MLP; SGLang drafts with Qwen3_5ForCausalLMMTP).
  qwen3_5_moe Qwen3_5MoeForCausalLM (text-only Qwen3.5 MoE, model_type qwen3_5_moe_text, GDN):
              the qwen3_5 shapes with qwen3_next's MoE, one MTP layer (full attention + MoE;
              per-expert checkpoint keys, as transformers writes them).
  nemotron_h  NemotronHForCausalLM (Mamba-2): hidden 256, 8 heads x 64, state 128, n_groups 2,
              pattern MEM*E, MTP pattern *E.

Real-shape look-alikes for timing (``--shape``, or any field through the override flags /
``--set key=value``) are usually written with ``--no-weights`` (config + tokenizer only) and
served with ``--load-format dummy --speculative-draft-load-format dummy``.

Weights follow /work/shared/notes/tiny_models.md section 4.2 so that greedy outputs and NEXTN
acceptance are controllable:

* embeddings ``E ~ N(0, 1)``, a random permutation ``perm``, ``lm_head[perm[t]] = s * E[t]``:
  the target predicts ``perm[cur]``; ``s = logit / hidden`` puts the winning logit near
  ``--logit`` so that logprobs stay sensitive to small changes of the hidden state;
* MTP ``fc`` (Qwen) / ``eh_proj`` (Nemotron) ``= [(1 - w) I | w I]``: ``w = 0`` drafts
  ``perm[next]`` (accepted), ``w = 1`` drafts ``perm[cur]`` (rejected).  ``--accept-rate-knob b``
  picks ``w`` so that the estimated first-draft acceptance is ``(1 - b)`` times the acceptance at
  ``w = 0`` (``--knob-mode raw`` uses ``w = b`` as in the notes; the raw knob is close to a step
  at 0.5);
* ``--mixer-out-scale`` multiplies the SSM mixers' output projections so that the outputs
  depend on the recurrent state (a state bug must change logprobs or tokens).

The numbers measured on CPU with transformers (fraction of greedy tokens that follow ``perm``,
estimated acceptance, mixer/residual norm ratio) go to ``tiny_model_info.json``.

Usage:
  python scripts/make_tiny_model.py --preset qwen3_next --out .tiny/qwen3_next
  python scripts/make_tiny_model.py --preset qwen3_5 --out .tiny/qwen3_5 --mixer-out-scale 300 --accept-rate-knob 0.3
  python scripts/make_tiny_model.py --preset qwen3_5_moe --out .tiny/qwen3_5_moe --mixer-out-scale 300
  python scripts/make_tiny_model.py --preset nemotron_h --out .tiny/nemotron_h --accept-rate-knob 0.3
  python scripts/make_tiny_model.py --preset qwen3_next --shape qwen3-next-80b --no-weights --out /tmp/qn80
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
from pathlib import Path

# transformers would otherwise try to fetch hub kernels (causal-conv1d, mamba-ssm) for Nemotron-H.
os.environ.setdefault("USE_HUB_KERNELS", "NO")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
PAD_ID, EOS_ID = 0, 2  # positions in SPECIAL_TOKENS

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Tiny presets: config fields as the transformers config classes name them.
# The GDN presets share their dims; qwen3_next adds its MoE (SGLang's Qwen3-Next is always MoE),
# qwen3_5 is text-only Qwen3.5, for which SGLang builds a dense MLP (model_type qwen3_5_text), and
# qwen3_5_moe the same with the MoE (SGLang picks the MoE from model_type qwen3_5_moe_text; the
# MoE presets leave intermediate_size unused).
_TINY_GDN = dict(
    vocab_size=2048,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=4,
    full_attention_interval=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=256,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=128,
    linear_value_head_dim=128,
    linear_conv_kernel_dim=4,
    max_position_embeddings=4096,
    rope_theta=10000.0,
)
_TINY_MOE = dict(
    num_experts=8,
    num_experts_per_tok=2,
    moe_intermediate_size=128,
    shared_expert_intermediate_size=128,
)
PRESETS = {
    "qwen3_next": dict(_TINY_GDN, **_TINY_MOE),
    "qwen3_5": dict(_TINY_GDN),
    "qwen3_5_moe": dict(_TINY_GDN, **_TINY_MOE),
    "nemotron_h": dict(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=512,
        hybrid_override_pattern="MEM*E",
        mtp_hybrid_override_pattern="*E",
        mamba_num_heads=8,
        mamba_head_dim=64,
        ssm_state_size=128,
        n_groups=2,
        conv_kernel=4,
        expand=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=128,
        n_routed_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=256,
        moe_shared_expert_intermediate_size=256,
        n_shared_experts=1,
        n_group=1,
        topk_group=1,
        max_position_embeddings=4096,
    ),
}

# Real per-layer shapes, few layers and experts (notes section 7): for timing, usually --no-weights.
SHAPES = {
    "qwen3-next-80b": (
        "qwen3_next",
        dict(
            vocab_size=151936,
            hidden_size=2048,
            intermediate_size=5120,
            num_hidden_layers=8,
            full_attention_interval=4,
            num_attention_heads=16,
            num_key_value_heads=2,
            head_dim=256,
            linear_num_key_heads=16,
            linear_num_value_heads=32,
            num_experts=16,
            num_experts_per_tok=10,
            moe_intermediate_size=512,
            shared_expert_intermediate_size=512,
            max_position_embeddings=32768,
            rope_theta=10000000.0,
        ),
    ),
    # Qwen3.5-4B (dense text model: 24 GDN + 8 attention layers): hidden 2560, MLP 9216, 16 query /
    # 4 KV heads of 256, GDN 16 key / 32 value heads of 128, vocab 248320. The real model ties its
    # embeddings; this look-alike keeps a separate lm_head (the same matmul per step).
    "qwen3.5-4b": (
        "qwen3_5",
        dict(
            vocab_size=248320,
            hidden_size=2560,
            intermediate_size=9216,
            num_hidden_layers=8,
            full_attention_interval=4,
            num_attention_heads=16,
            num_key_value_heads=4,
            head_dim=256,
            linear_num_key_heads=16,
            linear_num_value_heads=32,
            max_position_embeddings=32768,
            rope_theta=10000000.0,
        ),
    ),
    "nemotron-3-super": (
        "nemotron_h",
        dict(
            vocab_size=131072,
            hidden_size=4096,
            hybrid_override_pattern="MEMEM*EM",
            mamba_num_heads=128,
            mamba_head_dim=64,
            n_groups=8,
            num_attention_heads=32,
            num_key_value_heads=2,
            head_dim=128,
            n_routed_experts=32,
            num_experts_per_tok=22,
            moe_intermediate_size=2688,
            moe_shared_expert_intermediate_size=5376,
            moe_latent_size=1024,
            routed_scaling_factor=5.0,
            max_position_embeddings=32768,
        ),
    ),
    "nemotron-nano-9b-v2": (
        "nemotron_h",
        dict(
            vocab_size=131072,
            hidden_size=4480,
            intermediate_size=15680,
            hybrid_override_pattern="M-M-M*M-",
            mtp_hybrid_override_pattern="",
            mamba_num_heads=128,
            mamba_head_dim=80,
            n_groups=8,
            num_attention_heads=40,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=32768,
        ),
    ),
}

# GDN presets (Qwen3-Next and Qwen3.5 naming: linear_attn mixers, Gemma norms, `mtp.fc`).
QWEN_PRESETS = ("qwen3_next", "qwen3_5", "qwen3_5_moe")

# Named override flags -> config field as (Qwen, Nemotron-H) (anything else: --set key=value).
FLAG_FIELDS = {
    "vocab_size": ("vocab_size", "vocab_size"),
    "hidden_size": ("hidden_size", "hidden_size"),
    "intermediate_size": ("intermediate_size", "intermediate_size"),
    "num_layers": ("num_hidden_layers", None),
    "full_attention_interval": ("full_attention_interval", None),
    "pattern": (None, "hybrid_override_pattern"),
    "mtp_pattern": (None, "mtp_hybrid_override_pattern"),
    "ssm_heads": ("linear_num_value_heads", "mamba_num_heads"),
    "ssm_groups": ("linear_num_key_heads", "n_groups"),
    "ssm_head_dim": ("linear_value_head_dim", "mamba_head_dim"),
    "ssm_state_size": ("linear_key_head_dim", "ssm_state_size"),
    "attn_heads": ("num_attention_heads", "num_attention_heads"),
    "kv_heads": ("num_key_value_heads", "num_key_value_heads"),
    "attn_head_dim": ("head_dim", "head_dim"),
    "num_experts": ("num_experts", "n_routed_experts"),
    "experts_per_tok": ("num_experts_per_tok", "num_experts_per_tok"),
    "moe_intermediate_size": ("moe_intermediate_size", "moe_intermediate_size"),
    "shared_intermediate_size": ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size"),
    "max_position_embeddings": ("max_position_embeddings", "max_position_embeddings"),
}
# The dense qwen3_5 preset has no experts: these flags are refused there.
MOE_FLAGS = ("num_experts", "experts_per_tok", "moe_intermediate_size", "shared_intermediate_size")


# ----------------------------------------------------------------------------------------------
# Tokenizer
# ----------------------------------------------------------------------------------------------

_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her she there been one all we their has would when if so no will more "
    "what about up out who them some can into only its time new two may first also after any "
    "number find let compute prove answer integer real positive sum product triangle circle square "
    "point line angle area probability value function sequence remainder divided prime digit "
    "solution equation matrix vector state model token server request decode verify replay cache "
    "question step therefore because since each every many most least greatest smallest how why "
    "Alice Bob Carol Janet eggs dollars hours minutes apples books students school store week "
    "think reason check final result total cost price pays sells buys gives takes makes needs"
).split()
_SYMBOLS = list("+-*/=^_()[]{}<>.,;:!?'\"$%&#@|\\~`") + [
    "\\frac", "\\sqrt", "\\cdot", "\\boxed", "\\left", "\\right", "\\pi", "\\le", "\\ge", "\\times",
    "\\sum", "\\int", "\\alpha", "\\beta", "\\theta", "$$", "\\(", "\\)", "\n", "\t", "  ",
]


def _corpus(seed: int, n_lines: int = 600) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for i in range(n_lines):
        parts = []
        for _ in range(rng.randint(4, 24)):
            r = rng.random()
            if r < 0.6:
                w = rng.choice(_WORDS)
                parts.append(w.capitalize() if rng.random() < 0.1 else w)
            elif r < 0.8:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 6))))
            else:
                parts.append(rng.choice(_SYMBOLS))
        lines.append(" ".join(parts))
    # Every printable ASCII character, a few non-ASCII samples (byte-level covers the rest).
    lines.append("".join(chr(c) for c in range(32, 127)))
    lines.append("café naïve Straße 数学 математика ∑ ∫ √ π ≤ ≥ → ✓")
    return lines


def build_tokenizer(vocab_size: int = 2048, seed: int = 0):
    """Byte-level BPE trained in-process (no download), ChatML specials and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=1,
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=SPECIAL_TOKENS[EOS_ID],
        pad_token=SPECIAL_TOKENS[PAD_ID],
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = CHATML_TEMPLATE
    for i, s in enumerate(SPECIAL_TOKENS):
        assert fast.convert_tokens_to_ids(s) == i, (s, fast.convert_tokens_to_ids(s))
    return fast


# ----------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------


def resolve_fields(preset: str, shape: str | None, flags: dict, sets: dict) -> dict:
    """Preset fields, then the shape look-alike, then named flags, then --set."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
    fields = dict(PRESETS[preset])
    if shape is not None:
        shape_preset, shape_fields = SHAPES[shape]
        if shape_preset != preset:
            raise ValueError(f"--shape {shape} is a {shape_preset} shape, not {preset}")
        fields.update(shape_fields)
    col = 0 if preset in QWEN_PRESETS else 1
    for flag, value in flags.items():
        if value is None:
            continue
        key = None if (preset == "qwen3_5" and flag in MOE_FLAGS) else FLAG_FIELDS[flag][col]
        if key is None:
            raise ValueError(f"--{flag.replace('_', '-')} does not apply to preset {preset}")
        fields[key] = value
    fields.update(sets)
    return fields


def _qwen_layer_types(n_layers: int, interval: int) -> list[str]:
    # SGLang's rule (configs/qwen3_next.py): (i + 1) % interval == 0 -> full attention.
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]


def make_config(preset: str, fields: dict):
    """Return (transformers config, dict of keys to write into config.json afterwards)."""
    fields = dict(fields)
    common = dict(eos_token_id=EOS_ID, pad_token_id=PAD_ID, bos_token_id=None, tie_word_embeddings=False)
    if preset in QWEN_PRESETS:
        interval = int(fields.pop("full_attention_interval"))
        rope_theta = float(fields.pop("rope_theta"))
        n_layers = int(fields["num_hidden_layers"])
        layer_types = _qwen_layer_types(n_layers, interval)
        if "linear_attention" not in layer_types:
            raise ValueError(f"{preset} needs at least one GDN layer")
        if fields["linear_num_value_heads"] % fields["linear_num_key_heads"]:
            raise ValueError("linear_num_value_heads must be a multiple of linear_num_key_heads")
        # No mrope_section: SGLang's text-only Qwen3.5 wrapper would then read mrope positions.
        rope = {"rope_type": "default", "rope_theta": rope_theta, "partial_rotary_factor": 0.25}
        if preset == "qwen3_next":
            from transformers import Qwen3NextConfig

            cfg = Qwen3NextConfig(
                layer_types=layer_types,
                rope_parameters=rope,
                decoder_sparse_step=1,
                mlp_only_layers=[],
                **common,
                **fields,
            )
        else:
            from transformers import Qwen3_5MoeTextConfig, Qwen3_5TextConfig

            cls = Qwen3_5MoeTextConfig if preset == "qwen3_5_moe" else Qwen3_5TextConfig
            cfg = cls(layer_types=layer_types, rope_parameters=rope, **common, **fields)
        patch = {
            "full_attention_interval": interval,
            "rope_theta": rope_theta,
            "attn_output_gate": True,
            "mamba_ssm_dtype": "float32",
            "mtp_num_hidden_layers": 1,
            "mtp_use_dedicated_embeddings": False,
            "dtype": "bfloat16",
        }
        if preset != "qwen3_next":
            # SGLang's Qwen3.5 attention reads the top-level field (its config class defaults it
            # to 0.25); transformers keeps it in rope_parameters. Write both, equal.
            patch["partial_rotary_factor"] = rope["partial_rotary_factor"]
        return cfg, patch
    if preset == "nemotron_h":
        from transformers import NemotronHConfig

        pattern = fields["hybrid_override_pattern"]
        mtp_pattern = fields.get("mtp_hybrid_override_pattern", "")
        if set(pattern) - set("ME*-"):
            raise ValueError(f"pattern {pattern!r}: only M, E, *, - are allowed")
        if "M" not in pattern:
            raise ValueError(f"pattern {pattern!r} has no Mamba layer")
        if set(mtp_pattern) - set("*E"):
            raise ValueError(f"MTP pattern {mtp_pattern!r}: SGLang's NemotronH MTP supports only '*' and 'E'")
        for ch in set(mtp_pattern):
            if ch not in pattern:
                raise ValueError(f"MTP pattern {mtp_pattern!r} needs a {ch!r} layer in the target pattern")
        if (fields["mamba_num_heads"] * fields["mamba_head_dim"]) % fields["n_groups"]:
            raise ValueError("mamba_num_heads * mamba_head_dim must be a multiple of n_groups")
        kw = dict(fields)
        if not mtp_pattern:
            kw.pop("mtp_hybrid_override_pattern", None)
        cfg = NemotronHConfig(
            num_nextn_predict_layers=1 if mtp_pattern else 0,
            use_mamba_kernels=False,
            **common,
            **kw,
        )
        patch = {
            "mamba_n_groups": fields["n_groups"],
            "hybrid_override_pattern": pattern,
            "num_hidden_layers": len(pattern),
            "num_nextn_predict_layers": 1 if mtp_pattern else 0,
            "dtype": "bfloat16",
        }
        if mtp_pattern:
            patch["mtp_hybrid_override_pattern"] = mtp_pattern
        return cfg, patch
    raise ValueError(preset)


def patch_config_json(out: Path, patch: dict, drop: tuple[str, ...] = ()) -> dict:
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    for k in drop:
        cfg.pop(k, None)
    cfg.update(patch)
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    return cfg


NEMOTRON_DROP = ("layers_block_type", "mtp_layers_block_type", "time_step_limit")


# ----------------------------------------------------------------------------------------------
# Weights
# ----------------------------------------------------------------------------------------------


def _final_norm(model, preset):
    return model.model.norm if preset in QWEN_PRESETS else model.model.norm_f


def _embedding(model):
    return model.get_input_embeddings()


def _mixers(model, preset):
    """(name, module) of every SSM mixer in the target."""
    layers = model.model.layers
    out = []
    for i, layer in enumerate(layers):
        if preset in QWEN_PRESETS:
            if hasattr(layer, "linear_attn"):  # GDN layers only
                out.append((f"layers.{i}.linear_attn", layer.linear_attn))
        else:
            if getattr(layer, "block_type", None) == "mamba":
                out.append((f"layers.{i}.mixer", layer.mixer))
    return out


def _rms(x, eps=1e-6):
    import torch

    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def apply_construction(model, preset: str, logit: float, mixer_out_scale: float, gen):
    """Embeddings N(0,1), permuted scaled lm_head, scaled mixer outputs. Returns perm (LongTensor)."""
    import torch

    emb = _embedding(model).weight
    V, H = emb.shape
    with torch.no_grad():
        E = torch.randn(V, H, generator=gen)
        perm = torch.randperm(V, generator=gen)
        head = torch.empty_like(E)
        head[perm] = E * (logit / H)  # row perm[t] = s * E[t]
        emb.copy_(E.to(emb.dtype))
        model.lm_head.weight.copy_(head.to(model.lm_head.weight.dtype))
        for _, mixer in _mixers(model, preset):
            mixer.out_proj.weight.mul_(mixer_out_scale)
    return perm


def mtp_mix_matrix(H: int, w: float, dtype):
    import torch

    eye = torch.eye(H)
    return torch.cat([(1.0 - w) * eye, w * eye], dim=1).to(dtype)


def make_mtp_tensors(preset: str, target: dict, cfg_json: dict, w: float, gen) -> dict:
    """MTP tensors (notes section 2.1) built from templates of the target's own layers."""
    import torch

    H = cfg_json["hidden_size"]
    dtype = next(iter(target.values())).dtype

    def fresh(name, t):
        if name.endswith("e_score_correction_bias"):
            return torch.zeros(t.shape, dtype=torch.float32)
        if t.dim() == 1:  # norms (Gemma zeros / plain ones), D, biases: keep the init value
            return t.clone()
        return (torch.randn(t.shape, generator=gen) * 0.02).to(t.dtype)

    out = {}
    if preset in QWEN_PRESETS:
        # The attention layer's own tensors (self_attn.*, norms, and the MLP: the MoE with
        # per-expert keys, or qwen3_5's dense gate/up/down) are the MTP layer's templates.
        interval = cfg_json["full_attention_interval"]
        attn_idx = interval - 1
        prefix = f"model.layers.{attn_idx}."
        tmpl = {k[len(prefix):]: v for k, v in target.items() if k.startswith(prefix)}
        if not any(k.startswith("self_attn.") for k in tmpl):
            raise RuntimeError(f"layer {attn_idx} is not a full-attention layer")
        for k, v in tmpl.items():
            out[f"mtp.layers.0.{k}"] = fresh(k, v)
        zeros = torch.zeros(H, dtype=dtype)  # Gemma RMSNorm: stored w, applied (1 + w)
        out["mtp.pre_fc_norm_embedding.weight"] = zeros.clone()
        out["mtp.pre_fc_norm_hidden.weight"] = zeros.clone()
        out["mtp.norm.weight"] = zeros.clone()
        out["mtp.fc.weight"] = mtp_mix_matrix(H, w, dtype)
        return out

    pattern = cfg_json["hybrid_override_pattern"]
    mtp_pattern = cfg_json.get("mtp_hybrid_override_pattern", "")
    ones = torch.ones(H, dtype=dtype)
    for j, ch in enumerate(mtp_pattern):
        src = pattern.index(ch)
        prefix = f"backbone.layers.{src}."
        for k, v in target.items():
            if k.startswith(prefix):
                rel = k[len(prefix):]
                out[f"mtp.layers.{j}.{rel}"] = fresh(rel, v)
        if j == 0:
            out[f"mtp.layers.{j}.enorm.weight"] = ones.clone()
            out[f"mtp.layers.{j}.hnorm.weight"] = ones.clone()
            out[f"mtp.layers.{j}.eh_proj.weight"] = mtp_mix_matrix(H, w, dtype)
        if j == len(mtp_pattern) - 1:
            out[f"mtp.layers.{j}.final_layernorm.weight"] = ones.clone()
    return out


# ----------------------------------------------------------------------------------------------
# Measurements on CPU (transformers forward)
# ----------------------------------------------------------------------------------------------


def greedy_rollouts(model, tok_vocab: int, n_prompts: int, prompt_len: int, gen_len: int, gen):
    """Greedy continuation of random prompts; returns ids [n, prompt_len + gen_len]."""
    import torch

    ids = torch.randint(len(SPECIAL_TOKENS), tok_vocab, (n_prompts, prompt_len), generator=gen)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=gen_len,
            min_new_tokens=gen_len,
            pad_token_id=PAD_ID,
        )
    return out


def forward_with_taps(model, preset: str, ids):
    """Logits, final-norm output and per-mixer/residual norm ratios for one teacher-forced pass."""
    import torch

    taps, ratios = {}, []
    hooks = [_final_norm(model, preset).register_forward_hook(lambda m, a, o: taps.__setitem__("h", o))]
    for name, mixer in _mixers(model, preset):
        def hook(m, args, out, name=name):
            o = out[0] if isinstance(out, tuple) else out
            ratios.append((name, o))
        hooks.append(mixer.register_forward_hook(hook))
    try:
        with torch.no_grad():
            res = model(input_ids=ids, use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return res.logits.float(), taps["h"].float(), ratios


def draft_first_token(E, head, x_next, h, w: float):
    """Section-4.2 MTP approximation (its transformer layer ignored): argmax of the draft head."""
    u = (1.0 - w) * _rms(E[x_next]) + w * _rms(h)
    return (_rms(u) @ head.T).argmax(-1)


def measure(model, preset: str, perm, tok_vocab: int, seed: int, n_prompts=6, prompt_len=12, gen_len=24):
    """Greedy rollouts; fraction following perm; inputs for the acceptance estimate."""
    import torch

    gen = torch.Generator().manual_seed(seed + 17)
    ids = greedy_rollouts(model, tok_vocab, n_prompts, prompt_len, gen_len, gen)
    logits, h, mixer_outs = forward_with_taps(model, preset, ids)
    pred = logits.argmax(-1)  # pred[:, i] = target's token after ids[:, i]
    lo = prompt_len - 1  # first position whose successor is generated
    gen_pos = slice(lo, ids.shape[1] - 1)
    follows = (pred[:, gen_pos] == perm[ids[:, gen_pos]]).float().mean().item()
    teacher_ok = (pred[:, gen_pos] == ids[:, lo + 1:]).float().mean().item()
    emb = _embedding(model).weight.detach().float().clone()
    resid = emb[ids].norm(dim=-1).mean().item()
    mixer_ratio = {name: round(o.float().norm(dim=-1).mean().item() / resid, 4) for name, o in mixer_outs}
    # Draft positions: at i the target hidden h_i and the next token x_{i+1}; accepted iff the draft
    # predicts the target's token after x_{i+1}.
    pos = torch.arange(lo, ids.shape[1] - 2)
    sample = dict(
        E=emb,
        head=model.lm_head.weight.detach().float().clone(),
        x_next=ids[:, pos + 1],
        h=h[:, pos],
        want=pred[:, pos + 1],
    )
    top2 = logits[:, gen_pos].topk(2, dim=-1).values
    gap = (top2[..., 0] - top2[..., 1]).flatten()
    stats = dict(
        follows_perm=follows,
        teacher_forced_match=teacher_ok,
        mixer_to_embedding_norm=mixer_ratio,
        greedy_gap_min=round(gap.min().item(), 4),
        greedy_gap_p05=round(gap.quantile(0.05).item(), 4),
    )
    stats.update(state_sensitivity(model, preset, tok_vocab, gen))
    return stats, sample


def state_sensitivity(model, preset: str, tok_vocab: int, gen, n: int = 8, prefix_len: int = 24, tail_len: int = 4):
    """How much the last position depends on history: two batches share their last ``tail_len``
    tokens but not the prefix. Reports mixer-output and final-hidden differences (relative to the
    embedding norm) and the change of the logprob of the first batch's greedy token."""
    import torch

    tail = torch.randint(len(SPECIAL_TOKENS), tok_vocab, (n, tail_len), generator=gen)
    pre_a = torch.randint(len(SPECIAL_TOKENS), tok_vocab, (n, prefix_len), generator=gen)
    pre_b = torch.randint(len(SPECIAL_TOKENS), tok_vocab, (n, prefix_len), generator=gen)
    la, ha, ma = forward_with_taps(model, preset, torch.cat([pre_a, tail], 1))
    lb, hb, mb = forward_with_taps(model, preset, torch.cat([pre_b, tail], 1))
    ref = _embedding(model).weight.detach().float()[tail[:, -1]].norm(dim=-1)
    mixer = [((oa[:, -1].float() - ob[:, -1].float()).norm(dim=-1) / ref).mean().item() for (_, oa), (_, ob) in zip(ma, mb)]
    hid = ((ha[:, -1] - hb[:, -1]).norm(dim=-1) / ha[:, -1].norm(dim=-1)).mean().item()
    lpa, lpb = la[:, -1].log_softmax(-1), lb[:, -1].log_softmax(-1)
    top = lpa.argmax(-1, keepdim=True)
    dlp = (lpa.gather(1, top) - lpb.gather(1, top)).abs()
    return dict(
        history_mixer_delta=round(max(mixer) if mixer else 0.0, 4),
        history_hidden_delta=round(hid, 4),
        history_logprob_delta_mean=round(dlp.mean().item(), 4),
        history_argmax_changed=round((lpa.argmax(-1) != lpb.argmax(-1)).float().mean().item(), 4),
        greedy_logprob_mean=round(lpa.gather(1, top).mean().item(), 4),
    )


def estimated_acceptance(sample: dict, w: float) -> float:
    got = draft_first_token(sample["E"], sample["head"], sample["x_next"], sample["h"], w)
    return (got == sample["want"]).float().mean().item()


def calibrate_w(sample: dict, b: float, iters: int = 30) -> tuple[float, float, float]:
    """Smallest w whose estimated acceptance is <= (1 - b) * acceptance(w=0). Returns (w, a0, a(w))."""
    a0 = estimated_acceptance(sample, 0.0)
    if b <= 0.0:
        return 0.0, a0, a0
    if b >= 1.0:
        return 1.0, a0, estimated_acceptance(sample, 1.0)
    goal = (1.0 - b) * a0
    lo, hi = 0.0, 1.0
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if estimated_acceptance(sample, mid) > goal:
            lo = mid
        else:
            hi = mid
    # Pick the side closer to the goal.
    a_lo, a_hi = estimated_acceptance(sample, lo), estimated_acceptance(sample, hi)
    w, a = (lo, a_lo) if abs(a_lo - goal) < abs(a_hi - goal) else (hi, a_hi)
    return w, a0, a


# ----------------------------------------------------------------------------------------------
# Build
# ----------------------------------------------------------------------------------------------


def _random_bf16_model(cfg):
    """`AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)` with the random init run in fp32.

    torch fills a bf16 tensor with `normal_` about 5x slower than an fp32 one, and at the real
    shapes the init is most of a build (a 48-layer Qwen3-Next look-alike took 212 s on the H200
    machine's CPU). Every tensor then takes the dtype a bf16 build gives it, read off the same
    model built on the meta device (no init, no memory): bf16, except what such a build keeps in
    fp32 (the rotary `inv_freq` buffers of Qwen3-Next)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        ref = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    want = {n: t.dtype for n, t in (*ref.named_parameters(), *ref.named_buffers())}
    del ref
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.data = p.data.to(want[n])
        for n, b in list(model.named_buffers()):
            owner, _, name = n.rpartition(".")
            mod = model.get_submodule(owner) if owner else model
            mod._buffers[name] = b.to(want[n])
    model.config.dtype = torch.bfloat16
    return model


def build(
    preset: str,
    out: str | os.PathLike,
    *,
    shape: str | None = None,
    flags: dict | None = None,
    sets: dict | None = None,
    seed: int = 0,
    no_weights: bool = False,
    accept_rate_knob: float | None = 0.0,
    knob_mode: str = "calibrated",
    mixer_out_scale: float = 1.0,
    logit: float = 10.0,
    tokenizer_vocab: int = 2048,
    measure_outputs: bool = True,
) -> dict:
    """Write a checkpoint directory; returns the info dict (also saved as tiny_model_info.json)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fields = resolve_fields(preset, shape, flags or {}, sets or {})
    cfg, patch = make_config(preset, fields)
    tok = build_tokenizer(min(tokenizer_vocab, cfg.vocab_size), seed)
    if len(tok) > cfg.vocab_size:
        raise ValueError(f"tokenizer has {len(tok)} tokens > vocab_size {cfg.vocab_size}")
    tok.save_pretrained(out)
    drop = NEMOTRON_DROP if preset == "nemotron_h" else ()
    info = dict(
        preset=preset,
        shape=shape,
        seed=seed,
        fields=fields,
        tokenizer_size=len(tok),
        weights=not no_weights,
    )

    if no_weights:
        # save_pretrained of a bare config writes no `architectures`; SGLang needs it to pick the
        # model class (with weights, the model's save_pretrained fills it in).
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        cfg.architectures = [MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[cfg.model_type]]
        cfg.dtype = torch.bfloat16
        cfg.save_pretrained(out)
        GenerationConfig(eos_token_id=EOS_ID, pad_token_id=PAD_ID, bos_token_id=None).save_pretrained(out)
        cfg_json = patch_config_json(out, patch, drop)
        info["config"] = cfg_json
        (out / "tiny_model_info.json").write_text(json.dumps(info, indent=2) + "\n")
        return info

    # Tiny matrices: one thread is faster than several (and does not fight other jobs for cores).
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = _random_bf16_model(cfg)
    model.eval()
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.bos_token_id = None

    construct = accept_rate_knob is not None
    w = None
    if construct:
        if not 0.0 <= accept_rate_knob <= 1.0:
            raise ValueError("--accept-rate-knob must be in [0, 1]")
        perm = apply_construction(model, preset, logit, mixer_out_scale, gen)
        info.update(accept_rate_knob=accept_rate_knob, knob_mode=knob_mode, logit=logit, mixer_out_scale=mixer_out_scale)
        # The end points need no calibration (w = b); interior calibrated knobs do.
        needs_calibration = knob_mode == "calibrated" and 0.0 < accept_rate_knob < 1.0
        if measure_outputs or needs_calibration:
            # fp32 on CPU is much faster than bf16; the bf16 -> fp32 -> bf16 round trip is exact.
            stats, sample = measure(model.float(), preset, perm, len(tok), seed)
            model.to(torch.bfloat16)
            info.update(stats)
            if knob_mode == "calibrated":
                w, a0, a = calibrate_w(sample, accept_rate_knob)
            else:
                w = accept_rate_knob
                a0, a = estimated_acceptance(sample, 0.0), estimated_acceptance(sample, w)
            info.update(mtp_mix_w=w, est_first_draft_accept_w0=a0, est_first_draft_accept=a)
        else:
            w = accept_rate_knob
            info.update(mtp_mix_w=w)
        info["perm_head"] = perm[:16].tolist()
    else:
        if mixer_out_scale != 1.0:
            with torch.no_grad():
                for _, mixer in _mixers(model, preset):
                    mixer.out_proj.weight.mul_(mixer_out_scale)
        info.update(plain_random=True, mixer_out_scale=mixer_out_scale)

    model.save_pretrained(out)
    cfg_json = patch_config_json(out, patch, drop)
    info["config"] = cfg_json

    from safetensors.torch import load_file, save_file

    st = out / "model.safetensors"
    if not st.exists():
        raise RuntimeError("expected a single model.safetensors (tiny models only)")
    target = load_file(str(st))
    if preset == "nemotron_h" and "backbone.embedding.weight" in target:
        target["backbone.embeddings.weight"] = target.pop("backbone.embedding.weight")
    has_mtp = preset in QWEN_PRESETS or bool(cfg_json.get("mtp_hybrid_override_pattern"))
    if has_mtp:
        if w is None:  # plain random MTP: a random fc/eh_proj
            mix_w = None
        else:
            mix_w = w
        mtp = make_mtp_tensors(preset, target, cfg_json, 0.0 if mix_w is None else mix_w, gen)
        if mix_w is None:
            key = "mtp.fc.weight" if preset in QWEN_PRESETS else "mtp.layers.0.eh_proj.weight"
            mtp[key] = (torch.randn(mtp[key].shape, generator=gen) * 0.02).to(mtp[key].dtype)
        clash = set(mtp) & set(target)
        assert not clash, clash
        target.update(mtp)
        info["mtp_tensors"] = len(mtp)
    save_file({k: v.contiguous() for k, v in target.items()}, str(st), metadata={"format": "pt"})
    info["num_params"] = int(sum(v.numel() for v in target.values()))
    info["bytes"] = sum(p.stat().st_size for p in out.iterdir() if p.is_file())
    (out / "tiny_model_info.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def _kv(s: str):
    if "=" not in s:
        raise argparse.ArgumentTypeError(f"expected key=value, got {s!r}")
    k, v = s.split("=", 1)
    try:
        return k, json.loads(v)
    except json.JSONDecodeError:
        return k, v


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", required=True, choices=sorted(PRESETS))
    p.add_argument("--out", required=True, help="output directory (avoid path parts like 'points', 'vicuna')")
    p.add_argument("--shape", choices=sorted(SHAPES), help="real-shape look-alike (few layers)")
    p.add_argument("--no-weights", action="store_true", help="config + tokenizer only (for --load-format dummy)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--accept-rate-knob", type=float, default=0.0,
                   help="b in [0,1]: 0 = draft always right (as far as the target follows perm), 1 = always wrong")
    p.add_argument("--knob-mode", choices=["calibrated", "raw"], default="calibrated",
                   help="calibrated: pick w so est. acceptance = (1-b)*acc(w=0); raw: w = b (notes 4.2)")
    p.add_argument("--plain-random", action="store_true", help="no section-4.2 construction (random MTP head)")
    p.add_argument("--mixer-out-scale", type=float, default=1.0, help="multiply SSM mixer out_proj by this")
    p.add_argument("--logit", type=float, default=10.0, help="approximate winning logit (lm_head scale)")
    p.add_argument("--tokenizer-vocab", type=int, default=2048)
    p.add_argument("--no-measure", action="store_true", help="skip the CPU greedy measurements")
    g = p.add_argument_group("overrides (mapped to the preset's config field)")
    for flag in FLAG_FIELDS:
        typ = str if flag in ("pattern", "mtp_pattern") else int
        g.add_argument("--" + flag.replace("_", "-"), type=typ, default=None)
    g.add_argument("--set", type=_kv, action="append", default=[], metavar="KEY=VALUE",
                   help="any config field (value parsed as JSON when possible)")
    return p.parse_args(argv)


def main(argv=None):
    a = parse_args(argv)
    flags = {f: getattr(a, f) for f in FLAG_FIELDS}
    if (a.no_measure and a.knob_mode == "calibrated" and 0.0 < a.accept_rate_knob < 1.0
            and not a.plain_random and not a.no_weights):
        raise SystemExit("--no-measure with an interior knob needs --knob-mode raw (calibration measures the model)")
    info = build(
        a.preset,
        a.out,
        shape=a.shape,
        flags=flags,
        sets=dict(a.set),
        seed=a.seed,
        no_weights=a.no_weights,
        accept_rate_knob=None if a.plain_random else a.accept_rate_knob,
        knob_mode=a.knob_mode,
        mixer_out_scale=a.mixer_out_scale,
        logit=a.logit,
        tokenizer_vocab=a.tokenizer_vocab,
        measure_outputs=not a.no_measure,
    )
    keys = ["preset", "shape", "weights", "num_params", "bytes", "follows_perm", "teacher_forced_match",
            "mtp_mix_w", "est_first_draft_accept_w0", "est_first_draft_accept", "mixer_to_embedding_norm",
            "history_mixer_delta", "history_hidden_delta", "history_logprob_delta_mean", "history_argmax_changed",
            "greedy_logprob_mean", "greedy_gap_min", "greedy_gap_p05"]
    for k in keys:
        if k in info:
            print(f"{k:28s} {info[k]}")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    sys.exit(main())
