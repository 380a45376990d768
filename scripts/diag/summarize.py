#!/usr/bin/env python3
"""Summarise scripts/diag/sitecustomize.py samples: for each side's folder, the scheduler
process's busiest thread and the functions it spends its samples in.

    python3 scripts/diag/summarize.py stock=/tmp/diag_stock ours=/tmp/diag_ours [--top 40] [--match replayssm]
    python3 scripts/diag/summarize.py ours=D1 stock=D2 --diff ours,stock --steps 1020   # us per step, A - B

`--diff A,B` puts two sides side by side in microseconds per scheduler step (`--steps`: steps in
the sampled window, one number or NAME=N per side), sorted by how much more A spends than B.
Sampled seconds of a function include whatever waits it made; a difference says where a side's
step went longer, not that the function's own work grew.
"""

import argparse
import json
import pathlib


def scheduler_profile(folder: pathlib.Path):
    """The process/thread whose stacks run SGLang's scheduler event loop the most:
    `(event-loop seconds, file name, thread name, thread samples, process counters or None)`."""
    best = None
    for p in folder.glob("*.json"):
        d = json.loads(p.read_text())
        for tname, t in d["threads"].items():
            loop = sum(c for k, c in t["incl"] if k.startswith("scheduler.py") and "event_loop" in k)
            if best is None or loop > best[0]:
                best = (loop, p.name, tname, t, d.get("process"))
    return best


def process_line(proc: dict) -> str:
    """The scheduler process's counters over the window (sitecustomize.py `process`)."""
    gc_n = sum(v[0] for v in proc.get("gc", {}).values())
    gc_s = sum(v[1] for v in proc.get("gc", {}).values())
    gen2 = proc.get("gc", {}).get("2", [0, 0.0, 0])
    aff = proc.get("affinity")
    return (f"process: CPU {proc['cpu_s']:.2f} s in {proc['wall_s']:.2f} s wall; context switches "
            f"{proc['voluntary_switches']} voluntary, {proc['involuntary_switches']} involuntary; GC "
            f"{gc_n} collections, {gc_s * 1e3:.1f} ms ({gen2[0]} of generation 2, {gen2[1] * 1e3:.1f} ms); "
            f"{proc.get('gc_tracked_objects')} tracked objects; CPUs {len(aff) if aff else '?'}")


def per_step_diff(a_thread: dict, b_thread: dict, a_steps: float, b_steps: float, kind: str = "incl",
                  top: int = 30):
    """Rows `(A - B, A, B, function)` in microseconds per step for the functions either side has in
    its `kind` list ("incl" or "self"), largest difference first."""
    a, b = dict(a_thread[kind]), dict(b_thread[kind])
    rows = [((a.get(k, 0.0) / a_steps - b.get(k, 0.0) / b_steps) * 1e6, a.get(k, 0.0) / a_steps * 1e6,
             b.get(k, 0.0) / b_steps * 1e6, k) for k in set(a) | set(b)]
    rows.sort(key=lambda r: (-r[0], r[3]))
    return rows[:top]


def _steps_for(spec: str, names):
    if "=" not in spec:
        return {n: float(spec) for n in names}
    out = dict((k, float(v)) for k, v in (x.split("=", 1) for x in spec.split(",")))
    missing = [n for n in names if n not in out]
    if missing:
        raise SystemExit(f"--steps: no step count for {', '.join(missing)}")
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sides", nargs="+", help="name=folder")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--match", default=None, help="also list every function whose key contains this")
    ap.add_argument("--diff", default=None, metavar="A,B", help="two side names: us per step side by side")
    ap.add_argument("--steps", default=None, help="scheduler steps in the window: N, or NAME=N,NAME=M (with --diff)")
    a = ap.parse_args()
    if a.diff:
        folders = dict(x.split("=", 1) for x in a.sides)
        names = a.diff.split(",")
        if len(names) != 2 or any(n not in folders for n in names) or not a.steps:
            raise SystemExit("--diff A,B needs two of the named sides and --steps")
        steps = _steps_for(a.steps, names)
        threads = {}
        for n in names:
            best = scheduler_profile(pathlib.Path(folders[n]))
            if best is None:
                raise SystemExit(f"{n}: no samples in {folders[n]}")
            threads[n] = best[3]
        for kind in ("incl", "self"):
            print(f"== {kind}, us per step: {names[0]} - {names[1]}, {names[0]}, {names[1]}")
            for d, x, y, k in per_step_diff(threads[names[0]], threads[names[1]], steps[names[0]],
                                            steps[names[1]], kind, a.top):
                print(f"   {d:8.0f} {x:8.0f} {y:8.0f}  {k}")
        return
    for spec in a.sides:
        name, folder = spec.split("=", 1)
        best = scheduler_profile(pathlib.Path(folder))
        if best is None:
            print(f"== {name}: no samples in {folder}")
            continue
        loop, fname, tname, t, proc = best
        n = t["samples"]
        print(f"== {name}: {fname} thread {tname}: {n:.1f} s sampled ({loop:.1f} s in the event loop)")
        if proc:
            print("   " + process_line(proc))
        print("   inclusive %  function")
        for k, c in t["incl"][: a.top]:
            print(f"   {100 * c / n:10.1f}  {k}")
        print("   self %  function")
        for k, c in t["self"][:15]:
            print(f"   {100 * c / n:6.1f}  {k}")
        if a.match:
            print(f"   functions matching {a.match!r}:")
            for k, c in t["incl"]:
                if a.match in k:
                    print(f"   {100 * c / n:10.1f}  {k}")


if __name__ == "__main__":
    main()
