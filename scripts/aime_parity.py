#!/usr/bin/env python3
"""AIME parity: the same sampled generations on two servers (stock SGLang and ReplaySSM), scored,
checked for repetition loops and truncation, and compared with paired tests.

Data: AIME 2024 / 2025 / 2026 (30 problems each) as shipped inside the ``sgl-eval`` 0.1.3 wheel
(``sgl_eval/_vendored/nemo_skills/dataset/aime{24,25,26}/test.txt``, JSONL with ``id``, ``problem``,
``expected_answer``). Looked up in this order: ``--data-dir`` (``aime24.jsonl`` ... or the wheel's
``aime24/test.txt`` layout), ``--sgl-eval-wheel`` (the .whl, read as a zip), the installed
``sgl_eval`` package (importlib.resources). Nothing is downloaded. ``--export-data DIR`` writes the
three files as ``DIR/aime24.jsonl`` ... so they can be carried to a machine without network.

Requests: ``/v1/chat/completions`` (the model's chat template), one request per (problem, repeat),
``temperature`` / ``top_p`` / ``max_tokens`` as given and ``seed`` = a fixed function of
(``--seed``, year, problem id, repeat), identical on both servers. SGLang applies per-request seeds
only with ``--enable-deterministic-inference`` (``--deterministic`` adds it when this script
launches the servers); without it the two generations of a pair are independent draws (the paired
tests stay valid, they just lose the pairing's variance reduction).

Scoring: the last ``\\boxed{...}`` (balanced braces) of the final answer text, else the last
"Answer: ..." line; normalised to an integer 0..999 (``$``, ``\\text{}``, spacing, thousands
commas, ``x = `` prefixes and a trailing ``.0`` are stripped); exact match with
``expected_answer``. The final answer text is ``message.content`` with any ``<think>...</think>``
removed (a generation that ends inside ``<think>`` has none).

Loops: the whole generation (reasoning + content) is split into tokens ``\\w{1,8}|[^\\w\\s]`` (words
cut into pieces of at most 8 characters, each punctuation mark a token); for every n-gram of
``--loop-ngram`` (16) tokens the number of positions where it starts is counted (overlaps allowed;
in text that repeats one unit exactly, every window recurs once per repetition, whatever the unit's
length). A generation is "looped >= 50" / "looped >= 200" when its most frequent n-gram occurs at
least 50 / 200 times. (Calibration: over the AIME 2024/2025 problems and reference solutions
concatenated, 43k tokens of ordinary math text, the largest count is 10 for n = 16 and 32 for n = 8.)
Truncated: ``finish_reason == "length"``.

Statistics per server and year: accuracy with two 95% intervals, Wilson (all generations treated as
independent) and a problem bootstrap (problems resampled with replacement with all their repeats,
2000 draws, percentile interval; the one to quote when repeats > 1), loop and truncation rates, mean
output tokens. Paired over identical (year, problem, repeat, seed): exact McNemar tests for
accuracy, looped >= 50 and truncation, and a sign test on output tokens. Verdict: "DIFFERS" when
any of these four p-values (all years pooled) is below alpha / 4 (Bonferroni), else "no difference
beyond noise".

Examples:
  python3 scripts/aime_parity.py --sgl-eval-wheel sgl_eval-0.1.3-py3-none-any.whl --export-data .aime_data
  python3 scripts/aime_parity.py --data-dir .aime_data --base-url-a http://127.0.0.1:30000 \\
      --base-url-b http://127.0.0.1:30001 --n 8 --max-tokens 32768 --out aime_out
  python3 scripts/aime_parity.py --data-dir .aime_data --model /models/Qwen3.5-4B --deterministic --out aime_out
Exit status: 0 verdict "no difference", 1 "DIFFERS", 3 incomplete (time budget or failed requests:
rerun to resume), 2 usage or data errors.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import io
import json
import math
import os
import random
import re
import shlex
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
import zipfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_parity as e2e  # noqa: E402  (server launch / shutdown helpers)

YEARS = {2024: "aime24", 2025: "aime25", 2026: "aime26"}
WHEEL_DATA = "sgl_eval/_vendored/nemo_skills/dataset/{name}/test.txt"
PROMPT = {
    "boxed": ("Solve this competition problem. Its answer is an integer between 0 and 999. "
              "Show your reasoning, then give the final answer inside \\boxed{{}}.\n\n{problem}"),
    "answer-line": ("Solve this competition problem. Its answer is an integer between 0 and 999. "
                    "Show your reasoning; the last line of your reply must be 'Answer: <integer>'.\n\n{problem}"),
}

# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------


def _parse_jsonl(text: str, source: str) -> list[dict]:
    rows = []
    for i, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        r = json.loads(line)
        for k in ("problem", "expected_answer"):
            if k not in r:
                raise ValueError(f"{source}: line {i + 1} has no {k!r}")
        rows.append(dict(id=str(r.get("id", i)), problem=r["problem"], expected_answer=str(r["expected_answer"])))
    if not rows:
        raise ValueError(f"{source}: no rows")
    return rows


def load_year(year: int, data_dir: str | None = None, wheel: str | None = None) -> tuple[list[dict], str]:
    """(rows, source description) for one AIME year, from the first source that has it."""
    name = YEARS[year]
    tried = []
    if data_dir:
        for p in (Path(data_dir) / f"{name}.jsonl", Path(data_dir) / name / "test.txt",
                  Path(data_dir) / WHEEL_DATA.format(name=name)):
            if p.is_file():
                return _parse_jsonl(p.read_text(encoding="utf-8"), str(p)), str(p)
            tried.append(str(p))
    if wheel:
        member = WHEEL_DATA.format(name=name)
        with zipfile.ZipFile(wheel) as z:
            if member in z.namelist():
                return _parse_jsonl(z.read(member).decode("utf-8"), f"{wheel}!{member}"), f"{wheel}!{member}"
        tried.append(f"{wheel}!{member}")
    try:
        import importlib.resources as ir

        res = ir.files("sgl_eval").joinpath(f"_vendored/nemo_skills/dataset/{name}/test.txt")
        if res.is_file():
            return _parse_jsonl(res.read_text(encoding="utf-8"), f"sgl_eval:{name}"), f"installed sgl_eval ({name})"
        tried.append("installed sgl_eval (no such file)")
    except ModuleNotFoundError:
        tried.append("installed sgl_eval (not installed)")
    raise FileNotFoundError(f"AIME {year} not found; tried: " + "; ".join(tried)
                            + ". Give --data-dir or --sgl-eval-wheel (pip download --no-deps sgl-eval==0.1.3).")


def export_data(years: list[int], dst: str, data_dir=None, wheel=None) -> list[str]:
    out = Path(dst)
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for y in years:
        rows, _ = load_year(y, data_dir, wheel)
        p = out / f"{YEARS[y]}.jsonl"
        p.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
        files.append(str(p))
    return files


# ----------------------------------------------------------------------------------------------
# Scoring
# ----------------------------------------------------------------------------------------------


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} / \\fbox{...} (balanced braces), or of \\boxed <token>."""
    best = None
    for m in re.finditer(r"\\(?:boxed|fbox)\b", text):
        i = m.end()
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth, j = 0, i
            while j < len(text):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        break
                j += 1
            if depth == 0:
                best = text[i + 1:j]
        else:
            tok = re.match(r"[^\s$]+", text[i:])
            if tok:
                best = tok.group(0)
    return best


