#!/usr/bin/env python3
"""Server-level throughput benchmark: stock SGLang vs SGLang's own ReplaySSM flags vs ours.

One GPU, one server at a time, same checkpoint for every side:

  stock     --mamba-backend triton                                   (pristine: no SGLang plugins)
  upstream  --mamba-backend triton --enable-linear-replayssm --mamba-radix-cache-strategy no_buffer
            --disable-overlap-schedule  (decode study; GDN only; what 0.5.17 requires with the flag)
            --mamba-backend triton --enable-linear-replayssm-spec    (spec study;   GDN only)
  ours      --mamba-backend replayssm
  nospec    --mamba-backend triton without NEXTN                     (spec study only: the no-spec reference)

Studies:
  decode  real-shape, few-layer checkpoint with dummy weights (config + tokenizer only, served with
          --load-format dummy); no speculative decoding.
  spec    the same shapes with real (constructed) weights from make_tiny_model.py --accept-rate-knob,
          so that the NEXTN acceptance is controlled; NEXTN 3 steps / topk 1 / 4 draft tokens.
          Dummy weights give arbitrary acceptance (use --weights dummy only for memory/fit numbers).

Models (--model; the SSM layer count is --ssm-layers):
  gdn     Qwen3-Next / Qwen3.5 shaped GDN (HV=32, H=16, K=V=128), attention every 4th layer, MoE
  qwen35_4b  Qwen3.5-4B shaped GDN (the same GDN heads, hidden 2560), attention every 4th layer, dense
          MLP; 24 GDN layers (the real count) for decode and spec
  nano9b  Nemotron-Nano-9B-v2 shaped Mamba-2 (NH=128, P=80, N=128, G=8), M-/*- pattern, no MTP (decode only)
  super   Nemotron-3-Super shaped Mamba-2 (NH=128, P=64, N=128, G=8), ME/* pattern, MoE, MTP "*E"

Per concurrency C (--concurrency, default 1,8,32,128,256) the client sends max(C * --rounds,
--min-prompts) requests of --input-len random token ids with --output-len new tokens each
(temperature 0, ignore_eos), at most C in flight, streaming. Reported per case: output token
throughput (completion tokens / wall time from the first send to the last finish), TPOT
((latency - TTFT) / (tokens - 1) per request; mean, median, p90, p99), TTFT, the token-weighted
accept length (completion tokens / verify steps, from /generate meta_info), and from the server
log the median "gen throughput" and the CUDA-graph share of the decode-batch lines logged while
the case ran with #running-req == C, and the median over those of its windows with no prefill
batch inside (the decode steps alone). The case record also keeps each request's send time,
TTFT and latency, and when the client sent the second wave against when the first ended (a
stall in the arrivals shows there, and the report notes it).

Server facts (from each server's log): max_running_requests, KV tokens, mamba slots, ssm/conv
state, the stock spec server's intermediate_ssm cache, the ReplaySSM ring bytes ("ReplaySSM pool
(...)" line) and upstream's ring bytes; "fit" = the largest concurrency the server admits =
min(reported max_running_requests, KV tokens // (input + output + draft tokens)) when the server is
launched with a large --max-running-requests (--launch-max-running-requests, default 1024), i.e.
derived from the log, not probed.

Resumable: every case is a JSON file under OUT/cases; a rerun of the same command skips the cases
that are done (--redo to repeat them), so a sweep can span several device calls (--time-budget).
The report (OUT/report.md, OUT/plots/*.png, printed table) is rebuilt from all case files in OUT
at the end of every call (--report-only: nothing else).

Only the standard library is imported at module level (tests: tests/test_bench_serving_logic.py);
server launch/shutdown comes from scripts/e2e_parity.py.

Examples:
  python3 scripts/bench_serving.py --model gdn --study decode --out /tmp/bench --time-budget 540
  python3 scripts/bench_serving.py --model gdn --study decode --only ours --concurrency 128,256 --out /tmp/bench
  python3 scripts/bench_serving.py --model gdn --study spec --ssm-layers 12 --out /tmp/bench
  python3 scripts/bench_serving.py --report-only --out /tmp/bench
Exit status: 0 when every case run in this call succeeded (or nothing was left), 1 when a case or
server failed, 3 when the time budget ran out with cases left (rerun to resume), 2 on usage errors.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import hashlib
import json
import math
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_parity as e2e  # noqa: E402  (server launch / shutdown helpers)

HERE = Path(__file__).resolve().parent
DEFAULT_CONCURRENCY = (1, 8, 32, 128, 256)
SIDE_ORDER = ("stock", "stockplug", "upstream", "ours", "nospec")  # report order; --only sets the run order
# stockplug: stock's flags (--mamba-backend triton) with the SGLang plugins loaded, ours included
# (installed, not selected): a control that separates "our plugin is loaded" from "our path runs".
STUDY_SIDES = {"decode": ("stock", "stockplug", "upstream", "ours"),
               "spec": ("stock", "stockplug", "upstream", "ours", "nospec")}
DEFAULT_SIDES = {"decode": ("stock", "upstream", "ours"), "spec": ("stock", "upstream", "ours", "nospec")}
SPEC_DRAFT_TOKENS = 4  # e2e.SPEC_ARGS: --speculative-num-draft-tokens 4

# ----------------------------------------------------------------------------------------------
# Model recipes (scripts/make_tiny_model.py presets + real-shape look-alikes)
# ----------------------------------------------------------------------------------------------

MODELS = {
    "gdn": dict(
        family="gdn", preset="qwen3_next", shape="qwen3-next-80b", mtp=True, default_ssm_layers=24,
        desc="Qwen3-Next/Qwen3.5-shaped GDN (HV=32, H=16, K=V=128), full attention every 4th layer, MoE",
    ),
    "qwen35_4b": dict(
        family="gdn", preset="qwen3_5", shape="qwen3.5-4b", mtp=True, default_ssm_layers=24,
        desc="Qwen3.5-4B-shaped GDN (HV=32, H=16, K=V=128, hidden 2560), attention every 4th layer, dense MLP",
    ),
    "nano9b": dict(
        family="mamba2", preset="nemotron_h", shape="nemotron-nano-9b-v2", mtp=False, default_ssm_layers=24,
        desc="Nemotron-Nano-9B-v2-shaped Mamba-2 (NH=128, P=80, N=128, G=8), dense MLP, no MTP",
    ),
    "super": dict(
        family="mamba2", preset="nemotron_h", shape="nemotron-3-super", mtp=True, default_ssm_layers=20,
        desc="Nemotron-3-Super-shaped Mamba-2 (NH=128, P=64, N=128, G=8), MoE, MTP '*E'",
    ),
}
# The models with an MTP head, which the spec study needs.
SPEC_MODELS = ", ".join(m for m, rec in MODELS.items() if rec["mtp"])
# Spec checkpoints carry real weights built on the CPU: keep them smaller by default.
DEFAULT_SPEC_SSM_LAYERS = {"gdn": 12, "qwen35_4b": 24, "nano9b": 12, "super": 8}


def layer_pattern(model: str, ssm_layers: int) -> dict:
    """make_tiny_model.py layer flags for ``ssm_layers`` SSM layers of ``model``.

    gdn, qwen35_4b: (ssm_layers / 3) blocks of 3 GDN + 1 attention (full_attention_interval 4;
            Qwen3.5-4B itself: 24 GDN / 32 layers);
    nano9b: "M-" per SSM layer, "*-" after every 7th (Nano-9B-v2: 27 M / 4 *);
    super:  "ME" per SSM layer, "*" after every 5th (Super: 40 M / 40 E / 8 *).
    Mamba-2 patterns always contain at least one attention layer."""
    if ssm_layers < 1:
        raise ValueError("--ssm-layers must be >= 1")
    if MODELS.get(model, {}).get("family") == "gdn":
        if ssm_layers % 3:
            raise ValueError(f"{model}: --ssm-layers must be a multiple of 3 (3 GDN + 1 attention per block)")
        return {"num_layers": ssm_layers // 3 * 4, "full_attention_interval": 4}
    if model in ("nano9b", "super"):
        unit, attn, every = ("M-", "*-", 7) if model == "nano9b" else ("ME", "*", 5)
        parts = []
        for i in range(ssm_layers):
            parts.append(unit)
            if (i + 1) % every == 0:
                parts.append(attn)
        pattern = "".join(parts)
        if "*" not in pattern:
            pattern += attn
        return {"pattern": pattern}
    raise ValueError(f"unknown model {model!r}")


def model_tag(model: str, ssm_layers: int, weights: str, knob: float | None, build_flags: str = "") -> str:
    tag = f"{model}-{ssm_layers}ssm-" + ("dummy" if weights == "dummy" else f"knob{knob:g}")
    if build_flags.strip():
        tag += "-" + hashlib.sha1(build_flags.strip().encode()).hexdigest()[:6]
    return tag


def build_model_cmd(python: str, model: str, ssm_layers: int, weights: str, knob: float | None, out: str,
                    build_flags: str = "") -> list[str]:
    """The make_tiny_model.py command that writes the checkpoint (config + tokenizer for dummy)."""
    rec = MODELS[model]
    cmd = [python, str(HERE / "make_tiny_model.py"), "--preset", rec["preset"], "--shape", rec["shape"], "--out", out]
    for k, v in layer_pattern(model, ssm_layers).items():
        cmd += ["--" + k.replace("_", "-"), str(v)]
    if weights == "dummy":
        cmd += ["--no-weights"]
    else:
        if not rec["mtp"]:
            raise ValueError(f"{model} has no MTP head: the spec study needs one of: {SPEC_MODELS}")
        knob = 0.0 if knob is None else knob
        # Real-shape models are large for the CPU: skip the CPU measurements. The knob end points
        # need no calibration; an interior knob then takes the raw mixing weight (w = knob).
        cmd += ["--accept-rate-knob", f"{knob:g}", "--no-measure"]
        if 0.0 < knob < 1.0:
            cmd += ["--knob-mode", "raw"]
    cmd += shlex.split(build_flags)
    return cmd


# ----------------------------------------------------------------------------------------------
# Sides -> server commands
# ----------------------------------------------------------------------------------------------


def side_applicable(side: str, study: str, family: str) -> tuple[bool, str]:
    if side not in STUDY_SIDES[study]:
        return False, f"side {side!r} is not part of the {study} study"
    if side == "upstream" and family != "gdn":
        return False, ("SGLang's --enable-linear-replayssm / --enable-linear-replayssm-spec cover GDN/KDA only "
                       "(no Mamba-2 path in 0.5.17)")
    return True, ""


def side_server_args(side: str, study: str, ring_len: int | None) -> tuple[str, bool, list[str]]:
    """(mamba backend, spec on, extra flags) of one side."""
    spec = study == "spec" and side != "nospec"
    if side == "ours":
        return "replayssm", spec, (["--replayssm-ring-len", str(ring_len)] if ring_len else [])
    if side == "upstream":
        if spec:
            return "triton", True, ["--enable-linear-replayssm-spec"]
        # SGLang 0.5.17 refuses --enable-linear-replayssm with the extra_buffer strategy, which
        # "auto" resolves to when the radix cache is on, and no_buffer without the overlap
        # scheduler: name both, the one configuration it serves.
        return "triton", False, ["--enable-linear-replayssm", "--mamba-radix-cache-strategy", "no_buffer",
                                 "--disable-overlap-schedule"] + (
            ["--linear-replayssm-cache-len", str(ring_len)] if ring_len else [])
    return "triton", spec, []


def side_plugin_env(base: dict, side: str) -> dict:
    """Stock, upstream and nospec run without SGLang plugins (pristine SGLang); ours and stockplug
    with them."""
    return e2e.server_env(base, "ours" if side in ("ours", "stockplug") else "stock")


# ----------------------------------------------------------------------------------------------
# Log parsing (pure)
# ----------------------------------------------------------------------------------------------

_NUM = r"([0-9]+(?:\.[0-9]+)?)"
_SCHED_RE = re.compile(r"max_total_num_tokens=(\d+), chunked_prefill_size=(-?\d+), max_prefill_tokens=(\d+), "
                       r"max_running_requests=(\d+), context_len=(\d+)")
_MAMBA_RE = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+), conv_state size: " + _NUM
                       + r"GB, ssm_state size: " + _NUM + r"GB")
_ISSM_RE = re.compile(r"intermediate_ssm_state_cache size: " + _NUM + r"GB")
_ICONV_RE = re.compile(r"intermediate_conv_window_cache size: " + _NUM + r"GB")
_KV_RE = re.compile(r"KV Cache is allocated\. dtype: [^,]+, #tokens: (\d+), (?:K size: " + _NUM + r" GB, V size: "
                    + _NUM + r" GB|KV size: " + _NUM + r" GB)")
_OURS_POOL_RE = re.compile(
    r"ReplaySSM pool \((\w+), (\d+) SSM layers, ring_len=(\d+), rings in (\w+)\): per slot checkpoint " + _NUM
    + r" MiB \+ rings " + _NUM + r" MiB \+ cursors (\d+) B; (\d+) slots: checkpoints " + _NUM + r" GiB, rings "
    + _NUM + r" GiB(?:[^\n]*?conv windows " + _NUM + r" GiB)?")
_OURS_MEM_RE = re.compile(r"ReplaySSM memory: (\d+) mamba slots \(\+1 padding\) x " + _NUM + r" MiB \(state " + _NUM
                          + r" \+ rings " + _NUM + r" MiB\)")
_UP_RING_RE = re.compile(r"GDN ReplaySSM ring buffers allocated \(record_len=(\d+)[^)]*\): (.*)")
_UP_PART_RE = re.compile(r"(\w+)=" + _NUM + r"GB")
_CAPPED_RE = re.compile(r"max_running_requests is capped to (\d+) by the mamba state cache")
_OOM_RE = re.compile(r"torch\.OutOfMemoryError|CUDA out of memory")
_GPU_TOTAL_RE = re.compile(r"total capacity of " + _NUM + r" GiB")
_MEM_FRAC_RE = re.compile(r"mem_fraction_static=" + _NUM)
_DECODE_RE = re.compile(
    r"Decode batch(?: \[\d+\])?, #running-req: (\d+),.*?(?:accept len: " + _NUM + r",.*?)?"
    r"(?:cuda|cpu|npu|musa) graph: (True|False), gen throughput \(token/s\): " + _NUM)


_PREFILL_RE = re.compile(
    r"Prefill batch(?: \[\d+\])?, #new-seq: (\d+), #new-token: (\d+),.*?input throughput \(token/s\): " + _NUM)


def prefill_line_summary(text: str, min_tokens: int = 4096) -> dict:
    """Prefill batches in a server-log slice: how many, and the median `input throughput` of the
    large ones (>= `min_tokens` new tokens; back-to-back chunked prefills, where the number is the
    batch's own rate rather than idle time since the last log line)."""
    lines = [(int(m.group(1)), int(m.group(2)), float(m.group(3))) for m in _PREFILL_RE.finditer(text)]
    big = [tps for _, tok, tps in lines if tok >= min_tokens]
    return dict(prefill_batches=len(lines), prefill_batches_large=len(big),
                prefill_input_tps_median=statistics.median(big) if big else None)


def parse_server_facts(text: str) -> dict:
    """Pool sizes and memory from a server log (None where a line is missing)."""
    f: dict = {}
    m = _SCHED_RE.search(text)
    if m:
        f.update(max_total_num_tokens=int(m.group(1)), chunked_prefill_size=int(m.group(2)),
                 max_prefill_tokens=int(m.group(3)), max_running_requests=int(m.group(4)),
                 context_len=int(m.group(5)))
    m = _MAMBA_RE.search(text)
    if m:
        f.update(mamba_slots=int(m.group(1)), conv_state_gb=float(m.group(2)), ssm_state_gb=float(m.group(3)))
        line = text[m.start():text.find("\n", m.start()) if "\n" in text[m.start():] else len(text)]
        mi = _ISSM_RE.search(line)
        f["intermediate_ssm_gb"] = float(mi.group(1)) if mi else None
        mc = _ICONV_RE.search(line)
        f["intermediate_conv_gb"] = float(mc.group(1)) if mc else None
    kv = []
    for m in _KV_RE.finditer(text):
        gb = float(m.group(4)) if m.group(4) else float(m.group(2)) + float(m.group(3))
        kv.append(dict(tokens=int(m.group(1)), gb=gb))
    f["kv_caches"] = kv  # the target's first; a NEXTN draft adds its own
    m = _OURS_POOL_RE.search(text)
    if m:
        f["replayssm"] = dict(
            family=m.group(1), ssm_layers=int(m.group(2)), ring_len=int(m.group(3)), ring_dtype=m.group(4),
            checkpoint_mib_per_slot=float(m.group(5)), rings_mib_per_slot=float(m.group(6)),
            cursor_bytes_per_slot=int(m.group(7)), slots=int(m.group(8)), checkpoints_gib=float(m.group(9)),
            rings_gib=float(m.group(10)),
            # speculative pools only: the per-draft conv windows (conv rollback after verify)
            conv_windows_gib=float(m.group(11)) if m.group(11) else None)
    m = _OURS_MEM_RE.search(text)
    if m:
        f["replayssm_memory"] = dict(slots=int(m.group(1)), mib_per_slot=float(m.group(2)),
                                     state_mib=float(m.group(3)), rings_mib=float(m.group(4)))
    m = _UP_RING_RE.search(text)
    if m:
        parts = {k: float(v) for k, v in _UP_PART_RE.findall(m.group(2))}
        f["upstream_rings"] = dict(record_len=int(m.group(1)), parts_gb=parts, total_gb=sum(parts.values()))
    m = _CAPPED_RE.search(text)
    f["capped_by_mamba"] = int(m.group(1)) if m else None
    return f


def upstream_oom_hint(text: str) -> str | None:
    """Why SGLang's own ReplaySSM server died of a CUDA OOM, and the flag that fixes it; None when
    the log shows no OOM or no upstream rings.

    SGLang 0.5.17's `--enable-linear-replayssm` allocates its rings after the KV cache has been sized
    from `--mem-fraction-static`, so they come out of the activation headroom. On the H200 (session
    24) its rings took 11.5 of the 12.9 GB left for activations, and the first batch of 256 prefills
    ran out of memory. The fix: lower its fraction by the rings' share of the GPU."""
    if not _OOM_RE.search(text):
        return None
    m = _UP_RING_RE.search(text)
    if not m:
        return None
    rings = sum(float(v) for _, v in _UP_PART_RE.findall(m.group(2)))
    how = "F = its --mem-fraction-static minus rings / GPU memory"
    frac, total = _MEM_FRAC_RE.search(text), _GPU_TOTAL_RE.search(text)
    if frac and total:
        f, t = float(frac.group(1)), float(total.group(1))
        how = f"here F <= {f:g} - {rings:.3f} / {t:.2f} = {math.floor((f - rings / t) * 1000) / 1000:.3f}"
    return (f"out of GPU memory: SGLang's own ReplaySSM allocates its rings ({rings:.3f} GB) after sizing the KV "
            f"cache, outside --mem-fraction-static; rerun with --upstream-args=--mem-fraction-static=F ({how})")


def fit_concurrency(facts: dict, input_len: int, output_len: int, spec: bool) -> dict:
    """Largest concurrency the server admits (derived from its log; see the module docstring)."""
    mrr = facts.get("max_running_requests")
    kvs = facts.get("kv_caches") or []
    per_req = input_len + output_len + (SPEC_DRAFT_TOKENS if spec else 0)
    by_kv = kvs[0]["tokens"] // per_req if kvs else None
    cands = [x for x in (mrr, by_kv) if x is not None]
    return dict(fit=min(cands) if cands else None, max_running_requests=mrr, by_kv=by_kv,
                tokens_per_request=per_req, mamba_slots=facts.get("mamba_slots"))


def memory_summary(facts: dict, fit: dict) -> dict:
    """Per-request and total bytes of the speculative scratch / rings, from the parsed facts."""
    out: dict = {}
    issm = facts.get("intermediate_ssm_gb")
    if issm:
        # SGLang sizes it for min(max_running_requests, mamba slots) + 1 requests (the padding slot).
        known = [x for x in (fit.get("max_running_requests"), facts.get("mamba_slots")) if x is not None]
        reqs = min(known) + 1 if known else None
        out["intermediate_ssm_gib"] = issm
        out["intermediate_ssm_mib_per_request"] = issm * 1024 / reqs if reqs else None
    rs = facts.get("replayssm")
    if rs:
        out["replayssm_rings_gib"] = rs["rings_gib"]
        out["replayssm_rings_mib_per_slot"] = rs["rings_mib_per_slot"]
        out["replayssm_checkpoint_mib_per_slot"] = rs["checkpoint_mib_per_slot"]
    up = facts.get("upstream_rings")
    if up:
        out["upstream_rings_gib"] = up["total_gb"]
        slots = facts.get("mamba_slots")
        out["upstream_rings_mib_per_slot"] = up["total_gb"] * 1024 / (slots + 1) if slots else None
    if facts.get("ssm_state_gb") is not None:
        out["ssm_state_gib"] = facts["ssm_state_gb"]
        slots = facts.get("mamba_slots")
        out["ssm_state_mib_per_slot"] = facts["ssm_state_gb"] * 1024 / (slots + 1) if slots else None
    return out


def parse_decode_lines(text: str) -> list[dict]:
    """Decode-batch lines in log order. SGLang's `gen throughput` is the tokens generated since the
    previous decode-batch line over the time since it, so a window is a clean decode-step rate only
    when a previous decode line opened it and no prefill batch ran inside it (`clean`)."""
    out, prev_end = [], None
    for m in _DECODE_RE.finditer(text):
        clean = prev_end is not None and _PREFILL_RE.search(text, prev_end, m.start()) is None
        out.append(dict(running=int(m.group(1)), accept_len=float(m.group(2)) if m.group(2) else None,
                        cuda_graph=m.group(3) == "True", gen_throughput=float(m.group(4)), clean=clean))
        prev_end = m.end()
    return out


def decode_line_summary(lines: list[dict], concurrency: int) -> dict:
    """Median server-side gen throughput and CUDA-graph share over the lines at #running-req == C
    (all lines when none is at C), plus the largest batch seen."""
    at_c = [ln for ln in lines if ln["running"] == concurrency]
    use = at_c or lines
    if not use:
        return dict(lines=0, lines_at_c=0, server_gen_throughput=None, cuda_graph_share=None, max_running=None,
                    server_accept_len=None, clean_lines_at_c=0, server_gen_throughput_clean=None)
    acc = [ln["accept_len"] for ln in use if ln["accept_len"] is not None]
    clean = [ln["gen_throughput"] for ln in at_c if ln.get("clean")]
    return dict(
        lines=len(lines), lines_at_c=len(at_c),
        server_gen_throughput=statistics.median(ln["gen_throughput"] for ln in use),
        # Windows at C with no prefill inside: the decode steps alone (None when the case had none).
        clean_lines_at_c=len(clean),
        server_gen_throughput_clean=statistics.median(clean) if clean else None,
        cuda_graph_share=sum(ln["cuda_graph"] for ln in use) / len(use),
        max_running=max(ln["running"] for ln in lines),
        server_accept_len=statistics.median(acc) if acc else None,
    )


# ----------------------------------------------------------------------------------------------
# Metrics (pure)
# ----------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    v = sorted(values)
    if not v:
        return None
    k = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def summarize_requests(reqs: list[dict], duration_s: float, concurrency: int) -> dict:
    """Case metrics from per-request records (ok, ttft_s, latency_s, output_tokens, verify_ct)."""
    ok = [r for r in reqs if r.get("ok")]
    toks = sum(r["output_tokens"] for r in ok)
    tpots = [(r["latency_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) * 1e3
             for r in ok if r["output_tokens"] > 1 and r.get("ttft_s") is not None]
    ttfts = [r["ttft_s"] * 1e3 for r in ok if r.get("ttft_s") is not None]
    lats = [r["latency_s"] * 1e3 for r in ok]
    spec = [r for r in ok if r.get("verify_ct")]
    acc = sum(r["output_tokens"] for r in spec) / sum(r["verify_ct"] for r in spec) if spec else None
    lag = [(r["latency_s"] - r["server_e2e_s"]) * 1e3 for r in ok if r.get("server_e2e_s") is not None]
    streamed = [r["stream_bytes"] for r in ok if r.get("stream_bytes") is not None]
    return dict(
        concurrency=concurrency,
        num_requests=len(reqs),
        completed=len(ok),
        failed=len(reqs) - len(ok),
        errors=sorted({str(r.get("error"))[:200] for r in reqs if not r.get("ok")})[:5],
        duration_s=duration_s,
        total_output_tokens=toks,
        output_throughput=toks / duration_s if duration_s > 0 else None,
        request_throughput=len(ok) / duration_s if duration_s > 0 else None,
        mean_tpot_ms=statistics.fmean(tpots) if tpots else None,
        median_tpot_ms=percentile(tpots, 50),
        p90_tpot_ms=percentile(tpots, 90),
        p99_tpot_ms=percentile(tpots, 99),
        mean_ttft_ms=statistics.fmean(ttfts) if ttfts else None,
        median_ttft_ms=percentile(ttfts, 50),
        p99_ttft_ms=percentile(ttfts, 99),
        median_e2e_latency_ms=percentile(lats, 50),
        accept_length=acc,
        accept_length_requests=len(spec),
        # Host side of the stream: the bytes of event payloads the client read (SGLang's default
        # streaming repeats every output id so far in each event), and how much later than the
        # server's own end of each request the client saw it (median and largest).
        stream_mb=sum(streamed) / 1e6 if streamed else None,
        median_stream_lag_ms=percentile(lag, 50),
        max_stream_lag_ms=max(lag) if lag else None,
    )


STREAM_LAG_NOTE_MS = 500.0  # a client that saw requests end later than this after the server gets a note
WAVE_SPREAD_NOTE_S = 0.25  # a second wave sent over longer than this gets a note in the report
# A server whose main process (HTTP server + tokenizer manager: one Python event loop that handles
# every output batch) was busier than this share of a case gets a note: session 41 measured both
# sides capped near the same rate on a host where it ran at 80-85 % (docs/serving.md).
MAIN_BUSY_NOTE = 0.8
TOKENIZER_WORKER_COMM = "sglang::tokeni"  # the kernel keeps 15 characters of the process title


def wave_timing(reqs: list[dict], concurrency: int) -> dict:
    """When the client sent the second wave, against when the first wave ended (closed loop: each
    of the C client slots sends its next request when its previous one ends).

    `wave1_end_spread_s`: first to C-th end among the first C requests sent; `wave2_send_spread_s`:
    first to last send among requests C..2C-1; `client_lag_max_s`: the largest delay between the
    i-th first-wave end and the i-th second-wave send (both sorted), i.e. time the client itself
    added. A long send spread with a short lag means the server delivered the first wave's ends
    spread out; a long lag, the client was late. None without two full waves."""
    rs = [r for r in reqs if r.get("t_send_s") is not None and r.get("latency_s") is not None]
    if concurrency < 1 or len(rs) < 2 * concurrency:
        return dict(wave1_end_spread_s=None, wave2_send_spread_s=None, client_lag_max_s=None)
    rs.sort(key=lambda r: r["t_send_s"])
    ends = sorted(r["t_send_s"] + r["latency_s"] for r in rs[:concurrency])
    sends = [r["t_send_s"] for r in rs[concurrency:2 * concurrency]]
    return dict(wave1_end_spread_s=ends[-1] - ends[0], wave2_send_spread_s=sends[-1] - sends[0],
                client_lag_max_s=max(max(s - e for s, e in zip(sends, ends)), 0.0))


def output_digest(ids: list[int]) -> str:
    """A short digest of a request's output token ids (equal ids, equal digest)."""
    return hashlib.blake2b(json.dumps(ids, separators=(",", ":")).encode(), digest_size=8).hexdigest()


def greedy_agreement(cases: dict, reference: str = "stock") -> list[str]:
    """For every side with a case at the same concurrency as `reference`'s (cases: side -> {C: case}),
    on how many requests its output digests equal the reference's, request by request (both sides
    send the same prompts in the same order; requests without a digest on either side are not
    counted)."""
    out = []
    for side in sorted(s for s in cases if s != reference):
        for c, case in sorted(cases[side].items()):
            ref = (cases.get(reference) or {}).get(c)
            a, b = (case.get("output_digests") or []), ((ref or {}).get("output_digests") or [])
            pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
            if pairs:
                same = sum(x == y for x, y in pairs)
                out.append(f"{side} C={c}: {same} of {len(pairs)} requests generated the same tokens as {reference}")
    return out


def request_timeline(reqs: list[dict]) -> list[list]:
    """[send s, TTFT s, latency s, output tokens] per request in send order (ms resolution), kept in
    the case record so that arrival stalls can be traced after the run."""
    rows = [[round(r["t_send_s"], 3), None if r.get("ttft_s") is None else round(r["ttft_s"], 3),
             None if r.get("latency_s") is None else round(r["latency_s"], 3), r.get("output_tokens", 0)]
            for r in reqs if r.get("t_send_s") is not None]
    return sorted(rows, key=lambda x: x[0])


def num_prompts_for(concurrency: int, rounds: int, min_prompts: int) -> int:
    return max(concurrency * rounds, min_prompts, 1)


def case_seed(base: int, concurrency: int) -> int:
    """A different prompt set per concurrency (no radix-cache hits across cases), the same for every side."""
    return base * 1_000_003 + concurrency


# ----------------------------------------------------------------------------------------------
# Streaming /generate client (stdlib asyncio)
# ----------------------------------------------------------------------------------------------


async def _read_headers(reader) -> tuple[int, dict]:
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("empty response")
    parts = status_line.decode("latin-1").split(None, 2)
    status = int(parts[1])
    headers = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers


async def _iter_body(reader, headers: dict):
    """Body blocks: chunked transfer encoding, Content-Length, or read-until-close."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            size_line = await reader.readline()
            if not size_line:
                return
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size)
            await reader.readline()  # CRLF after the chunk
            yield data
    elif "content-length" in headers:
        n = int(headers["content-length"])
        if n:
            yield await reader.readexactly(n)
    else:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                return
            yield data


async def _sse_events(reader, headers: dict):
    """Payloads of ``data:`` lines (bytes), in order."""
    buf = b""
    async for block in _iter_body(reader, headers):
        buf += block
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            line = line.strip()
            if line.startswith(b"data:"):
                yield line[5:].strip()
    if buf.strip().startswith(b"data:"):
        yield buf.strip()[5:].strip()


async def stream_generate(host: str, port: int, payload: dict) -> dict:
    """One streaming /generate request; times the first token and the end.

    Tokens are counted from ``meta_info.completion_tokens`` (not from the text: with a tokenizer
    smaller than the vocabulary most generated ids decode to empty strings). Only the first event
    carrying a token and the last event are parsed."""
    t0 = time.perf_counter()
    rec: dict = dict(ok=False, ttft_s=None, latency_s=None, output_tokens=0, verify_ct=None, error=None)
    writer = None
    try:
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 24)
        body = json.dumps(payload).encode()
        writer.write((f"POST /generate HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                      f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n")
                     .encode() + body)
        await writer.drain()
        status, headers = await _read_headers(reader)
        if status != 200:
            text = b"".join([b async for b in _iter_body(reader, headers)])[:300]
            rec["error"] = f"HTTP {status}: {text!r}"
            return rec
        last = None
        nbytes = 0
        async for data in _sse_events(reader, headers):
            if data == b"[DONE]":
                break
            nbytes += len(data)
            if rec["ttft_s"] is None:
                ev = json.loads(data)
                if "error" in ev:
                    rec["error"] = str(ev["error"])[:300]
                    return rec
                if (ev.get("meta_info") or {}).get("completion_tokens", 0) >= 1:
                    rec["ttft_s"] = time.perf_counter() - t0
            last = data
        rec["latency_s"] = time.perf_counter() - t0
        rec["stream_bytes"] = nbytes
        if last is None:
            rec["error"] = "no events in the stream"
            return rec
        final = json.loads(last)
        if "error" in final:
            rec["error"] = str(final["error"])[:300]
            return rec
        meta = final.get("meta_info") or {}
        rec["output_tokens"] = int(meta.get("completion_tokens") or 0)
        rec["verify_ct"] = meta.get("spec_verify_ct")
        # The server's own request latency (its tokenizer manager, up to the final output): the
        # client's latency minus this is time the stream spent between that process and here.
        if isinstance(meta.get("e2e_latency"), (int, float)):
            rec["server_e2e_s"] = float(meta["e2e_latency"])
        # SGLang's default (non-incremental) streaming ends with every output id: a digest of
        # them lets the report compare the sides' greedy tokens request by request.
        ids = final.get("output_ids")
        if isinstance(ids, list) and len(ids) == rec["output_tokens"]:
            rec["output_digest"] = output_digest(ids)
        fr = meta.get("finish_reason")
        rec["finish_reason"] = fr.get("type") if isinstance(fr, dict) else fr
        if rec["ttft_s"] is None:
            rec["ttft_s"] = rec["latency_s"]
        rec["ok"] = rec["output_tokens"] > 0
        if not rec["ok"]:
            rec["error"] = "no tokens generated"
        return rec
    except (OSError, ValueError, asyncio.IncompleteReadError, ConnectionError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        return rec
    finally:
        if writer is not None:
            writer.close()


class Progress:
    """tqdm when importable, else a plain counter on stderr (one line every 2 s, 20 s when piped)."""

    def __init__(self, total: int, desc: str, disable: bool = False):
        self.total, self.desc, self.n, self._last = total, desc, 0, 0.0
        self._bar = None
        self.disable = disable
        if disable:
            return
        try:
            from tqdm import tqdm

            # Piped output (the device tool keeps only the tail): few updates.
            self._bar = tqdm(total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True,
                             mininterval=0.5 if sys.stderr.isatty() else 20.0)
        except ImportError:
            print(f"{desc}: 0/{total}", file=sys.stderr, flush=True)

    def update(self, k: int = 1):
        self.n += k
        if self.disable:
            return
        if self._bar is not None:
            self._bar.update(k)
        elif time.time() - self._last > (2.0 if sys.stderr.isatty() else 20.0) or self.n == self.total:
            self._last = time.time()
            print(f"{self.desc}: {self.n}/{self.total}", file=sys.stderr, flush=True)

    def close(self):
        if self._bar is not None:
            self._bar.close()


async def _run_load(host: str, port: int, prompts: list[list[int]], output_len: int, concurrency: int,
                    deadline: float | None, progress: Progress | None) -> tuple[list[dict], float]:
    sem = asyncio.Semaphore(concurrency)

    async def one(p):
        async with sem:
            t_send = time.perf_counter() - t0
            payload = {"input_ids": p, "stream": True,
                       "sampling_params": {"temperature": 0, "max_new_tokens": output_len, "ignore_eos": True}}
            timeout = None if deadline is None else deadline - time.time()
            if timeout is not None and timeout <= 0:
                r = dict(ok=False, error="time budget used up", output_tokens=0)
            else:
                try:
                    r = await asyncio.wait_for(stream_generate(host, port, payload), timeout)
                except asyncio.TimeoutError:
                    r = dict(ok=False, error="time budget used up", output_tokens=0)
            r["t_send_s"] = t_send  # from the start of the load: when its slot in the window opened
            if progress:
                progress.update()
            return r

    t0 = time.perf_counter()
    res = await asyncio.gather(*(one(p) for p in prompts))
    return list(res), time.perf_counter() - t0


def run_load(host: str, port: int, prompts: list[list[int]], output_len: int, concurrency: int,
             deadline: float | None = None, desc: str = "requests", quiet: bool = False) -> tuple[list[dict], float]:
    """Send ``prompts`` with at most ``concurrency`` in flight; (per-request records, wall seconds)."""
    prog = Progress(len(prompts), desc, disable=quiet)
    try:
        return asyncio.run(_run_load(host, port, prompts, output_len, concurrency, deadline, prog))
    finally:
        prog.close()


# ----------------------------------------------------------------------------------------------
# SGLang's own client (optional: --client sglang)
# ----------------------------------------------------------------------------------------------


def sglang_client_cmd(python: str, base_url: str, model_dir: str, input_len: int, output_len: int,
                      num_prompts: int, concurrency: int, seed: int, output_file: str) -> list[str]:
    """python -m sglang.benchmark.serving with its offline dataset ("random-ids": random token ids
    from the tokenizer; "random" would download ShareGPT) and token-id prompts."""
    return [python, "-m", "sglang.benchmark.serving", "--backend", "sglang", "--base-url", base_url,
            "--dataset-name", "random-ids", "--tokenize-prompt", "--random-input-len", str(input_len),
            "--random-output-len", str(output_len), "--random-range-ratio", "1.0", "--num-prompts", str(num_prompts),
            "--max-concurrency", str(concurrency), "--model", model_dir, "--tokenizer", model_dir,
            "--seed", str(seed), "--warmup-requests", "1", "--output-file", output_file, "--disable-tqdm"]


def parse_sglang_client_output(path: str, concurrency: int) -> dict:
    """The last JSONL record SGLang's client appended, mapped to our metric names."""
    lines = [ln for ln in Path(path).read_text().splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"{path}: no result line")
    r = json.loads(lines[-1])
    dur = r.get("duration")
    return dict(
        concurrency=concurrency, num_requests=r.get("completed"), completed=r.get("completed"), failed=None,
        errors=[], duration_s=dur, total_output_tokens=r.get("total_output_tokens"),
        output_throughput=r.get("output_throughput"), request_throughput=r.get("request_throughput"),
        mean_tpot_ms=r.get("mean_tpot_ms"), median_tpot_ms=r.get("median_tpot_ms"),
        p90_tpot_ms=r.get("p90_tpot_ms"), p99_tpot_ms=r.get("p99_tpot_ms"),
        mean_ttft_ms=r.get("mean_ttft_ms"), median_ttft_ms=r.get("median_ttft_ms"),
        p99_ttft_ms=r.get("p99_ttft_ms"), median_e2e_latency_ms=r.get("median_e2e_latency_ms"),
        accept_length=r.get("accept_length"), accept_length_requests=None,
    )


# ----------------------------------------------------------------------------------------------
# Case bookkeeping (resumable)
# ----------------------------------------------------------------------------------------------


def case_id(tag: str, study: str, side: str, concurrency: int, input_len: int, output_len: int) -> str:
    return f"{tag}__{study}__{side}__c{concurrency}__i{input_len}o{output_len}"


def case_path(out: Path, cid: str) -> Path:
    return out / "cases" / f"{cid}.json"


def case_done(out: Path, cid: str) -> bool:
    p = case_path(out, cid)
    if not p.exists():
        return False
    try:
        rec = json.loads(p.read_text())
    except ValueError:
        return False
    return bool(rec.get("ok")) or bool(rec.get("skipped"))


def pending_cases(out: Path, tag: str, study: str, side: str, concs: list[int], input_len: int, output_len: int,
                  redo: bool) -> list[int]:
    return [c for c in concs if redo or not case_done(out, case_id(tag, study, side, c, input_len, output_len))]


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, sort_keys=True))
    tmp.replace(path)


def load_cases(out: Path) -> list[dict]:
    recs = []
    for p in sorted((out / "cases").glob("*.json")):
        try:
            recs.append(json.loads(p.read_text()))
        except ValueError:
            continue
    return recs


def load_servers(out: Path) -> list[dict]:
    recs = []
    for p in sorted((out / "servers").glob("*.json")):
        try:
            recs.append(json.loads(p.read_text()))
        except ValueError:
            continue
    return recs


# ----------------------------------------------------------------------------------------------
# Report (pure, plus optional matplotlib)
# ----------------------------------------------------------------------------------------------


def _f(x, nd=1, suffix=""):
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}{suffix}"
    return f"{x}{suffix}"


