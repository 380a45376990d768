"""Plugin infrastructure against the real SGLang 0.5.17 (CPU): CLI, register()/STATUS, kill
switch, argument validation (every guard names its flag), the runtime tier and the ring-length
carrier into spawned processes, the stock path with another backend, and `doctor`.

Models are tiny config.json files (no weights, no tokenizer: `skip_tokenizer_init`); ServerArgs
only parses them. The runtime tier needs `sglang_replayssm.backends.*`, written separately; tests
that install it use stand-in subclasses (`fake_backends`).
"""

from __future__ import annotations

import argparse
import copy
import json
import multiprocessing
import os
import pickle
import subprocess
import sys
import types
from pathlib import Path

import pytest

import sglang_replayssm
from sglang_replayssm import args as rargs
from sglang_replayssm import hooks, runtime
from sglang_replayssm.compat import TIER_CLI, TIER_RUNTIME
from sglang_replayssm.validation import detect_family

from sglang.srt.server_args import ServerArgs, prepare_server_args  # noqa: E402  (after the plugin import on purpose)

REPO = Path(__file__).resolve().parent.parent

CONFIGS = {
    "qwen3_next": {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 256, "vocab_size": 2048, "max_position_embeddings": 4096,
        "full_attention_interval": 4,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"],
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "num_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128, "norm_topk_prob": True,
        "decoder_sparse_step": 1, "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
        "torch_dtype": "bfloat16", "rms_norm_eps": 1e-6, "eos_token_id": 2, "pad_token_id": 0,
        "tie_word_embeddings": False,
    },
    "nemotron_h": {
        "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h",
        "hidden_size": 256, "vocab_size": 2048, "hybrid_override_pattern": "MEM*E", "num_hidden_layers": 5,
        "mamba_num_heads": 8, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 2, "mamba_n_groups": 2,
        "conv_kernel": 4, "expand": 2, "chunk_size": 128, "use_conv_bias": True, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 512, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 256, "moe_shared_expert_intermediate_size": 256,
        "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0,
        "norm_topk_prob": True, "mtp_hybrid_override_pattern": "*E", "num_nextn_predict_layers": 1,
        "max_position_embeddings": 4096, "torch_dtype": "bfloat16", "eos_token_id": 2, "pad_token_id": 0,
        "tie_word_embeddings": False,
    },
    "llama": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 2048, "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
    },
    "lfm2": {
        "architectures": ["Lfm2ForCausalLM"], "model_type": "lfm2", "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 2048, "layer_types": ["conv", "conv", "full_attention", "conv"], "conv_L_cache": 3,
        "max_position_embeddings": 4096, "torch_dtype": "bfloat16",
    },
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_models")
    out = {}
    for name, cfg in CONFIGS.items():
        d = root / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        out[name] = str(d)
    return out


@pytest.fixture(autouse=True)
def _plugin_env(plugin_env):
    """register() active, SGLang's exported env vars and the runtime tier reset per test (conftest)."""
    yield


