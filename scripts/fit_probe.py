"""Largest concurrency that fits with speculative decoding on and the radix cache off: stock vs
ours, probed on real servers (issue 5's ">= 3x" target).

With `--disable-radix-cache` SGLang 0.5.17 gives every running request one mamba slot and sizes
the mamba pool from `--max-running-requests` N (it does not fit N to memory; with NEXTN and no N
it uses 48). The stock server also reserves `intermediate_ssm` for N + 1 requests; both give the
KV cache what is left. So the KV tokens shrink as N grows, and the fit of a launch is

    fit(N) = min(N, KV tokens(N) // (input + output + draft tokens))

Per side this script

1. **calibrates**: launches at a small N0 and reads from the log what one slot costs (state,
   conv, `intermediate_ssm` or our rings and conv windows) and what one KV token costs (target and
   draft caches), i.e. the budget they share;
2. **predicts** N* with (N* + 1) * slot + N* * tokens_per_request * kv = budget;
3. **verifies**: launches at N* (0.9 N* if that fails to start), reads fit(N*) from the scheduler
   line, sends fit(N*) requests at once (non-streaming `/generate` batches, so the client needs
   few sockets), and takes the largest `#running-req` of the decode-log lines as the concurrency
   actually reached (and of the prefill lines as the requests admitted). A server that admits the
   requests and then runs out of memory under them (activations: the pools take
   --mem-fraction-static of the GPU, and the decode logits grow with the running batch) is
   relaunched with --mem-fraction-static lowered by --oom-mem-step and N lowered by the requests
   that memory held (`n_after_mem_step`); a side whose load crashed enters no ratio.

Sides: stock, ours, and upstream (SGLang's own `--enable-linear-replayssm-spec`, GDN only).

Bounds. "Reached" (the largest #running-req while fit(N*) requests were in flight) is a lower
bound on the fit. Upper bound: the budget does not depend on N, so the KV tokens fall linearly in
N; through the calibration and verify launches' KV tokens, the largest N whose requests all fit
is "max fit" (each launch also checks that the KV tokens shrank). Without a calibration
(--start-n) only fit(N) <= N for N <= N* and KV tokens(N) <= KV tokens(N*) for N >= N* are used:
the upper bound is max(N*, KV tokens(N*) // tokens per request), much looser. The conservative
ratio is ours' reached over stock's upper bound, next to the plain fit ratio.

Example (on the device; builds bench_serving's GDN spec checkpoint into --models-dir if missing):
  python3 scripts/fit_probe.py --model gdn --models-dir /tmp/bench_models --out /tmp/fit --time-budget 500
Output: OUT/fit.json, OUT/report.md, OUT/logs/*.log; a short table printed last.
Resumable: a side verified by an earlier call into the same OUT is kept (--redo repeats it), so
the sides can be probed in separate device calls; a side is not started with less than
--min-side-s left.
Exit status: 0 every side verified, 1 a side failed, 3 the time budget left a side for the next
call, 2 usage error.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as _dt
import json
import math
import os
import re
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_serving as bs  # noqa: E402
import e2e_parity as e2e  # noqa: E402

SIDES = ("stock", "upstream", "ours")


# ----------------------------------------------------------------------------------------------
# Pure: memory from a server log, prediction, bounds
# ----------------------------------------------------------------------------------------------


def memory_split(facts: dict) -> dict:
    """GiB the mamba pool takes (every per-slot allocation) and GiB per KV token (all KV caches:
    the target's and a NEXTN draft's), from `bench_serving.parse_server_facts` output."""
    kvs = facts.get("kv_caches") or []
    if facts.get("mamba_slots") is None or facts.get("ssm_state_gb") is None or not kvs:
        raise ValueError("the log has no mamba-pool or KV-cache allocation line")
    parts = {"ssm_state": facts["ssm_state_gb"], "conv_state": facts.get("conv_state_gb") or 0.0,
             "intermediate_ssm": facts.get("intermediate_ssm_gb") or 0.0,
             "intermediate_conv": facts.get("intermediate_conv_gb") or 0.0}
    up = facts.get("upstream_rings")
    if up:
        parts["upstream_rings"] = up["total_gb"]
    rs = facts.get("replayssm")
    if rs:
        parts["replayssm_rings"] = rs["rings_gib"]
        parts["replayssm_conv_windows"] = rs.get("conv_windows_gib") or 0.0
    tokens = kvs[0]["tokens"]
    kv_gb = sum(k["gb"] for k in kvs)
    return dict(slots=facts["mamba_slots"], mamba_gb=sum(parts.values()), parts_gb=parts, kv_tokens=tokens,
                kv_gb=kv_gb, kv_gb_per_token=kv_gb / tokens if tokens else None)


def predict_fit(split: dict, tokens_per_request: int) -> dict:
    """N* with (N* + 1) * slot + N* * tokens_per_request * kv = budget (the pool has one padding
    slot), from one launch's split."""
    slot = split["mamba_gb"] / (split["slots"] + 1)
    kv = split["kv_gb_per_token"]
    budget = split["mamba_gb"] + split["kv_gb"]
    n = int(math.floor((budget - slot) / (slot + tokens_per_request * kv)))
    return dict(n=max(n, 1), slot_gib=slot, slot_mib=slot * 1024, kv_mib_per_request=tokens_per_request * kv * 1024,
                budget_gib=budget)