def _ratio(a, b):
    return a / b if a and b else None


SPEEDUPS = {
    "decode": [("ours/stock", "ours", "stock"), ("ours/upstream", "ours", "upstream"),
               ("stockplug/stock", "stockplug", "stock")],
    "spec": [("ours/stock", "ours", "stock"), ("ours/upstream", "ours", "upstream"),
             ("ours/nospec", "ours", "nospec"), ("stock/nospec", "stock", "nospec"),
             ("stockplug/stock", "stockplug", "stock")],
}


def group_cases(cases: list[dict]) -> dict:
    """{(tag, study, input_len, output_len): {side: {concurrency: case}}} of the successful cases."""
    groups: dict = {}
    for c in cases:
        if not c.get("ok"):
            continue
        key = (c["tag"], c["study"], c["input_len"], c["output_len"])
        groups.setdefault(key, {}).setdefault(c["side"], {})[c["concurrency"]] = c
    return groups


def speedup_rows(group: dict, study: str) -> list[dict]:
    concs = sorted({c for side in group.values() for c in side})
    rows = []
    for c in concs:
        row = {"concurrency": c}
        for side in SIDE_ORDER:
            case = group.get(side, {}).get(c)
            m = case["metrics"] if case else {}
            row[f"{side}_tok_s"] = m.get("output_throughput")
            row[f"{side}_tpot_ms"] = m.get("median_tpot_ms")
            row[f"{side}_accept"] = m.get("accept_length")
        for name, a, b in SPEEDUPS[study]:
            row[name] = _ratio(row[f"{a}_tok_s"], row[f"{b}_tok_s"])
        rows.append(row)
    return rows