@pytest.fixture
def fake_backends(monkeypatch):
    """Stand-ins for sglang_replayssm.backends.{gdn,mamba2,commit} (the real ones are written
    separately): subclasses / pass-through hooks, enough to install the runtime tier."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

    pkg = types.ModuleType("sglang_replayssm.backends")
    pkg.__path__ = []
    gdn = types.ModuleType("sglang_replayssm.backends.gdn")
    gdn.ReplaySSMGDNAttnBackend = type("ReplaySSMGDNAttnBackend", (GDNAttnBackend,), {})
    m2 = types.ModuleType("sglang_replayssm.backends.mamba2")
    m2.ReplaySSMMamba2AttnBackend = type("ReplaySSMMamba2AttnBackend", (Mamba2AttnBackend,), {})
    commit = types.ModuleType("sglang_replayssm.backends.commit")
    commit.commit_after_verify = lambda original, *a, **k: original(*a, **k)
    commit.update_mamba_state_after_mtp_verify = lambda original, *a, **k: original(*a, **k)
    for mod in (pkg, gdn, m2, commit):
        monkeypatch.setitem(sys.modules, mod.__name__, mod)
    yield types.SimpleNamespace(gdn=gdn, mamba2=m2, commit=commit, GDNAttnBackend=GDNAttnBackend,
                                Mamba2AttnBackend=Mamba2AttnBackend)
    runtime.deactivate()


BASE = dict(skip_tokenizer_init=True, device="cpu", disable_radix_cache=True)
BASE_ARGV = ["--device", "cpu", "--disable-radix-cache", "--skip-tokenizer-init"]


def build(path, **kw):
    return ServerArgs(model_path=path, **{**BASE, **kw})


def parse(path, *extra):
    return prepare_server_args(["--model-path", path, *BASE_ARGV, *extra])


def replayssm(path, **kw):
    return build(path, mamba_backend="replayssm", **kw)


# ------------------------------------------------------------------------------ CLI


def test_argparse_lists_replayssm_and_ring_len():
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    actions = {a.dest: a for a in parser._actions}
    assert "replayssm" in actions["mamba_backend"].choices
    assert {"triton", "flashinfer"} <= set(actions["mamba_backend"].choices)
    ring = actions["replayssm_ring_len"]
    assert "--replayssm-ring-len" in ring.option_strings and ring.type is int and ring.default is None
    ns = parser.parse_args(["--model-path", "x", "--mamba-backend", "replayssm", "--replayssm-ring-len", "8"])
    assert ns.mamba_backend == "replayssm" and ns.replayssm_ring_len == 8
    assert "replayssm-ring-len" in parser.format_help()


def test_register_is_idempotent_and_records_status():
    before = dict(sglang_replayssm.STATUS)
    post_init = ServerArgs.__dict__["__post_init__"]
    add_cli = ServerArgs.__dict__["add_cli_args"]
    import sglang.srt.server_args as sa_mod

    n_choice = sa_mod.MAMBA_BACKEND_CHOICES.count("replayssm")
    assert sglang_replayssm.register() is sglang_replayssm.STATUS
    sglang_replayssm.register()
    assert dict(sglang_replayssm.STATUS) == before
    assert ServerArgs.__dict__["__post_init__"] is post_init and ServerArgs.__dict__["add_cli_args"] is add_cli
    assert sa_mod.MAMBA_BACKEND_CHOICES.count("replayssm") == n_choice == 1
    # a module-flag reset (re-imported plugin) is caught by the wrapper markers
    sglang_replayssm._REGISTERED = False
    sglang_replayssm.STATUS.clear()
    sglang_replayssm.register()
    for spec in sglang_replayssm.table().hooks:
        if spec.tier == TIER_CLI:
            assert sglang_replayssm.STATUS[spec.name] == "already applied", spec.name
    assert ServerArgs.__dict__["__post_init__"] is post_init
    assert getattr(post_init, hooks.MARK) is True
    # STATUS covers every table entry with one of the documented forms
    for spec in sglang_replayssm.table().hooks:
        st = sglang_replayssm.STATUS[spec.name]
        assert st in ("applied", "already applied") or st.startswith(("skipped (", "FAILED: ")), (spec.name, st)
        if spec.tier == TIER_RUNTIME:
            assert st.startswith("skipped (runtime hooks apply only"), (spec.name, st)


def test_kill_switch(models):
    import sglang.srt.server_args as sa_mod

    sglang_replayssm.unregister()
    try:
        assert "replayssm" not in sa_mod.MAMBA_BACKEND_CHOICES
        assert not hasattr(ServerArgs.__dict__["__post_init__"], hooks.MARK)
        os.environ[sglang_replayssm.ENABLE_ENV] = "0"
        status = sglang_replayssm.register()
        assert status == {"register": "skipped (SGLANG_REPLAYSSM_ENABLE=0)"}
        assert "replayssm" not in sa_mod.MAMBA_BACKEND_CHOICES
        assert not hasattr(ServerArgs.__dict__["__post_init__"], hooks.MARK)
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        assert "replayssm" not in {a.dest: a for a in parser._actions}["mamba_backend"].choices
        with pytest.raises(ValueError, match="disabled by SGLANG_REPLAYSSM_ENABLE=0"):
            sglang_replayssm.require_registered()
    finally:
        os.environ.pop(sglang_replayssm.ENABLE_ENV, None)
        sglang_replayssm.unregister()
        sglang_replayssm.register()
    assert "replayssm" in sa_mod.MAMBA_BACKEND_CHOICES
    sglang_replayssm.require_registered()


def test_unsupported_sglang_version_refuses(models, monkeypatch):
    import sglang_replayssm.compat as compat

    sglang_replayssm.unregister()
    monkeypatch.setattr(compat, "sglang_version", lambda: "0.5.99")
    monkeypatch.setattr(sglang_replayssm, "_TABLE", None)
    try:
        sglang_replayssm.register()
        assert "0.5.99" in sglang_replayssm.SGLANG_ERROR
        with pytest.raises(ValueError, match=r"supports SGLang 0\.5\.17 only; found 0\.5\.99"):
            replayssm(models["qwen3_next"])
        build(models["qwen3_next"])  # other backends are unaffected
    finally:
        sglang_replayssm.unregister()
        monkeypatch.undo()
        sglang_replayssm._TABLE = None  # reload the table (and SGLANG_ERROR) for the real version
        sglang_replayssm.register()
    assert sglang_replayssm.SGLANG_ERROR is None


# ------------------------------------------------------------------------------ guards


@pytest.mark.parametrize(
    "kw, flag",
    [
        (dict(disaggregation_mode="decode"), "--disaggregation-mode"),
        (dict(disaggregation_mode="prefill"), "--disaggregation-mode"),
        (dict(enable_unified_memory=True), "--enable-unified-memory"),
        (dict(enable_linear_replayssm=True), "--enable-linear-replayssm"),
        (dict(enable_linear_replayssm_spec=True), "--enable-linear-replayssm-spec"),
        (dict(enable_int8_mamba_checkpoint=True), "--enable-int8-mamba-checkpoint"),
        (dict(enable_hierarchical_cache=True), "--enable-hierarchical-cache"),
        (dict(enable_two_batch_overlap=True), "--enable-two-batch-overlap"),
        (dict(mamba_ssm_dtype="bfloat16"), "--mamba-ssm-dtype"),
        (dict(mamba_ssm_dtype="float16"), "--mamba-ssm-dtype"),
    ],
    ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={x}" for k, x in v.items()),
)
def test_flag_guards(models, kw, flag):
    with pytest.raises(ValueError, match="--mamba-backend replayssm") as e:
        replayssm(models["qwen3_next"], **kw)
    assert flag in str(e.value)


def test_env_ssm_dtype_guard(models):
    os.environ["SGLANG_MAMBA_SSM_DTYPE"] = "bfloat16"
    with pytest.raises(ValueError, match="SGLANG_MAMBA_SSM_DTYPE=bfloat16"):
        replayssm(models["qwen3_next"])


def test_ring_len_guards(models):
    with pytest.raises(ValueError, match=r"--replayssm-ring-len must be >= 1, got 0"):
        parse(models["qwen3_next"], "--mamba-backend", "replayssm", "--replayssm-ring-len", "0")
    os.environ[rargs.RING_LEN_ENV] = "sixteen"
    with pytest.raises(ValueError, match="SGLANG_REPLAYSSM_RING_LEN='sixteen' is not an integer"):
        replayssm(models["qwen3_next"])
    os.environ.pop(rargs.RING_LEN_ENV)
    with pytest.raises(ValueError, match="--replayssm-ring-len only applies to --mamba-backend replayssm"):
        parse(models["qwen3_next"], "--replayssm-ring-len", "8")


@pytest.mark.parametrize("name, match", [
    ("llama", "not a hybrid SSM model"),
    ("lfm2", "short-conv hybrid"),
])
def test_family_guard_through_server_args(models, name, match):
    with pytest.raises(ValueError, match=match) as e:
        replayssm(models[name])
    assert "--mamba-backend" in str(e.value)


def _supported_configs():
    """One hf_config per architecture family the issue names, as SGLang 0.5.17's config registry
    builds it (SGLang's own config classes; Qwen3.5's is the `...ForConditionalGeneration` one,
    whose GDN layers sit in its text config)."""
    from sglang.srt.configs import FalconH1Config, GraniteMoeHybridConfig, NemotronHConfig, Qwen3NextConfig
    from sglang.srt.configs.qwen3_5 import Qwen3_5Config, Qwen3_5MoeConfig

    return [
        ("Qwen3NextForCausalLM", Qwen3NextConfig(), "gdn"),
        ("Qwen3_5ForConditionalGeneration", Qwen3_5Config(), "gdn"),
        ("Qwen3_5MoeForConditionalGeneration", Qwen3_5MoeConfig(), "gdn"),
        ("NemotronHForCausalLM", NemotronHConfig(), "mamba2"),
        ("FalconH1ForCausalLM", FalconH1Config(), "mamba2"),
        ("GraniteMoeHybridForCausalLM",
         GraniteMoeHybridConfig(num_hidden_layers=4, layer_types=["mamba", "mamba", "attention", "mamba"]),
         "mamba2"),
    ]


def test_family_detection_every_supported_architecture():
    seen = set()
    for arch, cfg, family in _supported_configs():
        cfg.architectures = [arch]
        mc = types.SimpleNamespace(hf_config=cfg, is_draft_model=False, linear_attn_registry_result=None)
        assert detect_family(mc) == family, arch
        seen.add(family)
    assert seen == {"gdn", "mamba2"}
    # A Granite-4 checkpoint with attention layers only is not a hybrid: refused, naming the flag.
    from sglang.srt.configs import GraniteMoeHybridConfig

    cfg = GraniteMoeHybridConfig(num_hidden_layers=2, layer_types=["attention", "attention"])
    mc = types.SimpleNamespace(hf_config=cfg, is_draft_model=False, linear_attn_registry_result=None)
    with pytest.raises(ValueError, match="not a hybrid SSM model") as e:
        detect_family(mc)
    assert "--mamba-backend" in str(e.value)


@pytest.mark.parametrize("module, needle", [
    ("nemotron_h", "linear_attn_backend.forward("),
    ("falcon_h1", "linear_attn_backend.forward("),
    ("granitemoehybrid", "linear_attn_backend.forward("),
    ("qwen3_next", "RadixLinearAttention("),
    ("qwen3_5", "RadixLinearAttention("),
])
def test_every_supported_model_reaches_the_swapped_backend(module, needle):
    """The models reach their SSM only through the hybrid backend's linear-attention backend
    (Mamba-2: `Mamba2AttnBackend.forward`, GDN: `RadixLinearAttention` -> `GDNAttnBackend`),
    which the runtime tier replaces by our subclasses; their call shapes bind to our overrides."""
    import importlib
    import inspect

    from sglang.srt.layers.attention.hybrid_linear_attn_backend import Mamba2AttnBackend
    from sglang.srt.layers.attention.linear.gdn_backend import GDNAttnBackend

    from sglang_replayssm.backends.gdn import ReplaySSMGDNAttnBackend
    from sglang_replayssm.backends.mamba2 import ReplaySSMMamba2AttnBackend

    src = inspect.getsource(importlib.import_module(f"sglang.srt.models.{module}"))
    assert needle in src
    assert issubclass(ReplaySSMMamba2AttnBackend, Mamba2AttnBackend)
    assert issubclass(ReplaySSMGDNAttnBackend, GDNAttnBackend)
    sig = inspect.signature(ReplaySSMMamba2AttnBackend.forward)
    # Nemotron-H / Granite-4: keywords; Falcon-H1: mixer, hidden states and output positional,
    # plus its muP vector.
    sig.bind(None, mixer=1, layer_id=0, hidden_states=2, output=None, forward_batch=3, use_triton_causal_conv=True)
    sig.bind(None, 1, 2, 3, layer_id=0, forward_batch=4, mup_vector=5)


def test_family_detection_unsupported_families():
    from sglang.srt.configs import BailingHybridConfig, KimiLinearConfig

    for cfg, match in ((KimiLinearConfig(), "Kimi Delta Attention"), (BailingHybridConfig(), "lightning-attention")):
        mc = types.SimpleNamespace(hf_config=cfg, is_draft_model=False, linear_attn_registry_result=None)
        with pytest.raises(ValueError, match=match):
            detect_family(mc)


def test_tree_drafts_refused(models):
    path = models["qwen3_next"]
    with pytest.raises(ValueError, match="--speculative-eagle-topk 2 drafts a tree") as e:
        replayssm(path, speculative_algorithm="EAGLE", speculative_draft_model_path=path, speculative_eagle_topk=2,
                  speculative_num_steps=2, speculative_num_draft_tokens=4)
    assert "--speculative-eagle-topk 1" in str(e.value)
    # NGRAM sets speculative_eagle_topk from its breadth inside handle_speculative_decoding
    with pytest.raises(ValueError, match="--speculative-ngram-max-bfs-breadth 1"):
        replayssm(path, speculative_algorithm="NGRAM")


def test_ring_shorter_than_draft_window(models):
    path = models["qwen3_next"]
    with pytest.raises(ValueError) as e:
        parse(path, "--mamba-backend", "replayssm", "--replayssm-ring-len", "3", "--speculative-algorithm", "NEXTN",
              "--speculative-draft-model-path", path, "--speculative-num-steps", "3",
              "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
    msg = str(e.value)
    assert "--replayssm-ring-len 3" in msg and "--speculative-num-draft-tokens 4" in msg


def test_missing_backend_modules_refuse_to_start(models, monkeypatch):
    """Without sglang_replayssm.backends.* the server must not start on the stock path."""
    for name in ("gdn", "mamba2", "commit"):  # a None entry makes `import` raise ImportError
        monkeypatch.setitem(sys.modules, f"sglang_replayssm.backends.{name}", None)
    with pytest.raises(ValueError, match="required hooks are missing") as e:
        replayssm(models["qwen3_next"])
    assert "backend.gdn" in str(e.value) and "no fallback to the stock path" in str(e.value)
    assert "backend.mamba2" not in str(e.value)  # not needed for a GDN model
    with pytest.raises(ValueError, match="backend.mamba2"):
        replayssm(models["nemotron_h"])


# ------------------------------------------------------------------------------ happy path, runtime tier


def test_validation_happy_path_gdn(models, fake_backends):
    from sglang.kernels.ops.mamba.triton_ops import ssu_dispatch
    from sglang.srt.layers.attention.linear import gdn_backend
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool, MambaPool
    from sglang.srt.speculative import spec_utils

    from sglang_replayssm.pool import ReplaySSMMambaPool
    from sglang_replayssm.ssu import ReplaySSMSSUBackend

    path = models["qwen3_next"]
    orig_commit = spec_utils.commit_mamba_states_after_verify
    sa = parse(path, "--mamba-backend", "replayssm", "--replayssm-ring-len", "8", "--speculative-algorithm", "NEXTN",
               "--speculative-draft-model-path", path)
    assert sa.mamba_ssm_dtype == "float32"  # forced
    assert rargs.validated_ring_len(sa) == 8 and rargs.validated_family(sa) == "gdn"
    assert sa._replayssm_validated == sglang_replayssm.__version__
    st = sglang_replayssm.STATUS
    for name in ("ssu.registry", "pool.class", "pool.build_context", "pool.alloc_reset", "pool.donate_reset",
                 "pool.allocator_link", "pool.slot_alloc_reset", "memory.solver", "backend.gdn",
                 "commit.after_verify", "commit.mtp_verify"):
        assert st[name] in ("applied", "already applied"), (name, st[name])
    assert st["backend.mamba2"].startswith("skipped (not needed for gdn")
    assert HybridReqToTokenPool.mamba_pool_cls is ReplaySSMMambaPool
    assert ssu_dispatch._BACKEND_REGISTRY["replayssm"] is ReplaySSMSSUBackend
    assert gdn_backend.GDNAttnBackend is fake_backends.gdn.ReplaySSMGDNAttnBackend
    assert spec_utils.commit_mamba_states_after_verify.__wrapped__ is orig_commit
    # name-imported copies are rebound (eagle_worker_common imports it by name)
    from sglang.srt.speculative import eagle_worker_common

    assert eagle_worker_common.commit_mamba_states_after_verify is spec_utils.commit_mamba_states_after_verify
    # Scheduler.init_mamba_backend accepts the name
    ssu_dispatch.initialize_mamba_selective_state_update_backend(sa)
    assert ssu_dispatch._mamba_ssu_backend.name.startswith("replayssm")

    runtime.deactivate()
    assert HybridReqToTokenPool.mamba_pool_cls is MambaPool
    assert "replayssm" not in ssu_dispatch._BACKEND_REGISTRY
    assert gdn_backend.GDNAttnBackend is fake_backends.GDNAttnBackend
    assert spec_utils.commit_mamba_states_after_verify is orig_commit
    assert eagle_worker_common.commit_mamba_states_after_verify is orig_commit


def test_validation_happy_path_mamba2_without_spec(models, fake_backends):
    from sglang.srt.layers.attention import hybrid_linear_attn_backend as hla

    sa = replayssm(models["nemotron_h"])
    assert rargs.validated_family(sa) == "mamba2" and rargs.validated_ring_len(sa) == rargs.DEFAULT_RING_LEN
    st = sglang_replayssm.STATUS
    assert st["backend.mamba2"] in ("applied", "already applied")
    assert st["commit.after_verify"].startswith("skipped (not needed")
    assert hla.Mamba2AttnBackend is fake_backends.mamba2.ReplaySSMMamba2AttnBackend
    assert issubclass(hla.Mamba2AttnBackend, fake_backends.Mamba2AttnBackend)  # model isinstance asserts hold


def test_ssu_entry_forwards_to_the_mamba2_backend(fake_backends):
    import torch

    from sglang_replayssm.ssu import ReplaySSMSSUBackend

    calls = []
    fake_backends.mamba2.replayssm_selective_state_update = lambda *a, **k: calls.append((a, k))
    ssu = ReplaySSMSSUBackend()
    assert ssu.name == "replayssm"
    state, x = torch.zeros(1), torch.ones(1)
    ssu(state, x, None, None, None, None, dt_softplus=True, disable_state_update=True, cache_steps=4)
    (args, kwargs), = calls
    assert args[0] is state and args[1] is x
    assert kwargs["disable_state_update"] is True and kwargs["cache_steps"] == 4 and kwargs["dt_softplus"] is True
    with pytest.raises(ValueError, match="stochastic-rounding"):
        ReplaySSMSSUBackend(enable_stochastic_rounding=True)


def test_env_ring_len_for_programmatic_use(models, fake_backends):
    os.environ[rargs.RING_LEN_ENV] = "12"
    sa = replayssm(models["qwen3_next"])
    assert rargs.validated_ring_len(sa) == 12
    os.environ.pop(rargs.RING_LEN_ENV)
    # the flag beats the environment
    os.environ[rargs.RING_LEN_ENV] = "12"
    sa = parse(models["qwen3_next"], "--mamba-backend", "replayssm", "--replayssm-ring-len", "20")
    assert rargs.validated_ring_len(sa) == 20


def test_scheduler_probe(models, fake_backends):
    from sglang.srt.mem_cache.memory_pool import HybridReqToTokenPool, MambaPool

    triton = build(models["qwen3_next"])
    runtime.before_scheduler_init(None, triton)  # pass-through
    runtime.before_scheduler_init(None, server_args=triton)
    assert HybridReqToTokenPool.mamba_pool_cls is MambaPool and not runtime.is_active()

    sa = replayssm(models["qwen3_next"])
    runtime.deactivate()  # as in a fresh scheduler process
    child = pickle.loads(pickle.dumps(sa))
    runtime.before_scheduler_init(None, child, None, 0)
    assert runtime.is_active() and HybridReqToTokenPool.mamba_pool_cls is not MambaPool

    # a ServerArgs that selects replayssm but never went through the plugin's validation
    unvalidated = copy.copy(triton)
    object.__setattr__(unvalidated, "mamba_backend", "replayssm")
    with pytest.raises(RuntimeError, match="not validated by sglang-replayssm"):
        runtime.before_scheduler_init(None, unvalidated)


def test_scheduler_probe_is_installed_where_the_scheduler_is_imported():
    import sglang.srt.managers.scheduler as sched  # noqa: F401

    sglang_replayssm.register()  # a later call completes the deferred probe
    assert sglang_replayssm.STATUS["runtime.scheduler_probe"] in ("applied", "already applied")
    init = sched.Scheduler.__dict__["__init__"]
    assert hooks._chain_find(init, "runtime.scheduler_probe") is not None


# ------------------------------------------------------------------------------ carriers


def test_ring_len_survives_pickle_deepcopy_and_spawn(models, fake_backends):
    sa = parse(models["nemotron_h"], "--mamba-backend", "replayssm", "--replayssm-ring-len", "24")
    for clone in (pickle.loads(pickle.dumps(sa)), copy.deepcopy(sa)):
        assert rargs.validated_ring_len(clone) == 24 and rargs.validated_family(clone) == "mamba2"
    # the way SGLang ships ServerArgs to schedulers: a spawned process gets the pickled object
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        assert pool.apply(rargs.validated_ring_len, (sa,)) == 24
        assert pool.apply(rargs.validated_family, (sa,)) == "mamba2"
        assert pool.apply(os.getenv, (rargs.RING_LEN_ENV,)) is None  # no env leak needed


# ------------------------------------------------------------------------------ stock path


_STOCK_SCRIPT = r"""
import argparse, dataclasses, json, sys
from sglang.srt.server_args import ServerArgs, prepare_server_args
path = sys.argv[1]
argv = ["--model-path", path, "--device", "cpu", "--disable-radix-cache", "--skip-tokenizer-init",
        "--random-seed", "0"]

