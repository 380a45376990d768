"""Per-phase timing of the GDN ReplaySSM kernels (where does a decode cycle / spec step go?).

    python scripts/profile_gdn_phases.py [--batch 256] [--hv 32]

Times, with CUDA graphs, one launch of: SGLang's packed decode and single-token recurrent update;
with `--ceiling` a plain streaming read of the whole state (`read_ceiling.py`);
our decode on a non-flush step at several ring fills and on a flush step, for each output-path
variant (warp reductions vs tf32x3 tensor-core dots); the exact fold at several lengths; the
verify (T=4) at several launch configs and ring fills, and for the two-launch verify (products 4,
the default, and 5, its looping state launch) each of its launches alone (`_prep` / `_state`:
the other one skipped), so a spec
step's time splits into window algebra, the pass over the state, and the commit fold. Prints
registers and spills of each compiled variant.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
import bench_kernels  # noqa: E402
from bench_kernels import DECODE_CONFIGS, fill_rings_randn, phase_timer, staggered_snaps  # noqa: E402
from read_ceiling import read_ceiling  # noqa: E402


class _Skipped:
    """Stands in for a Triton kernel: `kernel[grid](...)` launches nothing."""

    def __getitem__(self, grid):
        return lambda *a, **k: None


@contextlib.contextmanager
def only_verify_launch(ver_mod, which: str):
    """Run only one launch of the two-launch verify: "prep" or "state" (either state kernel)."""
    names = {"prep": ("_gdn_verify_state_kernel", "_gdn_verify_state_loop_kernel"),
             "state": ("_gdn_verify_prep_kernel",)}
    orig = {n: getattr(ver_mod, n) for n in names[which]}
    for n in orig:
        setattr(ver_mod, n, _Skipped())
    try:
        yield
    finally:
        for n, kern in orig.items():
            setattr(ver_mod, n, kern)


def _plans(text: str, name: str, flag: str) -> tuple[tuple[int, ...], ...]:
    """Comma-separated plans of tunable `name`, checked as REPLAYSSM_CONFIG's entries are."""
    from replayssm_kernels.configs import parse_plan

    out = tuple(parse_plan(name, c) for c in text.split(",") if c)
    if any(c is None for c in out):
        raise SystemExit(f"{flag}: each plan is a {name} entry of REPLAYSSM_CONFIG (x-separated numbers), got {text!r}")
    return out