def provenance(group: dict) -> list[tuple[str, str, str]]:
    """Distinct (date, GPU, command) of the calls that measured a group's cases."""
    return sorted({(str(c.get("date")), str(c.get("gpu")), str(c.get("command")))
                   for side in group.values() for c in side.values()})


def server_commands(group: dict) -> list[tuple[str, str]]:
    """(side, exact server command) of a group, one per distinct command."""
    seen = []
    for side in SIDE_ORDER:
        for c in sorted(group.get(side, {}).values(), key=lambda x: x["concurrency"]):
            item = (side, shlex.join(c.get("server_cmd") or []))
            if item not in seen:
                seen.append(item)
    return seen


def markdown_report(cases: list[dict], servers: list[dict], runs: list[dict]) -> str:
    lines = ["# Serving benchmark (scripts/bench_serving.py)", ""]
    lines.append("Output throughput = completion tokens / wall time of the case; TPOT = median over requests of "
                 "(latency - TTFT) / (tokens - 1); accept = completion tokens / verify steps (token-weighted). "
                 "Speed-up = ratio of output throughputs. Numbers below are only what the listed runs measured.")
    lines.append("")
    lines.append("## Runs")
    lines.append("")
    if not runs:
        lines.append("(no run records)")
    for r in runs:
        lines.append(f"- {r.get('date')} on {r.get('gpu')} (SGLang {r.get('sglang_version')}, client "
                     f"{r.get('client')}): `{r.get('command')}`")
    lines.append("")
    groups = group_cases(cases)
    for (tag, study, il, ol), group in sorted(groups.items()):
        rows = speedup_rows(group, study)
        sides = [s for s in SIDE_ORDER if s in group]
        lines.append(f"## {tag}, {study} (input {il}, output {ol})")
        lines.append("")
        model_desc = next(iter(next(iter(group.values())).values())).get("model_desc", "")
        if model_desc:
            lines.append(model_desc)
            lines.append("")
        hdr = ["C"] + [f"{s} tok/s" for s in sides] + [f"{s} TPOT ms" for s in sides]
        if study == "spec":
            hdr += [f"{s} accept" for s in sides if s != "nospec"]
        sp = [name for name, a, b in SPEEDUPS[study] if a in group and b in group]
        hdr += sp
        lines.append("| " + " | ".join(hdr) + " |")
        lines.append("|" + "---|" * len(hdr))
        for row in rows:
            cells = [str(row["concurrency"])]
            cells += [_f(row[f"{s}_tok_s"]) for s in sides]
            cells += [_f(row[f"{s}_tpot_ms"], 2) for s in sides]
            if study == "spec":
                cells += [_f(row[f"{s}_accept"], 2) for s in sides if s != "nospec"]
            cells += [_f(row[n], 3, "x") for n in sp]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        warn = []
        for s in sides:
            for c, case in sorted(group[s].items()):
                srv = case.get("server_log", {})
                share = srv.get("cuda_graph_share")
                if share is not None and share < 1.0:
                    warn.append(f"{s} C={c}: CUDA graph on {share:.0%} of the decode-batch lines")
                spread = (case.get("metrics") or {}).get("wave2_send_spread_s")
                if spread is not None and spread > WAVE_SPREAD_NOTE_S:
                    m = case["metrics"]
                    warn.append(f"{s} C={c}: second wave sent over {spread:.2f} s (first wave ended over "
                                f"{m['wave1_end_spread_s']:.2f} s, client lag <= {m['client_lag_max_s']:.2f} s)")
                lag = (case.get("metrics") or {}).get("max_stream_lag_ms")
                if lag is not None and lag > STREAM_LAG_NOTE_MS:
                    m = case["metrics"]
                    warn.append(f"{s} C={c}: the client saw requests end up to {lag / 1e3:.2f} s after the server "
                                f"did (median {m['median_stream_lag_ms'] / 1e3:.2f} s; {_f(m.get('stream_mb'))} MB "
                                f"streamed): the host's streaming, not the GPU, set the end of this case")
                busy = main_busy(case.get("host"))
                if busy is not None and busy >= MAIN_BUSY_NOTE:
                    who = ("the server's busiest HTTP/tokenizer process" if case["host"].get("tokenizer_workers_cpu_s")
                           else "the server's main process (HTTP server and tokenizer manager)")
                    warn.append(f"{s} C={c}: {who} was "
                                f"busy {busy:.0%} of the case: SGLang's host output path may have capped this "
                                f"side's rate; the same `--stream-interval N` on every server (--server-args) "
                                f"lowers its work per token")
                fit = (case.get("fit") or {}).get("fit")
                if fit is not None and c > fit:
                    warn.append(f"{s} C={c}: above the server's admitted concurrency ({fit})")
        if warn:
            lines += ["Notes: " + "; ".join(warn), ""]
        agree = greedy_agreement(group)
        if agree:
            lines += ["Greedy tokens, request by request: " + "; ".join(agree) + ".", ""]
        # The servers' own rates (log lines of the case): decode steps at C and large prefill batches
        # separately, since a side can win one and lose the other.
        srv_hdr = (["C"] + [f"{s} decode gen tok/s (log)" for s in sides]
                   + [f"{s} decode-only windows tok/s (log, n)" for s in sides]
                   + [f"{s} prefill in tok/s (log)" for s in sides])
        srv_rows = []
        for c in sorted({c for s in sides for c in group[s]}):
            logs = [(group[s].get(c) or {}).get("server_log") or {} for s in sides]
            if not any(lg.get("server_gen_throughput") or lg.get("server_gen_throughput_clean")
                       or lg.get("prefill_input_tps_median") for lg in logs):
                continue
            srv_rows.append([str(c)] + [_f(lg.get("server_gen_throughput")) for lg in logs]
                            + [f"{_f(lg.get('server_gen_throughput_clean'))} ({lg.get('clean_lines_at_c', 0)})"
                               for lg in logs]
                            + [_f(lg.get("prefill_input_tps_median")) for lg in logs])
        if srv_rows:
            lines.append("| " + " | ".join(srv_hdr) + " |")
            lines.append("|" + "---|" * len(srv_hdr))
            lines += ["| " + " | ".join(r) + " |" for r in srv_rows]
            lines.append("")
        host_rows = []
        for s in sides:
            for c, case in sorted(group[s].items()):
                h = case.get("host")
                if not h:
                    continue
                srv = h["server_top"][0] if h.get("server_top") else None
                oth = h["other_top"][0] if h.get("other_top") else None
                order = case.get("side_order")
                busy = main_busy(h)
                host_rows.append([s, str(c), " > ".join(order) if order else "-", _f(h["wall_s"], 1),
                                  _f(h["server_cpu_s"], 2),
                                  (f"{h['main_cpu_s']:.2f}"
                                   + "".join(f" / {x:.2f}" for x in h.get("tokenizer_workers_cpu_s") or [])
                                   + f" ({busy:.0%})") if busy is not None else "-",
                                  f"{srv['comm']} {srv['cpu_s']:.2f}" if srv else "-",
                                  f"{oth['comm']} {oth['cpu_s']:.2f}" if oth else "-",
                                  " ".join(f"{x:.1f}" for x in h.get("loadavg_before") or []) or "-"])
        if host_rows:
            lines.append("Host CPU over each timed case (from /proc; the run order is the order the servers ran):")
            lines.append("")
            hdr = ["side", "C", "run order", "wall s", "server CPU s",
                   "main process (HTTP, tokenizer) [/ tokenizer workers] CPU s (busy)", "busiest server process, CPU s",
                   "busiest other process, CPU s", "load avg before"]
            lines.append("| " + " | ".join(hdr) + " |")
            lines.append("|" + "---|" * len(hdr))
            lines += ["| " + " | ".join(r) + " |" for r in host_rows]
            lines.append("")
        lines.append("Measured by:")
        lines += [f"- {d} on {g}: `{cmd}`" for d, g, cmd in provenance(group)]
        lines.append("")
        lines.append("Server commands:")
        lines += [f"- {side}: `{cmd}`" for side, cmd in server_commands(group)]
        lines.append("")
    mem_rows = [s for s in servers if s.get("facts")]
    if mem_rows:
        lines.append("## Server pools and memory (from the server logs)")
        lines.append("")
        hdr = ["model", "study", "side", "max running req", "KV tokens", "mamba slots", "fit C",
               "ssm state GiB", "intermediate_ssm GiB (MiB/req)", "ReplaySSM rings GiB (MiB/slot)",
               "upstream rings GiB (MiB/slot)", "startup s"]
        lines.append("| " + " | ".join(hdr) + " |")
        lines.append("|" + "---|" * len(hdr))
        for s in sorted(mem_rows, key=lambda r: (r["tag"], r["study"], SIDE_ORDER.index(r["side"]))):
            f, fit, mem = s["facts"], s.get("fit") or {}, s.get("memory") or {}
            kv = (f.get("kv_caches") or [{}])[0].get("tokens")
            cells = [s["tag"], s["study"], s["side"], _f(f.get("max_running_requests")), _f(kv),
                     _f(f.get("mamba_slots")), _f(fit.get("fit")), _f(mem.get("ssm_state_gib"), 2),
                     (f"{mem['intermediate_ssm_gib']:.2f} ({_f(mem.get('intermediate_ssm_mib_per_request'), 1)})"
                      if mem.get("intermediate_ssm_gib") is not None else "-"),
                     (f"{mem['replayssm_rings_gib']:.3f} ({_f(mem.get('replayssm_rings_mib_per_slot'), 2)})"
                      if mem.get("replayssm_rings_gib") is not None else "-"),
                     (f"{mem['upstream_rings_gib']:.3f} ({_f(mem.get('upstream_rings_mib_per_slot'), 2)})"
                      if mem.get("upstream_rings_gib") is not None else "-"),
                     _f(s.get("startup_s"), 0)]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        lines.append("fit C = min(max_running_requests reported by the scheduler, KV tokens // (input + output "
                     "[+ draft tokens])), for a server launched with a large --max-running-requests; derived from "
                     "the log, not probed.")
        lines.append("")
    skipped = sorted({(c["tag"], c["study"], c["side"], c.get("reason", "")) for c in cases if c.get("skipped")})
    failed = sorted({(c["tag"], c["study"], c["side"], c["concurrency"], str(c.get("error"))[:160])
                     for c in cases if not c.get("ok") and not c.get("skipped")})
    if skipped:
        lines.append("## Skipped")
        lines.append("")
        lines += [f"- {t} {st} {sd}: {r}" for t, st, sd, r in skipped]
        lines.append("")
    if failed:
        lines.append("## Failed or incomplete cases (rerun to retry)")
        lines.append("")
        lines += [f"- {t} {st} {sd} C={c}: {e}" for t, st, sd, c, e in failed]
        lines.append("")
    return "\n".join(lines)


