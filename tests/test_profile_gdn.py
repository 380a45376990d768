"""The GDN phase profiler end to end on the CPU (interpreter), with the GPU timer replaced by a
call counter: every verify plan and ring fill it names is timed, and the two-launch verify's
launches are timed one at a time as well as together."""

import contextlib
import sys

import pytest
import torch

from script_loader import load_script

prof = load_script("profile_gdn_phases")


def _profile_on_cpu(monkeypatch, fake_time):
    """The profiler on the CPU interpreter: `fake_time` stands in for the GPU timer, and SGLang's
    packed decode (which does not run under the interpreter; its baseline line is not what these
    tests check) launches nothing."""
    monkeypatch.setattr(sys.modules["bench_kernels"], "time_graph", fake_time)
    import sglang.kernels.ops.attention.fla.fused_recurrent as fr
    monkeypatch.setattr(fr, "fused_recurrent_gated_delta_rule_packed_decode", lambda *a, **k: None)
    if not hasattr(torch.cpu, "device"):
        monkeypatch.setattr(torch.cpu, "device", lambda index=None: contextlib.nullcontext(), raising=False)


def test_profile_gdn_phases_times_each_verify_launch_alone(monkeypatch):
    from replayssm_kernels.gdn import verify as ver_mod

    launched = []  # kernel names, in launch order
    calls = []  # per timed call: the set of verify kernels it launched

    def spy(name):
        kernel = getattr(ver_mod, name)

        class Spy:
            def __getitem__(self, grid):
                def launch(*a, **k):
                    launched.append(name)
                    return kernel[grid](*a, **k)
                return launch
        return Spy()

    for name in ("_gdn_verify_prep_kernel", "_gdn_verify_state_kernel", "_gdn_verify_state_loop_kernel"):
        monkeypatch.setattr(ver_mod, name, spy(name))

    def fake_time(fn, units, reps=30, warmup=2):
        before = len(launched)
        fn()
        calls.append(set(launched[before:]))
        return float(len(calls))

    _profile_on_cpu(monkeypatch, fake_time)
    res = prof.main(["--device", "cpu", "--dims", "2", "4", "32", "32", "--batch", "2", "--ring-len", "8",
                     "--reps", "1", "--decode-configs", "3x16x1x3x8x0x1", "--verify-configs", "16x1x2x4,32x1x2x0,16x1x2x5",
                     "--verify-fills", "0,4", "--fold-lens", "3"])
    for key in ("packed_decode", "decode_nonflush_3x16x1x3x8x0x1_wp8", "decode_flush_3x16x1x3x8x0x1_wp15",
                "ours_fold_n3", "ours_verify_T4_wp0_16x1x2x4", "ours_verify_T4_wp4_16x1x2x4_prep",
                "ours_verify_T4_wp4_16x1x2x4_state", "ours_verify_T4_wp4_32x1x2x0", "sglang_verify_T4_intermediate"):
        assert key in res, key
    assert "ours_verify_T4_wp0_32x1x2x0_prep" not in res  # the one-launch plan has no separate launches
    both, prep, state = {"_gdn_verify_prep_kernel", "_gdn_verify_state_kernel"}, {"_gdn_verify_prep_kernel"}, \
        {"_gdn_verify_state_kernel"}
    order = list(res)
    i = order.index("ours_verify_T4_wp4_16x1x2x4")
    assert calls[i] == both and calls[i + 1] == prep and calls[i + 2] == state
    # products 5: the prep launch, then the looping state launch; each alone likewise
    i = order.index("ours_verify_T4_wp4_16x1x2x5")
    loop = {"_gdn_verify_state_loop_kernel"}
    assert calls[i] == prep | loop and calls[i + 1] == prep and calls[i + 2] == loop
    # the kernels are restored after each launch-alone timing
    assert ver_mod._gdn_verify_prep_kernel.__class__.__name__ == "Spy"
    assert ver_mod._gdn_verify_state_loop_kernel.__class__.__name__ == "Spy"


def test_profile_gdn_phases_refuses_a_window_that_does_not_fit():
    with pytest.raises(SystemExit, match="verify-fills"):
        prof.main(["--device", "cpu", "--ring-len", "8", "--verify-fills", "6"])
    with pytest.raises(SystemExit, match="verify-configs"):
        prof.main(["--device", "cpu", "--verify-configs", "16x1"])


def test_profile_gdn_phases_times_decode_cycles_per_row_order(monkeypatch):
    """`--cycle-spreads`: a synchronised cycle and one staggered cycle per row order, each of L
    decode launches; the state launch takes the rows in decode_row_order's order exactly when a
    spread is given."""
    from replayssm_kernels.gdn import verify as ver_mod

    kernel = ver_mod._gdn_verify_state_kernel
    orders = []  # per state launch: the ORDER flag it was compiled with

    class Spy:
        def __getitem__(self, grid):
            def launch(*a, **k):
                orders.append(bool(k.get("ORDER")))
                return kernel[grid](*a, **k)
            return launch

    monkeypatch.setattr(ver_mod, "_gdn_verify_state_kernel", Spy())
    timed = []  # per timed cycle: the ORDER flags of its launches

    def fake_time(fn, units, reps=30, warmup=2):
        before = len(orders)
        fn()
        timed.append((units, orders[before:]))
        return 1.0

    _profile_on_cpu(monkeypatch, fake_time)
    res = prof.main(["--device", "cpu", "--dims", "2", "4", "32", "32", "--batch", "3", "--ring-len", "8",
                     "--reps", "1", "--decode-configs", "3x16x1x3x8x0x1", "--cycle-spreads", "off,0,50",
                     "--decode-launches", "--no-verify", "--verify-fills", "0", "--fold-lens", "2"])
    keys = [f"decode_cycle_3x16x1x3x8x0x1_{x}" for x in ("sync", "stag_off", "stag_sp0", "stag_sp50")]
    assert all(key in res for key in keys)
    # --decode-launches: the non-flush step's launches alone; the prep one launches no state kernel
    order = list(res)
    i = order.index("decode_nonflush_3x16x1x3x8x0x1_wp8")
    assert order[i + 1:i + 3] == ["decode_nonflush_3x16x1x3x8x0x1_wp8_prep", "decode_nonflush_3x16x1x3x8x0x1_wp8_state"]
    units = [u for u, _ in timed if u == 1]
    flags = [f for u, f in timed if u == 1]
    assert flags[i] == [False] and flags[i + 1] == [] and flags[i + 2] == [False] and len(units) >= i + 3
    cycles = [t for t in timed if t[0] == 8]  # the cycles: L = 8 launches each
    assert [flags for _, flags in cycles] == [[False] * 8, [False] * 8, [True] * 8, [True] * 8]
    with pytest.raises(SystemExit, match="cycle-spreads"):
        prof.main(["--device", "cpu", "--cycle-spreads", "101"])
