#!/usr/bin/env python3
"""End-to-end parity: the stock SGLang server (--mamba-backend triton) vs ours (--mamba-backend
replayssm) on the same checkpoint, one server after the other on one GPU.

Both servers get the same greedy batch (fixed seed; `/generate` with temperature 0,
ignore_eos, return_logprob). Checks:

* token ids: a prompt passes when its first divergence is at or after --min-match (default: all
  --max-new-tokens tokens identical); at least --min-pass-frac (0.95) of the prompts must pass.
  Logprob max/mean |diff| on each prompt's common prefix is reported (a threshold is optional);
* our server's log never mentions ``intermediate_ssm`` (the stock log with NEXTN does; both are
  reported);
* CUDA graphs are on: the log has the "Capture target decode|verify CUDA graph end" message
  (and no CUDA-graph-disabled notice);
* both servers started and answered.

Only the Python standard library is imported at module level, so the pure functions below can be
tested on CPU (tests/test_e2e_parity_logic.py) and the script runs with the device's python3
(SGLang from PYTHONPATH=/tmp/site).

Examples:
  python3 scripts/e2e_parity.py --model .tiny/qwen3_next --out /tmp/e2e/qn
  python3 scripts/e2e_parity.py --model .tiny/nemotron_h --spec --out /tmp/e2e/nh_spec
  python3 scripts/e2e_parity.py --model .tiny/qwen3_next --only stock --out /tmp/e2e/qn_stock
  python3 scripts/e2e_parity.py --model .tiny/qwen3_5 --spec --out /tmp/e2e/q35_spec
(text-only Qwen3.5, dense or MoE, gets --disable-radix-cache on both servers, or with --radix-waves
--mamba-radix-cache-strategy extra_buffer, unless --extra-args chooses: see radix_cache_args)
Exit status: 0 when every check passed, 1 when one failed, 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

READY_MARKER = "The server is fired up and ready to roll!"
# SGLang loads every `sglang.srt.plugins` entry point unless SGLANG_PLUGINS whitelists names; a
# name that matches nothing keeps the stock server free of our plugin (a pristine baseline).
NO_PLUGINS = "__no_plugins__"
SPEC_ARGS = [
    "--speculative-algorithm", "NEXTN",
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
]
DEFAULT_ATTENTION = {"nemotron_h": "flashinfer"}  # SGLang rejects triton for NemotronH
DEFAULT_MOE_RUNNER = {"nemotron_h": "triton"}  # avoids flashinfer_cutlass JIT (devtools README)
FALLBACK_ATTENTION = "triton"
NUM_SPECIAL_TOKENS = 5  # make_tiny_model.py: ids 0..4 are specials
# Text-only Qwen3.5 (Qwen3_5ForCausalLM / Qwen3_5MoeForCausalLM) is missing from SGLang 0.5.17's
# hybrid-mamba radix-cache arch sets (arg_groups/overrides.py: _MAMBA_RADIX_CACHE_ARCHS,
# _MAMBA_EXTRA_BUFFER_ARCHS), so ServerArgs never resolves its --mamba-radix-cache-strategy: with
# the radix cache on it runs without the extra buffer (the no_buffer path) and keeps the overlap
# scheduler, a pair that SGLang's own check refuses for every arch it does resolve ("no_buffer do
# not support overlap schedule"). radix_cache_args() picks a supported setting for both servers.
UNRESOLVED_RADIX_KINDS = ("qwen3_5_text", "qwen3_5_moe_text")

# ----------------------------------------------------------------------------------------------
# Pure helpers (tested on CPU)
# ----------------------------------------------------------------------------------------------


def make_prompts(seed: int, n: int, vocab_lo: int, vocab_hi: int, min_len: int, max_len: int) -> list[list[int]]:
    """n random token-id prompts with lengths in [min_len, max_len], ids in [vocab_lo, vocab_hi)."""
    if not (0 <= vocab_lo < vocab_hi):
        raise ValueError(f"bad id range [{vocab_lo}, {vocab_hi})")
    if not (1 <= min_len <= max_len):
        raise ValueError(f"bad length range [{min_len}, {max_len}]")
    rng = random.Random(seed)
    return [[rng.randrange(vocab_lo, vocab_hi) for _ in range(rng.randint(min_len, max_len))] for _ in range(n)]


def radix_wave2(prompts: list[list[int]], outputs: list[list[int]], seed: int, vocab_lo: int, vocab_hi: int,
                track_interval: int = 256) -> list[list[int]]:
    """Second-wave prompts that hit the radix cache on states the first wave left there.

    Per first-wave prompt P (output O), three prompts:
      * P + O[:k] + 16 new ids, with len(P) + k = track_interval + 24: the cache holds the state at
        `track_interval` tokens, snapshot during P's decode (by our fold, on our server);
      * P + 24 new ids: a hit at the end of P's prefill, if the cache kept that state;
      * P itself: a full hit (whether it regenerates O is reported, `repeats_identical`).
    """
    rng = random.Random(seed + 1)
    out = []
    for p, o in zip(prompts, outputs):
        k = max(0, min(len(o), track_interval + 24 - len(p)))
        out.append(list(p) + list(o[:k]) + [rng.randrange(vocab_lo, vocab_hi) for _ in range(16)])
        out.append(list(p) + [rng.randrange(vocab_lo, vocab_hi) for _ in range(24)])
        out.append(list(p))
    return out


_CACHED = re.compile(r"Prefill batch.*?#cached-token: (\d+)")
RETRACT_MARKER = "KV cache pool is full. Retract requests"


def cached_tokens(log_text: str) -> int:
    """Prompt tokens served from the radix cache, summed over the `Prefill batch` log lines."""
    return sum(int(m) for m in _CACHED.findall(log_text))


def model_kind(config: dict) -> str:
    """'qwen3_next', 'qwen3_5_text', 'qwen3_5_moe_text', 'nemotron_h', ... from a config.json dict
    (model_type, else architecture)."""
    mt = config.get("model_type")
    if mt:
        return mt
    arch = (config.get("architectures") or [""])[0]
    return {"Qwen3NextForCausalLM": "qwen3_next", "Qwen3_5ForCausalLM": "qwen3_5_text",
            "Qwen3_5MoeForCausalLM": "qwen3_5_moe_text", "NemotronHForCausalLM": "nemotron_h"}.get(arch, arch)


def radix_cache_args(kind: str, both_args: list[str], radix_waves: bool) -> list[str]:
    """Flags both servers get for a model whose radix-cache strategy SGLang leaves unresolved
    (UNRESOLVED_RADIX_KINDS); none for other models, or when `both_args` (the flags shared by
    both servers) already choose (--disable-radix-cache, --mamba-radix-cache-strategy).
    With radix waves: the extra_buffer strategy, which SGLang resolves for Qwen3-Next with the
    overlap scheduler on; else --disable-radix-cache."""
    if kind not in UNRESOLVED_RADIX_KINDS:
        return []
    chosen = any(a == "--disable-radix-cache" or a.split("=", 1)[0] == "--mamba-radix-cache-strategy"
                 for a in both_args)
    if chosen:
        return []
    if radix_waves:
        return ["--mamba-radix-cache-strategy", "extra_buffer"]
    return ["--disable-radix-cache"]


def prompt_id_range(config: dict, tokenizer_size: int | None) -> tuple[int, int]:
    hi = config["vocab_size"]
    if tokenizer_size:
        hi = min(hi, tokenizer_size)
    return NUM_SPECIAL_TOKENS, hi


def build_server_cmd(
    *,
    python: str,
    model: str,
    port: int,
    host: str = "127.0.0.1",
    mamba_backend: str,
    attention_backend: str,
    sampling_backend: str | None = "pytorch",
    moe_runner_backend: str | None = None,
    spec: bool = False,
    disable_prefill_cuda_graph: bool = False,
    cuda_graph_max_bs: int | None = None,
    mem_fraction_static: float | None = None,
    max_running_requests: int | None = None,
    extra_args: list[str] | None = None,
) -> list[str]:
    cmd = [python, "-m", "sglang.launch_server", "--model-path", model, "--host", host, "--port", str(port),
           "--mamba-backend", mamba_backend, "--attention-backend", attention_backend]
    if sampling_backend:
        cmd += ["--sampling-backend", sampling_backend]
    if moe_runner_backend:
        cmd += ["--moe-runner-backend", moe_runner_backend]
    if spec:
        cmd += SPEC_ARGS + ["--speculative-draft-model-path", model]
    if disable_prefill_cuda_graph:
        cmd += ["--disable-prefill-cuda-graph"]
    if cuda_graph_max_bs:
        cmd += ["--cuda-graph-max-bs-decode", str(cuda_graph_max_bs)]
    if mem_fraction_static is not None:
        cmd += ["--mem-fraction-static", str(mem_fraction_static)]
    if max_running_requests is not None:
        cmd += ["--max-running-requests", str(max_running_requests)]
    cmd += list(extra_args or [])
    return cmd


def server_env(base: dict, side: str, stock_with_plugins: bool = False) -> dict:
    env = dict(base)
    if side == "stock" and not stock_with_plugins:
        env["SGLANG_PLUGINS"] = NO_PLUGINS
    return env


PLUGIN_GROUP = "sglang.srt.plugins"
PLUGIN_VALUE_PREFIX = "sglang_replayssm"
_PLUGIN_PROBE = ("from importlib.metadata import entry_points\n"
                 f"print(','.join(ep.name for ep in entry_points(group={PLUGIN_GROUP!r}) "
                 f"if ep.value.startswith({PLUGIN_VALUE_PREFIX!r})))")


def plugin_preflight(python: str, env: dict, backend: str = "replayssm") -> str | None:
    """Whether a server started as `python -m sglang.launch_server --mamba-backend replayssm` with
    `env` will load our plugin: None when it will, else what stops it and the fix.

    Without the plugin's entry point SGLang rejects the flag only after its imports (about a minute
    on the lent GPU, several after a first-use compile of another side), so the scripts ask first."""
    try:
        r = subprocess.run([python, "-c", _PLUGIN_PROBE], env=env, capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        return f"could not ask {python} for its {PLUGIN_GROUP} entry points: {type(e).__name__}: {e}"
    if r.returncode != 0:
        return (f"could not ask {python} for its {PLUGIN_GROUP} entry points (exit {r.returncode}): "
                f"{r.stderr.strip()[-300:]}")
    names = [n for n in r.stdout.strip().split(",") if n]
    fix = ("pip install -e <this checkout> into that interpreter (on the lent GPU: run through "
           "scripts/device_plan.sh, or `source scripts/device_e2e.sh install && install_plugin` first)")
    if not names:
        return (f"--mamba-backend {backend} needs the sglang-replayssm plugin, but {python} sees no "
                f"{PLUGIN_GROUP} entry point for it, so SGLang would reject the flag. Fix: {fix}")
    allowed = env.get("SGLANG_PLUGINS")
    if allowed and not set(names) & {x.strip() for x in allowed.split(",")}:
        return (f"SGLANG_PLUGINS={allowed!r} leaves out the plugin's entry point ({', '.join(names)}), so "
                f"--mamba-backend {backend} would be rejected. Fix: unset SGLANG_PLUGINS or add {names[0]} to it")
    return None


def generate_payload(prompts: list[list[int]], max_new_tokens) -> dict:
    """One batched /generate request. `max_new_tokens`: one int for every prompt, or a list with
    one per prompt (SGLang takes a list of sampling params for a batch)."""
    if isinstance(max_new_tokens, int):
        params = {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}
    else:
        if len(max_new_tokens) != len(prompts):
            raise ValueError(f"{len(max_new_tokens)} max_new_tokens for {len(prompts)} prompts")
        params = [{"temperature": 0, "max_new_tokens": int(n), "ignore_eos": True} for n in max_new_tokens]
    return {"input_ids": prompts, "sampling_params": params, "return_logprob": True}


def spread_new_tokens(seed: int, n: int, max_new_tokens: int, spread: float) -> list[int]:
    """Per-prompt output lengths in [max_new_tokens * (1 - spread), max_new_tokens], seeded, so
    that requests finish at different steps and the running batch shrinks one request at a time
    (it crosses every decode dispatch threshold downwards with rings still pending)."""
    if not 0.0 <= spread < 1.0:
        raise ValueError(f"--new-tokens-spread must be in [0, 1), got {spread}")
    rng = random.Random(seed + 7919)
    lo = max(1, int(round(max_new_tokens * (1.0 - spread))))
    return [rng.randint(lo, max_new_tokens) for _ in range(n)]


def parse_generate_response(resp) -> list[dict]:
    """Per prompt: output token ids, their logprobs and the spec-decoding meta fields.

    The ids come from ``output_token_logprobs`` ([logprob, id, text] triples); ``output_ids``,
    when present, must agree with them."""
    items = resp if isinstance(resp, list) else [resp]
    out = []
    for i, item in enumerate(items):
        meta = item.get("meta_info", {})
        triples = meta.get("output_token_logprobs") or []
        ids = [int(t[1]) for t in triples]
        lps = [None if t[0] is None else float(t[0]) for t in triples]
        if "output_ids" in item and item["output_ids"] is not None:
            oids = [int(x) for x in item["output_ids"]]
            if not ids:
                ids, lps = oids, [None] * len(oids)
            elif oids != ids:
                raise ValueError(f"prompt {i}: output_ids disagree with output_token_logprobs ids")
        out.append(dict(
            ids=ids,
            logprobs=lps,
            completion_tokens=meta.get("completion_tokens"),
            spec_accept_length=meta.get("spec_accept_length"),
            spec_verify_ct=meta.get("spec_verify_ct"),
            finish_reason=meta.get("finish_reason"),
        ))
    return out


def first_divergence(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token, len(shorter) if one is a strict prefix, None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(stock: list[dict], ours: list[dict], min_match: int, expected=None) -> dict:
    """Per-prompt first divergence and logprob |diff| on the common prefix, plus a summary.

    `expected`: per-prompt requested output lengths (with --new-tokens-spread); a prompt then
    passes with min(min_match, expected[i]) identical tokens."""
    if len(stock) != len(ours):
        raise ValueError(f"{len(stock)} stock outputs vs {len(ours)} ours")
    per, all_diffs = [], []
    for i, (s, o) in enumerate(zip(stock, ours)):
        div = first_divergence(s["ids"], o["ids"])
        common = min(len(s["ids"]), len(o["ids"])) if div is None else div
        matched = common if div is not None else len(s["ids"])
        diffs = [abs(a - b) for a, b in zip(s["logprobs"][:common], o["logprobs"][:common])
                 if a is not None and b is not None]
        all_diffs += diffs
        per.append(dict(
            prompt=i,
            first_divergence=div,
            matched_tokens=matched,
            passed=matched >= (min_match if expected is None else min(min_match, expected[i])),
            logprob_max_abs_diff=max(diffs) if diffs else None,
            logprob_mean_abs_diff=sum(diffs) / len(diffs) if diffs else None,
        ))
    n_pass = sum(p["passed"] for p in per)
    return dict(
        per_prompt=per,
        num_prompts=len(per),
        num_passed=n_pass,
        pass_frac=n_pass / len(per) if per else 0.0,
        logprob_max_abs_diff=max(all_diffs) if all_diffs else None,
        logprob_mean_abs_diff=sum(all_diffs) / len(all_diffs) if all_diffs else None,
        min_match=min_match,
    )


_CAPTURE_RE = re.compile(r"Capture (?P<name>[A-Za-z][\w\- ]*?) (?:CUDA|cuda) graph (?P<event>begin|end)\b")
# ServerArgs repr fields and SGLang's "Cuda graph is disabled because ..." warnings.
_CG_DISABLED_RE = re.compile(r"(\bdisable_cuda_graph=True|\bdisable_decode_cuda_graph=True|[Cc](?:uda|UDA) graph is disabled)")
_ISSM_SIZE_RE = re.compile(r"intermediate_ssm_state_cache size:\s*([0-9.]+)\s*GB")
_PROBLEM_RE = re.compile(
    r"(Traceback \(most recent call last\)|\bKeyError\b|Parameter .* not found|not found in params_dict|"
    r"CUDA out of memory|\bERROR\b|Initialization failed|error: argument|invalid choice)"
)


def parse_cuda_graph_log(text: str) -> dict:
    """{'captures': {name: [events]}, 'disabled_notices': [...]} from a server log."""
    captures: dict[str, list[str]] = {}
    for m in _CAPTURE_RE.finditer(text):
        captures.setdefault(m.group("name").strip(), []).append(m.group("event"))
    disabled = sorted({m.group(0) for m in _CG_DISABLED_RE.finditer(text)})
    return dict(captures=captures, disabled_notices=disabled)


def cuda_graph_check(parsed: dict, spec: bool) -> tuple[bool, str]:
    """True when the target's decode (no spec) / verify (spec) graph capture finished."""
    want = "target verify" if spec else "target decode"
    events = parsed["captures"].get(want, [])
    if parsed["disabled_notices"]:
        return False, f"CUDA graph disabled: {parsed['disabled_notices']}"
    if "end" not in events:
        seen = sorted(parsed["captures"])
        return False, f"no '{want}' CUDA graph capture in the log (captures seen: {seen})"
    return True, f"'{want}' captured"