def n_after_mem_step(n: int, prediction: dict, gpu_gb: float | None, step: float) -> int:
    """N for a relaunch with --mem-fraction-static lowered by `step`: the pools' budget shrinks by
    step x the GPU's memory, i.e. by that over (slot + KV per request) requests, as in
    `predict_fit`; N itself without a calibrated prediction or a GPU size."""
    slot, kv = prediction.get("slot_mib"), prediction.get("kv_mib_per_request")
    if not (slot and kv and gpu_gb):
        return n
    return max(1, n - int(math.ceil(step * gpu_gb * 1024 / (slot + kv))))


def relaunch_n(n: int, facts: dict | None, prediction: dict, gpu_gb: float | None, step: float,
               tokens_per_request: int) -> tuple[int, dict]:
    """N for the relaunch after a launch at n ran out of memory under its load, and the prediction
    it used. The crashed launch's own pools (`facts`) give the N where its slots and KV balance;
    the relaunch asks for that N less what `step` of the GPU held, and never for more than n. Without
    such facts, `n_after_mem_step` on the side's prediction (session 14: a --start-n launch kept
    N=2857 at the lower fraction and its KV cache then held only 1346 requests)."""
    try:
        own = predict_fit(memory_split(facts or {}), tokens_per_request)
    except (ValueError, ZeroDivisionError, TypeError):
        return n_after_mem_step(n, prediction, gpu_gb, step), prediction
    own["source"] = "the crashed launch's pools"
    return min(n, n_after_mem_step(own["n"], own, gpu_gb, step)), own


_GPU_GB_RE = re.compile(r"Load weight begin\. avail mem=([0-9.]+) GB")


def launch_fit(facts: dict, n: int, tokens_per_request: int) -> dict:
    """fit(N) of a launch at --max-running-requests n (the scheduler's final max_running_requests
    and KV tokens), and the upper bound on the fit of any N (module docstring)."""
    mrr = facts.get("max_running_requests")
    tokens = facts.get("max_total_num_tokens")
    if mrr is None or tokens is None:
        raise ValueError("the log has no scheduler line (max_total_num_tokens=..., max_running_requests=...)")
    by_kv = tokens // tokens_per_request
    return dict(max_running_requests=mrr, kv_tokens=tokens, by_kv=by_kv, fit=min(mrr, by_kv), upper=max(n, by_kv))