def short_table(cases: list[dict]) -> str:
    out = []
    for (tag, study, il, ol), group in sorted(group_cases(cases).items()):
        sides = [s for s in SIDE_ORDER if s in group]
        sp = [name for name, a, b in SPEEDUPS[study] if a in group and b in group]
        out.append(f"{tag} {study} (in {il}, out {ol}): output tok/s" + (", accept len" if study == "spec" else ""))
        out.append(f"{'C':>5} " + " ".join(f"{s:>10}" for s in sides) + " " + " ".join(f"{n:>14}" for n in sp))
        for row in speedup_rows(group, study):
            cells = []
            for s in sides:
                v = _f(row[f"{s}_tok_s"], 0)
                if study == "spec" and row[f"{s}_accept"] is not None:
                    v += f"/{row[f'{s}_accept']:.2f}"
                cells.append(f"{v:>10}")
            out.append(f"{row['concurrency']:>5} " + " ".join(cells) + " "
                       + " ".join(f"{_f(row[n], 3, 'x'):>14}" for n in sp))
        # The servers' decode-only log windows (no prefill inside), where every side has one.
        for c in sorted({c for s in sides for c in group[s]}):
            rates = {s: ((group[s].get(c) or {}).get("server_log") or {}).get("server_gen_throughput_clean")
                     for s in sides}
            if not any(rates.values()):
                continue
            ratios = [f"{_f(_ratio(rates.get(a), rates.get(b)), 3, 'x'):>14}" for n, a, b in SPEEDUPS[study] if n in sp]
            out.append(f"{c:>5} " + " ".join(f"{_f(rates[s], 0):>10}" for s in sides) + " " + " ".join(ratios)
                       + "  (decode-only log windows, tok/s)")
    return "\n".join(out) if out else "(no successful cases yet)"


