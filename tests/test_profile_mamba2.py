"""The Mamba-2 phase profiler end to end on the CPU (interpreter), with the GPU timer replaced by
a call counter: every plan and unroll depth it names must launch, and the split plans' launches
must be timed one at a time."""

import contextlib
import json
import sys

import pytest
import torch

from script_loader import load_script

prof = load_script("profile_mamba2_phases")


def test_profile_mamba2_phases_runs_every_plan(monkeypatch, tmp_path, capsys):
    calls = []  # per timed call: the decode MODEs it launched

    def fake_time(fn, units, reps=30, warmup=2):
        before = len(seen_modes)
        fn()
        calls.append(set(seen_modes[before:]))
        return float(len(calls))

    monkeypatch.setattr(sys.modules["bench_kernels"], "time_graph", fake_time)
    if not hasattr(torch.cpu, "device"):  # SGLang's SSU launcher enters the device module's context
        monkeypatch.setattr(torch.cpu, "device", lambda index=None: contextlib.nullcontext(), raising=False)
    seen_modes = []
    from replayssm_kernels.mamba2 import decode as dec_mod

    kernel = dec_mod._mamba2_decode_kernel

    class Spy:  # records the MODE of every decode launch (`kernel[grid](..., MODE=m)`)
        def __getitem__(self, grid):
            def launch(*a, **k):
                seen_modes.append(k["MODE"])
                return kernel[grid](*a, **k)
            return launch

    monkeypatch.setattr(dec_mod, "_mamba2_decode_kernel", Spy())
    out = tmp_path / "p.json"
    prof.main(["--device", "cpu", "--heads", "2", "--batch", "2", "--ring-len", "4", "--reps", "1",
               "--plans", "default,t16x4x1,1x32x8x2", "--fills", "0,2", "--unrolls", "4,16", "--ceiling", "--json", str(out)])
    res = json.loads(out.read_text())["times_us"]
    for key in ("ssu", "exact", "default_nonflush", "default_u4_flush", "default_u16_cycle",
                "default_nonflush_wp0", "default_nonflush_wp2", "t16x4x1_u16_cycle", "1x32x8x2_nonflush_launch1", "1x32x8x2_nonflush_launch2", "1x32x8x2_u16_flush", "read_ceiling_R128_w8_slot"):
        assert key in res, key
    assert {0, 1, 2} <= set(seen_modes)
    # the split plan's launches are timed one at a time as well as together
    assert {1} in calls and {2} in calls and {1, 2} in calls
    # cycle = ((L - 1) * non-flush + flush) / L
    assert res["default_u4_cycle"] == pytest.approx((3 * res["default_nonflush"] + res["default_u4_flush"]) / 4, abs=0.06)
    assert "vs SSU" in capsys.readouterr().out
