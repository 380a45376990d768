"""Kernel benchmarks: ReplaySSM vs SGLang 0.5.17's own kernels, in one run, on one GPU.

Usage (GPU machine, SGLang importable):
    python scripts/bench_kernels.py                        # GDN + Mamba-2, all batches
    python scripts/bench_kernels.py --family gdn --batches 1,256 --json out.json
    python scripts/bench_kernels.py --sweep                # also try alternative verify configs

Method. Every timed unit is captured in a CUDA graph and replayed (median of `--reps` replays of
CUDA-event time), so launch overhead is that of a served step, not of Python. To keep the L2
(60 MB on H200) from holding the state, small batches run several disjoint slot sets inside the
graph, until the touched state is >= 256 MiB; times are per set. ReplaySSM decode is amortised
over a full ring cycle (L-1 output-only steps + 1 flush step); speculative verify+commit over a
fixed seeded sequence of 16 steps with random accept counts (mean ~2.5 of T=4).
Correctness is checked on the GPU before timing (bit-exact state, outputs close).

Effective GB/s = the bytes each kernel must move (see the *_bytes functions) / time; "% copy" is
against a device-to-device copy measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time

import torch

MiB = 1 << 20


# --------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------
def time_graph(fn, units: int, reps: int = 30, warmup: int = 2, repeat: int = 1) -> float:
    """Median microseconds per unit of a CUDA-graph replay of `fn` (which performs `units` units),
    captured `repeat` times back to back in the one graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(repeat):
            fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        st.record()
        g.replay()
        en.record()
        en.synchronize()
        times.append(st.elapsed_time(en))
    del g
    return statistics.median(times) * 1e3 / (units * repeat)


def phase_timer(res: dict, reps: int, width: int = 44):
    """`t(name, fn)` for the phase profilers: one launch of `fn` per graph replay, the median in
    `res[name]` (us, one decimal), printed as it comes."""
    def t(name, fn):
        res[name] = round(time_graph(fn, 1, reps), 1)
        print(f"{name:{width}s} {res[name]:9.1f} us", flush=True)
    return t