MATPLOTLIB_MISSING = ("plots not written: matplotlib is not importable by {python}; install it there "
                      "(pip install matplotlib) or copy OUT to a machine that has it and run "
                      "`python scripts/bench_serving.py --report-only --out OUT`")


def make_plots(cases: list[dict], plot_dir: Path) -> tuple[list[str], str | None]:
    """Throughput and speed-up vs concurrency per (model, study). Returns (files, error message)."""
    groups = group_cases(cases)
    if not groups:
        return [], None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return [], MATPLOTLIB_MISSING.format(python=sys.executable)
    plot_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for (tag, study, il, ol), group in sorted(groups.items()):
        prov = provenance(group)
        footer = "\n".join(f"{d} on {g}:\n" + textwrap_lines(cmd, 160) for d, g, cmd in prov[-3:])
        if len(prov) > 3:
            footer = f"(+{len(prov) - 3} earlier calls, see report.md)\n" + footer
        rows = speedup_rows(group, study)
        concs = [r["concurrency"] for r in rows]
        for kind in ("throughput", "speedup"):
            fig, ax = plt.subplots(figsize=(8, 5.5))
            if kind == "throughput":
                for side in SIDE_ORDER:
                    ys = [r[f"{side}_tok_s"] for r in rows]
                    pts = [(c, y) for c, y in zip(concs, ys) if y]
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=side)
                ax.set_ylabel("output tokens / s")
                ax.set_yscale("log")
            else:
                for name, a, b in SPEEDUPS[study]:
                    pts = [(r["concurrency"], r[name]) for r in rows if r[name]]
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
                ax.axhline(1.0, color="gray", lw=0.8, ls="--")
                ax.set_ylabel("speed-up (ratio of output throughputs)")
            ax.set_xscale("log", base=2)
            ax.set_xticks(concs)
            ax.set_xticklabels([str(c) for c in concs])
            ax.set_xlabel("concurrency (requests in flight)")
            ax.set_title(f"{tag} {study}: input {il}, output {ol}")
            ax.grid(True, which="both", alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend()
            fig.text(0.01, 0.01, footer, fontsize=5, va="bottom", family="monospace")
            fig.subplots_adjust(bottom=0.25)
            path = plot_dir / f"{tag}__{study}__i{il}o{ol}__{kind}.png"
            fig.savefig(path, dpi=130)
            plt.close(fig)
            files.append(str(path))
    return files, None


def textwrap_lines(s: str, width: int) -> str:
    return "\n".join(s[i:i + width] for i in range(0, len(s), width)) or ""


def pack_results(out: Path, tgz: str) -> Path:
    """OUT's files (models/ and temporary files left out) as a .tar.gz, plus report.md beside it."""
    import tarfile

    dst = Path(tgz).resolve()
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dst, "w:gz") as tar:
        for f in sorted(out.rglob("*")):
            rel = f.relative_to(out)
            if not f.is_file() or rel.parts[0] == "models" or f.suffix == ".tmp" or f == dst:
                continue
            tar.add(f, arcname=str(rel))
    if (out / "report.md").exists() and dst.parent != out:
        shutil.copyfile(out / "report.md", dst.parent / "report.md")
    return dst


def write_report(out: Path, plots: bool = True) -> str:
    cases, servers = load_cases(out), load_servers(out)
    runs = []
    rp = out / "runs.jsonl"
    if rp.exists():
        runs = [json.loads(ln) for ln in rp.read_text().splitlines() if ln.strip()]
    md = markdown_report(cases, servers, runs)
    if plots:
        files, err = make_plots(cases, out / "plots")
        if err:
            md += f"\n{err}\n"
            print(err, file=sys.stderr)
        elif files:
            md += "\n## Plots\n\n" + "\n".join(f"![{Path(f).name}](plots/{Path(f).name})" for f in files) + "\n"
    (out / "report.md").write_text(md)
    return md


# ----------------------------------------------------------------------------------------------
# Environment facts
# ----------------------------------------------------------------------------------------------