def intermediate_ssm_report(text: str) -> dict:
    """Lines naming ``intermediate_ssm``; ``allocated`` counts those that are not the pool's
    "intermediate_ssm_state_cache size: 0.00GB" summary (a None buffer still prints that)."""
    lines = [ln.strip() for ln in text.splitlines() if "intermediate_ssm" in ln]
    sizes = [float(x) for x in _ISSM_SIZE_RE.findall(text)]
    allocated = sum(
        1 for ln in lines
        if not (_ISSM_SIZE_RE.search(ln) and all(float(x) == 0.0 for x in _ISSM_SIZE_RE.findall(ln))
                and ln.count("intermediate_ssm") == len(_ISSM_SIZE_RE.findall(ln)))
    )
    return dict(mentions=len(lines), allocated=allocated, sizes_gb=sizes, examples=[ln[-240:] for ln in lines[:3]])


def problem_lines(text: str, limit: int = 20) -> list[str]:
    return [ln.strip()[-300:] for ln in text.splitlines() if _PROBLEM_RE.search(ln)][:limit]


def accept_stats(outputs: list[dict]) -> dict | None:
    vals = [o["spec_accept_length"] for o in outputs if o.get("spec_accept_length") is not None]
    if not vals:
        return None
    return dict(mean=sum(vals) / len(vals), min=min(vals), max=max(vals))