def parse_args(argv=None):
    """The profiler's flags, checked (no GPU, no SGLang import)."""
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hv", type=int, default=32)
    p.add_argument("--ring-len", type=int, default=16)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--ceiling", action="store_true", help="also time plain streaming reads of the state")
    p.add_argument("--decode-configs", default=None,
                   help="comma-separated GDN decode plans, each 7 x-separated numbers as in REPLAYSSM_CONFIG's "
                        "gdn_decode (default: bench_kernels.DECODE_CONFIGS)")
    p.add_argument("--cycle-spreads", default="",
                   help="also time whole decode cycles (L launches, per launch): rows synchronised, and rows "
                        "staggered over the ring as served requests are, once per comma-separated row order "
                        "('off' = batch order, N = configs.gdn_flush_spread N: flush rows spread over the first "
                        "N%% of the launch)")
    p.add_argument("--decode-launches", action="store_true",
                   help="also time the non-flush decode's two launches alone (plans 2 and 3: the per-head prep, "
                        "then the pass over the state), as the verify's are")
    p.add_argument("--no-verify", action="store_true", help="skip the verify launches")
    p.add_argument("--verify-configs", default="16x1x2x4,8x1x2x4,32x1x2x4",
                   help="GDN verify plans BVxWARPSxSTAGESxPRODUCTS as in REPLAYSSM_CONFIG's gdn_verify (default: "
                        "the default two-launch plan and its 8/32-column tiles; the one-launch plans of run 3 "
                        "were 32x1x2x0,32x2x2x0,32x1x2x1,...)")
    p.add_argument("--verify-fills", default="0,8,12", help="committed ring entries before the T=4 window")
    p.add_argument("--fold-lens", default="4,12,15", help="entries replayed by the timed commit folds")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # tests: cpu + TRITON_INTERPRET
    p.add_argument("--dims", type=int, nargs=4, metavar=("H", "HV", "K", "V"), help=argparse.SUPPRESS)  # tests
    args = p.parse_args(argv)
    args.decode_plans = (_plans(args.decode_configs, "gdn_decode", "--decode-configs") if args.decode_configs
                         else DECODE_CONFIGS)
    args.verify_plans = () if args.no_verify else _plans(args.verify_configs, "gdn_verify", "--verify-configs")
    args.fills = [int(x) for x in args.verify_fills.split(",") if x]
    if any(not 0 <= f <= args.ring_len - 4 for f in args.fills):
        raise SystemExit(f"--verify-fills: each in 0..ring_len-4 (the window must fit), got {args.fills}")
    args.folds = [int(x) for x in args.fold_lens.split(",") if x]
    try:
        args.spreads = [-1 if x.strip() == "off" else int(x) for x in args.cycle_spreads.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--cycle-spreads: comma-separated 'off' or 0..100, got {args.cycle_spreads!r}")
    if any(not -1 <= x <= 100 for x in args.spreads):
        raise SystemExit(f"--cycle-spreads: each 'off' or 0..100, got {args.cycle_spreads!r}")
    return args


def main(argv=None):
    args = parse_args(argv)
    decode_configs, verify_configs, verify_fills = args.decode_plans, args.verify_plans, args.fills

    from sglang.kernels.ops.attention.fla.fused_recurrent import fused_recurrent_gated_delta_rule_packed_decode
    from sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update,
    )

    from replayssm_kernels import decode_row_order
    from replayssm_kernels.configs import override
    from replayssm_kernels.gdn import alloc_gdn_rings, gdn_replay_decode, gdn_replay_fold, gdn_replay_verify
    from replayssm_kernels.gdn import decode as dec_mod
    from replayssm_kernels.gdn import verify as ver_mod

    dev, act = args.device, torch.bfloat16
    H, HV, K, V = args.dims or (16, args.hv, 128, 128)
    B, L, T = args.batch, args.ring_len, 4
    A_log = (torch.rand(HV, device=dev) * 0.9 + 0.05).log()
    dt_bias = torch.randn(HV, device=dev) - 1.0
    state = torch.randn(B, HV, V, K, device=dev) * 0.1
    slots = torch.arange(B, dtype=torch.int32, device=dev)
    mixed = torch.randn(B, 2 * H * K + HV * V, device=dev, dtype=act)
    a = torch.randn(B, HV, device=dev, dtype=act)
    b = torch.randn(B, HV, device=dev, dtype=act)
    q, k, v = (mixed[:, : H * K].view(B, H, K), mixed[:, H * K: 2 * H * K].view(B, H, K),
               mixed[:, 2 * H * K:].view(B, HV, V))
    out = torch.empty(B, 1, HV, V, device=dev, dtype=act)
    rings_all = alloc_gdn_rings(1, B, H, HV, K, V, L, act, dev)
    fill_rings_randn(rings_all, 0.1)
    rings_all.g.copy_(-rings_all.g.abs())
    rings = rings_all.layer(0)
    origin = torch.zeros(B, dtype=torch.int32, device=dev)
    res = {}
    t = phase_timer(res, args.reps, width=40)

    t("packed_decode", lambda: fused_recurrent_gated_delta_rule_packed_decode(
        mixed, a, b, A_log, dt_bias, K ** -0.5, state, out, slots, use_qk_l2norm_in_kernel=True))
    if args.ceiling:
        read_ceiling(state, slots, t)
    st2 = state.clone()
    t("sglang_recurrent_T1", lambda: fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, a=a[:, None], dt_bias=dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
        q=q[:, None], k=k[:, None], v=v[:, None], b=b[:, None], initial_state_source=st2,
        initial_state_indices=slots, use_qk_l2norm_in_kernel=True))
    del st2
    o2 = torch.empty(B, HV, V, device=dev, dtype=act)
    for cfg in decode_configs:
        name = "x".join(map(str, cfg))
        with override("gdn_decode", cfg):
            for wp in (0, 8, 15):
                row_wp = torch.full((B,), wp, dtype=torch.int32, device=dev)
                row_fl = torch.zeros(B, dtype=torch.int32, device=dev)
                t(f"decode_nonflush_{name}_wp{wp}", lambda: gdn_replay_decode(
                    q, k, v, a, b, A_log, dt_bias, state, rings, slots, row_wp, row_fl, origin, out=o2))
                if args.decode_launches and cfg[0] in (2, 3):  # plans on the two-launch pair: each alone
                    for which in ("prep", "state"):
                        with only_verify_launch(ver_mod, which):
                            t(f"decode_nonflush_{name}_wp{wp}_{which}", lambda: gdn_replay_decode(
                                q, k, v, a, b, A_log, dt_bias, state, rings, slots, row_wp, row_fl, origin, out=o2))
            for wp in (0, 15):
                row_wp = torch.full((B,), wp, dtype=torch.int32, device=dev)
                row_fl = torch.ones(B, dtype=torch.int32, device=dev)
                t(f"decode_flush_{name}_wp{wp}", lambda: gdn_replay_decode(
                    q, k, v, a, b, A_log, dt_bias, state, rings, slots, row_wp, row_fl, origin, out=o2))
            if args.spreads:
                _decode_cycles(res, args, name, B, L, dev, lambda rw, rf, order: gdn_replay_decode(
                    q, k, v, a, b, A_log, dt_bias, state, rings, slots, rw, rf, origin, out=o2, row_order=order),
                    decode_row_order)
    for n in args.folds:
        nf = torch.full((B,), n, dtype=torch.int32, device=dev)
        t(f"ours_fold_n{n}", lambda: gdn_replay_fold(state, rings, slots, nf, origin))
    qs = torch.randn(B, T, H, K, device=dev, dtype=act)
    ks = torch.randn(B, T, H, K, device=dev, dtype=act)
    vs = torch.randn(B, T, HV, V, device=dev, dtype=act)
    as_ = torch.randn(B, T, HV, device=dev, dtype=act)
    bs_ = torch.randn(B, T, HV, device=dev, dtype=act)
    ov = torch.empty(B, T, HV, V, device=dev, dtype=act)
    for cfg in verify_configs:
        name = "x".join(map(str, cfg))
        with override("gdn_verify", cfg):
            for fill in verify_fills:
                wpos = torch.full((B,), fill, dtype=torch.int32, device=dev)

                def verify():
                    gdn_replay_verify(qs, ks, vs, as_, bs_, A_log, dt_bias, state, rings, slots, wpos, origin,
                                      out=ov)
                t(f"ours_verify_T4_wp{fill}_{name}", verify)
                if len(cfg) >= 4 and cfg[3] in (4, 5):  # the two-launch verify: each launch alone
                    for which in ("prep", "state"):
                        with only_verify_launch(ver_mod, which):
                            t(f"ours_verify_T4_wp{fill}_{name}_{which}", verify)
    inter = torch.empty(B + 1, T, HV, V, K, device=dev)
    cu = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=dev)
    t("sglang_verify_T4_intermediate", lambda: fused_sigmoid_gating_delta_rule_update(
        A_log=A_log, a=as_.view(1, B * T, HV), dt_bias=dt_bias, softplus_beta=1.0, softplus_threshold=20.0,
        q=qs.view(1, B * T, H, K), k=ks.view(1, B * T, H, K), v=vs.view(1, B * T, HV, V),
        b=bs_.view(1, B * T, HV), initial_state_source=state, initial_state_indices=slots, cu_seqlens=cu,
        use_qk_l2norm_in_kernel=True, disable_state_update=True, intermediate_states_buffer=inter,
        intermediate_state_indices=slots, cache_steps=T))
    regs = {}
    try:
        _collect_regs(regs, dec_mod, ver_mod)
    except Exception as e:  # diagnostics only: report why registers could not be read
        regs["error"] = repr(e)
    print(json.dumps({"times_us": res, "regs_spills_warps_smem": regs}))
    return res