def gpu_name() -> str:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return "unknown (no nvidia-smi)"
    try:
        r = subprocess.run([exe, "--query-gpu=name,memory.total", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=20)
        names = [ln.strip() for ln in r.stdout.splitlines() if ln.strip()]
        return "; ".join(names) if names else "unknown (nvidia-smi printed nothing)"
    except (OSError, subprocess.SubprocessError):
        return "unknown (nvidia-smi failed)"


def package_version(python: str, name: str) -> str:
    try:
        r = subprocess.run([python, "-c", f"import importlib.metadata as m; print(m.version({name!r}))"],
                           capture_output=True, text=True, timeout=60)
        return r.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _flush_cache(host: str, port: int) -> None:
    try:
        req = urllib.request.Request(f"http://{host}:{port}/flush_cache", data=b"", method="POST")
        urllib.request.urlopen(req, timeout=30).read()
    except (urllib.error.URLError, OSError, ValueError):
        pass


def summarize_gpu_trace(path: Path, top: int = 25) -> dict:
    """Kernel time by name in a torch-profiler chrome trace (`.trace.json[.gz]`), in microseconds."""
    import gzip

    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as fh:
        events = json.load(fh).get("traceEvents", [])
    by_name: dict = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            t, n = by_name.get(e["name"], (0.0, 0))
            by_name[e["name"]] = (t + float(e.get("dur", 0.0)), n + 1)
    total = sum(t for t, _ in by_name.values())
    rows = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return dict(kernel_us=round(total, 1), kernels=sum(n for _, n in by_name.values()),
                top=[dict(name=k[:160], us=round(t, 1), count=n) for k, (t, n) in rows])


def gpu_profile_case(a, port: int, prompts: list, concurrency: int, dst: Path) -> dict:
    """After a measured case: profile `--gpu-profile-steps` forward steps of a short rerun of the same
    load (SGLang's /start_profile, GPU activity only) and summarise the kernel time by name."""
    dst.mkdir(parents=True, exist_ok=True)
    body = json.dumps(dict(output_dir=str(dst), num_steps=a.gpu_profile_steps, activities=["GPU"],
                           with_stack=False, record_shapes=False)).encode()
    # With num_steps SGLang answers /start_profile only once those steps ran: post it aside.
    answer: dict = {}

    def post():
        try:
            req = urllib.request.Request(f"http://{a.host}:{port}/start_profile", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
            urllib.request.urlopen(req, timeout=90).read()
        except (urllib.error.URLError, OSError, ValueError) as e:
            answer["error"] = f"start_profile: {e}"

    import threading

    load = (a.host, port, prompts[:max(2 * concurrency, 4)])
    if a.gpu_profile_delay > 0:
        # Profile the steady state: the rerun keeps the case's output length, and the profile starts
        # this many seconds into it (past the first wave's prefill at large C, where the first steps
        # of a rerun are prefill chunks and small decode batches).
        loader = threading.Thread(target=run_load, args=(*load, a.output_len, concurrency, time.time() + 120),
                                  kwargs=dict(desc="profile", quiet=True), daemon=True)
        loader.start()
        time.sleep(a.gpu_profile_delay)
        post()
        loader.join(timeout=120)
    else:
        poster = threading.Thread(target=post, daemon=True)
        poster.start()
        time.sleep(1.0)
        # Enough requests that the profiled steps are reached (4 x 64 tokens is >= 64 steps at C=1
        # even when every verify accepts 4 tokens).
        run_load(*load, min(a.output_len, 64), concurrency, time.time() + 60, desc="profile", quiet=True)
        poster.join(timeout=30)
    if "error" in answer:
        return answer
    deadline = time.time() + 60
    while time.time() < deadline:
        traces = sorted(dst.glob("*.trace.json*"))
        if traces and all(t.stat().st_size > 0 for t in traces):
            time.sleep(1.0)  # let the export finish writing
            try:
                out = summarize_gpu_trace(traces[0])
                out.update(steps=a.gpu_profile_steps, trace=traces[0].name, delay_s=a.gpu_profile_delay)
                return out
            except (OSError, ValueError, EOFError):
                pass
        time.sleep(1.0)
    return dict(error=f"no trace in {dst} within 60 s")


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help="results folder (cases/, servers/, logs/, models/, report.md, plots/); "
                   "required except with --log-windows")
    p.add_argument("--model", choices=sorted(MODELS), default="gdn")
    p.add_argument("--model-dir", default=None,
                   help="use this checkpoint instead of building one (give --tag; weights as --weights says)")
    p.add_argument("--tag", default=None, help="model tag in case names (default: from the recipe)")
    p.add_argument("--study", choices=sorted(STUDY_SIDES), default="decode")
    p.add_argument("--only", default=None, help="comma list of sides, run in this order (default: stock, "
                   "upstream, ours [, nospec]); also stockplug: stock's flags with the plugins loaded")
    p.add_argument("--concurrency", default=",".join(map(str, DEFAULT_CONCURRENCY)))
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--rounds", type=int, default=2, help="requests per case = max(C * rounds, --min-prompts)")
    p.add_argument("--min-prompts", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ssm-layers", type=int, default=None,
                   help="SSM layers of the built model (default: decode gdn/qwen35_4b/nano9b 24, super 20; spec "
                        "gdn/nano9b 12, qwen35_4b 24, super 8)")
    p.add_argument("--weights", choices=["auto", "dummy", "knob"], default="auto",
                   help="auto: dummy for decode, knob (real constructed weights) for spec")
    p.add_argument("--accept-rate-knob", type=float, default=0.0, help="make_tiny_model.py --accept-rate-knob")
    p.add_argument("--models-dir", default=None,
                   help="where built checkpoints go (default OUT/models; on the device use a folder outside OUT, "
                        "e.g. /tmp/bench_models, so that --pack and carries stay small)")
    p.add_argument("--build-flags", default="", help="extra make_tiny_model.py flags (one string)")
    p.add_argument("--ring-len", type=int, default=None,
                   help="ours: --replayssm-ring-len; upstream decode: --linear-replayssm-cache-len (default: theirs)")
    p.add_argument("--client", choices=["builtin", "sglang"], default="builtin",
                   help="builtin: stdlib streaming /generate client; sglang: python -m sglang.benchmark.serving "
                        "(needs aiohttp/requests and a tokenizer covering the vocabulary)")
    p.add_argument("--launch-max-running-requests", type=int, default=1024,
                   help="--max-running-requests of every server (large: the server's own limit is the fit; 0: "
                        "not passed, SGLang's default, which is 48 with speculative decoding. With "
                        "--disable-radix-cache SGLang sizes the mamba pool from this number instead of memory: "
                        "probe that fit with scripts/fit_probe.py)")
    p.add_argument("--cuda-graph-max-bs", type=int, default=None, help="default: the largest concurrency")
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--attention-backend", default=None, help="default: flashinfer for Nemotron-H, else triton")
    p.add_argument("--moe-runner-backend", default=None, help="default: triton for Nemotron-H")
    p.add_argument("--sampling-backend", default="pytorch")
    p.add_argument("--prefill-cuda-graph", action="store_true",
                   help="keep prefill CUDA graphs (default: --disable-prefill-cuda-graph; capture takes ~100 s)")
    p.add_argument("--server-args", default="", help="extra flags for every server (one string)")
    p.add_argument("--stock-args", default="")
    p.add_argument("--upstream-args", default="")
    p.add_argument("--ours-args", default="")
    p.add_argument("--no-warmup", action="store_true", help="skip the per-case warm-up (C requests, 2 tokens)")
    p.add_argument("--redo", action="store_true", help="rerun cases that are already done")
    p.add_argument("--report-only", action="store_true")
    p.add_argument("--log-windows", nargs="+", default=None, metavar="LOG",
                   help="print every decode-batch line of these server logs (running requests, gen tok/s, "
                        "whether its window held no prefill) and exit; nothing is launched")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--pack", default=None, metavar="TGZ",
                   help="at the end, write OUT (without models/) as this .tar.gz and report.md beside it "
                        "(e.g. $OUT/bench.tgz on the device)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--gpu-profile-steps", type=int, default=0, metavar="N",
                   help="after each measured case, profile N forward steps of a short rerun (C requests, <= 64 "
                        "tokens) with SGLang's /start_profile (GPU kernels only); kernel time by name goes into "
                        "the case file (gpu_profile)")
    p.add_argument("--gpu-profile-delay", type=float, default=0.0, metavar="S",
                   help="with --gpu-profile-steps: rerun at the case's output length and start the profile S "
                        "seconds into it, so that it holds steady decode steps rather than the rerun's first "
                        "prefill chunks (at C=256, input 512: ~16 chunks of 8192 tokens come first)")
    p.add_argument("--diag", default=None, metavar="DIR",
                   help="sample the servers' stacks (scripts/diag/sitecustomize.py, working folder DIR) over each "
                        "measured case; the samples land in OUT/diag/<case>/ "
                        "(python3 scripts/diag/summarize.py NAME=OUT/diag/<case> ...)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="first port to try (0: any free port)")
    p.add_argument("--startup-timeout", type=float, default=420.0)
    p.add_argument("--time-budget", type=float, default=None,
                   help="wall seconds for this call; cases left over are done by the next call")
    p.add_argument("--min-case-s", type=float, default=45.0,
                   help="do not start a case with less time left than this (or 2x the previous case on that server)")
    p.add_argument("--min-server-s", type=float, default=180.0,
                   help="do not launch a server with less time left than this (startup + a first case)")
    p.add_argument("--python", default=sys.executable, help="interpreter for sglang.launch_server and the builder")
    a = p.parse_args(argv)
    if a.out is None and a.log_windows is None:
        p.error("the following arguments are required: --out")
    try:
        a.concurrency_list = sorted({int(x) for x in a.concurrency.split(",") if x.strip()})
    except ValueError:
        p.error("--concurrency: comma-separated integers")
    if not a.concurrency_list or min(a.concurrency_list) < 1:
        p.error("--concurrency: positive integers")
    return a


def _resolve_model(a, out: Path, end_time: float | None) -> tuple[dict | None, str | None]:
    """(model info, error). Builds the checkpoint unless --model-dir is given or it exists."""
    weights = a.weights if a.weights != "auto" else ("dummy" if a.study == "decode" else "knob")
    if a.model_dir:
        mdir = Path(a.model_dir).resolve()
        if not (mdir / "config.json").exists():
            return None, f"{mdir}/config.json not found"
        cfg = json.loads((mdir / "config.json").read_text())
        kind = e2e.model_kind(cfg)
        family = "mamba2" if kind.startswith("nemotron") else "gdn"
        tag = a.tag or f"{mdir.name}-{weights}"
        return dict(dir=str(mdir), tag=tag, kind=kind, family=family, weights=weights, build_cmd=None,
                    desc=f"checkpoint {mdir}", config=cfg), None
    rec = MODELS[a.model]
    if a.study == "spec" and not rec["mtp"]:
        return None, f"{a.model} has no MTP head: the spec study needs --model one of: {SPEC_MODELS}"
    ssm = a.ssm_layers or (rec["default_ssm_layers"] if a.study == "decode" else DEFAULT_SPEC_SSM_LAYERS[a.model])
    knob = a.accept_rate_knob if weights == "knob" else None
    tag = a.tag or model_tag(a.model, ssm, weights, knob, a.build_flags)
    mdir = (Path(a.models_dir).resolve() if a.models_dir else out / "models") / tag
    try:
        cmd = build_model_cmd(a.python, a.model, ssm, weights, knob, str(mdir), a.build_flags)
    except ValueError as e:
        return None, str(e)
    stamp = mdir / "bench_build.json"
    if not (stamp.exists() and json.loads(stamp.read_text()).get("cmd") == cmd[1:]):
        print(f"[build] {shlex.join(cmd)}", flush=True)
        t0 = time.time()
        timeout = None if end_time is None else max(10.0, end_time - time.time() - 60)
        log = out / "logs" / f"build_{tag}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(log, "w") as fh:
                r = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, f"model build did not finish within the time budget (log {log})"
        if r.returncode != 0 or not (mdir / "config.json").exists():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            return None, f"model build failed (exit {r.returncode}); {log}:\n{tail}"
        write_json(stamp, dict(cmd=cmd[1:], seconds=time.time() - t0))
        print(f"[build] done in {time.time() - t0:.0f} s: {mdir}", flush=True)
    cfg = json.loads((mdir / "config.json").read_text())
    return dict(dir=str(mdir), tag=tag, kind=e2e.model_kind(cfg), family=rec["family"], weights=weights,
                build_cmd=cmd, desc=f"{rec['desc']}; {ssm} SSM layers; weights: {weights}"
                + (f" (accept-rate-knob {knob:g})" if knob is not None else ""), config=cfg), None


def _server_cmd(a, model: dict, side: str, port: int) -> list[str]:
    backend, spec, extra = side_server_args(side, a.study, a.ring_len)
    kind = model["kind"]
    attention = a.attention_backend or e2e.DEFAULT_ATTENTION.get(kind, e2e.FALLBACK_ATTENTION)
    moe = a.moe_runner_backend or e2e.DEFAULT_MOE_RUNNER.get(kind)
    side_extra = {"stock": a.stock_args, "stockplug": a.stock_args, "nospec": a.stock_args, "upstream": a.upstream_args,
                  "ours": a.ours_args}[side]
    load = []
    if model["weights"] == "dummy":
        load = ["--load-format", "dummy"] + (["--speculative-draft-load-format", "dummy"] if spec else [])
    args = extra + shlex.split(a.server_args) + shlex.split(side_extra)
    # Text-only Qwen3.5: SGLang 0.5.17 leaves the radix strategy unresolved, which our plugin
    # refuses with the overlap scheduler on; every side then gets extra_buffer, what SGLang resolves
    # for Qwen3-Next (the gdn model), unless the arguments already choose.
    args += e2e.radix_cache_args(kind, args, radix_waves=True)
    return e2e.build_server_cmd(
        python=a.python, model=model["dir"], port=port, host=a.host, mamba_backend=backend,
        attention_backend=attention, sampling_backend=a.sampling_backend, moe_runner_backend=moe, spec=spec,
        disable_prefill_cuda_graph=not a.prefill_cuda_graph,
        cuda_graph_max_bs=a.cuda_graph_max_bs or max(a.concurrency_list),
        mem_fraction_static=a.mem_fraction_static, max_running_requests=a.launch_max_running_requests or None,
        extra_args=load + args,
    )


def command_line(argv=None) -> str:
    """The exact command of this call (the script path relative to the working directory when inside it)."""
    script = os.path.abspath(__file__)
    try:
        rel = os.path.relpath(script)
        script = rel if not rel.startswith("..") else script
    except ValueError:
        pass
    args = list(argv) if argv is not None else sys.argv[1:]
    return shlex.join([os.path.basename(sys.executable) if sys.executable else "python3", script] + args)


def _time_left(end_time: float | None) -> float:
    return float("inf") if end_time is None else end_time - time.time()


def run_side(a, out: Path, model: dict, side: str, concs: list[int], end_time: float | None, meta: dict,
             prompt_range: tuple[int, int]) -> dict:
    """Launch one server, run its pending cases, stop it. Returns counters."""
    stats = dict(ok=0, failed=0, left=0, server_failed=False)
    port = e2e.pick_port(a.port, a.host)
    cmd = _server_cmd(a, model, side, port)
    spec = side_server_args(side, a.study, a.ring_len)[1]
    sname = f"{model['tag']}__{a.study}__{side}"
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log_path = out / "logs" / f"{sname}__{stamp}.log"
    run = e2e.ServerRun(name=side, cmd=cmd, log_path=str(log_path), port=port)
    env = side_plugin_env(dict(os.environ), side)
    if a.diag:  # every process of this server samples its stacks (scripts/diag/sitecustomize.py)
        env["REPLAYSSM_DIAG_SAMPLE"] = str(Path(a.diag).resolve())
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent / "diag"),
                                                          env.get("PYTHONPATH")]))
    server_rec = dict(tag=model["tag"], study=a.study, side=side, cmd=cmd, log=str(log_path.relative_to(out)),
                      sglang_plugins=env.get("SGLANG_PLUGINS"), gpu=meta["gpu"], date=meta["date"])
    with e2e.launched_server(run, a.host, a.startup_timeout, env, end_time) as _proc:
        log_text = e2e._read(str(log_path))
        facts = parse_server_facts(log_text)
        fit = fit_concurrency(facts, a.input_len, a.output_len, spec)
        server_rec.update(startup_s=run.startup_s, error=run.error, facts=facts, fit=fit,
                          memory=memory_summary(facts, fit), problems=e2e.problem_lines(log_text))
        write_json(out / "servers" / f"{sname}.json", server_rec)
        if run.error:
            stats["server_failed"] = True
            hint = upstream_oom_hint(log_text) if side == "upstream" else None
            if hint:
                run.error = f"{run.error}; {hint}"
                server_rec["error"] = run.error
                write_json(out / "servers" / f"{sname}.json", server_rec)
            print(f"[{side}] server failed: {run.error}\n" + "\n".join(log_text.splitlines()[-20:]), flush=True)
            for c in concs:
                cid = case_id(model["tag"], a.study, side, c, a.input_len, a.output_len)
                write_json(case_path(out, cid), dict(
                    id=cid, ok=False, tag=model["tag"], study=a.study, side=side, concurrency=c,
                    input_len=a.input_len, output_len=a.output_len, error=f"server: {run.error}",
                    server_cmd=cmd, log=server_rec["log"], gpu=meta["gpu"], date=meta["date"],
                    command=meta["command"]))
                stats["failed"] += 1
            return stats
        lo, hi = prompt_range
        last_case_s = 0.0
        for i, c in enumerate(concs):
            need = max(a.min_case_s, 2.0 * last_case_s) + 25.0
            if _time_left(end_time) < need:
                stats["left"] += len(concs) - i
                print(f"[{side}] time budget: {len(concs) - i} case(s) left for the next call", flush=True)
                break
            cid = case_id(model["tag"], a.study, side, c, a.input_len, a.output_len)
            n = num_prompts_for(c, a.rounds, a.min_prompts)
            seed = case_seed(a.seed, c)
            prompts = e2e.make_prompts(seed, n, lo, hi, a.input_len, a.input_len)
            _flush_cache(a.host, port)
            t_case = time.time()
            deadline = None if end_time is None else end_time - 25.0
            if not a.no_warmup:
                # Prefill and decode at batch C once (first-use JIT builds, autotuning) before timing.
                warm = e2e.make_prompts(seed + 7, c, lo, hi, a.input_len, a.input_len)
                run_load(a.host, port, warm, 2, c, deadline, desc=f"{side} C={c} warm-up", quiet=True)
                _flush_cache(a.host, port)
                if _time_left(end_time) < need:
                    stats["left"] += len(concs) - i
                    print(f"[{side}] time budget (after the warm-up): {len(concs) - i} case(s) left for the next "
                          f"call", flush=True)
                    break
            if a.diag:
                _diag_touch(a.diag, "reset")  # the samplers start this case's window
            probe = host_probe_start()
            off = len(e2e._read(str(log_path)))
            timeline = digests = None
            if a.client == "sglang":
                outfile = out / "logs" / f"{cid}__sglang_client.jsonl"
                ccmd = sglang_client_cmd(a.python, f"http://{a.host}:{port}", model["dir"], a.input_len,
                                         a.output_len, n, c, seed, str(outfile))
                clog = out / "logs" / f"{cid}__sglang_client.log"
                try:
                    with open(clog, "w") as fh:
                        subprocess.run(ccmd, stdout=fh, stderr=subprocess.STDOUT, check=True,
                                       timeout=None if deadline is None else max(5.0, deadline - time.time()))
                    metrics = parse_sglang_client_output(str(outfile), c)
                    reqs_failed, err = 0, None
                except (subprocess.SubprocessError, OSError, ValueError) as e:
                    metrics, reqs_failed, err = None, n, f"sglang client: {e} (log {clog})"
            else:
                reqs, dur = run_load(a.host, port, prompts, a.output_len, c, deadline, desc=f"{side} C={c}",
                                     quiet=a.quiet)
                metrics = {**summarize_requests(reqs, dur, c), **wave_timing(reqs, c)}
                timeline = request_timeline(reqs)
                digests = [r.get("output_digest") for r in reqs]  # prompt order (asyncio.gather keeps it)
                reqs_failed = metrics["failed"]
                err = None if reqs_failed == 0 else f"{reqs_failed}/{n} requests failed: {metrics['errors']}"
            if err and side == "upstream":
                hint = upstream_oom_hint(e2e._read(str(log_path)))
                err = f"{err}; {hint}" if hint else err
            host = host_probe_end(probe, _proc.pid)
            diag_dir = _diag_collect(a.diag, out / "diag" / cid) if a.diag else None
            log_slice = e2e._read(str(log_path))[off:]
            gpu_prof = None
            if a.gpu_profile_steps > 0 and _time_left(end_time) > 90:
                gpu_prof = gpu_profile_case(a, port, prompts, c, out / "gpuprof" / cid)
            ok = metrics is not None and reqs_failed == 0
            rec = dict(
                id=cid, ok=ok, error=err, tag=model["tag"], model_desc=model["desc"], study=a.study, side=side,
                concurrency=c, input_len=a.input_len, output_len=a.output_len, num_prompts=n, seed=seed,
                client=a.client, metrics=metrics, server_log={**decode_line_summary(parse_decode_lines(log_slice), c), **prefill_line_summary(log_slice)},
                fit=fit, server_cmd=cmd, log=server_rec["log"], gpu=meta["gpu"], date=meta["date"],
                command=meta["command"], sglang_version=meta["sglang_version"], case_wall_s=time.time() - t_case,
                diag=diag_dir, gpu_profile=gpu_prof, host=host, side_order=meta.get("side_order"),
                # The case's part of the server log (character offsets), and the requests' timeline.
                log_span=[off, off + len(log_slice)], timeline=timeline, output_digests=digests,
            )
            write_json(case_path(out, cid), rec)
            last_case_s = time.time() - t_case
            if ok:
                stats["ok"] += 1
                m = metrics
                print(f"[{side}] C={c}: {_f(m['output_throughput'])} tok/s, TPOT {_f(m['median_tpot_ms'], 2)} ms"
                      + (f", accept {m['accept_length']:.2f}" if m.get("accept_length") else "")
                      + f" ({n} requests, {last_case_s:.0f} s)", flush=True)
                print(f"[{side}] C={c}: {host_line(host)}", flush=True)
                if m.get("wave2_send_spread_s") is not None:
                    print(f"[{side}] C={c}: first wave ended over {m['wave1_end_spread_s']:.3f} s, second wave sent "
                          f"over {m['wave2_send_spread_s']:.3f} s (client lag <= {m['client_lag_max_s']:.3f} s)",
                          flush=True)
            else:
                stats["failed"] += 1
                print(f"[{side}] C={c}: FAILED {err}", flush=True)
        run.served = True
        server_rec["problems"] = e2e.problem_lines(e2e._read(str(log_path)))
        write_json(out / "servers" / f"{sname}.json", server_rec)
    return stats


