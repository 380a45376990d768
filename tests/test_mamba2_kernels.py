"""Mamba-2 ReplaySSM kernels against an fp64 recurrence and SGLang 0.5.17's `selective_state_update`.

State: bit-identical (`torch.equal`) to `selective_state_update(..., dt_softplus=True)` stepped over
the committed tokens, after every decode step and every commit. Outputs: within 2x the baseline's own
error against fp64, plus a small floor. Flush steps (and every step at L=1) match the baseline bit
for bit, output included.
"""

import contextlib
import os

import torch

if not torch.cuda.is_available():
    # Triton picks the interpreter when the kernels are defined; CPU tensors need it.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import triton  # noqa: E402

from replayssm_kernels import commit_prepare, decode_prepare, pending_fold_plan  # noqa: E402
from replayssm_kernels.mamba2 import (  # noqa: E402
    Mamba2Rings,
    alloc_mamba2_rings,
    mamba2_recurrent_ref,
    mamba2_replay_decode,
    mamba2_replay_fold,
    mamba2_replay_verify,
    tile_config,
)
from sglang.kernels.ops.mamba.triton_ops.mamba_ssm import selective_state_update  # noqa: E402
from sglang_replayssm.testing import Mamba2Harness  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
bf16, fp32 = torch.bfloat16, torch.float32
ATOL = {bf16: 1e-3, torch.float16: 1e-3, fp32: 1e-4}


@pytest.fixture(autouse=True, scope="module")
def _cpu_device_context():
    """SGLang's launcher enters `torch.get_device_module(dev).device(idx)`, which torch.cpu lacks;
    on CPU give it a no-op context so the baseline runs in the interpreter."""
    with pytest.MonkeyPatch.context() as mp:
        if not hasattr(torch.cpu, "device"):
            mp.setattr(torch.cpu, "device", lambda index=None: contextlib.nullcontext(), raising=False)
        yield


def _check_out(name, out, base, ref, dtype):
    err = (out.double() - ref.double()).abs().max().item()
    err_base = (base.double() - ref.double()).abs().max().item()
    bound = 2 * err_base + ATOL[dtype]
    assert err <= bound, (
        f"{name}: max err {err:.3e} > 2 * baseline err {err_base:.3e} + {ATOL[dtype]:.0e}; "
        f"mean err {(out.double() - ref.double()).abs().mean().item():.3e}"
    )


def _params(NH, device, gen, hot=False):
    """A in [-8, -0.5]; dt_bias such that softplus(dt_bias) is in [0.01, 0.3] (Mamba-2 init).
    `hot`: head 0 sits at the softplus threshold, so raw dt + bias falls on both sides of 20."""
    A = -(torch.rand(NH, generator=gen) * 7.5 + 0.5)
    dt_bias = torch.log(torch.expm1(torch.rand(NH, generator=gen) * 0.29 + 0.01))
    D = torch.randn(NH, generator=gen)
    if hot:
        A[0], dt_bias[0] = -0.05, 19.9
    return A.to(device), D.to(device), dt_bias.to(device)


def _inputs(B, T, NH, P, G, N, dtype, device, gen, has_z):
    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)

    x, dt, Bm, C = r(B, T, NH, P), r(B, T, NH, scale=0.5), r(B, T, G, N), r(B, T, G, N)
    z = r(B, T, NH, P) if has_z else None
    return x, dt, Bm, C, z


def _baseline(S, x, dt, Bm, C, A, D, dt_bias, z=None, idx=None, update=True):
    """SGLang's kernel as its Mamba-2 mixer calls it (tied head dim, stride-0 expansions).
    Single token: x `[B, NH, P]`; several: x `[B, T, NH, P]` (then `update=False` for verify)."""
    NH, P, N = S.shape[1:]
    out = torch.empty_like(x)
    selective_state_update(
        S, x, dt[..., None].expand(*dt.shape, P), A[:, None, None].expand(NH, P, N), Bm, C,
        D=D[:, None].expand(NH, P), z=z, dt_bias=dt_bias[:, None].expand(NH, P), dt_softplus=True,
        state_batch_indices=idx, out=out, disable_state_update=not update,
    )
    return out


def _tok(t, i):
    return None if t is None else t[:, i]


def _harness(B, NH, P, G, N, L, T_max, A, D, dt_bias, device):
    return Mamba2Harness(batch=B, num_heads=NH, head_dim=P, num_groups=G, state_size=N, A=A, D=D,
                         dt_bias=dt_bias, ring_len=L, max_draft_tokens=T_max, device=device)


DECODE_CASES = [
    # B, NH, P, G, N, L, dtype, has_z, hot, steps
    pytest.param(3, 4, 16, 2, 16, 1, bf16, True, False, 5, id="B3-NH4-P16-G2-N16-L1-bf16-z"),
    pytest.param(3, 4, 16, 1, 16, 4, bf16, False, False, 11, id="B3-NH4-P16-G1-N16-L4-bf16"),
    pytest.param(2, 2, 20, 2, 16, 16, bf16, True, False, 36, id="B2-NH2-P20-G2-N16-L16-bf16-z"),
    pytest.param(3, 4, 20, 2, 24, 4, fp32, True, True, 10, id="B3-NH4-P20-G2-N24-L4-fp32-z-hot"),
    pytest.param(2, 2, 16, 2, 16, 16, fp32, False, False, 34, id="B2-NH2-P16-G2-N16-L16-fp32"),
    pytest.param(2, 2, 80, 1, 16, 4, bf16, True, False, 9, id="B2-NH2-P80-G1-N16-L4-bf16-z"),
    pytest.param(2, 2, 16, 1, 128, 4, bf16, True, False, 9, id="B2-NH2-P16-G1-N128-L4-bf16-z"),
]


