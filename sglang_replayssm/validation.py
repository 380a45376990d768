"""Argument validation for `--mamba-backend replayssm`.

SGLang's `load_plugins()` logs and swallows plugin exceptions, so the argument validation is the
only place where the plugin can stop a misconfigured server loudly. Every check here raises
`ValueError` naming the flag and the fix; none of them silently falls back to the stock path.
With any other `--mamba-backend` the hooks return at once and change nothing (the one exception:
`--replayssm-ring-len` given without `--mamba-backend replayssm` is refused, as an explicit
option that would otherwise be ignored).

Order inside `ServerArgs.__post_init__` (server_args.py L3435):

    around_post_init  (before)  flags the user gave: version, hook status, ring length, PD,
                                unified memory, int8 checkpoints, HiCache, upstream ReplaySSM
                                flags, SSM dtype (forced to float32 here)
    ... SGLang handlers ...
    after_handle_mamba_backend  model family (needs the model config, loaded by then)
    ... handle_speculative_decoding (NGRAM sets speculative_eagle_topk) ...
    around_post_init  (after)   two-batch overlap, draft window vs ring length, tree drafts,
                                DFlash/DSpark; stores the ring length on the instance;
                                installs the runtime hooks
"""

from __future__ import annotations

import logging
import os

from sglang_replayssm import args as _args

logger = logging.getLogger("sglang_replayssm")

_FP32 = "float32"
_UNSUPPORTED_SPEC = ("DFLASH", "DSPARK")


def _err(msg: str) -> ValueError:
    return ValueError(f"--mamba-backend replayssm: {msg}")


def _is_dummy(server_args) -> bool:
    path = getattr(server_args, "model_path", None)
    return isinstance(path, str) and path.lower() in ("none", "dummy")


# ------------------------------------------------------------------------------ model family


def detect_family(model_config) -> str:
    """'gdn' or 'mamba2' for a model SGLang would serve with GDNAttnBackend / Mamba2AttnBackend;
    ValueError (naming the family) for everything else."""
    from sglang.srt.configs.hybrid_arch import (
        hybrid_gdn_config,
        hybrid_lightning_config,
        kimi_linear_config,
        mamba2_config,
        mambaish_config,
    )

    arch = _arch(model_config)
    if hybrid_gdn_config(model_config) is not None:
        return "gdn"
    m2 = mamba2_config(model_config)
    if m2 is not None:
        from sglang.srt.configs import (
            InklingMMConfig,
            InklingModelConfig,
            Lfm2Config,
            Lfm2MoeConfig,
            Lfm2VlConfig,
            ZayaConfig,
        )

        if isinstance(model_config.hf_config, (InklingModelConfig, InklingMMConfig)):
            raise _err(
                f"{arch} is an Inkling short-conv hybrid (served by InklingShortConvAttnBackend); "
                "ReplaySSM supports Gated DeltaNet (Qwen3-Next, Qwen3.5) and Mamba-2 (Nemotron-H, "
                "Falcon-H1, Granite-4 hybrid) layers. Use --mamba-backend triton."
            )
        if isinstance(m2, (ZayaConfig, Lfm2Config, Lfm2MoeConfig, Lfm2VlConfig)):
            raise _err(
                f"{arch} is a short-conv hybrid (LFM2 / ZAYA, served by ShortConvAttnBackend) "
                "with no selective-state layers; ReplaySSM supports Gated DeltaNet and Mamba-2 "
                "layers only. Use --mamba-backend triton."
            )
        return "mamba2"
    if kimi_linear_config(model_config) is not None:
        raise _err(
            f"{arch} uses Kimi Delta Attention (KDA), which ReplaySSM does not support. Use "
            "--mamba-backend triton (SGLang's own --enable-linear-replayssm covers KDA)."
        )
    if hybrid_lightning_config(model_config) is not None:
        raise _err(
            f"{arch} is a lightning-attention hybrid, which ReplaySSM does not support. Use "
            "--mamba-backend triton."
        )
    if mambaish_config(model_config) is not None:
        raise _err(
            f"{arch} is a linear-attention family registered through "
            "register_linear_attn_model(), which ReplaySSM does not support. Use "
            "--mamba-backend triton."
        )
    raise _err(
        f"{arch} has no Gated DeltaNet or Mamba-2 layers (not a hybrid SSM model), so there is "
        "nothing for ReplaySSM to serve. Drop --mamba-backend replayssm."
    )


def _arch(model_config) -> str:
    try:
        return model_config.hf_config.architectures[0]
    except Exception:  # noqa: BLE001
        return type(getattr(model_config, "hf_config", model_config)).__name__


# ------------------------------------------------------------------------------ hooks


def around_post_init(original, self, *args, **kwargs):
    """AROUND `ServerArgs.__post_init__`."""
    if not _args.is_selected(self):
        result = original(self, *args, **kwargs)
        if _args.cli_ring_len() is not None:
            raise ValueError(
                f"{_args.RING_LEN_FLAG} only applies to --mamba-backend replayssm (got "
                f"--mamba-backend {getattr(self, 'mamba_backend', None)!r}). Add --mamba-backend "
                f"replayssm or drop {_args.RING_LEN_FLAG}."
            )
        return result
    if not _is_dummy(self):
        check_before(self)
    result = original(self, *args, **kwargs)
    if not _is_dummy(self):
        check_after(self)
    return result


