"""scripts/ncu_gdn_decode.py: the launches it hands to Nsight Compute (ours' decode over a ring
cycle of staggered rows after the stock decode, warm-up outside the profiled region), and its
summary of ncu's raw CSV page (units normalised, medians per kernel)."""

import csv
import io

import pytest

from script_loader import load_script

ncu = load_script("ncu_gdn_decode")


def test_launches_stock_then_a_ring_cycle_of_ours(monkeypatch):
    import sglang.kernels.ops.attention.fla.fused_recurrent as fr

    stock = []
    # SGLang's packed decode does not run under the interpreter: count its calls instead.
    monkeypatch.setattr(fr, "fused_recurrent_gated_delta_rule_packed_decode", lambda *a, **k: stock.append(a[6]))
    B, L = 5, 4
    a = ncu.parse_args(["--device", "cpu", "--dims", "2", "4", "32", "32", "--batch", str(B), "--ring-len", str(L),
                        "--steps", str(L)])
    import replayssm_kernels.gdn as gdn

    calls = []
    convert = gdn.split_ckpt_convert

    def logged_convert(*args, **kw):  # on the same timeline as the profiler markers
        calls.append("convert")
        return convert(*args, **kw)

    monkeypatch.setattr(gdn, "split_ckpt_convert", logged_convert)
    assert ncu.launch(a, calls) is calls
    on, off = ncu.PROFILE_ON, ncu.PROFILE_OFF
    # the warm-up call of each is not in the list; the conversion to the split layout is outside
    # both profiled regions
    assert len(stock) == 1 + L and calls[:L + 4] == [on] + ["stock packed decode"] * L + [off, "convert", on]
    assert calls[-1] == off
    ours = calls[L + 4:-1]
    assert len(ours) == L and all(c.startswith("ours decode, ") for c in ours)
    # staggered rows: over one ring cycle every row flushes once
    assert sum(int(c.split(", ")[1].split()[0]) for c in ours) == B
    # the stock decode saw fp32 checkpoints (the driver converts to the split layout only for ours)
    assert all(s.dtype.is_floating_point and s.shape == (B, 4, 32, 32) for s in stock)


def _page(rows):
    f = io.StringIO()
    csv.writer(f).writerows(rows)
    return [r for r in csv.reader(io.StringIO("==PROF== a line of ncu's own\n" + f.getvalue())) if r]


def test_summary_of_the_raw_page():
    # Nsight Compute 2025.3's name of the DRAM share (session 43's page), and warp instructions
    header = ["ID", "Kernel Name", "gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum",
              "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "launch__registers_per_thread",
              "smsp__inst_issued.sum"]
    units = ["", "", "ns", "Mbyte", "Kbyte", "%", "register/thread", "inst"]
    rows = _page([header, units,
                  ["0", "_gdn_decode_loop_kernel", "190,000", "300", "20,000", "60.5", "128", "85,000,000"],
                  ["1", "_gdn_decode_loop_kernel", "200,000", "320", "22,000", "62.5", "128", "85,600,000"],
                  ["2", "_gdn_decode_loop_kernel", "250,000", "340", "24,000", "64.5", "128", "86,000,000"],
                  ["3", "fused_recurrent_gated_delta_rule_packed_decode_kernel", "360,000", "540", "540,000", "90",
                   "96", "55,000,000"],
                  ["4", "short row"]])
    start = next(i for i, r in enumerate(rows) if "Kernel Name" in r)
    out = {r["kernel"]: r for r in ncu.summarize(rows[start:])}
    ours, stock = out["_gdn_decode_loop_kernel"], out["fused_recurrent_gated_delta_rule_packed_decode_kernel"]
    assert ours["launches"] == 3 and ours["us"] == pytest.approx(200.0)  # median, ns -> us
    assert ours["MB read"] == pytest.approx(320.0) and ours["MB written"] == pytest.approx(22.0)  # Kbyte -> MB
    assert ours["GB/s"] == pytest.approx((320 + 22) * 1e3 / 200.0)
    assert ours["DRAM % peak"] == pytest.approx(62.5) and ours["registers"] == 128
    assert ours["M inst issued"] == pytest.approx(85.6)
    assert stock["GB/s"] == pytest.approx(1080 * 1e3 / 360.0) and "L2 hit %" not in stock
    table = ncu.summary_table(ncu.summarize(rows[start:]))
    assert "| _gdn_decode_loop_kernel | 3 | 200.0 | 320.0 | 22.0 | 1710.0 | 62.5 | - | 128 | - | 85.6 | - |" in table
    # older Nsight Compute versions name the DRAM share `dram__throughput`
    header[5] = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
    old = {r["kernel"]: r for r in ncu.summarize([header, units, rows[start + 2]])}
    assert old["_gdn_decode_loop_kernel"]["DRAM % peak"] == pytest.approx(60.5)


def test_summarize_refuses_a_file_that_is_not_the_raw_page(tmp_path):
    f = tmp_path / "details.txt"
    f.write_text("  _gdn_decode_loop_kernel (8192, 1, 1)x(32, 1, 1), Context 1\n    Duration  us  190\n")
    with pytest.raises(SystemExit, match="no ncu raw page"):
        ncu.main(["--summarize", str(f)])
    with pytest.raises(SystemExit):
        ncu.parse_args(["--plan", "3x16"])