def max_fit_two_points(n0: int, tokens0: int, n1: int, tokens1: int, tokens_per_request: int) -> int | None:
    """The largest fit of any N, with the KV tokens linear in N through the two launches
    (n0, tokens0) and (n1, tokens1), n0 < n1: tokens(N) = tokens1 - (N - n1) * s, and the fit is
    N while N * tokens_per_request <= tokens(N)."""
    if n1 <= n0 or tokens1 >= tokens0:
        return None
    s = (tokens0 - tokens1) / (n1 - n0)
    return max(n1 if n1 * tokens_per_request <= tokens1 else 0,
               int(math.floor((tokens1 + n1 * s) / (tokens_per_request + s))))


def bound(res: dict) -> int | None:
    """Upper bound on a side's fit: from both launches when there was a calibration, else the
    one-launch bound of the module docstring."""
    if res.get("max_fit") is not None:
        return res["max_fit"]
    return (res.get("fit") or {}).get("upper")


def ratio_summary(sides: dict) -> dict:
    """Ratios between sides whose load completed (`side_ok`): a server that admits N requests and
    then crashes under them has not shown that N fits."""
    ok = {k: v for k, v in sides.items() if side_ok(v)}
    s, o, u = ok.get("stock") or {}, ok.get("ours") or {}, ok.get("upstream") or {}
    out: dict = {}
    if s.get("fit") and o.get("fit"):
        out["fit_ratio"] = o["fit"]["fit"] / s["fit"]["fit"]
    if s.get("fit") and o.get("reached") and bound(s):
        out["conservative_ratio"] = o["reached"] / bound(s)
    if u.get("fit") and o.get("fit"):
        out["fit_ratio_vs_upstream"] = o["fit"]["fit"] / u["fit"]["fit"]
    return out


# A scheduler that died under the load (its traceback's last line, or SGLang's own report).
_CRASH_RE = re.compile(r"^.*(?:OutOfMemoryError|CUDA out of memory|Scheduler hit an exception).*$", re.M)
_PREFILL_RE = re.compile(r"Prefill batch(?: \[\d+\])?, .*?#running-req: (\d+)")
_MEM_FRACTION_RE = re.compile(r"mem_fraction_static=([0-9.]+)")


def load_log_facts(text: str) -> dict:
    """From a server log's lines written during the load: the largest #running-req of the decode
    lines (`reached`) and of the prefill lines (`admitted`: requests holding a slot, decoded or not),
    and the crash line if the scheduler died (an out-of-memory one preferred)."""
    decode = [ln["running"] for ln in bs.parse_decode_lines(text)]
    prefill = [int(m.group(1)) for m in _PREFILL_RE.finditer(text)]
    crashes = [m.group(0).strip() for m in _CRASH_RE.finditer(text)]
    oom = [c for c in crashes if "memory" in c.lower()]
    return dict(reached=max(decode, default=0), admitted=max(prefill + decode, default=0),
                crash=((oom or crashes) or [None])[-1], oom=bool(oom))


def mem_fraction(text: str) -> float | None:
    m = _MEM_FRACTION_RE.search(text)
    return float(m.group(1)) if m else None


# ----------------------------------------------------------------------------------------------
# Load: every request at once, in non-streaming batches
# ----------------------------------------------------------------------------------------------