_ANSWER_LINE = re.compile(r"(?im)^[ \t>*#_]*(?:final\s+)?answer[ \t*_]*[:：][ \t*_]*(.+?)[ \t*_]*$")


def answer_line(text: str) -> str | None:
    ms = _ANSWER_LINE.findall(text)
    return ms[-1] if ms else None


def normalize_int(s: str | None) -> int | None:
    """An AIME answer string -> int in 0..999, or None."""
    if s is None:
        return None
    s = s.strip()
    for _ in range(3):  # unwrap \text{..}, \mathbf{..}, \textbf{..}, braces
        s = re.sub(r"\\(?:text|textbf|mathbf|mathrm|boxed)\s*\{([^{}]*)\}", r"\1", s)
    s = s.replace("$", "").replace("\\,", "").replace("\\!", "").replace("\\ ", "").replace("\\;", "")
    s = re.sub(r"\^\s*\{?\\circ\}?", "", s)
    s = s.replace("\\%", "").replace("%", "")
    s = s.strip().strip("{}").strip().rstrip(".").strip()
    m = re.fullmatch(r"\(\s*(.*?)\s*\)", s)  # "(211)"
    if m:
        s = m.group(1)
    m = re.fullmatch(r"[A-Za-z]\w*\s*=\s*(.+)", s)
    if m:
        s = m.group(1).strip()
    s = re.sub(r"(?<=\d),(?=\d{3}\b)", "", s)
    m = re.fullmatch(r"\+?(\d+)(?:\.0*)?", s)
    if not m:
        return None
    v = int(m.group(1))
    return v if 0 <= v <= 999 else None


