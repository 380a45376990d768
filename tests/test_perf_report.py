"""scripts/perf_report.py on recorded H200 rows and on rows with the Mamba-2 decode sweep."""

import json

from script_loader import ROOT, load_script

pr = load_script("perf_report")


def test_tables_from_the_run3_rows():
    rows = pr.load_rows(ROOT / "docs" / "data" / "bench_kernels_2026-11-30_run3.json")
    assert {r["family"] for r in rows} == {"gdn", "mamba2"}
    m2 = "\n".join(pr.m2_tables(rows, None))
    assert "**Mamba-2 super" in m2 and "**Mamba-2 nano9b" in m2
    assert pr.m2_plan_tables(rows) == []  # run 3 timed no split plans


def test_mamba2_plan_table(tmp_path):
    row = {"family": "mamba2", "shape": "super", "NH": 128, "P": 64, "N": 128, "G": 8, "L": 16, "B": 256,
           "decode_ssu_us": 720.0, "decode_ours_us": 331.8, "decode_ours_staggered_us": 344.5,
           "decode_ours_1x16x4x2_us": 300.0, "decode_ours_1x16x4x2_staggered_us": 320.0,
           "decode_ours_1x32x8x2_us": 360.0, "decode_ours_1x32x8x2_staggered_us": float("nan"),
           "decode_ours_t16x8x4_us": 288.0, "decode_ours_t16x8x4_staggered_us": 300.0,
           "decode_ours_1x16x4x2_t16x8x4_us": 240.0, "decode_ours_1x16x4x2_t16x8x4_staggered_us": 250.0,
           "decode_bytes_ours": 1.0, "decode_bytes_ssu": 1.0, "spec_ours_us": 800.0, "spec_stock_us": 2800.0,
           "spec_ours_t16x8x4_us": 700.0, "decode_ours_u8_us": 320.0, "decode_ours_u8_staggered_us": 330.0,
           "spec_ours_u8_us": 780.0, "decode_ours_bc_us": 310.0, "decode_ours_bc_staggered_us": 320.0}
    row1 = {k: v for k, v in row.items() if "1x16x4x2" not in k}
    row1.update(B=1, decode_ssu_us=6.5, decode_ours_us=5.9, decode_ours_staggered_us=5.9)
    path = tmp_path / "bench.log"
    path.write_text('{"gpu": "x"}\n' + json.dumps(row1) + "\n" + json.dumps(row) + "\n")
    lines = pr.m2_plan_tables(pr.load_rows(path))
    assert "B=1 (us) | B=1 vs stock | B=256 (us) | B=256 vs stock" in lines[1]

    def line(label, start):
        return next(ln for ln in lines[start:] if ln.startswith(f"| {label} |")).strip("| ").split(" | ")

    assert line("default", 0)[3:5] == ["331.8 / 344.5", "2.17x / 2.09x"]
    assert line("`1x16x4x2`", 0)[3:5] == ["300.0 / 320.0", "2.40x / 2.25x"]
    assert line("`1x32x8x2`", 0)[4] == "2.00x / -"  # a plan whose staggered time is missing
    assert line("`1x16x4x2`", 0)[1:3] == ["- / -", "- / -"]  # not timed at batch 1
    assert line("`t16x8x4`", 0)[3:5] == ["288.0 / 300.0", "2.50x / 2.40x"]
    assert line("`1x16x4x2_t16x8x4`", 0)[4] == "3.00x / 2.88x"
    v = next(i for i, ln in enumerate(lines) if "verify tiles" in ln)
    assert line("default", v)[3:5] == ["800.0", "3.50x"] and line("`t16x8x4`", v)[3:5] == ["700.0", "4.00x"]
    assert "`1x16x4x2`" not in "\n".join(lines[v:])
    assert line("`u8`", 0)[3:5] == ["320.0 / 330.0", "2.25x / 2.18x"] and line("`u8`", v)[3] == "780.0"
    assert line("`bc`", 0)[3:5] == ["310.0 / 320.0", "2.32x / 2.25x"] and "`bc`" not in "\n".join(lines[v:])


def test_gdn_decode_only_rows():
    """`bench_kernels.py --gdn-decode-only` rows carry no spec keys: the report and the benchmark's
    own table print them with the spec cells empty."""
    rows = pr.load_rows(ROOT / "docs" / "data" / "session31_2026-12-05" / "call2_gdn_dflush" / "bench.json")
    for r in rows:
        for k in [k for k in r if k.startswith("spec_")]:
            del r[k]
    text = "\n".join(pr.gdn_tables(rows, 3000.0) + pr.dispatch_rows(rows))
    assert "| 256 | 425.8 |" in text and "/ 228.7 | 1.86x | - | - | - | - |" in text
    bk = load_script("bench_kernels")
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        bk.print_table(rows, 3000.0)
    assert "| 1.69 | - | - | - | -" in buf.getvalue()


def test_dispatch_rows_follow_the_split_default():
    """A run that timed split checkpoints: the dispatch table shows the split layout's default plan
    (three stages from 64 rows, session 38), not the fastest plan nor the fp32 layout's; a row
    without split timings keeps the fp32 layout's default plan."""
    rows = pr.load_rows(ROOT / "docs" / "data" / "session38_2026-12-06" / "call1_split_sweep" / "bench.json")
    for r in rows:  # recorded before the benchmark wrote the split default's name
        r.setdefault("decode_default_split_cfg", "5x16x1x3x8x0x1x1x8")
    text = "\n".join(pr.dispatch_rows(rows))
    assert "| gdn | HV=32 | 256 | ring, split | 366.1 | 190.3 | 1.92x |" in text
    assert "| gdn | HV=64 | 256 | ring, split | 723.9 | 353.9 | 2.05x |" in text
    for r in rows:
        r["decode_default_split_cfg"] = "5x16x1x2x8x0x1x1x8"
    assert "| gdn | HV=32 | 256 | ring, split | 366.1 | 192.9 | 1.90x |" in "\n".join(pr.dispatch_rows(rows))
    for r in rows:
        for k in [k for k in r if k.startswith("decode_ours_split")]:
            del r[k]
    assert "| gdn | HV=32 | 256 | ring | 366.1 | 230.5 | 1.59x |" in "\n".join(pr.dispatch_rows(rows))