def send_all(host: str, port: int, prompts: list[list[int]], output_len: int, batch: int, timeout: float) -> dict:
    """POST the prompts to /generate in batches of `batch` (all batches at once); counts the
    requests that came back with `output_len` tokens."""
    chunks = [prompts[i:i + batch] for i in range(0, len(prompts), batch)]
    url = f"http://{host}:{port}/generate"

    def one(chunk):
        payload = {"input_ids": chunk, "sampling_params": {"temperature": 0, "max_new_tokens": output_len,
                                                           "ignore_eos": True}}
        try:
            status, body = e2e._http_json(url, payload, timeout=timeout)
        except Exception as err:  # noqa: BLE001  (reported, not raised: the probe records the failure)
            return 0, len(chunk), f"{type(err).__name__}: {err}"
        items = body if isinstance(body, list) else [body]
        good = sum(1 for it in items if (it.get("meta_info") or {}).get("completion_tokens") == output_len)
        return good, len(chunk) - good, None if status == 200 else f"HTTP {status}"

    t0 = time.time()
    ok = failed = 0
    errors: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(chunks))) as ex:
        for g, f, err in ex.map(one, chunks):
            ok, failed = ok + g, failed + f
            if err:
                errors.append(err)
    wall = time.time() - t0
    return dict(requests=len(prompts), ok=ok, failed=failed, errors=errors[:3], wall_s=wall,
                output_tok_per_s=ok * output_len / wall if wall > 0 else None)


# ----------------------------------------------------------------------------------------------
# Device side
# ----------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--model", choices=sorted(bs.MODELS), default="gdn")
    p.add_argument("--model-dir", default=None, help="use this checkpoint (else bench_serving's spec recipe)")
    p.add_argument("--models-dir", default=None)
    p.add_argument("--sides", default="stock,ours")
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--calib-n", type=int, default=64, help="--max-running-requests of the calibration launch")
    p.add_argument("--start-n", default="", help="skip the calibration: SIDE=N,... (e.g. stock=900,ours=3000)")
    p.add_argument("--cuda-graph-max-bs", type=int, default=256)
    p.add_argument("--batch", type=int, default=128, help="prompts per /generate request")
    p.add_argument("--server-args", default="", help="extra flags for every server (one string)")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--startup-timeout", type=float, default=400.0)
    p.add_argument("--request-timeout", type=float, default=240.0)
    p.add_argument("--time-budget", type=float, default=None)
    p.add_argument("--min-side-s", type=float, default=240.0,
                   help="do not start a side with less time left (it is left for the next call into the same OUT)")
    p.add_argument("--redo", action="store_true", help="probe the --sides that an earlier call into OUT verified (other sides are kept)")
    p.add_argument("--oom-retries", type=int, default=1,
                   help="relaunches at the same N when the server runs out of memory under the load")
    p.add_argument("--oom-mem-step", type=float, default=0.1,
                   help="--mem-fraction-static is lowered by this much per out-of-memory relaunch")
    a = p.parse_args(argv)
    a.side_list = [s for s in a.sides.split(",") if s]
    if not a.side_list or any(s not in SIDES for s in a.side_list):
        p.error(f"--sides: a comma list of {', '.join(SIDES)}")
    try:
        a.start = {k: int(v) for k, v in (x.split("=") for x in a.start_n.split(",") if x)}
    except ValueError:
        p.error("--start-n: SIDE=N,...")
    a.tokens_per_request = a.input_len + a.output_len + bs.SPEC_DRAFT_TOKENS
    return a


def _bench_args(a, n: int, extra_args: str = ""):
    """bench_serving's argument namespace for one launch at --max-running-requests n."""
    argv = ["--out", a.out, "--model", a.model, "--study", "spec", "--input-len", str(a.input_len),
            "--output-len", str(a.output_len), "--launch-max-running-requests", str(n),
            "--cuda-graph-max-bs", str(min(a.cuda_graph_max_bs, n)), "--python", a.python,
            "--server-args=" + " ".join(x for x in ["--disable-radix-cache", a.server_args, extra_args] if x)]
    if a.model_dir:
        argv += ["--model-dir", a.model_dir, "--tag", Path(a.model_dir).name]
    if a.models_dir:
        argv += ["--models-dir", a.models_dir]
    return bs.parse_args(argv)


