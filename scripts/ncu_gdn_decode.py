"""GDN decode kernels for Nsight Compute: where the ring decode's time goes at batch 256.

    ncu --clock-control none --profile-from-start off --set full -o rep \\
        python3 scripts/ncu_gdn_decode.py [--batch 256] [--hv 32] [--plan 5x16x1x3x8x0x1x1x8]
    python3 scripts/ncu_gdn_decode.py --summarize raw.csv    # from `ncu --import rep.ncu-rep --page raw --csv`

The kernel benchmark (`bench_kernels.py`) times the decode; this script only launches it, for a
profiler. It sets up one layer at the Qwen3-Next head shape (H=16, HV=32, K=V=128, bf16
activations, ring length 16) and, between `cudaProfilerStart` and `cudaProfilerStop` (what
`ncu --profile-from-start off` profiles), launches:

1. SGLang's packed decode (`fused_recurrent_gated_delta_rule_packed_decode`, the stock server's
   decode) `--steps` times on the fp32 checkpoints;
2. ours (`gdn_replay_decode`) on the same checkpoints converted to the split layout (the default
   on servers), for `--steps` steps whose rows are spread over the ring cycle as a server's are
   (row r at ring position (r + step) % L: each launch holds a 1/L share of flush rows), with the
   row order the backend uses (`configs.gdn_flush_spread`).

Both run once before the profiled region, so Triton's compiles and autotuning stay out of it; the
conversion to the split layout runs between two profiled regions, outside both.
`--summarize` turns ncu's raw CSV page into one line per kernel name: launches, median duration,
DRAM bytes and bandwidth, DRAM % of peak, achieved occupancy, registers, L2 hit rate, warp
instructions issued (millions) and the share of cycles in which a scheduler issued one.
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hv", type=int, default=32)
    p.add_argument("--ring-len", type=int, default=16)
    # With rows staggered every launch holds the same mix (1/L flush rows), so a few launches tell the
    # story; each costs ncu tens of replay passes.
    p.add_argument("--steps", type=int, default=4, help="profiled launches of each decode")
    p.add_argument("--plan", default=None, help="a gdn_decode entry of REPLAYSSM_CONFIG (default: the backend's)")
    p.add_argument("--no-stock", action="store_true", help="leave SGLang's packed decode out")
    p.add_argument("--summarize", metavar="CSV", help="summarise ncu's raw CSV page instead of launching")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # tests: cpu + TRITON_INTERPRET
    p.add_argument("--dims", type=int, nargs=4, metavar=("H", "HV", "K", "V"), help=argparse.SUPPRESS)  # tests
    a = p.parse_args(argv)
    a.plan_cfg = None
    if a.plan is not None:
        from replayssm_kernels.configs import parse_plan

        a.plan_cfg = parse_plan("gdn_decode", a.plan)
        if a.plan_cfg is None:
            p.error(f"--plan: a gdn_decode entry of REPLAYSSM_CONFIG (x-separated numbers), got {a.plan!r}")
    return a


def launch(a, calls: list | None = None) -> list[str]:
    """Run the launches (module docstring); returns the names of the decode calls in order, with
    `PROFILE_ON` / `PROFILE_OFF` where a profiled region starts and stops (appended to `calls`
    when given, after the warm-up's entries are cleared from it)."""
    import contextlib

    import torch

    from bench_kernels import fill_rings_randn, staggered_snaps
    from replayssm_kernels import decode_order_and_index
    from replayssm_kernels.configs import gdn_flush_spread, override
    from replayssm_kernels.gdn import alloc_gdn_rings, gdn_replay_decode, split_ckpt_convert

    dev, act = a.device, torch.bfloat16
    H, HV, K, V = a.dims or (16, a.hv, 128, 128)
    B, L = a.batch, a.ring_len
    g = torch.Generator(device="cpu").manual_seed(0)

    def randn(*shape, scale=1.0, dtype=torch.float32):
        return (torch.randn(*shape, generator=g) * scale).to(device=dev, dtype=dtype)

    A_log = (torch.rand(HV, generator=g) * 0.9 + 0.05).log().to(dev)
    dt_bias = randn(HV) - 1.0
    state = randn(B, HV, V, K, scale=0.1)
    slots = torch.arange(B, dtype=torch.int32, device=dev)
    mixed = randn(B, 2 * H * K + HV * V, dtype=act)
    av, bv = randn(B, HV, dtype=act), randn(B, HV, dtype=act)
    q, k = mixed[:, : H * K].view(B, H, K), mixed[:, H * K: 2 * H * K].view(B, H, K)
    v = mixed[:, 2 * H * K:].view(B, HV, V)
    rings = alloc_gdn_rings(1, B, H, HV, K, V, L, act, dev).layer(0)
    fill_rings_randn(rings, 0.1)
    origin = torch.zeros(B, dtype=torch.int32, device=dev)
    spread = gdn_flush_spread()
    # (row_wp, row_flush, row order, flush rows) per ring position; the count is read here, not
    # after each profiled launch (a device-to-host copy between launches)
    snaps = [(wp, rf, *decode_order_and_index(rf, spread), int(rf.sum()))
             for wp, rf in (ph[0] for ph in staggered_snaps(B, L, 1, dev))]
    out = torch.empty(B, HV, V, device=dev, dtype=act)
    calls = [] if calls is None else calls
    cuda = dev.startswith("cuda")

    def profiling(on: bool):
        # ncu (--profile-from-start off) profiles the kernels between start and stop only; the
        # markers stay in `calls` so that the order can be checked without a GPU.
        if cuda:
            torch.cuda.synchronize()
            (torch.cuda.profiler.start if on else torch.cuda.profiler.stop)()
        calls.append(PROFILE_ON if on else PROFILE_OFF)

    def stock(n):
        from sglang.kernels.ops.attention.fla.fused_recurrent import fused_recurrent_gated_delta_rule_packed_decode

        for _ in range(n):
            fused_recurrent_gated_delta_rule_packed_decode(mixed, av, bv, A_log, dt_bias, K ** -0.5, state,
                                                           out.view(B, 1, HV, V), slots, use_qk_l2norm_in_kernel=True)
            calls.append("stock packed decode")

    def ours(n):
        for j in range(n):
            wp, rf, order, findex, nflush = snaps[j % L]
            gdn_replay_decode(q, k, v, av, bv, A_log, dt_bias, state, rings, slots, wp, rf, origin, out=out,
                              row_order=order, split_ckpt=True, flush_index=findex)
            calls.append(f"ours decode, {nflush} flush rows")

    plan = override("gdn_decode", a.plan_cfg) if a.plan_cfg else contextlib.nullcontext()
    with plan:
        if not a.no_stock:
            stock(1)
        split_ckpt_convert(state, None, True)
        ours(L)  # every ring position once: each compiled variant is built before the profiled region
        split_ckpt_convert(state, None, False)
        calls.clear()
        if not a.no_stock:
            profiling(True)
            stock(a.steps)
            profiling(False)
        split_ckpt_convert(state, None, True)  # outside the profiled region (session 43's run had it inside)
        profiling(True)
        ours(a.steps)
        profiling(False)
    return calls


PROFILE_ON, PROFILE_OFF = "[profiler start]", "[profiler stop]"


# ncu's raw page: the summary's columns, each from the first of its metric names the page has
# (Nsight Compute 2025.3 names the DRAM share `gpu__dram_throughput`, older ones `dram__throughput`)
_METRICS = {
    "us": ("gpu__time_duration.sum",),
    "MB read": ("dram__bytes_read.sum",),
    "MB written": ("dram__bytes_write.sum",),
    "DRAM % peak": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
                    "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
    "occupancy %": ("sm__warps_active.avg.pct_of_peak_sustained_active",),
    "registers": ("launch__registers_per_thread",),
    "L2 hit %": ("lts__t_sector_hit_rate.pct",),
    "M inst issued": ("smsp__inst_issued.sum",),
    "issue active %": ("smsp__issue_active.avg.pct_of_peak_sustained_active",),
}
_TO_BASE = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "usecond": 1.0, "nsecond": 1e-3, "msecond": 1e3,
            "byte": 1e-6, "Kbyte": 1e-3, "Mbyte": 1.0, "Gbyte": 1e3, "KB": 1e-3, "MB": 1.0, "GB": 1e3}


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def summarize(rows: list[list[str]]) -> list[dict]:
    """Per kernel name, the median of each metric over its launches. `rows`: ncu's raw CSV page
    (header, units row, one row per profiled kernel); durations in us, bytes in MB whatever units
    the page used; metrics the page lacks are left out."""
    header, units, data = rows[0], rows[1], rows[2:]
    col = {name: i for i, name in enumerate(header)}
    if "Kernel Name" not in col:
        raise ValueError("not ncu's raw page: no 'Kernel Name' column")
    per = {}
    for r in data:
        if len(r) != len(header):
            continue
        vals = {}
        for label, names in _METRICS.items():
            i = next((col[m] for m in names if m in col), None)
            x = _number(r[i]) if i is not None else None
            if x is None:
                continue
            unit = units[i].strip()
            if label == "us" or label.startswith("MB"):
                if unit not in _TO_BASE:
                    continue
                x *= _TO_BASE[unit]
            elif label == "M inst issued":
                x *= 1e-6
            vals[label] = x
        per.setdefault(r[col["Kernel Name"]], []).append(vals)
    out = []
    for name, launches in per.items():
        row = {"kernel": name, "launches": len(launches)}
        for label in _METRICS:
            xs = [v[label] for v in launches if label in v]
            if xs:
                row[label] = statistics.median(xs)
        if {"us", "MB read", "MB written"} <= row.keys() and row["us"] > 0:
            row["GB/s"] = (row["MB read"] + row["MB written"]) * 1e3 / row["us"]
        out.append(row)
    return out


