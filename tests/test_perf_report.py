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
           "decode_bytes_ours": 1.0, "decode_bytes_ssu": 1.0, "spec_ours_us": 1.0}
    path = tmp_path / "bench.log"
    path.write_text('{"gpu": "x"}\n' + json.dumps(row) + "\n")
    lines = pr.m2_plan_tables(pr.load_rows(path))
    assert "`1x16x4x2` (us)" in lines[1] and "`1x32x8x2` vs SSU" in lines[1]
    body = lines[-1].split(" | ")
    assert body[2] == "331.8 / 344.5" and body[3] == "2.17x / 2.09x"
    assert body[4] == "300.0 / 320.0" and body[5] == "2.40x / 2.25x"
    assert body[7].rstrip(" |") == "2.00x / -"  # a plan whose staggered time is missing