def fill_rings_randn(rings, scale: float = 1.0) -> None:
    """Random ring contents (any ring dataclass with `tensors()`), for timing the replay on data."""
    for ring in rings.tensors():
        ring.copy_((torch.randn_like(ring, dtype=torch.float32) * scale).to(ring.dtype))


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read + written per second (GB/s)."""
    n = 2 << 30
    src = torch.randn(n // 4, device="cuda")
    dst = torch.empty_like(src)
    us = time_graph(lambda: dst.copy_(src), 1, reps=20)
    return 2 * n / (us * 1e-6) / 1e9


def staggered_snaps(B: int, L: int, sets: int, dev) -> list:
    """Per phase j, per slot set, the (row_wp, row_flush) of a batch whose rows are spread over the
    ring cycle (row r at position (r + j) % L), as requests that arrived at different times are:
    every launch then mixes a 1/L share of flush rows with non-flush rows."""
    r = torch.arange(B, device=dev, dtype=torch.int32)
    out = []
    for j in range(L):
        wp = (r + j) % L
        out.append([(wp.clone(), (wp == L - 1).to(torch.int32)) for _ in range(sets)])
    return out


def n_sets(bytes_per_set: int, target: int = 256 * MiB, cap: int = 64) -> int:
    return max(1, min(cap, math.ceil(target / max(bytes_per_set, 1))))


# --------------------------------------------------------------------------------------------
# GDN
# --------------------------------------------------------------------------------------------
def gdn_state_bytes(HV, V, K):
    return HV * V * K * 4


def gdn_decode_bytes_baseline(B, H, HV, K, V, act=2):
    """Packed decode: state read + write; q, k, v, a, b read; o written."""
    return B * (2 * gdn_state_bytes(HV, V, K) + act * (2 * H * K + 2 * HV * V + 2 * HV))


def gdn_decode_bytes_ours(B, H, HV, K, V, L, act=2, raw_keys=None, half_reads=False):
    """Per step, amortised over a cycle of L steps: the state is read every step and written once
    per cycle; each non-flush step reads on average (L-2)/2 pending entries of d (act) and k (fp32)
    and appends one entry to the rings; the flush step reads L-1 entries of raw v, the replay's
    keys, g and beta. The raw-key ring exists only in the plain replay form (`raw_keys`, default:
    what the rings allocated now keep, gdn/rings.py); the tree and shuffle forms (the GPU default
    at K = 128) replay from the fp32 `k` ring instead. `half_reads`: split checkpoints with bf16
    activations (gdn/ckpt.py): a non-flush step reads only the `hi` plane, half the state."""
    if raw_keys is None:
        from replayssm_kernels.gdn import gdn_keeps_raw_keys

        raw_keys = gdn_keeps_raw_keys(K)
    st = gdn_state_bytes(HV, V, K)
    io = act * (2 * H * K + 2 * HV * V + 2 * HV)
    avg_pending = (L - 2) / 2 if L > 1 else 0
    entry_out = HV * V * act + H * K * 4 + HV * 4                                 # d, k, g
    entry_raw = HV * V * act + (H * K * act if raw_keys else 0) + HV * 4          # rawv, rawk, beta
    entry_replay = HV * V * act + H * K * (act if raw_keys else 4) + 2 * HV * 4   # rawv, keys, g, beta
    nonflush = (st // 2 if half_reads else st) + io + avg_pending * entry_out + entry_out + entry_raw
    flush = 2 * st + io + (L - 1) * entry_replay
    return B * ((L - 1) * nonflush + flush) / L


def gdn_verify_bytes_baseline(B, H, HV, K, V, T, act=2):
    """Recurrent verify: state read, T intermediate states written; scatter: one state read + write."""
    st = gdn_state_bytes(HV, V, K)
    return B * (st + T * st + 2 * st + act * T * (2 * H * K + 2 * HV * V + 2 * HV))


# (BV, num_warps, num_stages, products) of the GDN verify kernel timed in every run (configs.py);
# products 4 = the two-launch verify (gdn/verify_split.py), the default at 16x1 since run 5
# (docs/perf.md). The one-launch variants (products 0-3) spill at every warp count tried on the
# GPU and were 1.5x slower; `--sweep` still times some of them. Products 5 and 6 (session 28, not
# yet on a GPU; gdn/verify_loop.py): the state launch as one program per row and value head walking
# its value rows, the tile loads software-pipelined, after the prep launch (5) or with the prep's
# products made in it (6: one launch). (8, 1, 2, 4) and (16, 2, 2, 4) left this list then: 607.8
# and 576.8 us against 447.1 for the best plan at batch 256 in run 14. A fifth number is the loop
# split (session 29, configs.gdn_verify_loop_split): (16, 1, 1, 6, 8) is the whole verify in one
# launch with one 16-row tile per program (B * HV * 8 programs, each making the prep's products:
# for small batches, where B * HV programs leave most SMs idle); (16, 1, 2, 6, 2) two shares.
VERIFY_CONFIGS = ((16, 1, 2, 4), (32, 1, 2, 4), (64, 4, 2, 4), (16, 1, 2, 5), (32, 2, 2, 5), (16, 1, 2, 6),
                  (32, 2, 2, 6), (16, 1, 2, 6, 2), (16, 1, 1, 6, 8))
# GDN decode launch plans (configs.GDNDecodeConfig: split, block_v, warps, stages, flush_cols, dot,
# evict_first). (2, 16, ...) is the default since run 5; (0, 32, 1, 3, 32, 0, 0), the one-launch
# plan with the whole-tile flush, was the fastest one-launch plan in runs 3-4. Fused plans at
# several warps were not bit-exact on the GPU (run 4), so they are not offered.
# Plan 4 (session 27, not yet on a GPU): plan 3 without its prep launch (run 14: 24 us of the
# non-flush step at batch 256 ran in that launch, exposed). Plan 5 (session 28, not yet on a GPU):
# one launch, one program per row and value head (gdn/verify_loop.py); offline sm_90 96 registers
# at 8 and 16 rows, tile loads pipelined in 2 stages; an eighth number is its loop split (session 29:
# 2 programs per row and value head, so a flush row's exact path is half as long). A ninth number
# (session 31): a flush row's own programs per value head (8: one 16-row tile each, plan 3's flush
# parallelism) while the non-flush rows keep one (plan 5's prologue once per value head).
DECODE_CONFIGS = ((0, 32, 1, 3, 32, 0, 0), (2, 16, 1, 3, 32, 0, 1), (2, 16, 1, 3, 8, 0, 1),
                  (3, 16, 1, 3, 8, 0, 1), (3, 16, 1, 3, 16, 0, 1), (3, 32, 1, 3, 8, 0, 1),
                  (4, 16, 1, 3, 8, 0, 1), (5, 16, 1, 2, 8, 0, 1), (5, 8, 1, 2, 8, 0, 1), (5, 16, 1, 2, 8, 0, 1, 2),
                  (5, 16, 1, 2, 8, 0, 1, 1, 8))
# (32, 4, 2, 0): the one-launch verify, for small batches, where the two-launch default adds a
# launch per layer (batch 1: 23.9 us in run 3 vs 24.7 us for the default in run 5, SGLang 15.7 us;
# never timed side by side).
DECODE_ONLY = False  # --gdn-decode-only: the GDN decode rows alone
# --gdn-ckpt-split: also time ours on split-layout checkpoints (gdn/ckpt.py), in the same run
CKPT_SPLIT = False
VERIFY_SWEEP = ((32, 1, 2, 0), (32, 4, 2, 0), (64, 4, 2, 1), (64, 2, 2, 2), (128, 4, 2, 2), (128, 8, 2, 2))


def run_gdn(batches, L, T, reps, sweep, results, shapes=((16, 32), (16, 64))):
    from sglang.kernels.ops.attention.fla.fused_recurrent import fused_recurrent_gated_delta_rule_packed_decode
    from sglang.kernels.ops.attention.fla.fused_recurrent_linear_replayssm import (
        fused_recurrent_linear_replayssm_decode,
    )
    from sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update,
    )
    from sglang.kernels.ops.attention.fla.gdn_replayssm_spec_fold import commit_gdn_replayssm_fold_all_layers
    from sglang.kernels.ops.mamba.mamba_state_scatter_triton import fused_mamba_state_scatter_with_mask

    from replayssm_kernels import decode_order_and_index, decode_prepare
    from replayssm_kernels.configs import (
        GDN_UNROLL_SWEEP,
        gdn_decode_config,
        gdn_flush_spread,
        gdn_verify_plan,
        override,
        ring_min_batch,
    )
    from replayssm_kernels.gdn import (alloc_gdn_rings, gdn_commit, gdn_replay_decode, gdn_replay_verify,
                                       split_ckpt_convert)

    dev, act = "cuda", torch.bfloat16
    for H, HV in shapes:
        K = V = 128
        A_log = (torch.rand(HV, device=dev) * 0.9 + 0.05).log()
        dt_bias = torch.randn(HV, device=dev) - 1.0
        for B in batches:
            sets = n_sets(B * gdn_state_bytes(HV, V, K))
            S = sets * B
            state = torch.randn(S, HV, V, K, device=dev) * 0.1
            slots = [torch.arange(i * B, (i + 1) * B, dtype=torch.int32, device=dev) for i in range(sets)]
            qkv_dim = 2 * H * K + HV * V
            mixed = [torch.randn(B, qkv_dim, device=dev, dtype=act) for _ in range(sets)]
            av = [torch.randn(B, HV, device=dev, dtype=act) for _ in range(sets)]
            bv = [torch.randn(B, HV, device=dev, dtype=act) for _ in range(sets)]
            out = torch.empty(B, 1, HV, V, device=dev, dtype=act)

            def split(m):
                return (m[:, : H * K].view(B, H, K), m[:, H * K: 2 * H * K].view(B, H, K),
                        m[:, 2 * H * K:].view(B, HV, V))

            row = {"family": "gdn", "H": H, "HV": HV, "K": K, "V": V, "B": B, "L": L, "sets": sets}
            # --- decode: packed (stock) -------------------------------------------------
            def packed():
                for i in range(sets):
                    fused_recurrent_gated_delta_rule_packed_decode(
                        mixed[i], av[i], bv[i], A_log, dt_bias, K ** -0.5, state, out, slots[i],
                        use_qk_l2norm_in_kernel=True)
            # Timed as ours is: L steps back to back in one graph (a server runs the layers' launches
            # back to back). One launch a replay (the number before session 34) read 426 us at batch
            # 256 on an H100, where the same kernel ran at 363 us inside a server: kept beside it.
            row["decode_packed_us"] = time_graph(packed, sets, reps, repeat=L)
            row["decode_packed_single_us"] = time_graph(packed, sets, reps)
            # --- decode: SGLang in-tree ReplaySSM, amortised over a cycle ---------------
            d_c = torch.zeros(S, HV, L, V, device=dev)
            k_c = torch.zeros(S, H, L, K, device=dev)
            g_c = torch.zeros(S, HV, L, device=dev)
            wps = [torch.full((B,), j, dtype=torch.int32, device=dev) for j in range(L)]

            def intree():
                for j in range(L):
                    for i in range(sets):
                        fused_recurrent_linear_replayssm_decode(
                            mixed[i], av[i], bv[i], A_log, dt_bias, K ** -0.5, state, d_c, k_c, g_c,
                            out, slots[i], wps[j], use_qk_l2norm_in_kernel=True)
            row["decode_intree_us"] = time_graph(intree, sets * L, reps)
            wps_st = [[t[0] for t in ph] for ph in staggered_snaps(B, L, 1, dev)]

            def intree_staggered():
                for j in range(L):
                    for i in range(sets):
                        fused_recurrent_linear_replayssm_decode(
                            mixed[i], av[i], bv[i], A_log, dt_bias, K ** -0.5, state, d_c, k_c, g_c,
                            out, slots[i], wps_st[j][0], use_qk_l2norm_in_kernel=True)
            row["decode_intree_staggered_us"] = time_graph(intree_staggered, sets * L, reps)
            del d_c, k_c, g_c
            # --- decode: ours, amortised over a cycle -----------------------------------
            rings = alloc_gdn_rings(1, S, H, HV, K, V, L, act, dev).layer(0)
            wpos = torch.zeros(S, dtype=torch.int32, device=dev)
            origin = torch.zeros(S, dtype=torch.int32, device=dev)
            snaps = []
            for j in range(L):
                snaps.append([tuple(t.clone() for t in decode_prepare(slots[i], wpos, L)) for i in range(sets)])
            o2 = torch.empty(B, HV, V, device=dev, dtype=act)
            # The launch's row order per snapshot (configs.gdn_flush_spread, as the backend), made
            # before the timing, as the backend makes it once per batch outside the graph.
            spread, orders = gdn_flush_spread(), {}

            def add_orders(snap_sets):  # (row order, flush index) per snapshot, as the backend's
                for per_set in snap_sets:
                    for _, rf in per_set:
                        orders[id(rf)] = decode_order_and_index(rf, spread)
            add_orders(snaps)

            layout = {"split": False}

            def ours_decode():
                for j in range(L):
                    for i in range(sets):
                        q, k, v = split(mixed[i])
                        order, findex = orders[id(snaps[j][i][1])]
                        gdn_replay_decode(q, k, v, av[i], bv[i], A_log, dt_bias, state, rings, slots[i],
                                          snaps[j][i][0], snaps[j][i][1], origin, out=o2, row_order=order,
                                          split_ckpt=layout["split"], flush_index=findex)
            for cfg in DECODE_CONFIGS:
                with override("gdn_decode", cfg):
                    row["decode_ours_us_" + "x".join(map(str, cfg))] = time_graph(ours_decode, sets * L, reps)
            best = min(DECODE_CONFIGS, key=lambda c: row["decode_ours_us_" + "x".join(map(str, c))])
            row["decode_ours_cfg"] = "x".join(map(str, best))
            row["decode_ours_us"] = row["decode_ours_us_" + row["decode_ours_cfg"]]
            snaps_sync = snaps
            snaps = staggered_snaps(B, L, sets, dev)
            add_orders(snaps)
            for cfg in DECODE_CONFIGS:
                with override("gdn_decode", cfg):
                    row["decode_ours_staggered_us_" + "x".join(map(str, cfg))] = time_graph(ours_decode, sets * L, reps)
            best = min(DECODE_CONFIGS, key=lambda c: row["decode_ours_staggered_us_" + "x".join(map(str, c))])
            row["decode_ours_staggered_cfg"] = "x".join(map(str, best))
            row["decode_ours_staggered_us"] = row["decode_ours_staggered_us_" + row["decode_ours_staggered_cfg"]]
            if CKPT_SPLIT:
                # The same launches on split-layout checkpoints (the pool packed first, so the
                # exact paths see real values), synchronised and staggered.
                split_ckpt_convert(state, None, True)
                layout["split"] = True
                for suffix, snaps in (("", snaps_sync), ("_staggered", snaps)):  # ours_decode reads `snaps`
                    for cfg in DECODE_CONFIGS:
                        with override("gdn_decode", cfg):
                            row[f"decode_ours_split{suffix}_us_" + "x".join(map(str, cfg))] = time_graph(
                                ours_decode, sets * L, reps)
                    row[f"decode_ours_split{suffix}_us"] = min(
                        row[f"decode_ours_split{suffix}_us_" + "x".join(map(str, c))] for c in DECODE_CONFIGS)
                layout["split"] = False
                split_ckpt_convert(state, None, False)
            for unroll in (GDN_UNROLL_SWEEP if sweep else ()):  # the default plan with a deeper exact replay
                with override("gdn_replay_unroll", (unroll,)):
                    for suffix, snaps in (("", snaps_sync), ("_staggered", snaps)):  # ours_decode reads `snaps`
                        row[f"decode_ours{suffix}_us_u{unroll}"] = time_graph(ours_decode, sets * L, reps)
            # Small-batch mode (configs.ring_min_batch): every row flushes every step on an empty ring.
            exact = [(torch.zeros(B, dtype=torch.int32, device=dev), torch.ones(B, dtype=torch.int32, device=dev))
                     for _ in range(sets)]

            def ours_exact():
                for i in range(sets):
                    q, k, v = split(mixed[i])
                    gdn_replay_decode(q, k, v, av[i], bv[i], A_log, dt_bias, state, rings, slots[i],
                                      exact[i][0], exact[i][1], origin, out=o2)
            row["decode_ours_exact_us"] = time_graph(ours_exact, sets, reps, repeat=L)
            # Below the threshold the GDN backend runs SGLang's packed decode (after a fold).
            row["decode_dispatch"] = "stock" if B < ring_min_batch("gdn") else "ring"
            row["decode_default_cfg"] = gdn_decode_config(K, V, rows=B).key()
            row["decode_default_split_cfg"] = gdn_decode_config(K, V, rows=B, split_ckpt=True).key()
            row["spec_default_cfg"] = "x".join(map(str, gdn_verify_plan(B)))
            snaps = snaps_sync

            def prep():
                for i in range(sets):
                    decode_prepare(slots[i], wpos, L, row_wp=snaps[0][i][0], row_flush=snaps[0][i][1])
            row["decode_prepare_us"] = time_graph(prep, sets, reps)
            del rings
            row["decode_bytes_packed"] = gdn_decode_bytes_baseline(B, H, HV, K, V)
            row["decode_bytes_ours"] = gdn_decode_bytes_ours(B, H, HV, K, V, L)
            row["decode_bytes_ours_split"] = gdn_decode_bytes_ours(B, H, HV, K, V, L, half_reads=True)
            if DECODE_ONLY:
                del state
                torch.cuda.empty_cache()
                results.append(row)
                print(json.dumps(row), flush=True)
                continue
            # --- spec verify + commit ---------------------------------------------------
            gen = torch.Generator().manual_seed(0)
            n_steps = 16
            accs = [torch.randint(1, T + 1, (B,), generator=gen).to(dev, torch.int32) for _ in range(n_steps)]
            qs = [torch.randn(B, T, H, K, device=dev, dtype=act) for _ in range(sets)]
            ks = [torch.randn(B, T, H, K, device=dev, dtype=act) for _ in range(sets)]
            vs = [torch.randn(B, T, HV, V, device=dev, dtype=act) for _ in range(sets)]
            as_ = [torch.randn(B, T, HV, device=dev, dtype=act) for _ in range(sets)]
            bs_ = [torch.randn(B, T, HV, device=dev, dtype=act) for _ in range(sets)]
            ov = torch.empty(B, T, HV, V, device=dev, dtype=act)
            # stock: recurrent verify writing intermediate states, then the accept scatter
            inter = torch.empty(B + 1, T, HV, V, K, device=dev)
            inter_idx = torch.arange(B, dtype=torch.int32, device=dev)
            cu = torch.arange(0, B * T + 1, T, dtype=torch.int32, device=dev)
            steps_idx = [(a - 1).to(torch.int64) for a in accs]

            def stock_spec():
                for t in range(n_steps):
                    for i in range(sets):
                        fused_sigmoid_gating_delta_rule_update(
                            A_log=A_log, a=as_[i].view(1, B * T, HV), dt_bias=dt_bias, softplus_beta=1.0,
                            softplus_threshold=20.0, q=qs[i].view(1, B * T, H, K), k=ks[i].view(1, B * T, H, K),
                            v=vs[i].view(1, B * T, HV, V), b=bs_[i].view(1, B * T, HV),
                            initial_state_source=state, initial_state_indices=slots[i], cu_seqlens=cu,
                            use_qk_l2norm_in_kernel=True, disable_state_update=True,
                            intermediate_states_buffer=inter, intermediate_state_indices=inter_idx, cache_steps=T)
                        fused_mamba_state_scatter_with_mask(state[None], inter[None], slots[i], steps_idx[t])
            row["spec_stock_us"] = time_graph(stock_spec, sets * n_steps, reps)
            del inter
            # SGLang 0.5.17 fold-every-commit (--enable-linear-replayssm-spec)
            rv = torch.zeros(S, HV, T, V, device=dev, dtype=act)
            rk = torch.zeros(S, H, T, K, device=dev, dtype=act)
            rg = torch.zeros(S, HV, T, device=dev)
            rb = torch.zeros(S, HV, T, device=dev)

            def fold_spec():
                for t in range(n_steps):
                    for i in range(sets):
                        fused_sigmoid_gating_delta_rule_update(
                            A_log=A_log, a=as_[i].view(1, B * T, HV), dt_bias=dt_bias, softplus_beta=1.0,
                            softplus_threshold=20.0, q=qs[i].view(1, B * T, H, K), k=ks[i].view(1, B * T, H, K),
                            v=vs[i].view(1, B * T, HV, V), b=bs_[i].view(1, B * T, HV),
                            initial_state_source=state, initial_state_indices=slots[i], cu_seqlens=cu,
                            use_qk_l2norm_in_kernel=True, disable_state_update=True, cache_ring=True,
                            replayssm_rawv=rv, replayssm_rawk=rk, replayssm_g=rg, replayssm_beta=rb)
                        commit_gdn_replayssm_fold_all_layers(
                            state[None], rv[None], rk[None], rg[None], rb[None], slots[i], accs[t], T, H)
            row["spec_fold_every_commit_us"] = time_graph(fold_spec, sets * n_steps, reps)
            del rv, rk, rg, rb
            # ours
            rings_all = alloc_gdn_rings(1, S, H, HV, K, V, L, act, dev)
            rings = rings_all.layer(0)
            wpos.zero_()
            origin.zero_()
            tickets = torch.zeros(S, dtype=torch.int32, device=dev)

            def ours_spec(split_ckpt=False):
                # The backend's commit (pool.replayssm_commit): one launch below gdn_commit_fused_below rows.
                for t in range(n_steps):
                    for i in range(sets):
                        gdn_replay_verify(qs[i], ks[i], vs[i], as_[i], bs_[i], A_log, dt_bias, state, rings,
                                          slots[i], wpos, origin, out=ov, split_ckpt=split_ckpt)
                        gdn_commit(state[None], rings_all, slots[i], wpos, origin, accs[t], T, tickets,
                                   split_ckpt=split_ckpt)
            cfgs = VERIFY_CONFIGS + (VERIFY_SWEEP if sweep else ())
            for cfg in cfgs:
                with override("gdn_verify", cfg):
                    row["spec_ours_us_" + "x".join(map(str, cfg))] = time_graph(ours_spec, sets * n_steps, reps)
            best = min(cfgs, key=lambda c: row["spec_ours_us_" + "x".join(map(str, c))])
            row["spec_ours_cfg"] = "x".join(map(str, best))
            row["spec_ours_us"] = row["spec_ours_us_" + row["spec_ours_cfg"]]
            # What a server runs (the default plan at this batch), beside the best timed plan.
            row["spec_default_us"] = row.get("spec_ours_us_" + row["spec_default_cfg"])
            with override("gdn_verify", best), override("gdn_fold_cols", (32,)):
                row["spec_ours_fold32_us"] = time_graph(ours_spec, sets * n_steps, reps)
            # The commit both ways: commit_prepare + fold, and one launch (configs.gdn_commit_fused_below).
            for name, below in (("twolaunch", 0), ("onelaunch", B + 1)):
                with override("gdn_verify", best), override("gdn_commit_fused_below", (below,)):
                    row[f"spec_ours_{name}_us"] = time_graph(ours_spec, sets * n_steps, reps)
            for unroll in (GDN_UNROLL_SWEEP if sweep else ()):
                with override("gdn_verify", best), override("gdn_replay_unroll", (unroll,)):
                    row[f"spec_ours_us_u{unroll}"] = time_graph(ours_spec, sets * n_steps, reps)
            if CKPT_SPLIT:
                split_ckpt_convert(state, None, True)
                with override("gdn_verify", best):
                    row["spec_ours_split_us"] = time_graph(lambda: ours_spec(True), sets * n_steps, reps)
            del rings, rings_all, state
            torch.cuda.empty_cache()
            row["spec_bytes_stock"] = gdn_verify_bytes_baseline(B, H, HV, K, V, T)
            results.append(row)
            print(json.dumps(row), flush=True)


def gdn_correctness_check(sweep=False):
    """Quick on-GPU check before timing: bit-exact committed state, decode and spec (also with the
    replay-unroll depths the sweep times)."""
    t = _load_test_module("test_gdn_kernels.py")

    def check(name, out, base, ref, dtype):
        err = (out.double() - ref.double()).abs().max().item()
        eb = (base.double() - ref.double()).abs().max().item()
        assert err <= 2 * eb + {torch.bfloat16: 1e-3, torch.float32: 1e-4}[dtype], (name, err, eb)

    from replayssm_kernels.configs import GDN_UNROLL_SWEEP, override

    layouts = ((0,), (1,)) if CKPT_SPLIT else ((0,),)
    for cfg in DECODE_CONFIGS:
        for lay in layouts:
            with override("gdn_decode", cfg), override("gdn_ckpt_split", lay):
                t.test_gdn_decode(2, 16, 32, 128, 128, 16, torch.bfloat16, 34, "cuda", check)
                t.test_gdn_decode(2, 4, 8, 128, 128, 16, torch.float32, 20, "cuda", check)
    if DECODE_ONLY:
        return
    if CKPT_SPLIT:
        with override("gdn_ckpt_split", (1,)):
            t.test_gdn_verify_commit(4, 16, 32, 128, 128, 16, 4, torch.bfloat16, 20, "cuda", check)
    for cfg in VERIFY_CONFIGS + (VERIFY_SWEEP if sweep else ()):
        with override("gdn_verify", cfg):
            t.test_gdn_verify_commit(4, 16, 32, 128, 128, 16, 4, torch.bfloat16, 20, "cuda", check)
            t.test_gdn_verify_commit(2, 4, 8, 128, 128, 16, 4, torch.float32, 10, "cuda", check)
    with override("gdn_fold_cols", (32,)):
        t.test_gdn_verify_commit(4, 16, 32, 128, 128, 16, 4, torch.bfloat16, 20, "cuda", check)
    for unroll in (GDN_UNROLL_SWEEP if sweep else ()):
        with override("gdn_replay_unroll", (unroll,)):
            t.test_gdn_decode(2, 16, 32, 128, 128, 16, torch.bfloat16, 34, "cuda", check)
            t.test_gdn_verify_commit(4, 16, 32, 128, 128, 16, 4, torch.bfloat16, 20, "cuda", check)


# --------------------------------------------------------------------------------------------
# Mamba-2
# --------------------------------------------------------------------------------------------
def m2_state_bytes(NH, P, N):
    return NH * P * N * 4


def m2_decode_bytes_baseline(B, NH, P, N, G, act=2):
    """SSU decode: state read + write; x, dt, B, C read; y written."""
    return B * (2 * m2_state_bytes(NH, P, N) + act * (2 * NH * P + NH + 2 * G * N))


def m2_decode_bytes_ours(B, NH, P, N, G, L, act=2):
    """Per step, amortised over a cycle of L steps: state read every step, written once per cycle;
    a non-flush step reads on average (L-2)/2 pending (x, dt) entries and its group's B entries and
    appends one entry; the flush step reads L-1 entries."""
    st = m2_state_bytes(NH, P, N)
    io = act * (2 * NH * P + NH + 2 * G * N)
    entry = act * (NH * P + NH + G * N)
    avg_pending = (L - 2) / 2 if L > 1 else 0
    nonflush = st + io + (avg_pending + 1) * entry
    flush = 2 * st + io + (L - 1) * entry
    return B * ((L - 1) * nonflush + flush) / L


def m2_verify_bytes_baseline(B, NH, P, N, G, T, act=2):
    """SSU verify: state read, T intermediate states written; scatter: one state read + write."""
    st = m2_state_bytes(NH, P, N)
    return B * ((3 + T) * st + act * T * (2 * NH * P + NH + 2 * G * N))


M2_SHAPES = (("super", 128, 64, 128, 8), ("nano9b", 128, 80, 128, 8))


def run_mamba2(batches, L, T, reps, results, shapes=M2_SHAPES, sweep=False):
    from sglang.kernels.ops.mamba.mamba_state_scatter_triton import fused_mamba_state_scatter_with_mask
    from sglang.kernels.ops.mamba.triton_ops.mamba_ssm import selective_state_update

    from replayssm_kernels import commit_prepare, decode_prepare
    from replayssm_kernels.configs import MAMBA2_TILE_SWEEP, MAMBA2_UNROLL_SWEEP, override, overrides, ring_min_batch
    from replayssm_kernels.mamba2 import (
        alloc_mamba2_rings,
        mamba2_replay_decode,
        mamba2_replay_fold,
        mamba2_replay_verify,
    )

    dev, act = "cuda", torch.bfloat16
    for shape, NH, P, N, G in shapes:
        A = -torch.rand(NH, device=dev) * 4 - 0.5
        D = torch.randn(NH, device=dev)
        dt_bias = torch.randn(NH, device=dev) - 2.0
        A_e = A[:, None, None].expand(NH, P, N)
        D_e = D[:, None].expand(NH, P)
        dtb_e = dt_bias[:, None].expand(NH, P)
        for Bsz in batches:
            sets = n_sets(Bsz * m2_state_bytes(NH, P, N))
            S = sets * Bsz
            state = torch.randn(S, NH, P, N, device=dev) * 0.1
            slots = [torch.arange(i * Bsz, (i + 1) * Bsz, dtype=torch.int32, device=dev) for i in range(sets)]
            xs = [torch.randn(Bsz, NH, P, device=dev, dtype=act) for _ in range(sets)]
            dts = [torch.randn(Bsz, NH, device=dev, dtype=act) for _ in range(sets)]
            Bs = [torch.randn(Bsz, G, N, device=dev, dtype=act) for _ in range(sets)]
            Cs = [torch.randn(Bsz, G, N, device=dev, dtype=act) for _ in range(sets)]
            y = torch.empty(Bsz, NH, P, device=dev, dtype=act)
            row = {"family": "mamba2", "shape": shape, "NH": NH, "P": P, "N": N, "G": G, "B": Bsz, "L": L,
                   "sets": sets}

            def ssu():
                for i in range(sets):
                    selective_state_update(state, xs[i], dts[i][:, :, None].expand(Bsz, NH, P), A_e, Bs[i], Cs[i],
                                           D_e, z=None, dt_bias=dtb_e, dt_softplus=True,
                                           state_batch_indices=slots[i], out=y)
            # L steps back to back, as ours (see the GDN decode's note); one launch a replay beside it.
            row["decode_ssu_us"] = time_graph(ssu, sets, reps, repeat=L)
            row["decode_ssu_single_us"] = time_graph(ssu, sets, reps)
            rings_all = alloc_mamba2_rings(1, S, NH, P, G, N, L, act, dev)
            rings = rings_all.layer(0)
            wpos = torch.zeros(S, dtype=torch.int32, device=dev)
            origin = torch.zeros(S, dtype=torch.int32, device=dev)
            snaps = [[tuple(t.clone() for t in decode_prepare(slots[i], wpos, L)) for i in range(sets)]
                     for _ in range(L)]

            def ours_decode():
                for j in range(L):
                    for i in range(sets):
                        mamba2_replay_decode(xs[i], dts[i], Bs[i], Cs[i], A, D, dt_bias, state, rings, slots[i],
                                             snaps[j][i][0], snaps[j][i][1], origin, out=y)
            row["decode_ours_us"] = time_graph(ours_decode, sets * L, reps)
            synced, staggered = snaps, staggered_snaps(Bsz, L, sets, dev)
            snaps = staggered
            row["decode_ours_staggered_us"] = time_graph(ours_decode, sets * L, reps)
            for key, plan in (m2_decode_plans() if sweep else ()):
                with overrides(plan):
                    for suffix, snaps in (("", synced), ("_staggered", staggered)):  # ours_decode reads `snaps`
                        row[f"decode_ours_{key}{suffix}_us"] = time_graph(ours_decode, sets * L, reps)
            exact = [(torch.zeros(Bsz, dtype=torch.int32, device=dev), torch.ones(Bsz, dtype=torch.int32, device=dev))
                     for _ in range(sets)]

            def ours_exact():
                for i in range(sets):
                    mamba2_replay_decode(xs[i], dts[i], Bs[i], Cs[i], A, D, dt_bias, state, rings, slots[i],
                                         exact[i][0], exact[i][1], origin, out=y)
            row["decode_ours_exact_us"] = time_graph(ours_exact, sets, reps, repeat=L)
            row["decode_dispatch"] = "exact" if Bsz < ring_min_batch("mamba2") else "ring"
            del rings, rings_all
            # spec
            gen = torch.Generator().manual_seed(0)
            n_steps = 16
            accs = [torch.randint(1, T + 1, (Bsz,), generator=gen).to(dev, torch.int32) for _ in range(n_steps)]
            xv = [torch.randn(Bsz, T, NH, P, device=dev, dtype=act) for _ in range(sets)]
            dtv = [torch.randn(Bsz, T, NH, device=dev, dtype=act) for _ in range(sets)]
            Bv = [torch.randn(Bsz, T, G, N, device=dev, dtype=act) for _ in range(sets)]
            Cv = [torch.randn(Bsz, T, G, N, device=dev, dtype=act) for _ in range(sets)]
            yv = torch.empty(Bsz, T, NH, P, device=dev, dtype=act)
            inter = torch.empty(Bsz + 1, T, NH, P, N, device=dev)
            inter_idx = torch.arange(Bsz, dtype=torch.int32, device=dev)
            steps_idx = [(a - 1).to(torch.int64) for a in accs]

            def stock_spec():
                for t in range(n_steps):
                    for i in range(sets):
                        selective_state_update(
                            state, xv[i], dtv[i][..., None].expand(Bsz, T, NH, P), A_e, Bv[i], Cv[i], D_e, z=None,
                            dt_bias=dtb_e, dt_softplus=True, state_batch_indices=slots[i], out=yv,
                            disable_state_update=True, intermediate_states_buffer=inter, cache_steps=T,
                            intermediate_state_indices=inter_idx)
                        fused_mamba_state_scatter_with_mask(state[None], inter[None], slots[i], steps_idx[t])
            if (Bsz - 1) * T * NH * P * N >= 2 ** 31:
                # SGLang 0.5.17's fused_mamba_state_scatter_with_mask computes the source offset as
                # int32 (request index x per-request stride): past 2^31 elements it reads out of
                # bounds (seen: illegal memory access at Nemotron-Nano shape, batch 512, T=4).
                row["spec_stock_us"] = float("nan")
                row["spec_stock_note"] = "not run: SGLang's accept scatter overflows int32 at this size"
            else:
                row["spec_stock_us"] = time_graph(stock_spec, sets * n_steps, reps)
            del inter
            rings_all = alloc_mamba2_rings(1, S, NH, P, G, N, L, act, dev)
            rings = rings_all.layer(0)
            wpos.zero_()
            origin.zero_()
            nf = torch.empty(Bsz, dtype=torch.int32, device=dev)
            no = torch.empty(Bsz, dtype=torch.int32, device=dev)

            def ours_spec():
                for t in range(n_steps):
                    for i in range(sets):
                        mamba2_replay_verify(xv[i], dtv[i], Bv[i], Cv[i], A, D, dt_bias, state, rings, slots[i],
                                             wpos, origin, out=yv)
                        commit_prepare(slots[i], wpos, origin, accs[t], L, T, row_nfold=nf, row_origin=no)
                        mamba2_replay_fold(state[None], rings_all, A[None], dt_bias[None], slots[i], nf, no)
            row["spec_ours_us"] = time_graph(ours_spec, sets * n_steps, reps)
            for tile in (MAMBA2_TILE_SWEEP if sweep else ()):
                with override("mamba2_verify_tile", tile):
                    row[f"spec_ours_t{'x'.join(map(str, tile))}_us"] = time_graph(ours_spec, sets * n_steps, reps)
            for unroll in (MAMBA2_UNROLL_SWEEP if sweep else ()):  # the commit fold replays too
                with override("mamba2_replay_unroll", (unroll,)):
                    row[f"spec_ours_u{unroll}_us"] = time_graph(ours_spec, sets * n_steps, reps)
            del rings, rings_all, state
            torch.cuda.empty_cache()
            row["decode_bytes_ssu"] = m2_decode_bytes_baseline(Bsz, NH, P, N, G)
            row["decode_bytes_ours"] = m2_decode_bytes_ours(Bsz, NH, P, N, G, L)
            row["spec_bytes_stock"] = m2_verify_bytes_baseline(Bsz, NH, P, N, G, T)
            results.append(row)
            print(json.dumps(row), flush=True)


def m2_decode_plans():
    """(key, [(override name, plan), ...]) of the Mamba-2 decode plans the sweep times besides the
    default: the split plans, the exact replay's other unroll depths (`u<n>`), the ring's B . C in a
    launch of its own (`bc`), the chunked tiles, and
    the first split plan with each four-warp chunked tile."""
    from replayssm_kernels.configs import MAMBA2_DECODE_SWEEP, MAMBA2_TILE_SWEEP, MAMBA2_UNROLL_SWEEP

    plans = [("x".join(map(str, p)), [("mamba2_decode", p)]) for p in MAMBA2_DECODE_SWEEP]
    plans += [(f"u{u}", [("mamba2_replay_unroll", (u,))]) for u in MAMBA2_UNROLL_SWEEP]
    plans.append(("bc", [("mamba2_ring_bc_min_batch", (1,))]))  # ring B . C in a launch of its own
    for t in MAMBA2_TILE_SWEEP:
        key = "t" + "x".join(map(str, t))
        plans.append((key, [("mamba2_decode_tile", t)]))
        if t[2] == 4:  # the four-warp tiles also behind the first split plan's flush launch
            plans.append(("x".join(map(str, MAMBA2_DECODE_SWEEP[0])) + "_" + key,
                          [("mamba2_decode", MAMBA2_DECODE_SWEEP[0]), ("mamba2_decode_tile", t)]))
    return plans


def m2_correctness_check(sweep=False):
    """Quick on-GPU check before timing, at both Mamba-2 head shapes (Nemotron-3-Super P=64,
    Nemotron-Nano P=80): bit-exact committed state after every decode step and commit, outputs
    within the baseline's error, for every decode plan and verify tile that will be timed."""
    from replayssm_kernels.configs import MAMBA2_TILE_SWEEP, MAMBA2_UNROLL_SWEEP, override, overrides

    t = _load_test_module("test_mamba2_kernels.py")
    for P in (64, 80):
        t.test_mamba2_decode(4, 128, P, 8, 128, 16, torch.bfloat16, False, False, 34)
        for _, plan in (m2_decode_plans() if sweep else ()):
            with overrides(plan):
                t.test_mamba2_decode(4, 128, P, 8, 128, 16, torch.bfloat16, True, False, 34)
        t.test_mamba2_verify_commit(4, 128, P, 8, 128, 16, 4, torch.bfloat16, False, False, 20)
        for tile in (MAMBA2_TILE_SWEEP if sweep else ()):
            with override("mamba2_verify_tile", tile):
                t.test_mamba2_verify_commit(4, 128, P, 8, 128, 16, 4, torch.bfloat16, True, False, 20)
        for unroll in (MAMBA2_UNROLL_SWEEP if sweep else ()):
            with override("mamba2_replay_unroll", (unroll,)):
                t.test_mamba2_verify_commit(4, 128, P, 8, 128, 16, 4, torch.bfloat16, True, False, 20)


