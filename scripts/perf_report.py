"""Markdown tables from `bench_kernels.py` result rows (one JSON object per line, or its --json file).

    python scripts/perf_report.py docs/data/bench_kernels_2026-11-30_run2.jsonl [--copy-gbps 4300]
"""

from __future__ import annotations

import argparse
import json
import math
import re


def load_rows(path):
    """Result rows of a --json file ({"info", "results"}) or of a log with one JSON object a line.

    Only rows with a "family" key are results; other JSON lines (the run's info line) and lines that
    are not complete JSON objects are skipped.
    """
    with open(path) as f:
        text = f.read()
    if text.lstrip().startswith("{") and '"results"' in text[:2000]:
        rows = json.loads(text)["results"]
    else:
        rows = []
        for line in text.splitlines():
            if not line.strip().startswith("{"):
                continue
            try:
                rows.append(json.loads(line))
            except ValueError:
                continue
    return [r for r in rows if isinstance(r, dict) and "family" in r]


def _x(a, b):
    return "-" if (a is None or b is None or math.isnan(a) or math.isnan(b)) else f"{a / b:.2f}x"


def _us(v):
    return "-" if v is None or math.isnan(v) else f"{v:.1f}"


def dispatch_rows(rows):
    """What the backend runs per batch size: the ring (staggered rows; the default plan when the row
    names it, else the fastest timed plan; on split checkpoints, the servers' default layout, when the
    run timed them), the exact small-batch mode, or SGLang's own kernel."""
    out = ["\n**Decode as the backend dispatches it** (`configs.ring_min_batch`: below the threshold a "
           "GDN batch runs SGLang's packed decode (`stock`) and a Mamba-2 batch the exact recurrence "
           "(`exact`); ring above, staggered rows; `ring, split`: GDN on split checkpoints)\n",
           "| family | shape | batch | mode | stock (us) | ours (us) | ours vs stock |", "|---|---|---:|---|---:|---:|---:|"]
    for r in rows:
        if "decode_dispatch" not in r:
            continue
        stock = r.get("decode_packed_us", r.get("decode_ssu_us"))
        mode = r["decode_dispatch"]
        if mode == "stock":
            ours = stock
        elif mode == "exact":
            ours = r["decode_ours_exact_us"]
        elif "decode_ours_split_staggered_us" in r:
            mode = "ring, split"
            ours = r.get(f"decode_ours_split_staggered_us_{r.get('decode_default_split_cfg')}",
                         r["decode_ours_split_staggered_us"])
        else:
            ours = r.get(f"decode_ours_staggered_us_{r.get('decode_default_cfg')}", r["decode_ours_staggered_us"])
        shape = f"HV={r['HV']}" if r["family"] == "gdn" else r["shape"]
        out.append(f"| {r['family']} | {shape} | {r['B']} | {mode} | {_us(stock)} | {_us(ours)} | "
                   f"{_x(stock, ours)} |")
    return out if len(out) > 3 else []


def gdn_tables(rows, copy_gbps):
    out = []
    for HV in sorted({r["HV"] for r in rows if r["family"] == "gdn"}):
        sub = [r for r in rows if r["family"] == "gdn" and r["HV"] == HV]
        out.append(f"\n**GDN, H=16, HV={HV}, K=V=128** (fp32 state, bf16 activations, L={sub[0]['L']}, T=4)\n")
        stag = "decode_ours_staggered_us" in sub[0]
        out.append("| batch | packed decode (us) | in-tree ReplaySSM (us) | ours (us) | ours vs packed | "
                   "ours GB/s" + (" (% copy)" if copy_gbps else "") + " | "
                   + ("staggered: in-tree / ours (us) | staggered ours vs packed | " if stag else "")
                   + "spec: stock verify+scatter (us) | fold-every-commit (us) | ours verify+commit (us) | "
                   "ours vs stock |")
        out.append("|---:" * (10 + (2 if stag else 0)) + "|")
        for r in sub:
            gbs = r["decode_bytes_ours"] / (r["decode_ours_us"] * 1e-6) / 1e9
            pct = f" ({100 * gbs / copy_gbps:.0f}%)" if copy_gbps else ""
            out.append(
                f"| {r['B']} | {_us(r['decode_packed_us'])} | {_us(r['decode_intree_us'])} "
                f"({_x(r['decode_packed_us'], r['decode_intree_us'])}) | {_us(r['decode_ours_us'])} | "
                f"{_x(r['decode_packed_us'], r['decode_ours_us'])} | {gbs:.0f}{pct} | "
                + (f"{_us(r['decode_intree_staggered_us'])} / {_us(r['decode_ours_staggered_us'])} | "
                   f"{_x(r['decode_packed_us'], r['decode_ours_staggered_us'])} | " if stag else "")
                + f"{_us(r.get('spec_stock_us'))} | "
                f"{_us(r.get('spec_fold_every_commit_us'))} | {_us(r.get('spec_ours_us'))} | "
                f"{_x(r.get('spec_stock_us'), r.get('spec_ours_us'))} |"
            )
    return out


