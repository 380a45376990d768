#!/usr/bin/env python3
"""Kernel time of the decode-only steps in a serving GPU profile (`bench_serving.py
--gpu-profile-steps N`), for steps that mix prefill and decode badly in a plain per-step average.

    python3 scripts/diag/spec_steps.py STOCK.trace.json.gz OURS.trace.json.gz [--top 14]

A step is found by the kernel that runs once per SSM layer in it (the verify or decode kernel of
each side, `--marker` overrides): launches of it closer than `--gap-us` form one step. A step is
kept when it holds exactly `--layers` of them and no prefill kernel (`--prefill` substrings) runs
before the next step starts. For each side it prints the kept steps' mean span and kernel time,
and the kernels that take most of it.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import gzip
import json

MARKERS = (
    "fused_sigmoid_gating_delta_rule_update_kernel",  # SGLang's GDN verify (spec)
    "fused_recurrent_gated_delta_rule_packed_decode_kernel",  # SGLang's GDN decode
    "_gdn_verify_fused_kernel",  # ours, spec
    "_gdn_decode_loop_kernel",  # ours, decode
)
PREFILL = ("chunk_gated_delta_rule", "_causal_conv1d_fwd_kernel", "chunk_fwd_kernel_o")


def kernels(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as fh:
        trace = json.load(fh)
    ev = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") == "kernel"]
    ev.sort(key=lambda e: e["ts"])
    return ev


def pick_marker(ev: list[dict]) -> str:
    names = collections.Counter(e["name"] for e in ev)
    found = [m for m in MARKERS if names.get(m)]
    if not found:
        raise SystemExit("no GDN verify/decode kernel in the trace: pass --marker")
    return max(found, key=lambda m: names[m])


def decode_steps(ev: list[dict], marker: str, layers: int, gap_us: float, prefill=PREFILL) -> list[tuple[float, float]]:
    """(start, end) of each clean decode step: `layers` marker launches, no prefill kernel until the
    next step's first marker. The last group has no known end and is dropped."""
    marks = [e["ts"] for e in ev if e["name"] == marker]
    pre = [e["ts"] for e in ev if any(p in e["name"] for p in prefill)]
    groups: list[list[float]] = []
    for t in marks:
        if groups and t - groups[-1][-1] <= gap_us:
            groups[-1].append(t)
        else:
            groups.append([t])
    steps = []
    for g, nxt in zip(groups, groups[1:]):
        a, b = g[0], nxt[0]
        if len(g) == layers and bisect.bisect_left(pre, a) == bisect.bisect_left(pre, b):
            steps.append((a, b))
    return steps


def step_kernels(ev: list[dict], steps: list[tuple[float, float]]) -> collections.Counter:
    """Kernel microseconds by name over the steps (a kernel belongs to the step it starts in)."""
    starts = [e["ts"] for e in ev]
    tot: collections.Counter = collections.Counter()
    for a, b in steps:
        for e in ev[bisect.bisect_left(starts, a):bisect.bisect_left(starts, b)]:
            tot[e["name"]] += e["dur"]
    return tot


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", help="torch-profiler traces, one per side (stock first)")
    ap.add_argument("--layers", type=int, default=36, help="SSM layers of the model (marker launches a step)")
    ap.add_argument("--marker", default=None, help="the kernel that runs once per SSM layer in a step")
    ap.add_argument("--gap-us", type=float, default=3000.0, help="marker launches further apart start a new step")
    ap.add_argument("--prefill", default=",".join(PREFILL),
                    help="comma-separated substrings of the kernel names that mark a prefill (default: %(default)s)")
    ap.add_argument("--top", type=int, default=14)
    a = ap.parse_args(argv)
    prefill = tuple(p for p in a.prefill.split(",") if p)
    for path in a.traces:
        ev = kernels(path)
        marker = a.marker or pick_marker(ev)
        steps = decode_steps(ev, marker, a.layers, a.gap_us, prefill)
        print(f"{path}\n  marker {marker}: {len(steps)} clean decode steps")
        if not steps:
            continue
        tot = step_kernels(ev, steps)
        n = len(steps)
        span = sum(b - a for a, b in steps) / n
        print(f"  per step: span {span:.0f} us, kernels {sum(tot.values()) / n:.0f} us")
        for name, us in tot.most_common(a.top):
            print(f"  {us / n:10.1f}  {name[:90]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