def evaluate(
    *,
    spec: bool,
    sides: dict,
    comparison: dict | None,
    min_pass_frac: float,
    max_logprob_diff: float | None = None,
    issm_check: str = "strict",
) -> list[dict]:
    """Checks as a list of {name, ok, detail}. ``sides[name]`` holds 'served' (bool), 'log' (text)."""
    checks = []
    for name, side in sides.items():
        checks.append(dict(name=f"{name}: served", ok=bool(side.get("served")), detail=side.get("error") or "ok"))
        log = side.get("log", "")
        ok, detail = cuda_graph_check(parse_cuda_graph_log(log), spec)
        checks.append(dict(name=f"{name}: CUDA graphs", ok=ok, detail=detail))
    if "ours" in sides:
        rep = intermediate_ssm_report(sides["ours"].get("log", ""))
        bad = rep["mentions"] if issm_check == "strict" else rep["allocated"]
        checks.append(dict(
            name="ours: no intermediate_ssm",
            ok=bad == 0 and bool(sides["ours"].get("log")),
            detail=f"{rep['mentions']} mention(s) {rep['examples'][:1]}" if rep["mentions"] else
            ("0 mentions" if sides["ours"].get("log") else "no log"),
        ))
    if comparison is not None:
        ok = comparison["pass_frac"] >= min_pass_frac
        checks.append(dict(
            name="token parity",
            ok=ok,
            detail=f"{comparison['num_passed']}/{comparison['num_prompts']} prompts identical for "
                   f">= {comparison['min_match']} tokens (need {min_pass_frac:.0%})",
        ))
        if max_logprob_diff is not None:
            mx = comparison["logprob_max_abs_diff"]
            checks.append(dict(
                name="logprob parity",
                ok=mx is not None and mx <= max_logprob_diff,
                detail=f"max |diff| {mx} (limit {max_logprob_diff})",
            ))
    return checks