def _launch(a, model: dict, side: str, n: int, out: Path, end_time, id_range: tuple[int, int] | None = None,
            extra_args: str = ""):
    """One server at --max-running-requests n: its record (facts, fit, mem_fraction_static). With
    `id_range`, also sends fit(n) requests at once and reads from the log what the load reached
    (`load_log_facts`)."""
    ba = _bench_args(a, n, extra_args)
    port = e2e.pick_port(0, ba.host)
    cmd = bs._server_cmd(ba, model, side, port)
    log_path = out / "logs" / f"{side}_n{n}_{_dt.datetime.now().strftime('%H%M%S')}.log"
    run = e2e.ServerRun(name=f"{side} N={n}", cmd=cmd, log_path=str(log_path), port=port)
    env = bs.side_plugin_env(dict(os.environ), side)
    rec: dict = dict(side=side, n=n, cmd=cmd, log=str(log_path.relative_to(out)))
    timeout = a.startup_timeout if end_time is None else min(a.startup_timeout, max(30.0, end_time - time.time() - 30))
    with e2e.launched_server(run, ba.host, timeout, env, end_time):
        text = e2e._read(str(log_path))
        rec.update(startup_s=run.startup_s, error=run.error)
        if run.error:
            rec["log_tail"] = text.splitlines()[-15:]
            return rec
        rec["facts"] = bs.parse_server_facts(text)
        rec["fit"] = launch_fit(rec["facts"], n, a.tokens_per_request)
        rec["mem_fraction_static"] = mem_fraction(text)
        m = _GPU_GB_RE.search(text)
        rec["gpu_gb"] = float(m.group(1)) if m else None
        if extra_args:
            rec["extra_args"] = extra_args
        if id_range is not None:
            count = rec["fit"]["fit"]
            prompts = e2e.make_prompts(1000 + n, count, id_range[0], id_range[1], a.input_len, a.input_len)
            off = len(text)
            req_timeout = a.request_timeout if end_time is None else max(
                10.0, min(a.request_timeout, end_time - time.time() - 25))
            rec["load"] = send_all(ba.host, port, prompts, a.output_len, a.batch, req_timeout)
            rec.update(load_log_facts(e2e._read(str(log_path))[off:]))
        run.served = True
    return rec


def probe_side(a, model: dict, side: str, out: Path, end_time, id_range: tuple[int, int]) -> dict:
    """Calibrate (unless --start-n names the side), predict, then launch at N* and load it; a
    verify launch that does not start is retried once at 0.9 N*."""
    tpr = a.tokens_per_request
    res: dict = dict(side=side, tokens_per_request=tpr)
    if side in a.start:
        n = a.start[side]
        res["prediction"] = dict(n=n, source="--start-n")
    else:
        rec = _launch(a, model, side, a.calib_n, out, end_time)
        res["calibration"] = rec
        if rec.get("error"):
            res["error"] = f"calibration launch: {rec['error']}"
            return res
        res["split"] = memory_split(rec["facts"])
        res["prediction"] = {**predict_fit(res["split"], tpr), "source": f"calibration at N={a.calib_n}"}
        n = res["prediction"]["n"]
    for _ in range(2):
        rec = _launch(a, model, side, n, out, end_time, id_range)
        if not rec.get("error"):
            break
        res.setdefault("failed_launches", []).append(dict(n=n, error=rec["error"], log_tail=rec.get("log_tail")))
        n = int(n * 0.9)
    else:
        res["error"] = "the launch at the predicted N failed twice"
        return res
    # A server that admitted the requests and then ran out of memory under them (activations:
    # SGLang sizes the pools from --mem-fraction-static and leaves the rest for activations, and
    # the decode logits grow with the running batch) is relaunched with
    # --mem-fraction-static lowered by --oom-mem-step (and N by what that memory held), --oom-retries
    # times while time allows.
    for _ in range(a.oom_retries):
        if not (rec.get("oom") and rec.get("mem_fraction_static")):
            break
        if end_time is not None and end_time - time.time() < a.min_side_s / 2:
            break
        res.setdefault("crashed_loads", []).append(
            {k: rec.get(k) for k in ("n", "mem_fraction_static", "crash", "admitted", "reached", "log")})
        mf = round(rec["mem_fraction_static"] - a.oom_mem_step, 3)
        n, used = relaunch_n(n, rec.get("facts"), res.get("prediction") or {}, rec.get("gpu_gb"), a.oom_mem_step, tpr)
        res["crashed_loads"][-1]["relaunch"] = dict(n=n, mem_fraction_static=mf, source=used.get("source"))
        retry = _launch(a, model, side, n, out, end_time, id_range, extra_args=f"--mem-fraction-static {mf}")
        if retry.get("error"):
            res.setdefault("failed_launches", []).append(dict(n=n, error=retry["error"], log_tail=retry.get("log_tail")))
            break
        rec = retry
    res["verify_launch"] = {k: v for k, v in rec.items() if k not in ("facts", "fit", "load", "reached", "admitted")}
    res["fit"], res["load"], res["reached"], res["admitted"] = rec["fit"], rec["load"], rec["reached"], rec["admitted"]
    if rec.get("crash"):
        res["crash"] = rec["crash"]
    if "calibration" in res:
        c = res["calibration"]
        res["kv_shrinks_with_n"] = rec["fit"]["kv_tokens"] < c["fit"]["kv_tokens"]
        res["max_fit"] = max_fit_two_points(c["n"], c["fit"]["kv_tokens"], rec["n"], rec["fit"]["kv_tokens"], tpr)
    return res


