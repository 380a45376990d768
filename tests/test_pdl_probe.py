"""scripts/pdl_probe.py's plumbing on the CPU (the GPU probe of configs.gdn_pdl): its eager decode
and verify+commit steps run the real kernels from a fresh reset each time and compare, and a
result that differs stops it."""

import pytest
from script_loader import load_script

probe = load_script("pdl_probe")


def _fake_time(calls):
    def fake(fn, units, reps=30, warmup=2):
        fn()
        calls.append(units)
        return float(len(calls))
    return fake


def test_pdl_probe_runs_on_cpu(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(probe.bench_kernels, "time_graph", _fake_time(calls))
    rows = probe.main(["--device", "cpu", "--batches", "2", "--dims", "2", "4", "16", "16", "--ring-len", "8",
                       "--watchdog", "600"])
    assert [(r[0], r[1]) for r in rows] == [(2, "decode"), (2, "spec")]
    assert calls == [8, 8, 8, 8]  # a ring cycle per timing, PDL off and on, decode and spec
    out = capsys.readouterr().out
    assert out.count("equal to eager pdl=0") == 4 and "| 2 | spec |" in out


def test_pdl_probe_stops_on_a_difference(monkeypatch):
    """Eager results that differ between the two runs (here: the second decode run's output
    perturbed) stop the probe with the step named."""
    calls = []
    monkeypatch.setattr(probe.bench_kernels, "time_graph", _fake_time(calls))
    real = probe.run_steps
    seen = []

    def perturbed(s, kind, n, graph):
        snap = real(s, kind, n, graph)
        seen.append(kind)
        if len(seen) == 2:
            snap[0] = snap[0] + 1
        return snap
    monkeypatch.setattr(probe, "run_steps", perturbed)
    with pytest.raises(SystemExit, match="decode: results differ"):
        probe.main(["--device", "cpu", "--batches", "2", "--dims", "2", "4", "16", "16", "--ring-len", "8",
                    "--watchdog", "0"])
    assert seen == ["decode", "decode"]