def repeats_identical(outputs: list[dict], first_wave: int) -> str:
    """Radix waves: how many repeated first-wave prompts (full cache hits) generated their first
    output again on one server. Reported, not checked: a cached state and a fresh prefill may
    differ in the last bits on any server; the stock-vs-ours comparison covers the repeats."""
    first, repeats = outputs[:first_wave], outputs[first_wave + 2::3]
    same = sum(1 for a, b in zip(first, repeats) if a["ids"] == b["ids"])
    return f"{same}/{len(first)}"


def workload_checks(sides: dict, *, radix_waves: bool, expect_retract: bool) -> list[dict]:
    """Checks that the workload did what it is for, on every side that served: radix-cache hits
    in the later waves; retractions."""
    checks = []
    for name, side in sides.items():
        if not side.get("served"):
            continue
        if radix_waves:
            n = side.get("cached_tokens_later_waves") or 0
            checks.append(dict(name=f"{name}: radix hits", ok=n > 0,
                               detail=f"{n} prompt tokens of the second wave came from the radix cache; "
                                      f"repeated prompts identical to their first output: "
                                      f"{side.get('repeats_identical')}"))
        if expect_retract:
            n = side.get("retractions") or 0
            checks.append(dict(name=f"{name}: retraction", ok=n > 0, detail=f"{n} retraction(s) in the log"))
    return checks


