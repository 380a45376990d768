#!/usr/bin/env python3
"""Where two servers' host time per step differs: align the CUDA API calls of two torch-profiler
traces (written by `bench_serving.py --gpu-profile-steps N`, one per side) and compare the host
time between consecutive calls.

    python3 scripts/diag/trace_gaps.py STOCK.trace.json.gz OURS.trace.json.gz [--top 25]

Both servers run the same model code, so their sequences of kernel launches (each launch named by
the kernel it started) are nearly the same; they are aligned with difflib. For every aligned call
the host time until the next call is compared. (The steps repeat, so difflib may pair step i of one
trace with step j of the other; the pairs are still the same calls, which is what is compared.) The report says

* the GPU kernel time and the span of each trace;
* the host time over the aligned calls on each side, and how the difference is spread: a few
  large pauses (one part of the step is slower: a sync, a slow Python path) or every gap a bit
  longer (the whole process runs slower: CPU contention, placement);
* the call pairs whose gap grew most, and the calls only one side makes.
"""

from __future__ import annotations

import argparse
import difflib
import gzip
import json
import statistics
from collections import defaultdict

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
API_CATS = ("cuda_runtime", "cuda_driver")
API_KEEP = ("Launch", "Memcpy", "Memset", "Synchronize")


def load_events(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as fh:
        data = json.load(fh)
    events = data["traceEvents"] if isinstance(data, dict) else data
    return [e for e in events if e.get("ph") == "X"]


def api_calls(events: list[dict]) -> list[tuple[str, float]]:
    """[(label, host us until the next call)] of the launch/copy/sync API calls in time order; a
    launch is labelled with the kernel it started (matched by correlation id)."""
    started = {e.get("args", {}).get("correlation"): e["name"] for e in events if e.get("cat") in GPU_CATS}
    calls = sorted((e for e in events if e.get("cat") in API_CATS and any(k in e["name"] for k in API_KEEP)),
                   key=lambda e: e["ts"])
    out = []
    for i, e in enumerate(calls):
        nxt = calls[i + 1]["ts"] - e["ts"] if i + 1 < len(calls) else 0.0
        label = e["name"][:24] + "|" + started.get(e.get("args", {}).get("correlation"), "-")[:64]
        out.append((label, float(nxt)))
    return out


def gpu_summary(events: list[dict]) -> dict:
    k = [e for e in events if e.get("cat") == "kernel"]
    if not k:
        return dict(kernel_us=0.0, span_us=0.0)
    t0 = min(e["ts"] for e in k)
    t1 = max(e["ts"] + e["dur"] for e in k)
    return dict(kernel_us=sum(e["dur"] for e in k), span_us=t1 - t0)


def compare(a: list[tuple[str, float]], b: list[tuple[str, float]], big_us: float = 200.0) -> dict:
    """Align two call sequences and attribute the host-time difference (b - a)."""
    la, lb = [x[0] for x in a], [x[0] for x in b]
    sm = difflib.SequenceMatcher(None, la, lb, autojunk=False)
    pairs = defaultdict(lambda: [0, 0.0, 0.0])
    only_a, only_b = defaultdict(lambda: [0, 0.0]), defaultdict(lambda: [0, 0.0])
    diffs, ratios = [], []
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            for k in range(i2 - i1):
                ga, gb = a[i1 + k][1], b[j1 + k][1]
                nxt = la[i1 + k + 1] if i1 + k + 1 < len(la) else ""
                p = pairs[(la[i1 + k], nxt)]
                p[0] += 1
                p[1] += ga
                p[2] += gb
                diffs.append(gb - ga)
                if ga > 5.0:
                    ratios.append(gb / ga)
        else:
            for k in range(i1, i2):
                only_a[la[k]][0] += 1
                only_a[la[k]][1] += a[k][1]
            for k in range(j1, j2):
                only_b[lb[k]][0] += 1
                only_b[lb[k]][1] += b[k][1]
    big = [d for d in diffs if abs(d) > big_us]
    return dict(
        aligned=len(diffs),
        host_a_us=sum(v[1] for v in pairs.values()),
        host_b_us=sum(v[2] for v in pairs.values()),
        diff_in_big_gaps_us=sum(big),
        big_gaps=len(big),
        diff_in_small_gaps_us=sum(d for d in diffs if abs(d) <= big_us),
        median_gap_ratio=statistics.median(ratios) if ratios else None,
        pairs=sorted(((k, v) for k, v in pairs.items()), key=lambda kv: -(kv[1][2] - kv[1][1])),
        only_a=sorted(only_a.items(), key=lambda kv: -kv[1][1]),
        only_b=sorted(only_b.items(), key=lambda kv: -kv[1][1]),
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", help="baseline trace (stock)")
    ap.add_argument("b", help="compared trace (ours)")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--big-us", type=float, default=200.0, help="a gap change above this counts as a pause")
    args = ap.parse_args(argv)
    ea, eb = load_events(args.a), load_events(args.b)
    ga, gb = gpu_summary(ea), gpu_summary(eb)
    ca, cb = api_calls(ea), api_calls(eb)
    r = compare(ca, cb, args.big_us)
    print(f"GPU kernel time  a {ga['kernel_us'] / 1e3:9.1f} ms   b {gb['kernel_us'] / 1e3:9.1f} ms")
    print(f"trace span       a {ga['span_us'] / 1e3:9.1f} ms   b {gb['span_us'] / 1e3:9.1f} ms")
    print(f"API calls        a {len(ca):9d}      b {len(cb):9d}      aligned {r['aligned']}")
    print(f"host time over the aligned calls: a {r['host_a_us'] / 1e3:.1f} ms, b {r['host_b_us'] / 1e3:.1f} ms "
          f"(b - a = {(r['host_b_us'] - r['host_a_us']) / 1e3:+.1f} ms)")
    ratio = r["median_gap_ratio"]
    print(f"  in {r['big_gaps']} gaps that changed by > {args.big_us:.0f} us: {r['diff_in_big_gaps_us'] / 1e3:+.1f} ms; "
          f"in the others: {r['diff_in_small_gaps_us'] / 1e3:+.1f} ms; median gap ratio b/a "
          + (f"{ratio:.3f}" if ratio is not None else "-"))
    print(f"\ncall -> next call: count, mean gap a / b (us), total change (ms), largest first")
    for (x, y), (n, sa, sb) in r["pairs"][: args.top]:
        print(f"  {n:5d} {sa / n:8.0f} {sb / n:8.0f} {(sb - sa) / 1e3:+8.1f}  {x}  ->  {y}")
    for name, rows in (("only in a", r["only_a"]), ("only in b", r["only_b"])):
        print(f"\n{name}: count, host ms until the next call")
        for label, (n, s) in rows[:10]:
            print(f"  {n:5d} {s / 1e3:8.1f}  {label}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