def snap():
    a = dataclasses.asdict(ServerArgs(model_path=path, device="cpu", disable_radix_cache=True,
                                      skip_tokenizer_init=True, mamba_backend="triton", random_seed=0))
    b = dataclasses.asdict(prepare_server_args(argv + ["--mamba-backend", "triton"]))
    c = dataclasses.asdict(prepare_server_args(argv))
    return json.dumps([a, b, c], sort_keys=True, default=repr)

import pkgutil
import sglang_replayssm
from sglang_replayssm.compat import TIER_RUNTIME
targets = [s for s in sglang_replayssm.table().hooks if s.tier == TIER_RUNTIME]
def objs():
    out = []
    for s in targets:
        mod, qual = s.target.split(":")
        obj = pkgutil.resolve_name(mod)
        for p in qual.split("."):
            obj = getattr(obj, p)
        out.append(dict(obj) if isinstance(obj, dict) else obj)
    return out

before, before_objs = snap(), objs()
sglang_replayssm.register()
after, after_objs = snap(), objs()
assert before == after, "ServerArgs differ with the plugin registered"
for s, x, y in zip(targets, before_objs, after_objs):
    assert x is y or x == y, s.name
    assert sglang_replayssm.STATUS[s.name].startswith("skipped"), s.name
print("STOCK-IDENTICAL")
"""


def test_other_backends_stay_byte_identical(models):
    """Fresh process: ServerArgs for triton (explicit, default, via argv) are identical with and
    without the plugin, and no runtime target is touched."""
    proc = subprocess.run([sys.executable, "-c", _STOCK_SCRIPT, models["qwen3_next"]], capture_output=True,
                          text=True, timeout=600, cwd=str(Path.home()))
    assert "STOCK-IDENTICAL" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]


# ------------------------------------------------------------------------------ doctor


def test_console_script_declared():
    from importlib.metadata import entry_points

    scripts = {ep.name: ep.value for ep in entry_points(group="console_scripts")}
    assert scripts.get("sglang-replayssm") == "sglang_replayssm.cli:main"
    plugins = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    assert plugins.get("replayssm") == "sglang_replayssm:register"


def test_doctor_output_and_exit_code():
    proc = subprocess.run([sys.executable, "-m", "sglang_replayssm.cli", "doctor", "--no-selftest"],
                          capture_output=True, text=True, timeout=600, cwd=str(Path.home()))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[")]
    assert lines, proc.stdout + proc.stderr
    assert all(ln.split()[0] in ("[ok]", "[warn]", "[FAIL]") for ln in lines)
    for needle in ("sglang 0.5.17", "sglang-kernel", "entry point replayssm", "hook validate.post_init",
                   "runtime hook backend.gdn", "triton_kernels from", "launch plan (defaults): gdn_decode=",
                   "gdn_ring_min_batch="):
        assert any(needle in ln for ln in lines), needle
    fails = [i for i, ln in enumerate(proc.stdout.splitlines()) if ln.startswith("[FAIL]")]
    all_lines = proc.stdout.splitlines()
    for i in fails:
        assert all_lines[i + 1].strip().startswith("fix:"), all_lines[i]
    assert proc.returncode == (1 if fails else 0)
    assert not any("triton_kernels resolves to this checkout" in ln for ln in lines)


def test_doctor_rejects_a_bad_replayssm_config():
    env = dict(os.environ, REPLAYSSM_CONFIG="gdn_decode=2x16")
    proc = subprocess.run([sys.executable, "-m", "sglang_replayssm.cli", "doctor", "--no-selftest"],
                          capture_output=True, text=True, timeout=600, cwd=str(Path.home()), env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REPLAYSSM_CONFIG: bad entry 'gdn_decode=2x16'" in proc.stdout
    assert "fix: fix or unset REPLAYSSM_CONFIG" in proc.stdout
    # a value that parses but is out of range: a decode register cap below 96 (NaN on the H200, session 45)
    env["REPLAYSSM_CONFIG"] = "gdn_decode_maxnreg=80"
    proc = subprocess.run([sys.executable, "-m", "sglang_replayssm.cli", "doctor", "--no-selftest"],
                          capture_output=True, text=True, timeout=600, cwd=str(Path.home()), env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[FAIL] kernel launch plans: gdn_decode_maxnreg: 0 or 96..255 registers, got 80" in proc.stdout, proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    env["REPLAYSSM_CONFIG"] = "gdn_ring_min_batch=1"
    proc = subprocess.run([sys.executable, "-m", "sglang_replayssm.cli", "doctor", "--no-selftest"],
                          capture_output=True, text=True, timeout=600, cwd=str(Path.home()), env=env)
    assert "launch plan (REPLAYSSM_CONFIG): gdn_ring_min_batch=1" in proc.stdout, proc.stdout


def test_doctor_selftest_gdn_and_mamba2_bit_exact(monkeypatch):
    import contextlib

    import torch

    from sglang_replayssm import cli

    monkeypatch.setattr(torch.cpu, "device", lambda index=None: contextlib.nullcontext(), raising=False)
    for fn in (cli._selftest_gdn, cli._selftest_mamba2):
        res = fn("cpu")
        assert res["ok"], res