def _fmt(x, nd=4):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}g}"
    return str(x)


def format_table(result: dict) -> str:
    """Short human summary: per-side facts, divergences, checks."""
    lines = []
    title = f"e2e parity  model={result['model']}  spec={'NEXTN' if result['spec'] else 'off'}"
    lines.append(title)
    lines.append("-" * len(title))
    hdr = f"{'side':6s} {'served':6s} {'start_s':>7s} {'gen_s':>6s} {'tok/s':>8s} {'accept':>7s} {'issm':>5s} {'graphs':s}"
    lines.append(hdr)
    for name, side in result["sides"].items():
        acc = side.get("accept")
        gen_s = side.get("generate_s")
        toks = side.get("output_tokens")
        lines.append(
            f"{name:6s} {str(bool(side.get('served'))):6s} {_fmt(side.get('startup_s'), 4):>7s} "
            f"{_fmt(gen_s, 3):>6s} {_fmt(toks / gen_s if gen_s and toks else None, 4):>8s} "
            f"{_fmt(acc['mean'] if acc else None, 3):>7s} {side.get('intermediate_ssm', {}).get('mentions', '-')!s:>5s} "
            f"{','.join(sorted(side.get('cuda_graph', {}).get('captures', {}))) or '-'}"
        )
    comp = result.get("comparison")
    if comp:
        divs = [(p["prompt"], p["first_divergence"]) for p in comp["per_prompt"] if p["first_divergence"] is not None]
        lines.append(
            f"tokens: {comp['num_passed']}/{comp['num_prompts']} prompts pass (>= {comp['min_match']} identical); "
            f"logprob |diff| max {_fmt(comp['logprob_max_abs_diff'])} mean {_fmt(comp['logprob_mean_abs_diff'])}"
        )
        lines.append("first divergence (prompt:pos): " + (" ".join(f"{i}:{d}" for i, d in divs) or "none"))
    for c in result["checks"]:
        lines.append(f"[{'PASS' if c['ok'] else 'FAIL'}] {c['name']}: {c['detail']}")
    lines.append(f"RESULT: {'PASS' if result['ok'] else 'FAIL'}")
    return "\n".join(lines)


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(base: int | None, host: str = "127.0.0.1", span: int = 200) -> int:
    """``base`` or the next free port above it; an OS-chosen free port when base is 0/None."""
    if not base:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            return s.getsockname()[1]
    for p in range(base, base + span):
        if port_is_free(p, host):
            return p
    raise RuntimeError(f"no free port in [{base}, {base + span})")


# ----------------------------------------------------------------------------------------------
# Server process handling
# ----------------------------------------------------------------------------------------------


@dataclass
class ServerRun:
    name: str
    cmd: list
    log_path: str
    port: int
    served: bool = False
    error: str | None = None
    startup_s: float | None = None
    generate_s: float | None = None
    output_tokens: int | None = None
    outputs: list = field(default_factory=list)
    wave_log_offsets: list = field(default_factory=list)  # log length when each later wave started


