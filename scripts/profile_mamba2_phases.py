"""Per-phase timing of the Mamba-2 ReplaySSM decode (where does a ring cycle go?).

    python scripts/profile_mamba2_phases.py [--batch 256] [--shape super|nano] [--json out.json]

Times, with CUDA graphs, one launch of SGLang's SSU decode step, our exact step (every row flushes
with an empty ring), and for each decode plan and replay unroll depth: a step where no row flushes
(ring fills --fills, their mean) and a step where every row flushes a full ring (fill L-1). For split plans it also
times each of the two launches alone on a non-flush step (the flush launch then has no work: its
cost there is pure overhead). `cycle` = (15 * non-flush + flush) / 16, the synchronised ring-cycle
mean that `bench_kernels.py` times. Prints registers and spills of each compiled variant.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_kernels import M2_SHAPES, fill_rings_randn, phase_timer  # noqa: E402
from read_ceiling import read_ceiling  # noqa: E402

# (key, overrides): the default plan and the candidates for the Super-shape decode
PLANS = (
    ("default", []),
    ("t32x4x4", [("mamba2_decode_tile", (32, 4, 4))]),
    ("t64x1x2", [("mamba2_decode_tile", (64, 1, 2))]),
    ("t64x1x8", [("mamba2_decode_tile", (64, 1, 8))]),
    ("t32x2x2", [("mamba2_decode_tile", (32, 2, 2))]),
    ("t16x4x1", [("mamba2_decode_tile", (16, 4, 1))]),
    ("t16x8x4", [("mamba2_decode_tile", (16, 8, 4))]),
    ("bc", [("mamba2_ring_bc_min_batch", (1,))]),  # the default tile, ring B . C launched apart
    ("1x32x8x2", [("mamba2_decode", (1, 32, 8, 2))]),
    ("1x32x4x2", [("mamba2_decode", (1, 32, 4, 2))]),
    ("1x64x8x2", [("mamba2_decode", (1, 64, 8, 2))]),
)
UNROLLS = (4, 8, 16)


@contextlib.contextmanager
def only_mode(dec_mod, mode):
    """Run only the launch of `mode` of a split plan (1: flush rows, 2: the others)."""
    orig = dec_mod.decode_launches
    dec_mod.decode_launches = lambda P, N, rows: [lt for lt in orig(P, N, rows) if lt[0] == mode]
    try:
        yield
    finally:
        dec_mod.decode_launches = orig


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--shape", default="super", choices=[s[0] for s in M2_SHAPES])
    p.add_argument("--ring-len", type=int, default=16)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--plans", default=",".join(k for k, _ in PLANS))
    p.add_argument("--unrolls", default=",".join(map(str, UNROLLS)))
    p.add_argument("--fills", default="8", help="ring fills (pending entries) of the timed non-flush steps; "
                   "the plan's non-flush time is their mean")
    p.add_argument("--json")
    p.add_argument("--ceiling", action="store_true", help="also time plain streaming reads of the state")
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # tests: cpu + TRITON_INTERPRET
    p.add_argument("--heads", type=int, help=argparse.SUPPRESS)  # tests: fewer heads (and one group)
    args = p.parse_args(argv)

    from sglang.kernels.ops.mamba.triton_ops.mamba_ssm import selective_state_update

    from replayssm_kernels.configs import override, overrides
    from replayssm_kernels.mamba2 import alloc_mamba2_rings, mamba2_replay_decode
    from replayssm_kernels.mamba2 import decode as dec_mod

    _, NH, P, N, G = next(s for s in M2_SHAPES if s[0] == args.shape)
    if args.heads:
        NH, G = args.heads, 1
    dev, act, B, L = args.device, torch.bfloat16, args.batch, args.ring_len
    A = -torch.rand(NH, device=dev) * 4 - 0.5
    D = torch.randn(NH, device=dev)
    dt_bias = torch.randn(NH, device=dev) - 2.0
    state = torch.randn(B, NH, P, N, device=dev) * 0.1
    slots = torch.arange(B, dtype=torch.int32, device=dev)
    x = torch.randn(B, NH, P, device=dev, dtype=act)
    dt = torch.randn(B, NH, device=dev, dtype=act)
    Bm = torch.randn(B, G, N, device=dev, dtype=act)
    C = torch.randn(B, G, N, device=dev, dtype=act)
    y = torch.empty(B, NH, P, device=dev, dtype=act)
    rings_all = alloc_mamba2_rings(1, B, NH, P, G, N, L, act, dev)
    fill_rings_randn(rings_all)
    rings = rings_all.layer(0)
    origin = torch.zeros(B, dtype=torch.int32, device=dev)
    res = {}
    t = phase_timer(res, args.reps)

    A_e = A[:, None, None].expand(NH, P, N)
    t("ssu", lambda: selective_state_update(
        state, x, dt[:, :, None].expand(B, NH, P), A_e, Bm, C, D[:, None].expand(NH, P), z=None,
        dt_bias=dt_bias[:, None].expand(NH, P), dt_softplus=True, state_batch_indices=slots, out=y))

    def phase(wp, flush):
        row_wp = torch.full((B,), wp, dtype=torch.int32, device=dev)
        row_fl = torch.full((B,), int(flush), dtype=torch.int32, device=dev)
        return lambda: mamba2_replay_decode(x, dt, Bm, C, A, D, dt_bias, state, rings, slots, row_wp, row_fl,
                                            origin, out=y)

    t("exact", phase(0, True))
    if args.ceiling:
        read_ceiling(state, slots, t)
    plans = dict(PLANS)
    keys = args.plans.split(",")
    unrolls = [int(v) for v in args.unrolls.split(",")]
    fills = [int(v) for v in args.fills.split(",")]
    for key in keys:
        with overrides(plans[key]):
            for u in unrolls:
                with override("mamba2_replay_unroll", (u,)):
                    name = f"{key}_u{u}"
                    if f"{key}_nonflush" not in res:  # the non-flush code does not replay: once per plan
                        for wp in fills:
                            t(f"{key}_nonflush_wp{wp}", phase(wp, False))
                        res[f"{key}_nonflush"] = round(sum(res[f"{key}_nonflush_wp{wp}"] for wp in fills) / len(fills), 1)
                        if key[0].isdigit():
                            for mode in (1, 2):
                                with only_mode(dec_mod, mode):
                                    t(f"{key}_nonflush_launch{mode}", phase(L // 2, False))
                    t(f"{name}_flush", phase(L - 1, True))
                    res[f"{name}_cycle"] = round(((L - 1) * res[f"{key}_nonflush"] + res[f"{name}_flush"]) / L, 1)
                    print(f"{name + '_cycle':44s} {res[name + '_cycle']:9.1f} us  "
                          f"({res['ssu'] / res[name + '_cycle']:.2f}x SSU)", flush=True)
    regs = {}
    for kern in (dec_mod._mamba2_decode_kernel,) if dev == "cuda" else ():
        for dev_cache in kern.device_caches.values():
            for i, ck in enumerate(dev_cache[0].values()):
                ck._init_handles()
                regs[f"{kern.fn.__name__}#{i}"] = (ck.n_regs, ck.n_spills, ck.metadata.num_warps)
    info = {"gpu": torch.cuda.get_device_name() if dev == "cuda" else dev, "batch": B, "shape": args.shape,
            "L": L, "argv": sys.argv}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "times_us": res, "regs_spills_warps": regs}, f, indent=1)
    print(json.dumps({"times_us": res, "regs_spills_warps": regs}))
    print(f"\n{'plan':14s} {'unroll':>6s} {'non-flush':>10s} {'flush':>8s} {'cycle':>8s} {'vs SSU':>7s}")
    for key in keys:
        for u in unrolls:
            c = res[f"{key}_u{u}_cycle"]
            print(f"{key:14s} {u:6d} {res[key + '_nonflush']:10.1f} {res[f'{key}_u{u}_flush']:8.1f} {c:8.1f} "
                  f"{res['ssu'] / c:6.2f}x")


if __name__ == "__main__":
    main()