def markdown(result: dict) -> str:
    runs = sorted({(r.get("date", result["date"]), r.get("gpu", result["gpu"]), r.get("command", result["command"]))
                   for r in result["sides"].values()} or {(result["date"], result["gpu"], result["command"])})
    lines = ["# Max concurrency with NEXTN on, radix cache off (scripts/fit_probe.py)", ""]
    lines += [f"- {d} on {g}: `{c}`" for d, g, c in runs]
    lines += [f"- model: {result['model']['desc']} (`{result['model']['dir']}`)",
              f"- tokens per request: input {result['input_len']} + output {result['output_len']} + "
              f"{bs.SPEC_DRAFT_TOKENS} draft", "",
              "| side | calibration N | slot MiB | KV MiB per request | predicted N* | launched N | "
              "mem fraction | KV tokens | fit | max fit (upper bound) | requests sent | admitted (#running-req, "
              "prefill) | largest #running-req (decode) | ok | output tok/s |",
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for side in [x for x in SIDES if x in result["sides"]]:
        r = result["sides"][side]
        p, f, ld = r.get("prediction") or {}, r.get("fit") or {}, r.get("load") or {}
        lines.append("| " + " | ".join(str(x) for x in [
            side, (r.get("calibration") or {}).get("n", "-"), bs._f(p.get("slot_mib"), 2),
            bs._f(p.get("kv_mib_per_request"), 2), p.get("n", "-"), (r.get("verify_launch") or {}).get("n", "-"),
            bs._f((r.get("verify_launch") or {}).get("mem_fraction_static"), 3),
            f.get("kv_tokens", "-"), f.get("fit", "-"), bound(r) if bound(r) is not None else "-", ld.get("requests", "-"),
            r.get("admitted", "-"), r.get("reached", "-"), ld.get("ok", "-"), bs._f(ld.get("output_tok_per_s"))]) + " |")
    for side in [x for x in SIDES if x in result["sides"]]:
        r = result["sides"][side]
        for c in r.get("crashed_loads") or []:
            lines.append(f"\n{side}: at N={c['n']} with mem fraction {c['mem_fraction_static']} the server admitted "
                         f"{c['admitted']} requests and crashed under them: `{(c['crash'] or '')[:200]}` "
                         + (f"(relaunched at N={c['relaunch']['n']} with --mem-fraction-static "
                            f"{c['relaunch']['mem_fraction_static']}, N from {c['relaunch']['source'] or 'the launch'})\n"
                            if c.get("relaunch") else "(relaunched with --mem-fraction-static lowered by the --oom-mem-step)\n"))
        if r.get("crash"):
            lines.append(f"\n{side}: **the server crashed under the load** after admitting {r.get('admitted')} "
                         f"requests: `{r['crash'][:200]}`\n")
        if r.get("error"):
            lines.append(f"\n{side}: **{r['error']}**\n")
    rs = result.get("ratios") or {}
    lines += ["", f"ours / stock fit: {bs._f(rs.get('fit_ratio'), 2, 'x')}; ours reached / stock upper bound "
              f"(conservative): {bs._f(rs.get('conservative_ratio'), 2, 'x')}"
              + (f"; ours / upstream fit: {bs._f(rs['fit_ratio_vs_upstream'], 2, 'x')}"
                 if "fit_ratio_vs_upstream" in rs else ""), ""]
    return "\n".join(lines)


def command_line(argv=None) -> str:
    args = list(argv) if argv is not None else sys.argv[1:]
    return " ".join(["python3", "scripts/fit_probe.py"] + [shlex.quote(x) for x in args])


def side_ok(res: dict) -> bool:
    return (not res.get("error") and not res.get("crash") and (res.get("load") or {}).get("failed") == 0
            and bool(res.get("reached")))


def main(argv=None) -> int:
    a = parse_args(argv)
    out = Path(a.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    end_time = None if a.time_budget is None else t0 + a.time_budget
    ba = _bench_args(a, a.calib_n)
    model, err = bs._resolve_model(ba, out, end_time)
    if err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    id_range = e2e.prompt_id_range(model["config"], e2e._tokenizer_size(Path(model["dir"])))
    here = dict(command=command_line(argv), gpu=bs.gpu_name(),
                date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    result = dict(**here, model={k: model[k] for k in ("dir", "tag", "desc")}, input_len=a.input_len,
                  output_len=a.output_len, sides={})
    prev_path = out / "fit.json"
    if prev_path.exists():
        # Resumable: a side verified by an earlier call into the same OUT (same model and lengths) is
        # kept; --redo probes the sides of --sides again and keeps the others.
        prev = json.loads(prev_path.read_text())
        if (prev.get("model", {}).get("dir"), prev.get("input_len"), prev.get("output_len")) == (
                model["dir"], a.input_len, a.output_len):
            result["sides"] = {k: v for k, v in prev.get("sides", {}).items()
                               if side_ok(v) and not (a.redo and k in a.side_list)}
    rc = 0
    for side in a.side_list:
        if side in result["sides"]:
            print(f"[{side}] done by an earlier call ({result['sides'][side].get('date')}); --redo repeats it",
                  flush=True)
            continue
        if end_time is not None and end_time - time.time() < a.min_side_s:
            print(f"[{side}] time budget: {end_time - time.time():.0f} s left (< --min-side-s {a.min_side_s:.0f}); "
                  "left for the next call", flush=True)
            rc = 3 if rc == 0 else rc
            continue
        res = probe_side(a, model, side, out, end_time, id_range)
        res.update(here)
        result["sides"][side] = res
        rc = rc if side_ok(res) else 1
        f = res.get("fit") or {}
        print(f"[{side}] predicted {(res.get('prediction') or {}).get('n')}, fit {f.get('fit')} (upper bound "
              f"{bound(res)}), reached {res.get('reached')}" + (f"; {res['error']}" if res.get("error") else "")
              + (f"; crashed under the load after admitting {res.get('admitted')}: {res['crash'][:160]}"
                 if res.get("crash") else ""),
              flush=True)
    result["ratios"] = ratio_summary(result["sides"])
    bs.write_json(out / "fit.json", result)
    report = markdown(result)
    (out / "report.md").write_text(report)
    print(report, flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