def final_answer_text(content: str | None) -> str:
    """Answer region of a reply: after the last </think>; none when the reply stops inside <think>."""
    content = content or ""
    if "</think>" in content:
        return content.rsplit("</think>", 1)[1]
    if "<think>" in content:
        return ""
    return content


def extract_answer(content: str | None) -> int | None:
    region = final_answer_text(content)
    boxed = last_boxed(region)
    if boxed is not None:
        return normalize_int(boxed)
    return normalize_int(answer_line(region))


def score(content: str | None, expected: str) -> bool:
    got = extract_answer(content)
    try:
        want = int(str(expected).strip())
    except ValueError:
        return False
    return got is not None and got == want


# ----------------------------------------------------------------------------------------------
# Repetition loops
# ----------------------------------------------------------------------------------------------

_LOOP_TOKEN = re.compile(r"\w{1,8}|[^\w\s]")


def max_ngram_repeats(text: str, n: int = 16) -> int:
    """Largest number of (possibly overlapping) start positions shared by one n-gram of tokens."""
    toks = _LOOP_TOKEN.findall(text or "")
    if len(toks) < n:
        return 0
    counts = Counter(tuple(toks[i:i + n]) for i in range(len(toks) - n + 1))
    return max(counts.values())


# ----------------------------------------------------------------------------------------------
# Statistics
# ----------------------------------------------------------------------------------------------


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float] | None:
    if n == 0:
        return None
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def problem_bootstrap(per_problem: list[list[int]], draws: int = 2000, seed: int = 0,
                      level: float = 0.95) -> tuple[float, float] | None:
    """Percentile interval of the mean over problems resampled with replacement (all repeats kept)."""
    groups = [g for g in per_problem if g]
    if not groups:
        return None
    rng = random.Random(seed)
    sums = [(sum(g), len(g)) for g in groups]
    stats = []
    for _ in range(draws):
        s = n = 0
        for _ in range(len(sums)):
            a, b = sums[rng.randrange(len(sums))]
            s += a
            n += b
        stats.append(s / n)
    stats.sort()
    lo = stats[int(math.floor((1 - level) / 2 * (draws - 1)))]
    hi = stats[int(math.ceil((1 + level) / 2 * (draws - 1)))]
    return lo, hi


def binom_two_sided(k: int, n: int) -> float:
    """Exact two-sided p of k successes in n fair coin flips (doubled smaller tail, capped at 1)."""
    if n == 0:
        return 1.0
    k = min(k, n - k)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def mcnemar(pairs: list[tuple[bool, bool]]) -> dict:
    """Exact McNemar test: b = A only, c = B only."""
    b = sum(1 for x, y in pairs if x and not y)
    c = sum(1 for x, y in pairs if y and not x)
    return dict(n=len(pairs), a_only=b, b_only=c, p=binom_two_sided(b, b + c),
                rate_a=sum(x for x, _ in pairs) / len(pairs) if pairs else None,
                rate_b=sum(y for _, y in pairs) / len(pairs) if pairs else None)


def sign_test(diffs: list[float]) -> dict:
    pos = sum(1 for d in diffs if d > 0)
    neg = sum(1 for d in diffs if d < 0)
    return dict(n=len(diffs), a_more=pos, b_more=neg, ties=len(diffs) - pos - neg,
                mean_diff=sum(diffs) / len(diffs) if diffs else None, p=binom_two_sided(pos, pos + neg))


# ----------------------------------------------------------------------------------------------
# Requests
# ----------------------------------------------------------------------------------------------