@pytest.mark.parametrize("B,NH,P,G,N,L,dtype,has_z,hot,steps", DECODE_CASES)
def test_mamba2_decode(B, NH, P, G, N, L, dtype, has_z, hot, steps):
    device = DEVICE
    gen = torch.Generator().manual_seed(1000 + 7 * L + P + N)
    A, D, dt_bias = _params(NH, device, gen, hot=hot)
    h = _harness(B, NH, P, G, N, L, 1, A, D, dt_bias, device)
    S0 = (torch.randn(B, NH, P, N, generator=gen) * 0.3).to(device)
    h.set_state(S0)
    S_base, S_ref = S0.clone(), S0.double()
    rows = h.slot_idx.long()
    flushes = forced = 0
    for step in range(steps):
        x, dt, Bm, C, z = _inputs(B, 1, NH, P, G, N, dtype, device, gen, has_z)
        force = (torch.rand(B, generator=gen) < 0.4).to(device) if step % 5 == 3 else None
        pool_before = h.checkpoint_pool().clone()
        y = h.decode(x[:, 0], dt[:, 0], Bm[:, 0], C[:, 0], _tok(z, 0), force_flush=force)
        y_base = _baseline(S_base, x[:, 0], dt[:, 0], Bm[:, 0], C[:, 0], A, D, dt_bias, _tok(z, 0))
        y_ref, S_ref = mamba2_recurrent_ref(x, dt, A, Bm, C, D, dt_bias, S_ref, z)
        _check_out(f"step {step}", y, y_base, y_ref[:, 0], dtype)
        assert torch.equal(h.state(), S_base), f"state differs from SGLang's kernel at step {step}"
        flushed = h.pending() == 0
        flushes += int(flushed.sum())
        if force is not None:
            forced += int((force.bool() & flushed).sum())
        # A flush step replays the baseline's exact recurrence, output included. (On a GPU the
        # readout's reduction order follows the tile layout; it matches the baseline's for a
        # power-of-two N. The baseline's runtime `dstate` mask changes its own layout otherwise.)
        if device == "cpu" or N & (N - 1) == 0:
            assert torch.equal(y[flushed], y_base[flushed]), f"flush-step output not bit-exact at step {step}"
        # A non-flush step never writes the checkpoint.
        keep = rows[~flushed]
        assert torch.equal(h.checkpoint_pool()[keep], pool_before[keep])
        if L == 1:
            assert bool(flushed.all())
    assert flushes >= B * (steps // L), "the run must cross several flushes"
    if L > 2:
        assert forced > 0, "force_flush was never exercised"
    pool = h.checkpoint_pool()
    assert not pool[0].any() and not pool[-1].any(), "spare slots were written"


@pytest.mark.parametrize("plan", [
    pytest.param((1, 32, 4, 2), id="split-bm32-w4"),
    pytest.param((1, 32, 1, 1), id="split-bm32-w1"),
    pytest.param((1, 64, 8, 2), id="split-bm64-w8"),
])
@pytest.mark.parametrize("case", [
    pytest.param((2, 2, 20, 2, 16, 16, bf16, True, False, 36), id="P20-N16-L16-z"),
    pytest.param((2, 2, 16, 1, 128, 4, bf16, True, False, 9), id="P16-N128-L4-z"),
])
def test_mamba2_decode_split_plans(plan, case):
    """The split decode plans (flush rows in their own launch and tile) keep every guarantee of
    the one-launch plan: state bit-exact, flush outputs bit-exact, non-flush rows never write."""
    from replayssm_kernels.configs import mamba2_decode_plan, override

    with override("mamba2_decode", plan):
        assert mamba2_decode_plan() == plan
        test_mamba2_decode(*case)
    assert mamba2_decode_plan() == (0, 0, 0, 0)


def test_mamba2_decode_split_plan_with_small_flush_tile_raises():
    """Flush tiles under 32 rows were not bit-exact on the H200: such a plan is refused, naming the setting."""
    from replayssm_kernels.configs import override

    gen = torch.Generator().manual_seed(5)
    NH, P, G, N, L = 2, 16, 1, 16, 4
    A, D, dt_bias = _params(NH, DEVICE, gen)
    h = _harness(2, NH, P, G, N, L, 1, A, D, dt_bias, DEVICE)
    x, dt, Bm, C, z = _inputs(2, 1, NH, P, G, N, bf16, DEVICE, gen, False)
    with override("mamba2_decode", (1, 16, 4, 2)), pytest.raises(ValueError, match="REPLAYSSM_CONFIG"):
        h.decode(x[:, 0], dt[:, 0], Bm[:, 0], C[:, 0])


CHUNKED_DECODE = [
    # (BM, NC, warps), case: NC is capped at the chunks P needs; a program's last chunk may be
    # partly (P20: rows 16..23) or wholly (P80 with 32-row programs: rows 96..111) past P.
    pytest.param((8, 8, 1), (2, 2, 20, 2, 16, 16, bf16, True, False, 36), None, id="bm8-nc3-P20-N16-L16-z"),
    pytest.param((16, 8, 4), (2, 2, 80, 1, 128, 4, bf16, True, False, 9), None, id="bm16-nc5-P80-N128-z"),
    pytest.param((16, 2, 4), (2, 2, 80, 1, 128, 8, fp32, False, True, 19), None, id="bm16-nc2-P80-N128-L8-fp32-hot"),
    pytest.param((16, 8, 4), (2, 2, 80, 1, 128, 4, bf16, True, False, 9), (1, 32, 4, 2),
                 id="bm16-nc5-P80-N128-z-split-flush"),
]


@pytest.mark.parametrize("tile,case,split", CHUNKED_DECODE)
def test_mamba2_decode_chunked_tiles(tile, case, split):
    """Programs of several P-chunks (`configs.mamba2_tile`, e.g. one program per P=80 head as 5 x 16
    rows): every guarantee of the one-chunk tile holds (state and flush outputs bit-exact,
    non-flush rows never write, outputs within the baseline's error)."""
    from replayssm_kernels.configs import override

    P, N = case[2], case[4]
    with override("mamba2_decode_tile", tile), (override("mamba2_decode", split) if split
                                                else contextlib.nullcontext()):
        cfg = tile_config("decode", P, N)
        assert (cfg.BM, cfg.num_warps) == (tile[0], tile[2]) and cfg.NC == min(tile[1], -(-P // tile[0]))
        assert cfg.BMF >= 32  # flush sub-tiles: MIN_FLUSH_ROWS
        test_mamba2_decode(*case)
    assert tile_config("decode", P, N).NC == 1


VERIFY_CASES = [
    # B, NH, P, G, N, L, T_max, dtype, has_z, hot, steps
    pytest.param(3, 4, 16, 2, 16, 1, 1, bf16, True, False, 5, id="B3-NH4-G2-L1-T1-bf16-z"),
    pytest.param(2, 4, 16, 1, 16, 4, 3, bf16, False, True, 12, id="B2-NH4-G1-L4-T3-bf16-hot"),
    pytest.param(2, 4, 20, 2, 16, 16, 4, bf16, True, False, 20, id="B2-NH4-P20-G2-L16-T4-bf16-z"),
    pytest.param(2, 4, 20, 2, 24, 5, 3, fp32, True, False, 10, id="B2-NH4-P20-G2-N24-L5-T3-fp32-z"),
    pytest.param(2, 2, 16, 2, 16, 12, 4, fp32, False, False, 16, id="B2-NH2-G2-L12-T4-fp32"),
    pytest.param(2, 2, 16, 1, 128, 8, 4, bf16, True, False, 8, id="B2-NH2-N128-L8-T4-bf16-z"),
]
CHUNKED_VERIFY = [
    pytest.param((8, 8, 1), (2, 4, 20, 2, 16, 16, 4, bf16, True, False, 20), id="bm8-nc3-P20-L16-T4-z"),
    pytest.param((16, 8, 4), (2, 2, 80, 1, 128, 8, 4, bf16, True, False, 8), id="bm16-nc5-P80-N128-T4-z"),
    pytest.param((16, 2, 4), (2, 2, 80, 2, 128, 8, 3, fp32, False, False, 12), id="bm16-nc2-P80-N128-T3-fp32"),
]


def _advance_rows(S_base, S_ref, acc, x, dt, Bm, C, z, A, D, dt_bias):
    """Step the baseline (all rows at once, padding the rows that are done) and the fp64
    reference over the first `acc[r]` drafts of each row."""
    B, T = x.shape[:2]
    rows = torch.arange(B, dtype=torch.int32, device=x.device)
    for t in range(T):
        idx = torch.where(acc.to(x.device) > t, rows, torch.full_like(rows, -1))
        _baseline(S_base, x[:, t], dt[:, t], Bm[:, t], C[:, t], A, D, dt_bias, _tok(z, t), idx=idx)
    for r in range(B):
        n = int(acc[r])
        zr = None if z is None else z[r:r + 1, :n]
        _, S_new = mamba2_recurrent_ref(x[r:r + 1, :n], dt[r:r + 1, :n], A, Bm[r:r + 1, :n], C[r:r + 1, :n],
                                        D, dt_bias, S_ref[r:r + 1], zr)
        S_ref[r] = S_new[0]


@pytest.mark.parametrize("B,NH,P,G,N,L,T_max,dtype,has_z,hot,steps", VERIFY_CASES)
def test_mamba2_verify_commit(B, NH, P, G, N, L, T_max, dtype, has_z, hot, steps):
    device = DEVICE
    gen = torch.Generator().manual_seed(2000 + 7 * L + P + N + T_max)
    A, D, dt_bias = _params(NH, device, gen, hot=hot)
    h = _harness(B, NH, P, G, N, L, T_max, A, D, dt_bias, device)
    S0 = (torch.randn(B, NH, P, N, generator=gen) * 0.3).to(device)
    h.set_state(S0)
    S_base, S_ref = S0.clone(), S0.double()
    folds = 0
    for step in range(steps):
        T = int(torch.randint(1, T_max + 1, (1,), generator=gen))
        x, dt, Bm, C, z = _inputs(B, T, NH, P, G, N, dtype, device, gen, has_z)
        pool_before = h.checkpoint_pool().clone()
        y = h.verify(x, dt, Bm, C, z)
        assert y.shape == (B, T, NH, P)
        assert torch.equal(h.checkpoint_pool(), pool_before), "verify wrote the checkpoint"
        y_base = _baseline(S_base.clone(), x, dt, Bm, C, A, D, dt_bias, z, update=False)
        y_ref, _ = mamba2_recurrent_ref(x, dt, A, Bm, C, D, dt_bias, S_ref, z)
        _check_out(f"step {step}", y, y_base, y_ref, dtype)
        acc = torch.randint(1, T + 1, (B,), generator=gen)
        before = h.pending() + acc.to(device).int()
        h.commit(acc.to(device))
        folds += int((h.pending() < before).sum())
        _advance_rows(S_base, S_ref, acc, x, dt, Bm, C, z, A, D, dt_bias)
        assert torch.equal(h.state(), S_base), f"state differs from SGLang's kernel after commit {step}"
        assert bool((h.pending() + T_max <= L).all()), "the next window must fit"
    assert folds >= 2 * B if L > 1 else folds == B * steps, f"the run must fold several times, got {folds}"
    pool = h.checkpoint_pool()
    assert not pool[0].any() and not pool[-1].any(), "spare slots were written"


@pytest.mark.parametrize("unroll", [8, 16])
def test_mamba2_replay_unroll_depths_are_exact(unroll):
    """Other straight-line depths of the exact replay (`configs.mamba2_replay_unroll`, timed by the
    kernel sweep): decode flushes and commit folds stay bit-exact, through the chunked main loop and
    the one-entry remainder loop."""
    from replayssm_kernels.configs import mamba2_replay_unroll, override

    with override("mamba2_replay_unroll", (unroll,)):
        assert mamba2_replay_unroll() == unroll
        test_mamba2_decode(2, 2, 20, 2, 16, 16, bf16, True, False, 36)
        test_mamba2_verify_commit(2, 4, 20, 2, 16, 16, 4, bf16, True, False, 20)
    assert mamba2_replay_unroll() == 4


@pytest.mark.parametrize("plan,case", [
    pytest.param((), (2, 2, 20, 2, 16, 16, bf16, True, False, 36), id="table-G2-L16-z"),
    pytest.param((("mamba2_decode_tile", (16, 8, 2)),), (3, 2, 80, 1, 128, 4, bf16, False, False, 14),
                 id="t16x8x2-P80"),
    pytest.param((("mamba2_decode", (1, 32, 4, 2)),), (2, 4, 16, 2, 128, 4, bf16, True, False, 9), id="split-G2"),
])
def test_mamba2_decode_ring_bc_launch(plan, case):
    """The ring's B . C in a launch of its own (`configs.mamba2_ring_bc`, per row and group): state and
    flush outputs bit-exact, the other outputs within the baseline's error, with one and several
    groups and with the split plan's non-flush launch."""
    from replayssm_kernels.configs import mamba2_ring_bc, overrides

    assert not mamba2_ring_bc(1 << 20)
    with overrides([("mamba2_ring_bc_min_batch", (1,)), *plan]):
        assert mamba2_ring_bc(1)
        test_mamba2_decode(*case)


@pytest.mark.parametrize("tile,case", CHUNKED_VERIFY)
def test_mamba2_verify_chunked_tiles(tile, case):
    """The verify with several P-chunks per program: outputs within the baseline's error, the
    checkpoint untouched, the committed state bit-exact after every commit."""
    from replayssm_kernels.configs import override

    P, N = case[2], case[4]
    with override("mamba2_verify_tile", tile):
        assert tile_config("verify", P, N).NC == min(tile[1], -(-P // tile[0]))
        test_mamba2_verify_commit(*case)


def test_mamba2_partial_fold_rotates_origin():
    """Fold only part of the committed entries (radix track boundary): origin rotates, the rest
    stays pending, and the committed state is still exact."""
    device = DEVICE
    B, NH, P, G, N, L, T_max = 2, 4, 16, 2, 16, 8, 3
    gen = torch.Generator().manual_seed(7)
    A, D, dt_bias = _params(NH, device, gen)
    h = _harness(B, NH, P, G, N, L, T_max, A, D, dt_bias, device)
    S0 = (torch.randn(B, NH, P, N, generator=gen) * 0.3).to(device)
    h.set_state(S0)
    S_base, S_ref = S0.clone(), S0.double()
    for _ in range(6):
        x, dt, Bm, C, z = _inputs(B, T_max, NH, P, G, N, bf16, device, gen, True)
        h.verify(x, dt, Bm, C, z)
        acc = torch.tensor([T_max, 2])
        # Same as h.commit, but ask for a fold through the first 2 entries of this window.
        h._pending_verify = None
        fw = torch.full((B,), 2, dtype=torch.int32, device=device)
        pending = h.pending()
        n, org = commit_prepare(h.slot_idx, h.wpos, h.origin, acc.to(device).int(), L, T_max, fold_window=fw)
        assert bool((n >= pending + 2).all())
        mamba2_replay_fold(h._state, h._rings, A[None], dt_bias[None], h.slot_idx, n, org)
        _advance_rows(S_base, S_ref, acc, x, dt, Bm, C, z, A, D, dt_bias)
        assert torch.equal(h.state(), S_base)
    assert bool((h.origin[h.slot_idx.long()] != 0).any()), "origin never rotated"


def test_mamba2_ring_too_small_raises():
    p = torch.zeros(2)
    with pytest.raises(ValueError, match="ring_len"):
        _harness(1, 2, 16, 1, 16, 2, 4, p, p, p, DEVICE)


def test_mamba2_tile_config():
    """Nemotron-3-Super (P=64, N=128) and Nemotron-Nano (P=80): the whole N row per program with at
    least 4 fp32 per thread (the baseline's readout layout), little P padding."""
    for kernel in ("decode", "verify", "fold"):
        for P, N in ((64, 128), (80, 128), (20, 16), (16, 16), (64, 64)):
            cfg = tile_config(kernel, P, N)
            padded = -(-P // cfg.BM) * cfg.BM
            assert cfg.BN == triton.next_power_of_2(N)
            assert cfg.BM * cfg.BN >= 4 * 32 * cfg.num_warps and cfg.BMF * cfg.BN >= 4 * 32 * cfg.num_warps
            assert cfg.BM % cfg.BMF == 0 and cfg.BMF <= cfg.BM
            assert 4 * (padded - P) <= padded or cfg.BM * cfg.BN == 4 * 32 * cfg.num_warps


def test_mamba2_default_tiles_by_batch():
    """From `mamba2_chunk_min_batch` rows (8) the verify and the decode run 16-row chunks, 2 warps, one
    program per head; from 128 rows the decode at P = 64 (Nemotron-3-Super) runs 64-row programs
    of 2 warps; below 8 rows the table tile (the H200 measurements of docs/perf.md run 7)."""
    from replayssm_kernels.configs import mamba2_chunk_min_batch

    assert mamba2_chunk_min_batch() == 8
    for kernel, P, rows, want in (("verify", 64, 256, (16, 4, 2)), ("verify", 80, 512, (16, 5, 2)),
                                  ("decode", 80, 256, (16, 5, 2)), ("decode", 64, 256, (64, 1, 2)),
                                  ("decode", 64, 128, (64, 1, 2)), ("decode", 64, 127, (16, 4, 2)),
                                  ("decode", 64, 8, (16, 4, 2)),
                                  ("verify", 64, 8, (16, 4, 2)), ("decode", 80, 8, (16, 5, 2)),
                                  ("verify", 64, 7, None), ("decode", 64, 7, None), ("decode", 80, 1, None),
                                  ("verify", 80, None, None)):
        cfg = tile_config(kernel, P, 128, rows)
        if want is None:
            assert cfg.NC == 1 and cfg == tile_config(kernel, P, 128), (kernel, P, rows)
        else:
            assert (cfg.BM, cfg.NC, cfg.num_warps) == want, (kernel, P, rows, cfg)
            assert cfg.BMF >= 32
    # a head too narrow for 16-row chunks keeps the table tile
    assert tile_config("verify", 20, 16, 256).NC == 1


@pytest.mark.parametrize("kernel", ["decode", "verify"])
def test_mamba2_default_chunked_dispatch_is_exact(kernel, monkeypatch):
    """The default dispatch itself (threshold lowered to 1 row, so a CPU-sized batch takes it): the
    kernels launch the chunked default tiles, which keep the state bit-exact and the outputs within
    the baseline's error."""
    import importlib

    from replayssm_kernels.configs import override

    mod = importlib.import_module(f"replayssm_kernels.mamba2.{kernel}")
    used = []

    def spy(*args, **kwargs):
        cfg = tile_config(*args, **kwargs)
        used.append(cfg.NC if cfg.num_warps != 2 or cfg.NC != 1 else "wide")
        return cfg

    monkeypatch.setattr(mod, "tile_config", spy)
    with override("mamba2_chunk_min_batch", (1,)):
        if kernel == "decode":
            test_mamba2_decode(2, 2, 80, 1, 128, 4, bf16, True, False, 9)
        else:
            test_mamba2_verify_commit(2, 2, 64, 2, 128, 8, 4, bf16, True, False, 8)
    assert used and set(used) == {5 if kernel == "decode" else 4}, used
    if kernel == "decode":
        # the P = 64 decode's wide programs (threshold lowered to 1 row as well)
        import replayssm_kernels.configs as configs

        monkeypatch.setattr(configs, "_MAMBA2_DECODE_WIDE_MIN_BATCH", 1)
        used.clear()
        with override("mamba2_chunk_min_batch", (1,)):
            test_mamba2_decode(2, 2, 64, 1, 128, 4, bf16, True, False, 9)
        assert used and set(used) == {"wide"}, used


def _direct_setup(device, gen, dtype=bf16, NH=4, P=16, G=2, N=16, L=4, S=6, Lm=1, slot_pad=1):
    """State pool and rings as strided slot views (pool layout), filled with random data."""
    state = torch.randn(Lm, S, slot_pad, NH, P, N, generator=gen)[:, :, 0].mul(0.3).to(device)
    shapes = {"x": (NH, L, P), "B": (G, L, N), "dt": (NH, L)}
    rings = Mamba2Rings(**{
        k: (torch.randn(Lm, S, slot_pad, *s, generator=gen) * (0.5 if k == "dt" else 1.0)).to(device, dtype)[:, :, 0]
        for k, s in shapes.items()
    })
    return state, rings


@pytest.mark.parametrize("tile", [None, (16, 8, 2)], ids=["table", "chunked"])
def test_mamba2_padding_rows_write_nothing(tile):
    """Padding rows (slot < 0) write nothing in the decode, the verify and the fold, with the table
    tile and with the chunked tile that the default takes from 8 rows."""
    from replayssm_kernels.configs import overrides

    with overrides([("mamba2_decode_tile", tile), ("mamba2_verify_tile", tile)] if tile else []):
        _padding_rows_write_nothing()


def _padding_rows_write_nothing():
    device = DEVICE
    gen = torch.Generator().manual_seed(3)
    B, NH, P, G, N, L, S = 3, 4, 16, 2, 16, 6, 6
    A, D, dt_bias = _params(NH, device, gen)
    state, rings = _direct_setup(device, gen, NH=NH, P=P, G=G, N=N, L=L, S=S)
    slot = torch.tensor([4, -1, 1], dtype=torch.int32, device=device)
    wpos = torch.tensor([0, 2, 0, 0, 5, 0], dtype=torch.int32, device=device)
    origin = torch.tensor([0, 3, 0, 0, 2, 0], dtype=torch.int32, device=device)
    snap = lambda: [t.clone() for t in [state, *rings.tensors(), wpos, origin]]  # noqa: E731
    before = snap()
    x, dt, Bm, C, z = _inputs(B, 1, NH, P, G, N, bf16, device, gen, True)
    out = torch.full((B, NH, P), float("nan"), dtype=bf16, device=device)
    row_wp, row_flush = decode_prepare(slot, wpos, L)
    assert row_wp.tolist() == [5, 0, 2] and row_flush.tolist() == [1, 0, 0]
    mamba2_replay_decode(x[:, 0], dt[:, 0], Bm[:, 0], C[:, 0], A, D, dt_bias, state[0], rings.layer(0),
                         slot, row_wp, row_flush, origin, z=z[:, 0], out=out)
    assert torch.isnan(out[1]).all() and not torch.isnan(out[[0, 2]]).any()
    # Only slot 4 (flush: checkpoint) and slot 1 (append: ring) may change; nothing else.
    untouched = torch.ones(S, dtype=torch.bool, device=device)
    untouched[[4, 1]] = False
    after = [state, *rings.tensors()]
    for t0, t1 in zip(before, after):
        assert torch.equal(t0[:, untouched], t1[:, untouched])
    assert not torch.equal(before[0][:, 4], state[:, 4]), "the flush row must store its checkpoint"
    assert torch.equal(before[0][:, 1], state[:, 1]), "a non-flush row must not write its checkpoint"
    for t0, t1 in zip(before[1:4], after[1:]):
        assert torch.equal(t0[:, 4], t1[:, 4]), "a flush row appends nothing"
    # Verify and fold: the padding row stays untouched too; verify never writes the checkpoint.
    before = snap()
    x, dt, Bm, C, z = _inputs(B, 2, NH, P, G, N, bf16, device, gen, True)
    out = torch.full((B, 2, NH, P), float("nan"), dtype=bf16, device=device)
    mamba2_replay_verify(x, dt, Bm, C, A, D, dt_bias, state[0], rings.layer(0), slot, wpos, origin, z=z, out=out)
    assert torch.isnan(out[1]).all() and not torch.isnan(out[[0, 2]]).any()
    assert torch.equal(before[0], state)
    for t0, t1 in zip(before, [state, *rings.tensors()]):
        assert torch.equal(t0[:, untouched], t1[:, untouched])
    n, org = commit_prepare(slot, wpos, origin, torch.tensor([2, 2, 2], device=device), L, 2)
    assert n.tolist() == [0, 0, 5]
    mamba2_replay_fold(state, rings, A[None], dt_bias[None], slot, n, org)
    for t0, t1 in zip(before, [state, *rings.tensors(), wpos, origin]):
        assert torch.equal(t0[:, untouched] if t0.dim() > 1 else t0[untouched],
                           t1[:, untouched] if t1.dim() > 1 else t1[untouched])
    # Padding rows with a separate destination: nothing is copied for them either.
    dst = torch.full((1, B, NH, P, N), float("nan"), device=device)
    n, org = pending_fold_plan(slot, wpos, origin)
    mamba2_replay_fold(state, rings, A[None], dt_bias[None], slot, n, org, dst=dst,
                       dst_idx=torch.arange(B, dtype=torch.int32, device=device))
    assert torch.isnan(dst[0, 1]).all() and not torch.isnan(dst[0, [0, 2]]).any()


def _per_layer_params(Lm, NH, device, gen):
    """`[Lm, NH]` A and dt_bias, one draw of `_params` per layer."""
    draws = [_params(NH, device, gen) for _ in range(Lm)]
    return torch.stack([d[0] for d in draws]), torch.stack([d[2] for d in draws])


def test_mamba2_fold_all_layers_equals_per_layer():
    """One launch over all layers (per-layer A and dt_bias, strided slot views) equals layer-by-layer
    folds; `dst` equals the in-place result and copies rows with nothing to fold."""
    device = DEVICE
    gen = torch.Generator().manual_seed(11)
    Lm, L, NH = 3, 4, 4
    state, rings = _direct_setup(device, gen, L=L, Lm=Lm, NH=NH, slot_pad=2)
    A, dt_bias = _per_layer_params(Lm, NH, device, gen)
    slot = torch.tensor([5, 0, 2, -1], dtype=torch.int32, device=device)
    n = torch.tensor([4, 1, 0, 2], dtype=torch.int32, device=device)
    org = torch.tensor([1, 3, 0, 0], dtype=torch.int32, device=device)
    state0 = state.clone()
    dst = torch.zeros(Lm, 4, *state.shape[2:], device=device)
    mamba2_replay_fold(state, rings, A, dt_bias, slot, n, org, dst=dst,
                       dst_idx=torch.tensor([2, 0, 1, 3], dtype=torch.int32, device=device))
    assert torch.equal(state, state0), "a fold into `dst` must not touch the pool"
    per_layer = state.clone()
    for i in range(Lm):
        mamba2_replay_fold(per_layer[i], rings.layer(i), A[i], dt_bias[i], slot, n, org)
    mamba2_replay_fold(state, rings, A, dt_bias, slot, n, org)
    assert torch.equal(state, per_layer)
    assert torch.equal(dst[:, [2, 0, 1]], state[:, [5, 0, 2]])
    assert not dst[:, 3].any(), "a padding row must not be materialised"
    # The fold is the baseline stepped over the ring entries (layer 1, slot 5: 4 entries from 1).
    li, sl = 1, 5
    S_b = state0[li, [sl]].clone()
    for j in range(4):
        phys = (1 + j) % L
        xj, Bj, dtj = rings.x[li, sl, :, phys][None], rings.B[li, sl, :, phys][None], rings.dt[li, sl, :, phys][None]
        _baseline(S_b, xj, dtj, Bj, torch.zeros_like(Bj), A[li], torch.zeros(NH, device=device), dt_bias[li])
    assert torch.equal(S_b[0], state[li, sl]), "fold differs from the baseline stepped over the ring"


def test_mamba2_fold_snapshot_at_track_step():
    """The fold can store the state after its j-th entry into another slot (radix track slot):
    that snapshot equals folding only j entries; a row without a request stores nothing."""
    device = DEVICE
    gen = torch.Generator().manual_seed(17)
    Lm, L, NH, S = 2, 8, 4, 8
    state, rings = _direct_setup(device, gen, L=L, Lm=Lm, NH=NH, S=S)
    A, dt_bias = _per_layer_params(Lm, NH, device, gen)
    slot = torch.tensor([1, 4, 3], dtype=torch.int32, device=device)
    n = torch.tensor([6, 3, 5], dtype=torch.int32, device=device)
    org = torch.tensor([5, 0, 2], dtype=torch.int32, device=device)
    snap_at = torch.tensor([2, -1, 5], dtype=torch.int32, device=device)
    snap_slot = torch.tensor([6, 7, 0], dtype=torch.int32, device=device)
    ref_partial = state.clone()
    mamba2_replay_fold(ref_partial, rings, A, dt_bias, slot, torch.tensor([2, 0, 5], dtype=torch.int32,
                                                                          device=device), org)
    ref_full = state.clone()
    mamba2_replay_fold(ref_full, rings, A, dt_bias, slot, n, org)
    before7 = state[:, 7].clone()
    mamba2_replay_fold(state, rings, A, dt_bias, slot, n, org, snap_at=snap_at, snap_slot=snap_slot)
    assert torch.equal(state[:, 6], ref_partial[:, 1]), "snapshot must be the state after 2 entries"
    assert torch.equal(state[:, 0], ref_full[:, 3]), "snapshot after all 5 entries is the folded state"
    assert torch.equal(state[:, 7], before7), "no snapshot requested for row 1"
    assert torch.equal(state[:, [1, 4, 3]], ref_full[:, [1, 4, 3]])
    with pytest.raises(ValueError, match="snap_at"):
        mamba2_replay_fold(state, rings, A, dt_bias, slot, n, org, snap_at=snap_at)


def test_mamba2_strided_activations():
    """x, B, C as views of one packed conv output and dt of a wider projection (the mixer's
    layout) give the same results as contiguous copies."""
    device = DEVICE
    gen = torch.Generator().manual_seed(13)
    B, NH, P, G, N, L = 3, 4, 16, 2, 16, 3
    A, D, dt_bias = _params(NH, device, gen)
    S0 = (torch.randn(B, NH, P, N, generator=gen) * 0.3).to(device)
    ha, hb = (_harness(B, NH, P, G, N, L, 1, A, D, dt_bias, device) for _ in range(2))
    ha.set_state(S0)
    hb.set_state(S0)
    for step in range(4):
        xbc = torch.randn(B, NH * P + 2 * G * N, generator=gen).to(device, bf16)
        proj = torch.randn(B, NH + 5, generator=gen).to(device, bf16)
        x = xbc[:, :NH * P].view(B, NH, P)
        Bm = xbc[:, NH * P:NH * P + G * N].view(B, G, N)
        C = xbc[:, NH * P + G * N:].view(B, G, N)
        dt = proj[:, 2:2 + NH]
        ya = ha.decode(x, dt, Bm, C)
        yb = hb.decode(x.contiguous(), dt.contiguous(), Bm.contiguous(), C.contiguous())
        torch.testing.assert_close(ya, yb, rtol=0, atol=0 if DEVICE == "cpu" else 1e-2)
        assert torch.equal(ha.state(), hb.state())


def test_mamba2_perturbed_ring_is_caught():
    """Teeth: corrupting one pending ring entry breaks the state check (dt, x or B) and the output
    check (x). The checks above can fail."""
    device = DEVICE
    B, NH, P, G, N, L = 2, 4, 16, 2, 16, 8
    gen = torch.Generator().manual_seed(5)
    A, D, dt_bias = _params(NH, device, gen)
    h = _harness(B, NH, P, G, N, L, 1, A, D, dt_bias, device)
    S0 = (torch.randn(B, NH, P, N, generator=gen) * 0.3).to(device)
    h.set_state(S0)
    S_base, S_ref = S0.clone(), S0.double()
    for _ in range(3):
        x, dt, Bm, C, z = _inputs(B, 1, NH, P, G, N, bf16, device, gen, False)
        h.decode(x[:, 0], dt[:, 0], Bm[:, 0], C[:, 0])
        _baseline(S_base, x[:, 0], dt[:, 0], Bm[:, 0], C[:, 0], A, D, dt_bias)
        _, S_ref = mamba2_recurrent_ref(x, dt, A, Bm, C, D, dt_bias, S_ref)
    assert torch.equal(h.state(), S_base)
    slot0 = int(h.slot_idx[0])
    for ring, index in ((h._rings.dt, (0, slot0, 1, 1)), (h._rings.x, (0, slot0, 2, 1, 3)),
                        (h._rings.B, (0, slot0, 1, 0, 5))):
        saved = ring[index].clone()
        ring[index] += 0.25
        assert not torch.equal(h.state(), S_base), "a corrupted ring entry went unnoticed"
        ring[index] = saved
        assert torch.equal(h.state(), S_base)
    # Output path: corrupt x of one pending entry; the next output must leave the tolerance.
    h._rings.x[0, slot0, 0, 2] += 4.0
    x, dt, Bm, C, z = _inputs(B, 1, NH, P, G, N, bf16, device, gen, False)
    y = h.decode(x[:, 0], dt[:, 0], Bm[:, 0], C[:, 0])
    y_base = _baseline(S_base, x[:, 0], dt[:, 0], Bm[:, 0], C[:, 0], A, D, dt_bias)
    y_ref, _ = mamba2_recurrent_ref(x, dt, A, Bm, C, D, dt_bias, S_ref)
    with pytest.raises(AssertionError):
        _check_out("perturbed", y, y_base, y_ref[:, 0], bf16)
    assert not torch.equal(h.state(), S_base)


def test_mamba2_fold_from_cursors_equals_the_pending_plan():
    """`cursors=(wpos, origin)` folds exactly what `pending_fold_plan` + the fold do."""
    device = DEVICE
    gen = torch.Generator().manual_seed(12)
    Lm, L, NH = 2, 4, 4
    state, rings = _direct_setup(device, gen, L=L, Lm=Lm, NH=NH, slot_pad=2)
    A, dt_bias = _per_layer_params(Lm, NH, device, gen)
    from pool_helpers import pending_cursor_case

    slot, wpos, origin = pending_cursor_case(state.shape[1], device)
    n, org = pending_fold_plan(slot, wpos, origin)
    ref, got = state.clone(), state.clone()
    mamba2_replay_fold(ref, rings, A, dt_bias, slot, n, org)
    mamba2_replay_fold(got, rings, A, dt_bias, slot, None, None, cursors=(wpos, origin))
    assert torch.equal(got, ref) and not torch.equal(got, state)
    dst_idx = torch.tensor([1, 3, 0, 2], dtype=torch.int32, device=device)
    d_ref = torch.zeros(Lm, 4, *state.shape[2:], device=device)
    d_got = torch.zeros_like(d_ref)
    mamba2_replay_fold(state, rings, A, dt_bias, slot, n, org, dst=d_ref, dst_idx=dst_idx)
    mamba2_replay_fold(state, rings, A, dt_bias, slot, None, None, dst=d_got, dst_idx=dst_idx, cursors=(wpos, origin))
    assert torch.equal(d_got, d_ref) and d_ref.any()
