#!/usr/bin/env python3
"""Summarise scripts/diag/sitecustomize.py samples: for each side's folder, the scheduler
process's busiest thread and the functions it spends its samples in.

    python3 scripts/diag/summarize.py stock=/tmp/diag_stock ours=/tmp/diag_ours [--top 40] [--match replayssm]
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sides", nargs="+", help="name=folder")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--match", default=None, help="also list every function whose key contains this")
    a = ap.parse_args()
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