def request_seed(base: int, year: int, pid: str, repeat: int) -> int:
    h = hashlib.sha256(f"{base}:{year}:{pid}:{repeat}".encode()).digest()
    return int.from_bytes(h[:4], "little") & 0x7FFFFFFF


def sampling_key(a) -> str:
    """Identifies the sampling setup: cached responses are reused only under the same key."""
    d = dict(t=a.temperature, p=a.top_p, m=a.max_tokens, s=a.seed, style=a.prompt_style,
             ctk=a.chat_template_kwargs, extra=a.extra_body)
    return hashlib.sha1(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def build_jobs(data: dict, n: int, base_seed: int) -> list[dict]:
    jobs = []
    for year, rows in sorted(data.items()):
        for r in rows:
            for k in range(n):
                jobs.append(dict(year=year, id=r["id"], repeat=k, seed=request_seed(base_seed, year, r["id"], k),
                                 problem=r["problem"], expected=r["expected_answer"]))
    return jobs


def job_key(j: dict) -> str:
    return f"{j['year']}|{j['id']}|{j['repeat']}|{j['seed']}"


def chat_payload(job: dict, a, model_name: str) -> dict:
    body = dict(model=model_name, messages=[{"role": "user", "content": PROMPT[a.prompt_style].format(
        problem=job["problem"])}], temperature=a.temperature, top_p=a.top_p, max_tokens=a.max_tokens,
        seed=job["seed"], n=1, stream=False)
    if a.chat_template_kwargs:
        body["chat_template_kwargs"] = json.loads(a.chat_template_kwargs)
    if a.extra_body:
        body.update(json.loads(a.extra_body))
    return body


def _post(url: str, payload: dict, timeout: float) -> dict:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def model_name_of(base_url: str, given: str | None) -> str:
    if given:
        return given
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/v1/models", timeout=30) as r:
            data = json.loads(r.read()).get("data") or []
        return data[0]["id"] if data else "default"
    except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError):
        return "default"