def _decode_cycles(res, args, name, B, L, dev, step, decode_row_order):
    """Per-launch time of a whole decode cycle (L launches in one graph): every row at the same
    ring position (one launch in L flushes every row), then rows staggered over the ring (every
    launch flushes a 1/L share) in each row order of `args.spreads`."""
    sync = []
    for j in range(L):
        rw = torch.full((B,), j, dtype=torch.int32, device=dev)
        sync.append((rw, (rw == L - 1).to(torch.int32)))
    stag = [snap[0] for snap in staggered_snaps(B, L, 1, dev)]
    cases = [("sync", sync, -1)] + [(f"stag_{'off' if sp < 0 else f'sp{sp}'}", stag, sp) for sp in args.spreads]
    for label, snaps, sp in cases:
        orders = [decode_row_order(rf, sp) if sp >= 0 else None for _, rf in snaps]

        def cycle():
            for (rw, rf), order in zip(snaps, orders):
                step(rw, rf, order)
        key = f"decode_cycle_{name}_{label}"
        res[key] = round(bench_kernels.time_graph(cycle, L, args.reps), 1)
        print(f"{key:40s} {res[key]:9.1f} us", flush=True)


def _collect_regs(regs, dec_mod, ver_mod):
    for kern in (dec_mod._gdn_decode_kernel, ver_mod._gdn_verify_kernel, ver_mod._gdn_verify_mm_kernel,
                 ver_mod._gdn_verify_prep_kernel, ver_mod._gdn_verify_state_kernel,
                 ver_mod._gdn_verify_state_loop_kernel, ver_mod._gdn_verify_fused_kernel,
                 dec_mod._gdn_decode_loop_kernel):
        for dev_cache in kern.device_caches.values():
            for i, ck in enumerate(dev_cache[0].values()):
                ck._init_handles()
                regs[f"{kern.fn.__name__}#{i}"] = (ck.n_regs, ck.n_spills, ck.metadata.num_warps,
                                                   ck.metadata.shared)


if __name__ == "__main__":
    main()