def _http_json(url: str, payload: dict | None = None, timeout: float = 10.0):
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
        return r.status, (json.loads(body) if body else None)


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _kill_group(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the server's process group (it was started in its own session), then SIGKILL."""
    if proc.poll() is not None and not _group_alive(proc.pid):
        return
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.time() + wait
        while time.time() < deadline:
            if proc.poll() is not None and not _group_alive(proc.pid):
                return
            time.sleep(0.25)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


_LIVE: list[subprocess.Popen] = []


def _cleanup(*_):
    for p in list(_LIVE):
        _kill_group(p, grace_s=5.0)
    _LIVE.clear()


@contextmanager
def launched_server(run: ServerRun, host: str, startup_timeout: float, env: dict,
                    end_time: float | None = None, ready_note: str = "", timeout_note: str = ""):
    """Start ``run.cmd`` in its own session (output to ``run.log_path``) and wait until it is ready.

    Yields the Popen. When the server did not become ready, ``run.error`` is set (and
    ``run.startup_s`` stays None) before the yield. On exit the whole process group is stopped.
    ``end_time`` (time.time() scale) caps the wait, leaving ~20 s to stop the server."""
    Path(run.log_path).parent.mkdir(parents=True, exist_ok=True)
    print(f"[{run.name}] {shlex.join(run.cmd)}", flush=True)
    t0 = time.time()
    with open(run.log_path, "w") as log:
        log.write("# " + shlex.join(run.cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(run.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
    _LIVE.append(proc)
    base = f"http://{host}:{run.port}"
    try:
        while True:
            if proc.poll() is not None:
                run.error = f"server exited with code {proc.returncode} before it was ready"
                break
            if time.time() - t0 > startup_timeout:
                run.error = f"not ready after {startup_timeout:.0f} s{timeout_note}"
                break
            if end_time is not None and time.time() > end_time - 20:
                run.error = f"not ready after {time.time() - t0:.0f} s (time budget used up)"
                break
            if READY_MARKER in _read(run.log_path):
                try:
                    status, _ = _http_json(base + "/health", timeout=5)
                    if status == 200:
                        run.startup_s = time.time() - t0
                        print(f"[{run.name}] ready after {run.startup_s:.0f} s{ready_note}", flush=True)
                        break
                except (urllib.error.URLError, OSError, ValueError):
                    pass
            time.sleep(0.25)
        yield proc
    finally:
        _kill_group(proc)
        if proc in _LIVE:
            _LIVE.remove(proc)
        print(f"[{run.name}] stopped ({'served' if run.served else run.error})", flush=True)


# What a later side needs after an earlier one's startup wait: our server started in 70-100 s on
# the H200 (tiny Qwen3-Next / Nemotron-H with NEXTN, 2026-12-04) and served 32 x 256 tokens in
# ~3-6 s. Stock's start there took 100-177 s with warm Triton caches and more on a fresh machine,
# where splitting the budget in halves gave it 163 s and lost the whole call.
LATER_SIDE_RESERVE_S = 130.0


def side_startup_timeout(cap: float, end_time: float | None, now: float, later_sides: int,
                         reserve: float) -> float:
    """Startup wait for one side: `cap`, or with an overall budget (`end_time`) at most what is
    left after `reserve` seconds for each of the `later_sides` still to run and ~20 s to stop
    this server; never below 1 s (the wait then fails at once with its budget message)."""
    if end_time is None:
        return cap
    return max(1.0, min(cap, end_time - now - 20.0 - reserve * later_sides))


def run_server(run: ServerRun, payload: dict, host: str, startup_timeout: float, request_timeout: float,
               env: dict, end_time: float | None = None, next_waves=(), timeout_note: str = "") -> ServerRun:
    """Start, wait until ready, send the batch, shut down. Fills ``run`` in place.

    ``next_waves``: callables that build each further batch from the outputs so far (sent after
    the previous batch finished; their outputs are appended). ``end_time`` (time.time() scale)
    caps both waits, leaving ~20 s to stop the server."""
    base = f"http://{host}:{run.port}"
    note = f"; sending {len(payload['input_ids'])} prompts" + (f" (+{len(next_waves)} wave(s))" if next_waves else "")
    with launched_server(run, host, startup_timeout, env, end_time, ready_note=note, timeout_note=timeout_note):
        if run.error:
            return run
        t1 = time.time()
        waves = [lambda outs: payload, *next_waves]
        for i, make in enumerate(waves):
            if i > 0:
                run.wave_log_offsets.append(len(_read(run.log_path)))
            body = make(run.outputs)
            timeout = request_timeout if end_time is None else max(5.0, min(request_timeout, end_time - 20 - time.time()))
            try:
                _, resp = _http_json(base + "/generate", body, timeout=timeout)
            except urllib.error.HTTPError as e:
                run.error = f"/generate failed: HTTP {e.code}: {e.read()[:500]!r}"
                return run
            except (urllib.error.URLError, OSError) as e:
                run.error = f"/generate failed: {e}"
                return run
            try:
                run.outputs = run.outputs + parse_generate_response(resp)
            except (ValueError, KeyError, TypeError, IndexError) as e:
                run.error = f"bad /generate response: {e}"
                return run
        run.generate_s = time.time() - t1
        run.output_tokens = sum(len(o["ids"]) for o in run.outputs)
        run.served = True
        return run


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------


def _tokenizer_size(model: Path) -> int | None:
    p = model / "tokenizer.json"
    if not p.exists():
        return None
    tok = json.loads(p.read_text())
    n = len(tok.get("model", {}).get("vocab", {}))
    added = {t["id"] for t in tok.get("added_tokens", [])}
    return max(n, (max(added) + 1) if added else 0) or None


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="checkpoint directory (also the NEXTN draft with --spec)")
    p.add_argument("--spec", action="store_true", help="NEXTN: num-steps 3, eagle-topk 1, num-draft-tokens 4")
    p.add_argument("--only", choices=["both", "stock", "ours"], default="both")
    p.add_argument("--out", default=None, help="folder for result.json, outputs and server logs")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--new-tokens-spread", type=float, default=0.0,
                   help="per-prompt output lengths drawn from [max*(1-F), max] (0: all max); the batch then "
                        "shrinks one request at a time")
    p.add_argument("--min-match", type=int, default=None, help="identical tokens a prompt needs (default: all)")
    p.add_argument("--min-pass-frac", type=float, default=0.95)
    p.add_argument("--max-logprob-diff", type=float, default=None, help="optional limit on max |logprob diff|")
    p.add_argument("--issm-check", choices=["strict", "allocated"], default="strict",
                   help="strict: our log must not mention intermediate_ssm at all; allocated: a "
                        "'intermediate_ssm_state_cache size: 0.00GB' summary line is tolerated")
    p.add_argument("--radix-waves", action="store_true",
                   help="a second batch built from the first one's outputs that hits the radix cache on states "
                        "the first left there (decode-time track snapshots, prefill ends, full prompts); both "
                        "servers must report cached tokens")
    p.add_argument("--expect-retract", action="store_true",
                   help="fail unless both servers retracted requests (run with a small --max-total-tokens)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-len", type=int, nargs=2, default=(16, 160), metavar=("MIN", "MAX"))
    p.add_argument("--stock-backend", default="triton")
    p.add_argument("--ours-backend", default="replayssm")
    p.add_argument("--attention-backend", default=None, help="default: flashinfer for Nemotron-H, else triton")
    p.add_argument("--sampling-backend", default="pytorch")
    p.add_argument("--moe-runner-backend", default=None, help="default: triton for Nemotron-H, else SGLang's")
    p.add_argument("--disable-prefill-cuda-graph", action="store_true")
    p.add_argument("--cuda-graph-max-bs", type=int, default=None, help="--cuda-graph-max-bs-decode")
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--extra-args", default="", help="extra server flags for both servers (one string)")
    p.add_argument("--stock-extra-args", default="")
    p.add_argument("--ours-extra-args", default="")
    p.add_argument("--stock-with-plugins", action="store_true",
                   help="load SGLang plugins (ours included) in the stock server too (default: SGLANG_PLUGINS="
                        f"{NO_PLUGINS} there)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="first port to try (0: any free port)")
    p.add_argument("--startup-timeout", type=float, default=300.0,
                   help="longest startup wait of a server; with --time-budget also cut to what is left after "
                        "--later-side-reserve for each side still to run")
    p.add_argument("--later-side-reserve", type=float, default=LATER_SIDE_RESERVE_S,
                   help="with --time-budget: seconds kept back for each side that runs after this one (its "
                        f"startup and its batch; default {LATER_SIDE_RESERVE_S:.0f})")
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--time-budget", type=float, default=None,
                   help="wall seconds for the whole script; waits are cut short so results are still written")
    p.add_argument("--python", default=sys.executable, help="interpreter that runs sglang.launch_server")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    end_time = None if a.time_budget is None else time.time() + a.time_budget
    model = Path(a.model).resolve()
    cfg_path = model / "config.json"
    if not cfg_path.exists():
        print(f"error: {cfg_path} not found", file=sys.stderr)
        return 2
    config = json.loads(cfg_path.read_text())
    kind = model_kind(config)
    attention = a.attention_backend or DEFAULT_ATTENTION.get(kind, FALLBACK_ATTENTION)
    moe_runner = a.moe_runner_backend or DEFAULT_MOE_RUNNER.get(kind)
    min_match = a.max_new_tokens if a.min_match is None else a.min_match
    out = Path(a.out or f"e2e_out/{model.name}{'_nextn' if a.spec else ''}").resolve()
    out.mkdir(parents=True, exist_ok=True)

    lo, hi = prompt_id_range(config, _tokenizer_size(model))
    prompts = make_prompts(a.seed, a.num_prompts, lo, hi, a.prompt_len[0], a.prompt_len[1])
    new_tokens = (a.max_new_tokens if not a.new_tokens_spread
                  else spread_new_tokens(a.seed, len(prompts), a.max_new_tokens, a.new_tokens_spread))
    payload = generate_payload(prompts, new_tokens)
    next_waves = []
    if a.radix_waves:
        first = len(prompts)
        next_waves.append(lambda outs: generate_payload(
            radix_wave2(prompts, [o["ids"] for o in outs[:first]], a.seed, lo, hi), a.max_new_tokens))

    signal.signal(signal.SIGTERM, lambda *x: (_cleanup(), sys.exit(143)))
    env = dict(os.environ)
    both_args = shlex.split(a.extra_args)
    radix_args = radix_cache_args(kind, both_args, a.radix_waves)
    if radix_args:
        print(f"[e2e] {kind}: SGLang 0.5.17 leaves its radix-cache strategy unresolved; both servers get "
              f"{' '.join(radix_args)}", flush=True)
    sides_to_run = ["stock", "ours"] if a.only == "both" else [a.only]
    for name in sides_to_run:
        backend = a.stock_backend if name == "stock" else a.ours_backend
        if backend == "replayssm":
            err = plugin_preflight(a.python, server_env(env, name, a.stock_with_plugins), backend)
            if err:
                print(f"error: {name} side: {err}", file=sys.stderr)
                return 2
    runs: dict[str, ServerRun] = {}
    try:
        for k, name in enumerate(sides_to_run):
            port = pick_port(a.port, a.host)
            extra = both_args + radix_args + shlex.split(a.stock_extra_args if name == "stock" else a.ours_extra_args)
            cmd = build_server_cmd(
                python=a.python,
                model=str(model),
                port=port,
                host=a.host,
                mamba_backend=a.stock_backend if name == "stock" else a.ours_backend,
                attention_backend=attention,
                sampling_backend=a.sampling_backend,
                moe_runner_backend=moe_runner,
                spec=a.spec,
                disable_prefill_cuda_graph=a.disable_prefill_cuda_graph,
                cuda_graph_max_bs=a.cuda_graph_max_bs,
                mem_fraction_static=a.mem_fraction_static,
                max_running_requests=a.max_running_requests,
                extra_args=extra,
            )
            run = ServerRun(name=name, cmd=cmd, log_path=str(out / f"{name}.log"), port=port)
            side_env = server_env(env, name, a.stock_with_plugins)
            startup = side_startup_timeout(a.startup_timeout, end_time, time.time(), len(sides_to_run) - k - 1,
                                           a.later_side_reserve)
            cut = (f" (time budget: {a.later_side_reserve:.0f} s kept for each later side)"
                   if startup < a.startup_timeout else "")
            runs[name] = run_server(run, payload, a.host, startup, a.request_timeout, side_env, end_time,
                                    next_waves=next_waves, timeout_note=cut)
    finally:
        _cleanup()

    sides = {}
    for name, run in runs.items():
        log = _read(run.log_path)
        sides[name] = dict(
            served=run.served,
            error=run.error,
            cmd=run.cmd,
            sglang_plugins_env=server_env(env, name, a.stock_with_plugins).get("SGLANG_PLUGINS"),
            log_path=run.log_path,
            startup_s=run.startup_s,
            generate_s=run.generate_s,
            output_tokens=run.output_tokens,
            accept=accept_stats(run.outputs),
            intermediate_ssm=intermediate_ssm_report(log),
            cuda_graph=parse_cuda_graph_log(log),
            problems=problem_lines(log),
            log_tail=log.splitlines()[-15:] if not run.served else [],
            cached_tokens_later_waves=(cached_tokens(log[run.wave_log_offsets[0]:])
                                       if run.wave_log_offsets else None),
            retractions=log.count(RETRACT_MARKER),
            repeats_identical=repeats_identical(run.outputs, len(prompts)) if a.radix_waves and run.served else None,
        )
        if run.outputs:
            (out / f"{name}_outputs.json").write_text(json.dumps(run.outputs))

    comparison = None
    if runs.get("stock") and runs.get("ours") and runs["stock"].served and runs["ours"].served:
        comparison = compare_outputs(runs["stock"].outputs, runs["ours"].outputs, min_match,
                                     expected=None if isinstance(new_tokens, int) else new_tokens)
    checks = evaluate(
        spec=a.spec,
        sides={k: dict(served=v["served"], error=v["error"], log=_read(v["log_path"])) for k, v in sides.items()},
        comparison=comparison,
        min_pass_frac=a.min_pass_frac,
        max_logprob_diff=a.max_logprob_diff,
        issm_check=a.issm_check,
    )
    if a.only == "both" and comparison is None:
        checks.append(dict(name="token parity", ok=False, detail="not compared: a server did not serve"))
    checks += workload_checks(sides, radix_waves=a.radix_waves, expect_retract=a.expect_retract)
    result = dict(
        model=str(model),
        kind=kind,
        spec=a.spec,
        only=a.only,
        attention_backend=attention,
        moe_runner_backend=moe_runner,
        num_prompts=a.num_prompts,
        workload=dict(radix_waves=a.radix_waves, expect_retract=a.expect_retract,
                      compared_prompts=(comparison or {}).get("num_prompts")),
        radix_cache_args=radix_args,
        max_new_tokens=a.max_new_tokens,
        new_tokens_spread=a.new_tokens_spread,
        seed=a.seed,
        sides=sides,
        comparison=comparison,
        checks=checks,
        ok=all(c["ok"] for c in checks),
    )
    (out / "result.json").write_text(json.dumps(result, indent=2))
    for name, side in sides.items():
        if not side["served"]:
            print(f"--- {name} log tail ({side['log_path']}):\n" + "\n".join(side["log_tail"]))
    print(format_table(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