def _load_test_module(name):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "tests" / name
    spec = importlib.util.spec_from_file_location("_t_" + name[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --------------------------------------------------------------------------------------------
def print_table(results, bw):
    print(f"\nmeasured copy bandwidth: {bw:.0f} GB/s")
    hdr = ("fam", "shape", "B", "dec base us", "base 1-launch us", "dec ours us", "x", "GB/s", "%copy", "intree x",
           "spec base us", "spec ours us", "x", "fold-every x")
    print(" | ".join(hdr))
    for r in results:
        if r["family"] == "gdn":
            shape = f"H{r['H']} HV{r['HV']}"
            base, ours = r["decode_packed_us"], r["decode_ours_us"]
            gbs = r["decode_bytes_ours"] / (ours * 1e-6) / 1e9
            print(" | ".join(str(x) for x in (
                "gdn", shape + " " + r.get("decode_ours_cfg", ""), r["B"], f"{base:.1f}",
                f"{r.get('decode_packed_single_us', float('nan')):.1f}", f"{ours:.1f}", f"{base / ours:.2f}", f"{gbs:.0f}",
                f"{100 * gbs / bw:.0f}", f"{base / r['decode_intree_us']:.2f}",
                *((f"{r['spec_stock_us']:.1f}", f"{r['spec_ours_us']:.1f}",
                   f"{r['spec_stock_us'] / r['spec_ours_us']:.2f}",
                   f"{r['spec_stock_us'] / r['spec_fold_every_commit_us']:.2f}") if "spec_ours_us" in r
                  else ("-",) * 4))))
        else:
            base, ours = r["decode_ssu_us"], r["decode_ours_us"]
            gbs = r["decode_bytes_ours"] / (ours * 1e-6) / 1e9
            print(" | ".join(str(x) for x in (
                "mamba2", r["shape"], r["B"], f"{base:.1f}", f"{r.get('decode_ssu_single_us', float('nan')):.1f}",
                f"{ours:.1f}", f"{base / ours:.2f}", f"{gbs:.0f}",
                f"{100 * gbs / bw:.0f}", "-", f"{r['spec_stock_us']:.1f}", f"{r['spec_ours_us']:.1f}",
                f"{r['spec_stock_us'] / r['spec_ours_us']:.2f}", "-")))


def print_split_table(results):
    """GDN rows timed on both checkpoint layouts (--gdn-ckpt-split): ours fp32 vs ours split vs
    SGLang's kernels, same run."""
    rows = [r for r in results if r["family"] == "gdn" and "decode_ours_split_us" in r]
    if not rows:
        return
    print("\nsplit checkpoint layout (same run): decode staggered and spec, us and x vs SGLang")
    print(" | ".join(("shape", "B", "packed us", "ours fp32 stag", "x", "ours split stag", "x", "split GB/s",
                      "spec base us", "spec fp32 us", "x", "spec split us", "x")))
    for r in rows:
        base = r["decode_packed_us"]
        f32, spl = r["decode_ours_staggered_us"], r["decode_ours_split_staggered_us"]
        spec = [r.get(k) for k in ("spec_stock_us", "spec_ours_us", "spec_ours_split_us")]
        spec_cols = ((f"{spec[0]:.1f}", f"{spec[1]:.1f}", f"{spec[0] / spec[1]:.2f}", f"{spec[2]:.1f}",
                      f"{spec[0] / spec[2]:.2f}") if None not in spec else ("-",) * 5)
        gbs = r["decode_bytes_ours_split"] / (spl * 1e-6) / 1e9
        print(" | ".join(str(x) for x in (f"H{r['H']} HV{r['HV']}", r["B"], f"{base:.1f}", f"{f32:.1f}",
                                          f"{base / f32:.2f}", f"{spl:.1f}", f"{base / spl:.2f}", f"{gbs:.0f}",
                                          *spec_cols)))


def _plan_list(parser, name: str, text: str) -> tuple:
    from replayssm_kernels.configs import parse_plan

    plans = tuple(parse_plan(name, t) for t in text.split(","))
    if not plans or None in plans:
        parser.error(f"--{name.replace('_', '-')}-plans: {text!r} is not a comma-separated list of {name} plans")
    return plans


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", default="all", choices=["all", "gdn", "mamba2"])
    p.add_argument("--batches", default="1,8,32,128,256,512")
    p.add_argument("--ring-len", type=int, default=16)
    p.add_argument("--draft-tokens", type=int, default=4)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--sweep", action="store_true")
    p.add_argument("--skip-check", action="store_true")
    p.add_argument("--json")
    p.add_argument("--gdn-decode-plans", help="comma-separated gdn_decode plans to time (and check) instead of "
                   "DECODE_CONFIGS, e.g. 3x16x1x3x8x0x1")
    p.add_argument("--gdn-verify-plans", help="comma-separated gdn_verify plans to time (and check) instead of "
                   "VERIFY_CONFIGS, e.g. 16x1x1x6x8,32x2x2x6,16x1x2x6")
    p.add_argument("--gdn-ckpt-split", action="store_true", help="GDN: also check and time ours on split-layout "
                   "checkpoints (gdn/ckpt.py: output reads of bf16 halves), beside the fp32 layout in the same run")
    p.add_argument("--gdn-decode-only", action="store_true", help="GDN: check and time the decode only (no spec "
                   "verify + commit rows: a decode plan sweep in less device time)")
    args = p.parse_args(argv)
    global DECODE_CONFIGS, VERIFY_CONFIGS, DECODE_ONLY, CKPT_SPLIT
    DECODE_ONLY = args.gdn_decode_only
    CKPT_SPLIT = args.gdn_ckpt_split
    if args.gdn_decode_plans:
        DECODE_CONFIGS = _plan_list(p, "gdn_decode", args.gdn_decode_plans)
    if args.gdn_verify_plans:
        VERIFY_CONFIGS = _plan_list(p, "gdn_verify", args.gdn_verify_plans)
    if not torch.cuda.is_available():
        sys.exit("bench_kernels.py needs a CUDA GPU")
    batches = [int(x) for x in args.batches.split(",")]
    torch.manual_seed(0)
    t0 = time.time()
    info = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d"), "argv": sys.argv}
    import triton
    info["triton"] = triton.__version__
    bw = copy_bandwidth()
    info["copy_GBps"] = bw
    results = []
    L, T, reps = args.ring_len, args.draft_tokens, args.reps
    if not args.skip_check:
        if args.family in ("all", "gdn"):
            gdn_correctness_check(args.sweep)
            print("gdn correctness check on GPU: ok", flush=True)
        if args.family in ("all", "mamba2"):
            m2_correctness_check(args.sweep)
            print("mamba2 correctness check on GPU: ok", flush=True)
    # Headline shapes first, so a run cut short still has them.
    if args.family in ("all", "gdn"):
        run_gdn(batches, L, T, reps, args.sweep, results, shapes=((16, 32),))
    if args.family in ("all", "mamba2"):
        run_mamba2(batches, L, T, reps, results, shapes=M2_SHAPES[:1], sweep=args.sweep)
    if args.family in ("all", "gdn"):
        run_gdn(batches, L, T, reps, args.sweep, results, shapes=((16, 64),))
    if args.family in ("all", "mamba2"):
        run_mamba2(batches, L, T, reps, results, shapes=M2_SHAPES[1:], sweep=args.sweep)
    info["elapsed_s"] = time.time() - t0
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"info": info, "results": results}, f, indent=1)
    print(json.dumps(info))
    print_table(results, bw)
    print_split_table(results)


if __name__ == "__main__":
    main()