def check_before(sa) -> None:
    """Checks on flags as the user gave them (before SGLang resolves anything)."""
    from sglang_replayssm import SGLANG_ERROR
    from sglang_replayssm.hooks import STATUS, is_failed

    if SGLANG_ERROR:
        raise _err(SGLANG_ERROR)
    failed = [f"{k}: {v}" for k, v in STATUS.items() if k.startswith(("cli.", "validate.")) and is_failed(v)]
    if failed:
        raise _err(
            "sglang-replayssm could not install its argument hooks:\n  "
            + "\n  ".join(failed)
            + "\nRun `sglang-replayssm doctor` for details."
        )
    ring_len, source = _args.resolve_ring_len(sa)
    if ring_len < 1:
        raise _err(f"{_args.RING_LEN_FLAG} must be >= 1, got {ring_len} (from {source}).")
    mode = getattr(sa, "disaggregation_mode", "null")
    if mode not in (None, "null"):
        raise _err(
            f"PD disaggregation is not supported (got --disaggregation-mode {mode}): the rings and "
            "cursors are not part of the PD state transfer. Serve without --disaggregation-mode "
            "or use --mamba-backend triton."
        )
    if getattr(sa, "enable_unified_memory", False):
        raise _err(
            "--enable-unified-memory is not supported: UnifiedMambaPool replaces the mamba pool "
            "that holds the ReplaySSM rings. Drop --enable-unified-memory."
        )
    if getattr(sa, "enable_linear_replayssm", False) or getattr(sa, "enable_linear_replayssm_spec", False):
        flags = [
            f
            for f, on in (
                ("--enable-linear-replayssm", getattr(sa, "enable_linear_replayssm", False)),
                ("--enable-linear-replayssm-spec", getattr(sa, "enable_linear_replayssm_spec", False)),
            )
            if on
        ]
        raise _err(
            f"{' and '.join(flags)} (SGLang's built-in GDN/KDA ReplaySSM) cannot be combined with "
            "the plugin: both would drive the same layers with different rings and cursors. Drop "
            f"{' / '.join(flags)} (the plugin covers decode and speculative verify)."
        )
    if getattr(sa, "enable_int8_mamba_checkpoint", False):
        raise _err(
            "--enable-int8-mamba-checkpoint is not supported: it quantizes an active slot's "
            "checkpoint without its pending ring entries. Drop --enable-int8-mamba-checkpoint."
        )
    if getattr(sa, "enable_hierarchical_cache", False):
        raise _err(
            "--enable-hierarchical-cache is not supported yet: the host copy of mamba states "
            "(memory_pool_host.py) moves conv/temporal only, not the rings and cursors. Drop "
            "--enable-hierarchical-cache."
        )
    _force_fp32_ssm_state(sa)


def _force_fp32_ssm_state(sa) -> None:
    dtype = getattr(sa, "mamba_ssm_dtype", None)
    if dtype is not None and dtype != _FP32:
        raise _err(
            f"--mamba-ssm-dtype {dtype} is not supported: the exact fold keeps the checkpoint "
            "bit-identical to SGLang's recurrent kernels only for a float32 state. Use "
            "--mamba-ssm-dtype float32 (or drop the flag)."
        )
    env = os.environ.get("SGLANG_MAMBA_SSM_DTYPE")
    if dtype is None and env not in (None, "", _FP32):
        raise _err(
            f"SGLANG_MAMBA_SSM_DTYPE={env} is not supported: the exact fold needs a float32 SSM "
            "state. Unset SGLANG_MAMBA_SSM_DTYPE or set it to float32."
        )
    if dtype is None:
        logger.info("--mamba-backend replayssm: setting --mamba-ssm-dtype float32 (exact fold).")
        sa.mamba_ssm_dtype = _FP32


def after_handle_mamba_backend(_result, self, *args, **kwargs) -> None:
    """AFTER `ServerArgs._handle_mamba_backend`: the model family (model config is loaded)."""
    if not _args.is_selected(self) or _is_dummy(self):
        return
    model_config = self.get_model_config()
    family = detect_family(model_config)
    cfg_dtype = getattr(model_config.hf_config.get_text_config(), "mamba_ssm_dtype", None)
    if cfg_dtype not in (None, _FP32):
        logger.info(
            "--mamba-backend replayssm: the model config asks for a %s SSM state; using float32 "
            "(the exact fold needs it).",
            cfg_dtype,
        )
    setattr(self, _args.ATTR_FAMILY, family)


