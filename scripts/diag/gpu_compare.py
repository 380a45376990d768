#!/usr/bin/env python3
"""Compare the GPU kernel time of two serving cases profiled with `bench_serving.py --gpu-profile-steps N`.

    python3 scripts/diag/gpu_compare.py OUT/cases/<stock case>.json OUT/cases/<ours case>.json [--top 20]

Prints each side's kernel time per profiled step and the kernels whose time differs most.
"""

import argparse
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    sides = []
    for path in (args.a, args.b):
        case = json.load(open(path))
        prof = case.get("gpu_profile") or {}
        if "error" in prof or not prof:
            raise SystemExit(f"{path}: no GPU profile ({prof.get('error', 'not profiled')})")
        sides.append((case["side"], prof))
    for side, prof in sides:
        print(f"{side:>8}: {prof['kernel_us'] / prof['steps']:10.1f} us of kernels per step "
              f"({prof['kernels']} kernels in {prof['steps']} steps)")
    (na, pa), (nb, pb) = sides
    ta = {r["name"]: r["us"] for r in pa["top"]}
    tb = {r["name"]: r["us"] for r in pb["top"]}
    rows = sorted(set(ta) | set(tb), key=lambda k: -abs(tb.get(k, 0.0) - ta.get(k, 0.0)))
    print(f"{'per step, us':>14} {na:>10} {nb:>10}  kernel (top {args.top} of each side's top list)")
    for k in rows[: args.top]:
        print(f"{'':>14} {ta.get(k, 0.0) / pa['steps']:10.1f} {tb.get(k, 0.0) / pb['steps']:10.1f}  {k[:110]}")


if __name__ == "__main__":
    main()
