"""Per-phase timing of the GDN ReplaySSM kernels (where does a decode cycle / spec step go?).

    python scripts/profile_gdn_phases.py [--batch 256] [--hv 32]

Times, with CUDA graphs, one launch of: SGLang's packed decode and single-token recurrent update;
with `--ceiling` a plain streaming read of the whole state (`read_ceiling.py`);
our decode on a non-flush step at several ring fills and on a flush step, for each output-path
variant (warp reductions vs tf32x3 tensor-core dots); the exact fold at several lengths; the
verify kernel at several launch configs. Prints registers and spills of each compiled variant.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_kernels import DECODE_CONFIGS, fill_rings_randn, phase_timer  # noqa: E402
from read_ceiling import read_ceiling  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hv", type=int, default=32)
    p.add_argument("--ring-len", type=int, default=16)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--ceiling", action="store_true", help="also time plain streaming reads of the state")
    p.add_argument("--decode-configs", default=None,
                   help="comma-separated GDN decode plans, each 7 x-separated numbers as in REPLAYSSM_CONFIG's "
                        "gdn_decode (default: bench_kernels.DECODE_CONFIGS)")
    p.add_argument("--no-verify", action="store_true", help="skip the verify launches")
    args = p.parse_args()
    decode_configs = (tuple(tuple(int(x) for x in c.split("x")) for c in args.decode_configs.split(","))
                      if args.decode_configs else DECODE_CONFIGS)

    from sglang.kernels.ops.attention.fla.fused_recurrent import fused_recurrent_gated_delta_rule_packed_decode
    from sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update,
    )

    from replayssm_kernels.configs import override
    from replayssm_kernels.gdn import alloc_gdn_rings, gdn_replay_decode, gdn_replay_fold, gdn_replay_verify
    from replayssm_kernels.gdn import decode as dec_mod
    from replayssm_kernels.gdn import verify as ver_mod

    dev, act = "cuda", torch.bfloat16
    B, H, HV, K, V, L, T = args.batch, 16, args.hv, 128, 128, args.ring_len, 4
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
            for wp in (0, 15):
                row_wp = torch.full((B,), wp, dtype=torch.int32, device=dev)
                row_fl = torch.ones(B, dtype=torch.int32, device=dev)
                t(f"decode_flush_{name}_wp{wp}", lambda: gdn_replay_decode(
                    q, k, v, a, b, A_log, dt_bias, state, rings, slots, row_wp, row_fl, origin, out=o2))
    for n in (4, 15):
        nf = torch.full((B,), n, dtype=torch.int32, device=dev)
        t(f"ours_fold_n{n}", lambda: gdn_replay_fold(state, rings, slots, nf, origin))
    # verify at fill 8
    wpos = torch.full((B,), 8, dtype=torch.int32, device=dev)
    qs = torch.randn(B, T, H, K, device=dev, dtype=act)
    ks = torch.randn(B, T, H, K, device=dev, dtype=act)
    vs = torch.randn(B, T, HV, V, device=dev, dtype=act)
    as_ = torch.randn(B, T, HV, device=dev, dtype=act)
    bs_ = torch.randn(B, T, HV, device=dev, dtype=act)
    ov = torch.empty(B, T, HV, V, device=dev, dtype=act)
    verify_cfgs = () if args.no_verify else (
        (32, 1, 2, 0), (32, 2, 2, 0), (32, 1, 2, 1), (32, 1, 2, 2), (32, 2, 2, 2), (32, 4, 2, 2),
        (64, 2, 2, 2), (64, 4, 2, 2), (128, 4, 2, 2), (128, 8, 2, 2))
    for cfg in verify_cfgs:
        with override("gdn_verify", cfg):
            t("ours_verify_T4_wp8_" + "x".join(map(str, cfg)), lambda: gdn_replay_verify(
                qs, ks, vs, as_, bs_, A_log, dt_bias, state, rings, slots, wpos, origin, out=ov))
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


def _collect_regs(regs, dec_mod, ver_mod):
    for kern in (dec_mod._gdn_decode_kernel, ver_mod._gdn_verify_kernel, ver_mod._gdn_verify_mm_kernel):
        for dev_cache in kern.device_caches.values():
            for i, ck in enumerate(dev_cache[0].values()):
                ck._init_handles()
                regs[f"{kern.fn.__name__}#{i}"] = (ck.n_regs, ck.n_spills, ck.metadata.num_warps,
                                                   ck.metadata.shared)


if __name__ == "__main__":
    main()
