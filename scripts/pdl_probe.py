"""Probe the GDN prep/state pair with programmatic dependent launch (configs.gdn_pdl) on a GPU.

    python scripts/pdl_probe.py --batches 1,256 --watchdog 120

Session 27 (H200): the GDN kernel tests passed with gdn_pdl=1 (eager launches), but
`bench_kernels.py`, which times CUDA-graph replays, printed nothing in 150 s with it. This script
walks the steps one at a time, printing each before it starts, with a watchdog that dumps every
thread's Python stack and exits when a step does not return (`--watchdog` seconds for the whole
run): eager decode and verify+commit with PDL off and on (outputs, state and rings `torch.equal`),
then the same steps captured in a CUDA graph and replayed (equal to the eager results), then the
graph timing of one decode cycle and of the verify+commit steps with PDL off and on. The table at
the end has the timings; a step that hangs is the last one printed before the stack dump.

Needs a GPU of sm_90 or later (PDL) and no SGLang. `--device cpu` (the CPU tests, under
TRITON_INTERPRET=1) runs the eager steps only, with PDL off both times (the interpreter has no
PDL), and times nothing itself (`time_graph` needs CUDA; the tests stand in for it).
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "triton_kernels"))

import bench_kernels  # noqa: E402

from replayssm_kernels import decode_prepare  # noqa: E402
from replayssm_kernels.configs import gdn_pdl, override  # noqa: E402
from replayssm_kernels.gdn import alloc_gdn_rings, gdn_commit, gdn_replay_decode, gdn_replay_verify  # noqa: E402

_T0 = time.time()


def say(msg: str) -> None:
    print(f"[pdl_probe +{time.time() - _T0:6.1f}s] {msg}", flush=True)


class Setup:
    """One GDN layer's inputs, checkpoints and rings at batch `B` (Qwen3-Next head shape)."""

    def __init__(self, B, H=16, HV=32, K=128, V=128, L=16, T=4, dev="cuda"):
        g = torch.Generator(device="cpu").manual_seed(B)
        act = torch.bfloat16
        self.B, self.H, self.HV, self.K, self.V, self.L, self.T = B, H, HV, K, V, L, T
        self.A_log = (torch.rand(HV, generator=g) * 0.9 + 0.05).log().to(dev)
        self.dt_bias = (torch.randn(HV, generator=g) - 1.0).to(dev)
        self.state0 = (torch.randn(B, HV, V, K, generator=g) * 0.1).to(dev)
        self.slots = torch.arange(B, dtype=torch.int32, device=dev)

        def r(*shape):
            return torch.randn(*shape, generator=g).to(dev, act)
        self.dec = (r(B, H, K), r(B, H, K), r(B, HV, V), r(B, HV), r(B, HV))
        self.ver = (r(B, T, H, K), r(B, T, H, K), r(B, T, HV, V), r(B, T, HV), r(B, T, HV))
        self.acc = torch.randint(1, T + 1, (B,), generator=g, dtype=torch.int32).to(dev)
        self.dev = dev
        self.reset()

    def reset(self):
        B, dev = self.B, self.dev
        self.state = self.state0.clone()
        self.rings_all = alloc_gdn_rings(1, B, self.H, self.HV, self.K, self.V, self.L, torch.bfloat16, dev)
        self.rings = self.rings_all.layer(0)
        self.wpos = torch.zeros(B, dtype=torch.int32, device=dev)
        self.origin = torch.zeros(B, dtype=torch.int32, device=dev)
        self.tickets = torch.zeros(B, dtype=torch.int32, device=dev)
        self.out_d = torch.empty(B, self.HV, self.V, device=dev, dtype=torch.bfloat16)
        self.out_v = torch.empty(B, self.T, self.HV, self.V, device=dev, dtype=torch.bfloat16)

    def decode_step(self):
        row_wp, row_flush = decode_prepare(self.slots, self.wpos, self.L)
        q, k, v, a, b = self.dec
        gdn_replay_decode(q, k, v, a, b, self.A_log, self.dt_bias, self.state, self.rings, self.slots, row_wp,
                          row_flush, self.origin, out=self.out_d)

    def spec_step(self):
        q, k, v, a, b = self.ver
        gdn_replay_verify(q, k, v, a, b, self.A_log, self.dt_bias, self.state, self.rings, self.slots, self.wpos,
                          self.origin, out=self.out_v)
        gdn_commit(self.state[None], self.rings_all, self.slots, self.wpos, self.origin, self.acc, self.T,
                   self.tickets)

    def step(self, kind):
        """The step function of `kind` ("decode" or "spec")."""
        return self.decode_step if kind == "decode" else self.spec_step

    def snapshot(self, kind):
        out = self.out_d if kind == "decode" else self.out_v
        return [out.clone(), self.state.clone(), self.wpos.clone(), self.origin.clone(),
                *(t.clone() for t in self.rings.tensors())]