def summary_table(summary: list[dict]) -> str:
    cols = ["launches", "us", "MB read", "MB written", "GB/s", "DRAM % peak", "occupancy %", "registers", "L2 hit %",
            "M inst issued", "issue active %"]
    lines = ["| kernel | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for row in summary:
        cells = [("-" if c not in row else f"{row[c]:.0f}" if c == "registers"
                  else f"{row[c]:.1f}" if isinstance(row[c], float) else str(row[c])) for c in cols]
        lines.append(f"| {row['kernel'][:60]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    a = parse_args(argv)
    if a.summarize:
        with open(a.summarize, newline="") as f:
            rows = [r for r in csv.reader(f) if r]
        # ncu may print lines of its own before the page; the page starts at its header row.
        start = next((i for i, r in enumerate(rows) if "Kernel Name" in r), None)
        if start is None:
            raise SystemExit(f"{a.summarize}: no ncu raw page (no 'Kernel Name' header row)")
        print(summary_table(summarize(rows[start:])))
        return
    calls = launch(a)
    decodes = [c for c in calls if c not in (PROFILE_ON, PROFILE_OFF)]
    print(f"profiled {len(decodes)} decode calls at batch {a.batch}: " + "; ".join(calls), flush=True)


if __name__ == "__main__":
    main()