# ----------------------------------------------------------------------------------------------
# Host probe: CPU seconds per process over a case (is a side slower because its server burns more
# CPU per step, or because something else competes for the CPUs?)
# ----------------------------------------------------------------------------------------------


def parse_proc_stat(text: str) -> dict | None:
    """`/proc/<pid>/stat` -> {comm, state, ppid, pgid, ticks (utime + stime)}; None if malformed."""
    try:
        head, rest = text[: text.rindex(")")], text[text.rindex(")") + 2:].split()
        return dict(comm=head[head.index("(") + 1:], state=rest[0], ppid=int(rest[1]), pgid=int(rest[2]),
                    ticks=int(rest[11]) + int(rest[12]))
    except (ValueError, IndexError):
        return None


def proc_snapshot(root: str = "/proc") -> dict[int, dict]:
    snap = {}
    for d in Path(root).glob("[0-9]*"):
        try:
            st = parse_proc_stat((d / "stat").read_text())
        except OSError:
            continue
        if st is not None:
            snap[int(d.name)] = st
    return snap


def cpu_report(before: dict[int, dict], after: dict[int, dict], wall_s: float, server_pgid: int | None,
               ticks_per_s: float, top: int = 5, client_pid: int | None = None) -> dict:
    """CPU seconds each process spent between two snapshots, split into the server's process group,
    this benchmark's own process (the load generator, `client_cpu_s`) and everything else (the
    busiest `top` of the server's and of the others). `main_cpu_s`: the server group's leader (the
    launched process), None without a server group. `tokenizer_workers_cpu_s`: with SGLang's
    `--tokenizer-worker-num N > 1` the HTTP server and tokenizer manager run in N worker processes
    of the group (process title `sglang::tokenizer_worker:<pid>`), busiest first."""
    rows = []
    for pid, st in after.items():
        prev = before.get(pid)
        spent = (st["ticks"] - (prev["ticks"] if prev and prev["comm"] == st["comm"] else 0)) / ticks_per_s
        if spent > 0:
            rows.append(dict(pid=pid, comm=st["comm"], cpu_s=round(spent, 3), server=st["pgid"] == server_pgid))
    rows.sort(key=lambda r: -r["cpu_s"])
    server = [r for r in rows if r["server"]]
    client = [r for r in rows if not r["server"] and r["pid"] == client_pid]
    other = [r for r in rows if not r["server"] and r["pid"] != client_pid]
    main = [r["cpu_s"] for r in server if r["pid"] == server_pgid]
    workers = [r["cpu_s"] for r in server if r["comm"].startswith(TOKENIZER_WORKER_COMM)]
    return dict(wall_s=round(wall_s, 3), server_cpu_s=round(sum(r["cpu_s"] for r in server), 3),
                main_cpu_s=(main[0] if main else 0.0) if server_pgid is not None else None,
                tokenizer_workers_cpu_s=workers,
                client_cpu_s=round(sum(r["cpu_s"] for r in client), 3),
                other_cpu_s=round(sum(r["cpu_s"] for r in other), 3),
                server_top=server[:top], other_top=other[:top])