def sync(dev: str) -> None:
    if dev != "cpu":
        torch.cuda.synchronize()


def run_steps(s: Setup, kind: str, n: int, graph: bool):
    """`n` steps of `kind` from a fresh reset, eager or as one captured step replayed `n` times."""
    step = s.step(kind)
    s.reset()
    if not graph:
        for _ in range(n):
            step()
        sync(s.dev)
        return s.snapshot(kind)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compile outside the capture; the reset below undoes its effects
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    s.reset()
    g = torch.cuda.CUDAGraph()
    # The reset's tensors are the ones the graph captures: reset in place from here on.
    with torch.cuda.graph(g):
        step()
    s.state.copy_(s.state0)
    s.wpos.zero_()
    s.origin.zero_()
    for t in s.rings.tensors():
        t.zero_()
    torch.cuda.synchronize()
    for i in range(n):
        g.replay()
        torch.cuda.synchronize()
    return s.snapshot(kind)


def _probe(args, on_gpu: bool) -> list:
    H, HV, K, V = args.dims
    rows = []
    for B in (int(x) for x in args.batches.split(",")):
        s = Setup(B, H, HV, K, V, args.ring_len, dev=args.device)
        n = 2 * s.L + 3
        for kind in ("decode", "spec"):
            res = {}
            for graph in ((False, True) if on_gpu else (False,)):
                for pdl in (0, 1):
                    say(f"B={B} {kind} {'graph' if graph else 'eager'} pdl={pdl}: {n} steps")
                    with override("gdn_pdl", (pdl,)):
                        res[graph, pdl] = run_steps(s, kind, n, graph)
            ref = res[False, 0]
            for key, got in res.items():
                same = all(torch.equal(x, y) for x, y in zip(got, ref))
                say(f"B={B} {kind} {'graph' if key[0] else 'eager'} pdl={key[1]}: "
                    f"{'equal to' if same else 'DIFFERS from'} eager pdl=0")
                if not same:
                    raise SystemExit(f"B={B} {kind}: results differ with {key}")
            times = {}
            for pdl in (0, 1):
                say(f"B={B} {kind} timing pdl={pdl}")
                with override("gdn_pdl", (pdl,)):
                    s.reset()
                    step = s.step(kind)
                    times[pdl] = bench_kernels.time_graph(lambda: [step() for _ in range(s.L)], s.L, args.reps)
            rows.append((B, kind, times[0], times[1]))
    return rows


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,256")
    ap.add_argument("--watchdog", type=float, default=240.0,
                    help="seconds before the stack dump and exit (0 = none)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dims", type=int, nargs=4, default=(16, 32, 128, 128), metavar=("H", "HV", "K", "V"))
    ap.add_argument("--ring-len", type=int, default=16)
    return ap.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.watchdog > 0:
        faulthandler.dump_traceback_later(args.watchdog, exit=True, file=sys.__stderr__)
    on_gpu = args.device != "cpu"
    if on_gpu:
        cap = torch.cuda.get_device_capability()
        with override("gdn_pdl", (1,)):
            if not gdn_pdl():
                raise SystemExit(f"gdn_pdl cannot be on here (compute capability {cap}, TRITON_INTERPRET="
                                 f"{os.environ.get('TRITON_INTERPRET', '0')}): PDL needs sm_90+ without the "
                                 "interpreter")
    else:
        say("--device cpu: eager steps only, PDL off both times (plumbing check)")
    try:
        rows = _probe(args, on_gpu)
    finally:
        faulthandler.cancel_dump_traceback_later()
    print("\n| batch | step | PDL off (us) | PDL on (us) | on / off |")
    print("|---:|---|---:|---:|---:|")
    for B, kind, t0, t1 in rows:
        print(f"| {B} | {kind} | {t0:.1f} | {t1:.1f} | {t1 / t0:.3f} |")
    return rows


if __name__ == "__main__":
    main()