def one_request(base_url: str, job: dict, a, model_name: str) -> dict:
    rec = dict(key=job_key(job), year=job["year"], id=job["id"], repeat=job["repeat"], seed=job["seed"],
               sampling=sampling_key(a))
    url = base_url.rstrip("/") + "/v1/chat/completions"
    t0 = time.time()
    err = None
    for attempt in range(2):
        try:
            resp = _post(url, chat_payload(job, a, model_name), a.request_timeout)
            ch = resp["choices"][0]
            msg = ch.get("message") or {}
            rec.update(content=msg.get("content") or "", reasoning=msg.get("reasoning_content") or "",
                       finish_reason=ch.get("finish_reason"),
                       completion_tokens=(resp.get("usage") or {}).get("completion_tokens"),
                       latency_s=time.time() - t0, error=None)
            return rec
        except urllib.error.HTTPError as e:
            err = f"HTTP {e.code}: {e.read()[:300]!r}"
            break
        except (urllib.error.URLError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
            err = f"{type(e).__name__}: {e}"
            if attempt == 0:
                time.sleep(1.0)  # one retry after a connection error or a malformed reply
    rec.update(error=err, latency_s=time.time() - t0)
    return rec


def load_cache(path: Path, skey: str) -> dict:
    done = {}
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("sampling") == skey and not r.get("error"):
                done[r["key"]] = r
    return done


def run_jobs(base_url: str, label: str, jobs: list[dict], a, cache_path: Path, end_time: float | None) -> dict:
    """Send the jobs that are not cached yet; returns {key: record} for all done jobs."""
    skey = sampling_key(a)
    done = load_cache(cache_path, skey)
    todo = [j for j in jobs if job_key(j) not in done]
    model_name = model_name_of(base_url, a.model_name)
    print(f"[{label}] {len(jobs) - len(todo)} of {len(jobs)} generations cached; sending {len(todo)} "
          f"(model {model_name!r}, {a.concurrency} at a time)", flush=True)
    if not todo:
        return done
    from bench_serving import Progress

    prog = Progress(len(todo), f"{label}", disable=a.quiet)
    lock = threading.Lock()
    cache_path.parent.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()

    def work(job):
        if stop.is_set() or (end_time is not None and time.time() > end_time):
            stop.set()
            return None
        rec = one_request(base_url, job, a, model_name)
        with lock:
            if not rec.get("error"):
                done[rec["key"]] = rec
            with open(cache_path, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            prog.update()
        return rec

    try:
        with cf.ThreadPoolExecutor(max_workers=a.concurrency) as pool:
            errors = [r for r in pool.map(work, todo) if r is not None and r.get("error")]
    finally:
        prog.close()
    if errors:
        print(f"[{label}] {len(errors)} request(s) failed, e.g. {errors[0]['error']}", flush=True)
    if stop.is_set():
        print(f"[{label}] time budget reached; rerun the same command to continue", flush=True)
    return done


# ----------------------------------------------------------------------------------------------
# Analysis
# ----------------------------------------------------------------------------------------------


def annotate(rec: dict, expected: str, ngram: int) -> dict:
    full = (rec.get("reasoning") or "") + "\n" + (rec.get("content") or "")
    reps = max_ngram_repeats(full, ngram)
    return dict(correct=score(rec.get("content"), expected), answer=extract_answer(rec.get("content")),
                max_repeats=reps, loop50=reps >= 50, loop200=reps >= 200,
                truncated=rec.get("finish_reason") == "length",
                tokens=rec.get("completion_tokens") if rec.get("completion_tokens") is not None else 0)


def side_stats(items: list[dict], bootstrap_draws: int, seed: int) -> dict:
    """items: annotated records with 'year'/'id'. Accuracy (Wilson + problem bootstrap) and rates."""
    n = len(items)
    k = sum(i["correct"] for i in items)
    per_problem: dict = {}
    for i in items:
        per_problem.setdefault((i["year"], i["id"]), []).append(int(i["correct"]))
    return dict(
        n=n, problems=len(per_problem), correct=k, accuracy=k / n if n else None,
        ci_wilson=wilson(k, n), ci_bootstrap=problem_bootstrap(list(per_problem.values()), bootstrap_draws, seed),
        loop50=sum(i["loop50"] for i in items), loop200=sum(i["loop200"] for i in items),
        truncated=sum(i["truncated"] for i in items),
        mean_output_tokens=sum(i["tokens"] for i in items) / n if n else None,
    )


def paired_stats(pa: list[dict], pb: list[dict]) -> dict:
    acc = mcnemar([(x["correct"], y["correct"]) for x, y in zip(pa, pb)])
    loop50 = mcnemar([(x["loop50"], y["loop50"]) for x, y in zip(pa, pb)])
    loop200 = mcnemar([(x["loop200"], y["loop200"]) for x, y in zip(pa, pb)])
    trunc = mcnemar([(x["truncated"], y["truncated"]) for x, y in zip(pa, pb)])
    toks = sign_test([x["tokens"] - y["tokens"] for x, y in zip(pa, pb)])
    same = sum(1 for x, y in zip(pa, pb) if x["text"] == y["text"])
    return dict(n=len(pa), accuracy=acc, loop50=loop50, loop200=loop200, truncated=trunc, output_tokens=toks,
                identical_generations=same, identical_frac=same / len(pa) if pa else None)


VERDICT_TESTS = ("accuracy", "loop50", "truncated", "output_tokens")


def verdict(paired: dict, alpha: float) -> dict:
    """'DIFFERS' when any of VERDICT_TESTS has p < alpha / len(VERDICT_TESTS) (Bonferroni)."""
    thr = alpha / len(VERDICT_TESTS)
    if not paired.get("n"):
        return dict(verdict="no data", threshold=thr, reasons=[])
    reasons = [f"{t} (p={paired[t]['p']:.3g})" for t in VERDICT_TESTS if paired[t]["p"] < thr]
    return dict(verdict="DIFFERS" if reasons else "no difference beyond noise", threshold=thr, reasons=reasons)


def analyze(jobs: list[dict], res_a: dict, res_b: dict, labels: tuple[str, str], a) -> dict:
    """Per-year and pooled stats for both sides, paired tests on keys answered by both."""
    expected = {job_key(j): j["expected"] for j in jobs}
    meta = {job_key(j): j for j in jobs}

    def ann(res):
        out = {}
        for key, rec in res.items():
            if key not in meta:
                continue
            d = annotate(rec, expected[key], a.loop_ngram)
            d.update(year=meta[key]["year"], id=meta[key]["id"],
                     text=(rec.get("reasoning") or "") + "\x00" + (rec.get("content") or ""))
            out[key] = d
        return out

    A, B = ann(res_a), ann(res_b)
    years = sorted({j["year"] for j in jobs})
    result = dict(labels=list(labels), years=years, per_year={}, jobs=len(jobs),
                  answered={labels[0]: len(A), labels[1]: len(B)})
    for scope in [*years, "all"]:
        keys = [job_key(j) for j in jobs if scope == "all" or j["year"] == scope]
        ka = [k for k in keys if k in A]
        kb = [k for k in keys if k in B]
        both = [k for k in keys if k in A and k in B]
        result["per_year"][str(scope)] = dict(
            sides={labels[0]: side_stats([A[k] for k in ka], a.bootstrap, a.seed),
                   labels[1]: side_stats([B[k] for k in kb], a.bootstrap, a.seed)},
            paired=paired_stats([A[k] for k in both], [B[k] for k in both]),
        )
    result["verdict"] = verdict(result["per_year"]["all"]["paired"], a.alpha)
    result["complete"] = len(A) == len(jobs) and len(B) == len(jobs)
    fields = ("correct", "answer", "max_repeats", "loop50", "loop200", "truncated", "tokens")
    result["_generations"] = [
        dict(key=k, year=meta[k]["year"], id=meta[k]["id"], repeat=meta[k]["repeat"], seed=meta[k]["seed"],
             expected=expected[k],
             **{lab: ({f: side[k][f] for f in fields} if k in side else None) for lab, side in zip(labels, (A, B))},
             identical=(A[k]["text"] == B[k]["text"]) if k in A and k in B else None)
        for k in (job_key(j) for j in jobs)]
    return result


def _pct(x):
    return "-" if x is None else f"{100 * x:.1f}%"


def _ci(ci):
    return "-" if not ci else f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def format_report(res: dict, settings: dict) -> str:
    la, lb = res["labels"]
    lines = [f"AIME parity: {la} vs {lb}", ""]
    lines.append("settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    lines.append("")
    lines.append("| year | server | n | accuracy | 95% CI Wilson | 95% CI problem bootstrap | looped>=50 | looped>=200 "
                 "| truncated | mean out tokens |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for scope, blk in res["per_year"].items():
        for lab in (la, lb):
            s = blk["sides"][lab]
            lines.append(f"| {scope} | {lab} | {s['n']} | {_pct(s['accuracy'])} | {_ci(s['ci_wilson'])} | "
                         f"{_ci(s['ci_bootstrap'])} | {s['loop50']} | {s['loop200']} | {s['truncated']} | "
                         f"{_num(s['mean_output_tokens'])} |")
    lines.append("")
    lines.append(f"Paired tests ({la} vs {lb}, identical problem/repeat/seed; a_only/b_only = discordant pairs):")
    lines.append("")
    lines.append("| year | pairs | accuracy a_only/b_only p | looped>=50 p | looped>=200 p | truncated p | "
                 "out tokens (mean a-b, sign test p) | identical generations |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for scope, blk in res["per_year"].items():
        p = blk["paired"]
        if not p["n"]:
            lines.append(f"| {scope} | 0 | - | - | - | - | - | - |")
            continue
        lines.append(
            f"| {scope} | {p['n']} | {p['accuracy']['a_only']}/{p['accuracy']['b_only']} {p['accuracy']['p']:.3g} | "
            f"{p['loop50']['a_only']}/{p['loop50']['b_only']} {p['loop50']['p']:.3g} | "
            f"{p['loop200']['a_only']}/{p['loop200']['b_only']} {p['loop200']['p']:.3g} | "
            f"{p['truncated']['a_only']}/{p['truncated']['b_only']} {p['truncated']['p']:.3g} | "
            f"{_num(p['output_tokens']['mean_diff'], 1)}, {p['output_tokens']['p']:.3g} | {_pct(p['identical_frac'])} |")
    lines.append("")
    v = res["verdict"]
    lines.append(f"VERDICT (all years pooled; McNemar for accuracy / looped>=50 / truncated, sign test for output "
                 f"tokens; Bonferroni alpha {settings.get('alpha')}/4 = {v['threshold']:.4g}): {v['verdict']}"
                 + (": " + ", ".join(v["reasons"]) if v["reasons"] else ""))
    if not res["complete"]:
        lines.append(f"INCOMPLETE: answered {res['answered']} of {res['jobs']} generations per server; "
                     "rerun to finish (cached generations are kept)")
    return "\n".join(lines)


def _num(x, nd=0):
    return "-" if x is None else f"{x:.{nd}f}"


# ----------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("data")
    g.add_argument("--years", default="2024,2025,2026")
    g.add_argument("--data-dir", default=None, help="folder with aime24.jsonl ... (see --export-data)")
    g.add_argument("--sgl-eval-wheel", default=None, help="sgl_eval-0.1.3-py3-none-any.whl (read as a zip)")
    g.add_argument("--export-data", default=None, metavar="DIR", help="write DIR/aime2X.jsonl and exit")
    g.add_argument("--limit", type=int, default=None, help="first N problems per year (smoke runs)")
    g = p.add_argument_group("servers (two base URLs, or --model to launch stock and ours one after the other)")
    g.add_argument("--base-url-a", default=None, help="e.g. http://127.0.0.1:30000 (stock)")
    g.add_argument("--base-url-b", default=None, help="e.g. http://127.0.0.1:30001 (replayssm)")
    g.add_argument("--label-a", default="stock")
    g.add_argument("--label-b", default="replayssm")
    g.add_argument("--model", default=None, help="checkpoint: launch A (--mamba-backend triton, no plugins) and "
                   "B (--mamba-backend replayssm) with the same flags")
    g.add_argument("--deterministic", action="store_true",
                   help="launch with --enable-deterministic-inference (SGLang applies per-request seeds only then)")
    g.add_argument("--spec", action="store_true", help="launch both with NEXTN (3 steps, topk 1, 4 draft tokens)")
    g.add_argument("--attention-backend", default=None)
    g.add_argument("--server-args", default="", help="extra flags for both launched servers (one string)")
    g.add_argument("--a-args", default="")
    g.add_argument("--b-args", default="")
    g.add_argument("--python", default=sys.executable)
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=0)
    g.add_argument("--startup-timeout", type=float, default=900.0)
    g.add_argument("--model-name", default=None, help="'model' field of the requests (default: /v1/models)")
    g = p.add_argument_group("sampling")
    g.add_argument("--n", type=int, default=4, help="repeats per problem (each with its own seed)")
    g.add_argument("--temperature", type=float, default=0.6)
    g.add_argument("--top-p", type=float, default=0.95)
    g.add_argument("--max-tokens", type=int, default=32768)
    g.add_argument("--seed", type=int, default=0, help="base of the per-request seeds")
    g.add_argument("--prompt-style", choices=sorted(PROMPT), default="boxed")
    g.add_argument("--chat-template-kwargs", default=None, help='JSON, e.g. \'{"enable_thinking": true}\'')
    g.add_argument("--extra-body", default=None, help="JSON merged into every request body")
    g.add_argument("--concurrency", type=int, default=64)
    g.add_argument("--request-timeout", type=float, default=3600.0)
    g = p.add_argument_group("analysis / output")
    g.add_argument("--out", default="aime_parity_out")
    g.add_argument("--loop-ngram", type=int, default=16,
                   help="n of the repeated n-gram (tokens: \\w{1,8} pieces and single punctuation marks)")
    g.add_argument("--alpha", type=float, default=0.05)
    g.add_argument("--bootstrap", type=int, default=2000)
    g.add_argument("--time-budget", type=float, default=None, help="stop sending new requests after this many s")
    g.add_argument("--quiet", action="store_true")
    a = p.parse_args(argv)
    try:
        a.year_list = sorted({int(y) for y in a.years.split(",") if y.strip()})
    except ValueError:
        p.error("--years: comma-separated years")
    bad = [y for y in a.year_list if y not in YEARS]
    if bad:
        p.error(f"--years: {bad} not in {sorted(YEARS)}")
    for k in ("chat_template_kwargs", "extra_body"):
        v = getattr(a, k)
        if v is not None:
            try:
                json.loads(v)
            except ValueError:
                p.error(f"--{k.replace('_', '-')}: not JSON")
    if not a.export_data and not a.model and not (a.base_url_a and a.base_url_b):
        p.error("give --base-url-a and --base-url-b, or --model (or --export-data)")
    return a


def _launch_cmd(a, side: str, port: int) -> tuple[list[str], dict]:
    cfg = json.loads((Path(a.model) / "config.json").read_text())
    kind = e2e.model_kind(cfg)
    extra = shlex.split(a.server_args) + shlex.split(a.a_args if side == "a" else a.b_args)
    if a.deterministic:
        extra = ["--enable-deterministic-inference"] + extra
    cmd = e2e.build_server_cmd(
        python=a.python, model=str(Path(a.model).resolve()), port=port, host=a.host,
        mamba_backend="triton" if side == "a" else "replayssm",
        attention_backend=a.attention_backend or e2e.DEFAULT_ATTENTION.get(kind, e2e.FALLBACK_ATTENTION),
        sampling_backend="pytorch", moe_runner_backend=e2e.DEFAULT_MOE_RUNNER.get(kind), spec=a.spec,
        extra_args=extra)
    env = e2e.server_env(dict(os.environ), "stock" if side == "a" else "ours")
    return cmd, env


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        if a.export_data:
            for f in export_data(a.year_list, a.export_data, a.data_dir, a.sgl_eval_wheel):
                print(f"wrote {f}")
            return 0
        data, sources = {}, {}
        for y in a.year_list:
            rows, src = load_year(y, a.data_dir, a.sgl_eval_wheel)
            data[y] = rows[: a.limit] if a.limit else rows
            sources[y] = src
    except (FileNotFoundError, ValueError, zipfile.BadZipFile) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    end_time = None if a.time_budget is None else time.time() + a.time_budget
    jobs = build_jobs(data, a.n, a.seed)
    labels = (a.label_a, a.label_b)
    results = {}
    servers = {}
    signal.signal(signal.SIGTERM, lambda *x: (e2e._cleanup(), sys.exit(143)))
    try:
        for side, label, url in (("a", a.label_a, a.base_url_a), ("b", a.label_b, a.base_url_b)):
            cache = out / f"responses_{label}.jsonl"
            if not a.model:
                results[label] = run_jobs(url, label, jobs, a, cache, end_time)
                servers[label] = dict(base_url=url)
                continue
            skey = sampling_key(a)
            cached = load_cache(cache, skey)
            if all(job_key(j) in cached for j in jobs):
                results[label] = cached
                servers[label] = dict(cached=True)
                continue
            port = e2e.pick_port(a.port, a.host)
            cmd, env = _launch_cmd(a, side, port)
            run = e2e.ServerRun(name=label, cmd=cmd, log_path=str(out / f"server_{label}.log"), port=port)
            with e2e.launched_server(run, a.host, a.startup_timeout, env, end_time):
                servers[label] = dict(cmd=cmd, log=run.log_path, startup_s=run.startup_s, error=run.error)
                if run.error:
                    print(f"[{label}] server failed: {run.error}", flush=True)
                    results[label] = load_cache(cache, skey)
                    continue
                results[label] = run_jobs(f"http://{a.host}:{port}", label, jobs, a, cache, end_time)
                run.served = True
    finally:
        e2e._cleanup()
    res = analyze(jobs, results[a.label_a], results[a.label_b], labels, a)
    settings = dict(years=a.year_list, problems=sum(len(v) for v in data.values()), n=a.n,
                    temperature=a.temperature, top_p=a.top_p, max_tokens=a.max_tokens, seed=a.seed,
                    prompt_style=a.prompt_style, loop_ngram=a.loop_ngram, alpha=a.alpha, bootstrap=a.bootstrap,
                    deterministic=a.deterministic)
    report = format_report(res, settings)
    res.update(settings=settings, sources={str(k): v for k, v in sources.items()}, servers=servers,
               command=shlex.join([sys.executable] + (sys.argv if argv is None else [__file__, *argv])))
    gens = res.pop("_generations")
    (out / "generations.jsonl").write_text("".join(json.dumps(g) + "\n" for g in gens))
    (out / "result.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "report.md").write_text(report + "\n")
    print(report)
    if not res["complete"]:
        return 3
    return 1 if res["verdict"]["verdict"] == "DIFFERS" else 0


if __name__ == "__main__":
    sys.exit(main())