def main_busy(host: dict | None) -> float | None:
    """Share of a case's wall time the server's main process (the launched one, which leads its process
    group: SGLang's HTTP server and tokenizer manager) spent on a CPU, or its busiest tokenizer worker
    where those serve HTTP instead (each is one Python event loop); None when not recorded."""
    if not host or host.get("main_cpu_s") is None or not host.get("wall_s"):
        return None
    return max([host["main_cpu_s"], *(host.get("tokenizer_workers_cpu_s") or [])]) / host["wall_s"]


def host_probe_start() -> dict:
    return dict(t=time.time(), snap=proc_snapshot(), load=_loadavg())


def host_probe_end(start: dict, server_pgid: int | None) -> dict:
    after = proc_snapshot()
    rep = cpu_report(start["snap"], after, time.time() - start["t"], server_pgid,
                     float(os.sysconf("SC_CLK_TCK")), client_pid=os.getpid())
    rep["loadavg_before"] = start["load"]
    rep["cpus"] = os.cpu_count()
    top = rep["server_top"][0]["pid"] if rep["server_top"] else None
    try:
        rep["busiest_server_affinity"] = sorted(os.sched_getaffinity(top)) if top else None
    except OSError:
        rep["busiest_server_affinity"] = None
    return rep


def _loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def host_line(rep: dict | None) -> str:
    if not rep:
        return ""
    srv = rep["server_top"][0] if rep["server_top"] else None
    oth = rep["other_top"][0] if rep["other_top"] else None
    return (f"host: server CPU {rep['server_cpu_s']:.1f} s in {rep['wall_s']:.1f} s"
            + (f" (busiest {srv['comm']} {srv['cpu_s']:.1f} s)" if srv else "")
            + (f"; main process {rep['main_cpu_s']:.1f} s" if rep.get("main_cpu_s") is not None else "")
            + (f"; tokenizer workers {' / '.join(f'{x:.1f}' for x in rep['tokenizer_workers_cpu_s'])} s"
               if rep.get("tokenizer_workers_cpu_s") else "")
            + (f"; busiest other process {oth['comm']} (pid {oth['pid']}) {oth['cpu_s']:.1f} s" if oth else ""))


def _diag_touch(folder: str, name: str) -> None:
    """Signal the stack samplers of scripts/diag/sitecustomize.py (REPLAYSSM_DIAG_SAMPLE=folder)."""
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    if name == "reset":  # drop the dumps of servers that are gone (an earlier side)
        for f in path.glob("*.json"):
            f.unlink(missing_ok=True)
    (path / name).write_text(str(time.time()))
    time.sleep(0.3)  # the samplers look every 0.1 s


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:  # a process exited and its dump went with it
        return float("inf")


def _diag_collect(folder: str, dst: Path) -> str:
    """Have every sampled process write its window now and copy the files next to the case.

    Waits (up to 5 s) until every dump is newer than the request: a sampler that is late on a busy
    machine would otherwise leave its last periodic dump, a window cut short."""
    _diag_touch(folder, "dump")
    asked = (Path(folder) / "dump").stat().st_mtime
    deadline = time.time() + 5.0
    while time.time() < deadline:
        stamps = [_mtime(f) for f in Path(folder).glob("*.json")]
        if stamps and all(m >= asked for m in stamps):
            break
        time.sleep(0.1)
    dst.mkdir(parents=True, exist_ok=True)
    for f in Path(folder).glob("*.json"):
        shutil.copy(f, dst / f.name)
    return str(dst)


_DIAG_FLUSH_RE = re.compile(r"ReplaySSM diag decode batch (\d+): rows=(\d+) flush=(\d+) pending-count histogram "
                            r"\[([0-9, ]*)\]")


def parse_diag_flush(text: str) -> list[dict]:
    """The `REPLAYSSM_DIAG_FLUSH` lines of ours' server log (sglang_replayssm/backends/common.py):
    per logged ring decode batch, its rows, flush rows and the histogram of pending counts."""
    return [dict(batch=int(m.group(1)), rows=int(m.group(2)), flush=int(m.group(3)),
                 hist=[int(x) for x in m.group(4).split(",") if x.strip()])
            for m in _DIAG_FLUSH_RE.finditer(text)]


def diag_flush_summary(recs: list[dict]) -> str | None:
    """One line: how the logged decode batches' rows flush (spread over steps or all at once)."""
    if not recs:
        return None
    shares = [r["flush"] / r["rows"] for r in recs if r["rows"]]
    full = sum(1 for r in recs if r["rows"] and r["flush"] == r["rows"])
    none = sum(1 for r in recs if r["flush"] == 0)
    mean = sum(shares) / len(shares) if shares else 0.0
    return (f"diag flush: {len(recs)} logged decode batches, mean flush share {mean:.3f}, "
            f"{full} with every row flushing, {none} with none")


def print_log_windows(paths: list[str]) -> int:
    """The decode-batch windows of server logs, one line each, then the median of the decode-only
    ones per running count (how serving.md session 25 read its logs), and with REPLAYSSM_DIAG_FLUSH
    lines in the log how its ring decode batches flushed."""
    for path in paths:
        lines = parse_decode_lines(e2e._read(path))
        print(f"== {path}: {len(lines)} decode-batch lines")
        for ln in lines:
            print(f"  running {ln['running']:>5}  gen {ln['gen_throughput']:>10.1f} tok/s  "
                  + ("decode-only" if ln["clean"] else "prefill or start inside"))
        for r in sorted({ln["running"] for ln in lines}):
            sm = decode_line_summary(lines, r)
            if sm["server_gen_throughput_clean"] is not None:
                print(f"  running {r}: decode-only median {sm['server_gen_throughput_clean']:.1f} tok/s over "
                      f"{sm['clean_lines_at_c']}")
        diag = diag_flush_summary(parse_diag_flush(e2e._read(path)))
        if diag:
            print(f"  {diag}")
    return 0


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.log_windows:
        return print_log_windows(a.log_windows)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if a.report_only:
        write_report(out, plots=not a.no_plots)
        if a.pack:
            pack_results(out, a.pack)
        print(short_table(load_cases(out)))
        return 0
    t_start = time.time()
    end_time = None if a.time_budget is None else t_start + a.time_budget
    signal.signal(signal.SIGTERM, lambda *x: (e2e._cleanup(), sys.exit(143)))
    meta = dict(
        command=command_line(argv),
        gpu=gpu_name(),
        date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        sglang_version=package_version(a.python, "sglang"),
        client=a.client,
    )
    with open(out / "runs.jsonl", "a") as fh:
        fh.write(json.dumps(meta) + "\n")

    sides = DEFAULT_SIDES[a.study] if not a.only else tuple(s.strip() for s in a.only.split(",") if s.strip())
    bad = [s for s in sides if s not in STUDY_SIDES[a.study]]
    if bad:
        print(f"error: --only {bad}: the {a.study} study has sides {list(STUDY_SIDES[a.study])}", file=sys.stderr)
        return 2
    if len(set(sides)) != len(sides):
        print(f"error: --only {a.only}: a side is listed twice (one results folder holds one run of a side; "
              f"use another --out for a repeat)", file=sys.stderr)
        return 2
    for side in sides:  # a side whose server runs our backend needs the plugin's entry point
        backend = side_server_args(side, a.study, a.ring_len)[0]
        if backend == "replayssm":
            err = e2e.plugin_preflight(a.python, side_plugin_env(os.environ, side), backend)
            if err:
                print(f"error: {side} side: {err}", file=sys.stderr)
                return 2
    model, err = _resolve_model(a, out, end_time)
    if err:
        print(f"error: {err}", file=sys.stderr)
        write_report(out, plots=not a.no_plots)
        if a.pack:
            pack_results(out, a.pack)
        return 1 if "build" in err else 2
    if a.client == "sglang":
        tok = e2e._tokenizer_size(Path(model["dir"]))
        if tok is not None and tok < model["config"].get("vocab_size", 0):
            print(f"error: --client sglang counts tokens from streamed text, but the tokenizer ({tok} tokens) "
                  f"is smaller than vocab_size ({model['config']['vocab_size']}): most generated ids decode to "
                  f"empty text and its TTFT/TPOT/token counts would be wrong. Use --client builtin or build with "
                  f"--build-flags '--vocab-size {tok}'.", file=sys.stderr)
            return 2
    lo, hi = e2e.prompt_id_range(model["config"], e2e._tokenizer_size(Path(model["dir"])))

    meta["side_order"] = list(sides)
    total = dict(ok=0, failed=0, left=0)
    # The servers start in the --only order (one after the other on the same GPU and CPUs), so a
    # second call with the order reversed shows whether running second changes a side's numbers.
    for side in sides:
        okay, reason = side_applicable(side, a.study, model["family"])
        if not okay:
            print(f"[{side}] skipped: {reason}", flush=True)
            cid = case_id(model["tag"], a.study, side, 0, a.input_len, a.output_len)
            write_json(case_path(out, cid), dict(id=cid, ok=False, skipped=True, reason=reason, tag=model["tag"],
                                                 study=a.study, side=side, concurrency=0, input_len=a.input_len,
                                                 output_len=a.output_len, date=meta["date"]))
            continue
        concs = pending_cases(out, model["tag"], a.study, side, a.concurrency_list, a.input_len, a.output_len, a.redo)
        if not concs:
            print(f"[{side}] all {len(a.concurrency_list)} case(s) done already (--redo to repeat)", flush=True)
            continue
        # A server needs a few minutes (imports, weights, CUDA graphs) before its first case.
        if _time_left(end_time) < a.min_server_s:
            total["left"] += len(concs)
            print(f"[{side}] time budget: not starting a server ({_time_left(end_time):.0f} s left); "
                  f"{len(concs)} case(s) left", flush=True)
            continue
        st = run_side(a, out, model, side, concs, end_time, meta, (lo, hi))
        for k in ("ok", "failed", "left"):
            total[k] += st[k]
    e2e._cleanup()
    write_report(out, plots=not a.no_plots)
    if a.pack:
        print(f"packed {pack_results(out, a.pack)}")
    print(f"\nthis call: {total['ok']} case(s) ok, {total['failed']} failed, {total['left']} left "
          f"({time.time() - t_start:.0f} s); report: {out / 'report.md'}")
    print(short_table(load_cases(out)))
    if total["failed"]:
        return 1
    return 3 if total["left"] else 0


if __name__ == "__main__":
    sys.exit(main())