def check_after(sa) -> None:
    """Checks on resolved values; stores the carriers and installs the runtime hooks."""
    from sglang_replayssm import runtime

    ring_len, source = _args.resolve_ring_len(sa)
    family = getattr(sa, _args.ATTR_FAMILY, None)
    if family is None:
        # _handle_mamba_backend did not run (a connector-backed model path returns early).
        family = detect_family(sa.get_model_config())
        setattr(sa, _args.ATTR_FAMILY, family)
    mode = getattr(sa, "disaggregation_mode", "null")
    if mode not in (None, "null"):
        raise _err(f"PD disaggregation is not supported (--disaggregation-mode {mode} was resolved).")
    if getattr(sa, "enable_unified_memory", False):
        raise _err("--enable-unified-memory is not supported (it was enabled during resolution).")
    if getattr(sa, "enable_two_batch_overlap", False):
        raise _err(
            "--enable-two-batch-overlap is not supported: TboAttnBackend prepares every batch on "
            "its primary backend and again on the two child backends (tbo_backend.py "
            "init_forward_metadata), which would advance the ReplaySSM ring cursors twice per "
            "decode step. Drop --enable-two-batch-overlap."
        )
    if getattr(sa, "mamba_ssm_dtype", None) != _FP32:
        raise _err(
            f"the SSM state dtype resolved to {sa.mamba_ssm_dtype!r}; the exact fold needs "
            "--mamba-ssm-dtype float32."
        )
    _check_radix_strategy(sa)
    algo = getattr(sa, "speculative_algorithm", None)
    if algo is not None:
        algo_u = str(algo).upper()
        if algo_u in _UNSUPPORTED_SPEC:
            raise _err(
                f"--speculative-algorithm {algo} is not supported: its commit path (ragged "
                "verify, direct backend commit) is not wired to the ReplaySSM rings. Use NEXTN / "
                "EAGLE / EAGLE3 / STANDALONE, or --mamba-backend triton."
            )
        topk = getattr(sa, "speculative_eagle_topk", None)
        if topk not in (None, 1):
            if algo_u == "NGRAM":
                raise _err(
                    f"NGRAM drafts a tree (speculative_eagle_topk={topk}, set from "
                    "--speculative-ngram-max-bfs-breadth); ReplaySSM verifies a linear draft chain "
                    "only. Pass --speculative-ngram-max-bfs-breadth 1."
                )
            raise _err(
                f"--speculative-eagle-topk {topk} drafts a tree; ReplaySSM verifies a linear draft "
                "chain only. Use --speculative-eagle-topk 1."
            )
        draft = getattr(sa, "max_speculative_num_draft_tokens", None)
        if draft is None:
            draft = getattr(sa, "speculative_num_draft_tokens", None)
        if draft is not None and ring_len < draft:
            raise _err(
                f"{_args.RING_LEN_FLAG} {ring_len} (from {source}) is smaller than the draft window "
                f"(--speculative-num-draft-tokens {draft}): a verify window must fit an empty ring. "
                f"Pass {_args.RING_LEN_FLAG} {max(draft, _args.DEFAULT_RING_LEN)} or fewer draft tokens."
            )
    setattr(sa, _args.ATTR_RING_LEN, ring_len)
    setattr(sa, _args.ATTR_VALIDATED, _plugin_version())
    failures = runtime.activate(sa)
    if failures:
        raise _err(
            "required hooks are missing, refusing to start (no fallback to the stock path):\n  "
            + "\n  ".join(failures)
            + "\nRun `sglang-replayssm doctor` for details."
        )
    logger.info(
        "--mamba-backend replayssm: family=%s ring_len=%d (%s)%s.",
        family,
        ring_len,
        source,
        f", speculative {algo} with {sa.max_speculative_num_draft_tokens} draft tokens" if algo else "",
    )


def _check_radix_strategy(sa) -> None:
    """The radix cache's mamba strategy must be one SGLang's scheduler supports. SGLang resolves
    and checks it only for the archs it lists (`_MAMBA_RADIX_CACHE_ARCHS`); for the others (the
    text-only `Qwen3_5ForCausalLM` / `Qwen3_5MoeForCausalLM` in 0.5.17) an "auto" strategy stays
    unresolved, which runs the no-buffer path with the overlap scheduler on: the pair SGLang
    refuses for every arch it resolves."""
    if getattr(sa, "disable_radix_cache", False) or getattr(sa, "disable_overlap_schedule", False):
        return
    extra = getattr(sa, "enable_mamba_extra_buffer", None)
    if callable(extra) and extra():
        return
    strategy = getattr(sa, "mamba_radix_cache_strategy", None)
    why = (f" (SGLang 0.5.17 leaves the strategy unresolved for {_arch(sa.get_model_config())})"
           if strategy == "auto" else "")
    raise _err(
        f"the radix cache is on with --mamba-radix-cache-strategy {strategy} (the no-buffer path) and "
        f"the overlap scheduler on, which SGLang's no-buffer path does not support{why}. Pass "
        "--mamba-radix-cache-strategy extra_buffer, or --mamba-radix-cache-strategy no_buffer "
        "--disable-overlap-schedule, or --disable-radix-cache."
    )


def _plugin_version() -> str:
    from sglang_replayssm import __version__

    return __version__