def m2_tables(rows, copy_gbps):
    out = []
    for shape in dict.fromkeys(r["shape"] for r in rows if r["family"] == "mamba2"):
        sub = [r for r in rows if r["family"] == "mamba2" and r["shape"] == shape]
        r0 = sub[0]
        out.append(f"\n**Mamba-2 {shape}: NH={r0['NH']}, P={r0['P']}, N={r0['N']}, G={r0['G']}** "
                   f"(fp32 state, bf16 activations, L={r0['L']}, T=4)\n")
        stag = "decode_ours_staggered_us" in r0
        out.append("| batch | SGLang SSU decode (us) | SSU GB/s | ours (us) | ours vs SSU | ours GB/s"
                   + (" (% copy)" if copy_gbps else "") + " | "
                   + ("staggered ours (us) | staggered vs SSU | " if stag else "")
                   + "spec: SSU+intermediate+scatter (us) | ours verify+commit (us) | ours vs stock |")
        out.append("|---:" * (9 + (2 if stag else 0)) + "|")
        for r in sub:
            gbs = r["decode_bytes_ours"] / (r["decode_ours_us"] * 1e-6) / 1e9
            gbs_b = r["decode_bytes_ssu"] / (r["decode_ssu_us"] * 1e-6) / 1e9
            pct = f" ({100 * gbs / copy_gbps:.0f}%)" if copy_gbps else ""
            out.append(
                f"| {r['B']} | {_us(r['decode_ssu_us'])} | {gbs_b:.0f} | {_us(r['decode_ours_us'])} | "
                f"{_x(r['decode_ssu_us'], r['decode_ours_us'])} | {gbs:.0f}{pct} | "
                + (f"{_us(r['decode_ours_staggered_us'])} | {_x(r['decode_ssu_us'], r['decode_ours_staggered_us'])} | "
                   if stag else "")
                + f"{_us(r.get('spec_stock_us'))} | "
                f"{_us(r['spec_ours_us'])} | {_x(r.get('spec_stock_us'), r['spec_ours_us'])} |"
            )
    return out


_M2_PLAN_RE = re.compile(r"^decode_ours_((?:\d+x\d+x\d+x\d+)?(?:_?t\d+x\d+x\d+)?|u\d+|bc)_us$")
_M2_VERIFY_RE = re.compile(r"^spec_ours_(t\d+x\d+x\d+|u\d+)_us$")


def _plan_table(sub, base_label, base_us, names, cells):
    """One plan table over the batches of `sub`: a baseline line (`base_us(row)`, 1.00x) and a line per
    plan name (None = the default) with the two cells `cells(row, name)` per batch."""
    lines = ["| plan | " + " | ".join(f"B={r['B']} (us) | B={r['B']} vs stock" for r in sub) + " |",
             "|---" + "|---:" * (2 * len(sub)) + "|",
             f"| {base_label} | " + " | ".join(f"{_us(base_us(r))} | 1.00x" for r in sub) + " |"]
    for name in [None, *names]:
        row_cells = [c for r in sub for c in cells(r, name)]
        lines.append(f"| {'default' if name is None else '`' + name + '`'} | " + " | ".join(row_cells) + " |")
    return lines


def _decode_cells(r, plan):
    k = "decode_ours" + (f"_{plan}" if plan else "")
    a, b, ssu = r.get(f"{k}_us"), r.get(f"{k}_staggered_us"), r["decode_ssu_us"]
    return [f"{_us(a)} / {_us(b)}", f"{_x(ssu, a)} / {_x(ssu, b)}"]


def _spec_cells(r, tile):
    a = r.get("spec_ours_us" if tile is None else f"spec_ours_{tile}_us")
    return [_us(a), _x(r.get("spec_stock_us"), a)]


def m2_plan_tables(rows):
    """The Mamba-2 plans timed by `bench_kernels.py --sweep`, one table per shape with a line per plan
    and a column pair per batch: decode plans (keys `decode_ours_<plan>_us` / `..._staggered_us`;
    `S x BM x W x ST` = split plan, `tBM x NC x W` = chunked tile, both joined by `_`; `u<n>` = the
    exact replay unrolled n entries; `bc` = the ring's B . C launched apart) against SGLang's SSU, and
    verify tiles / unroll depths (`spec_ours_t<tile>_us`, `spec_ours_u<n>_us`) against SGLang's
    verify + scatter."""
    out = []
    for shape in dict.fromkeys(r["shape"] for r in rows if r["family"] == "mamba2"):
        sub = [r for r in rows if r["family"] == "mamba2" and r["shape"] == shape]
        plans = list(dict.fromkeys(m.group(1) for r in sub for k in r for m in [_M2_PLAN_RE.match(k)] if m))
        tiles = list(dict.fromkeys(m.group(1) for r in sub for k in r for m in [_M2_VERIFY_RE.match(k)] if m))
        if plans:
            out.append(f"\n**Mamba-2 {shape}: decode plans vs SGLang's SSU** (synchronised / staggered; "
                       "`split x BM x warps x stages`, `t` = chunked tile `BM x chunks x warps`)\n")
            out += _plan_table(sub, "SSU", lambda r: r["decode_ssu_us"], plans, _decode_cells)
        if tiles:
            out.append(f"\n**Mamba-2 {shape}: verify tiles and replay unroll, verify + commit at T=4 vs SGLang's "
                       "verify + scatter**\n")
            out += _plan_table(sub, "stock", lambda r: r.get("spec_stock_us"), tiles, _spec_cells)
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("path")
    p.add_argument("--copy-gbps", type=float, default=None)
    a = p.parse_args()
    rows = load_rows(a.path)
    print("\n".join(gdn_tables(rows, a.copy_gbps) + m2_tables(rows, a.copy_gbps) + m2_plan_tables(rows)
                    + dispatch_rows(rows)))


if __name__ == "__main__":
    main()
