"""The split checkpoint layout (gdn/ckpt.py): exact round trip, the same committed state as
SGLang's kernel through every decode plan, verify plan and fold, and half reads only where the
outputs end in a bf16 cast.

Shapes follow the device: on the GPU the split layout runs with the tree (or shuffle) form of the
exact replay only, which is K = 128's (`configs.gdn_ckpt_split_form_ok`; the plain form is
refused there, `test_split_is_refused_where_the_replay_form_cannot_keep_it`); under the
interpreter every form matches SGLang's kernel, and small heads keep the run short."""

import pytest
import torch
import triton
import triton.language as tl

from replayssm_kernels import decode_prepare
from replayssm_kernels.configs import interpreted, override, overrides
from replayssm_kernels.gdn import gdn_replay_decode, gdn_replay_fold, split_ckpt_decode, split_ckpt_encode
from replayssm_kernels.gdn import verify_loop
from replayssm_kernels.gdn.ckpt import split_ckpt_convert, split_ckpt_hi
from sglang_replayssm.testing import GDNHarness

import test_gdn_kernels as gk
from test_gdn_kernels import VERIFY_KERNEL_PLANS, _direct_setup, _inputs, _params

bf16, fp32 = torch.bfloat16, torch.float32
SPLIT = ("gdn_ckpt_split", (1,))


def _kv(device, small):
    """(K, V): `small` under the interpreter, 128 x 128 on the GPU."""
    return (128, 128) if str(device).startswith("cuda") else small


def _words(hi: torch.Tensor, lo: torch.Tensor) -> torch.Tensor:
    """fp32 values with the given 16-bit halves (int64 inputs)."""
    bits = (hi << 16) | lo
    return (bits - ((bits & 0x80000000) << 1)).to(torch.int32).view(torch.float32)


def test_split_layout_round_trip_is_exact_on_every_high_half():
    """Every high half (NaN and infinity included) with low halves around the rounding point:
    decode(encode(x)) has x's bits, and the `hi` plane alone is x rounded to bf16 (nearest,
    ties away from zero)."""
    hi = torch.arange(1 << 16, dtype=torch.int64)
    for lo_val in (0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1234, 0xBEEF):
        lo = torch.full_like(hi, lo_val)
        x = _words(hi, lo).reshape(256, 256)  # [V, K] = [256, 256]
        y = split_ckpt_encode(x)
        assert torch.equal(split_ckpt_decode(y).view(torch.int32), x.view(torch.int32))
        finite = torch.isfinite(x) & (x.abs() < 3.0e38)
        got = split_ckpt_hi(y)[finite]
        mag = x.abs()[finite]
        down = (mag.view(torch.int32) & ~0xFFFF).view(torch.float32)
        up = ((mag.view(torch.int32) & ~0xFFFF) + 0x10000).view(torch.float32)
        want = torch.where(torch.tensor(lo_val >= 0x8000), up, down) * torch.sign(x[finite])
        want = torch.where(x[finite] == 0, x[finite], want)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), f"lo={lo_val:#x}"
        if lo_val not in (0x8000,):  # off the tie, that is bf16's own round to nearest
            assert torch.equal(got, x[finite].bfloat16().float())


def test_split_convert_kernel_matches_the_reference_and_touches_only_the_given_slots(device):
    """`split_ckpt_convert` (the servers' in-place conversion kernel) against the torch reference
    `split_ckpt_encode` / `_decode`: listed slots of every layer (padding `-1` skipped), a whole
    one-layer pool, and back."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 5, 3, 8, 16, generator=gen).to(device)
    s = x.clone()
    split_ckpt_convert(s, torch.tensor([4, -1, 1], dtype=torch.int32, device=device), True)
    assert torch.equal(s[:, [0, 2, 3]].view(torch.int32), x[:, [0, 2, 3]].view(torch.int32))
    assert torch.equal(s[:, [4, 1]].view(torch.int32), split_ckpt_encode(x[:, [4, 1]]).view(torch.int32))
    split_ckpt_convert(s, torch.tensor([1, 4], dtype=torch.int64, device=device), False)
    assert torch.equal(s.view(torch.int32), x.view(torch.int32))
    s4 = x[0].clone()
    split_ckpt_convert(s4, None, True)
    assert torch.equal(s4.view(torch.int32), split_ckpt_encode(x[0]).view(torch.int32))
    split_ckpt_convert(s4, None, False)
    assert torch.equal(s4.view(torch.int32), x[0].view(torch.int32))


@pytest.mark.parametrize("cfg,shape", [
    pytest.param((0, 32, 1, 3, 32, 0, 0), (32, 40, 4), id="plan0-fused"),
    pytest.param((1, 64, 4, 2, 16, 0, 1), (32, 40, 4), id="plan1-split"),
    pytest.param((1, 128, 4, 2, 32, 1, 0), (32, 40, 4), id="plan1-dot"),
    pytest.param((2, 16, 1, 3, 8, 0, 1), (48, 40, 4), id="plan2-prep"),
    pytest.param((3, 16, 1, 3, 16, 0, 1), (48, 40, 4), id="plan3"),
    pytest.param((4, 16, 1, 3, 16, 0, 1), (48, 40, 4), id="plan4"),
    pytest.param((5, 16, 1, 2, 16, 0, 1, 2, 3), (48, 40, 4), id="plan5-split2-flushsplit3"),
    pytest.param((5, 16, 1, 3, 8, 0, 1, 1, 8), (128, 128, 16), id="plan5-flushsplit8-K128"),
    # Plan 5's tensor-core products (its sixth number; split checkpoints with bf16 activations):
    # the outputs of non-flush rows from bf16 products of the hi planes.
    pytest.param((5, 16, 1, 1, 16, 1, 1, 2, 3, 25), (48, 40, 4), id="plan5-dot-split2-flushsplit3-cap25"),
    pytest.param((5, 16, 1, 0, 16, 1, 1, 1, 3), (48, 40, 4), id="plan5-dot-prefetch-flushsplit3"),
    # 32-column tiles with it (session 47: 128 registers and no spills offline, a candidate for the
    # H200, whose decode waits on loads: 8 KB a tile in flight a warp instead of 4)
    pytest.param((5, 32, 1, 1, 8, 1, 1, 1, 2, 13), (48, 80, 4), id="plan5-dot-bv32-flushsplit2-cap13"),
])
def test_gdn_decode_split_ckpt(cfg, shape, device, assert_within_baseline):
    """Every decode plan on a split-layout pool: the state `torch.equal` to SGLang's kernel after
    every step, flush outputs bit-exact, the others within the baseline's error."""
    K, V = _kv(device, shape[:2])
    L = shape[2]
    with overrides([SPLIT, ("gdn_decode", cfg)]):
        gk.test_gdn_decode(2, 1, 2, K, V, L, bf16, 18 if L == 16 else 9, device, assert_within_baseline)


@triton.jit
def _tile_products_probe(h, kq, out, DOT: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr):
    """Decode plan 5's `(S k, S q)` of one bf16 tile (`[BV, BK]`) with the given `DOT` form."""
    o_v = tl.arange(0, BV)
    o_k = tl.arange(0, BK)
    b_h = tl.load(h + o_v[:, None] * BK + o_k[None, :])
    b_ks = tl.load(kq + o_k)
    b_qs = tl.load(kq + BK + o_k)
    if DOT > 0:
        b_p = verify_loop._decode_probe_halves(kq, kq + BK, 1.0, 1.0, BK, BK, 16)
        b_sk, b_sq = verify_loop._tile_products(b_h, b_ks, b_qs, b_p, DOT, 16)
    else:
        b_sk, b_sq = verify_loop._tile_products(b_h.to(tl.float32), b_ks, b_qs, b_ks, DOT, 16)
    tl.store(out + o_v, b_sk)
    tl.store(out + BV + o_v, b_sq)


def test_plan5_tensor_core_products_keep_fp32_accuracy(device):
    """Plan 5's tensor-core form (`_tile_products`, `DOT` 1 on the GPU, 2 under the interpreter) gives
    `S k` and `S q` of the bf16 `hi` tile to about fp32 accuracy: the key and query go in as two
    bf16 halves each. With the high halves alone the products would be ~2^-9 off; the bound below
    is 2^-15 of the sums' magnitudes, and the fp32 warp reductions (`DOT` 0) meet it too."""
    gen = torch.Generator().manual_seed(46)
    BV, BK = 16, 128
    h = torch.randn(BV, BK, generator=gen).to(bf16).to(device)
    kq = torch.randn(2, BK, generator=gen)
    kq = (kq / kq.norm(dim=1, keepdim=True)).to(device)
    want = h.double() @ kq.double().T  # [BV, 2]
    mag = h.double().abs() @ kq.double().abs().T
    for dot in (0, 2 if interpreted() else 1):
        out = torch.empty(2, BV, dtype=fp32, device=device)
        _tile_products_probe[(1,)](h, kq.contiguous(), out, DOT=dot, BV=BV, BK=BK)
        err = (out.double().T - want).abs()
        assert bool((err <= mag * 2.0 ** -15).all()), (dot, (err / mag).max().item())


def test_plan5_tensor_core_form_only_on_split_half_reads():
    """A plan-5 `gdn_decode` plan's sixth number turns the tensor-core form on (`DOT` 1, or 2 under
    the interpreter) only where the outputs read the bf16 `hi` planes: split checkpoints with bf16
    activations; elsewhere (fp32 checkpoints, fp32 activations) the fp32 warp reductions run."""
    from dataclasses import replace

    from replayssm_kernels.configs import gdn_decode_config
    from replayssm_kernels.gdn.decode import plan5_constexprs

    dot = gdn_decode_config(128, 128, rows=256, split_ckpt=True)
    assert dot.use_dot, "the split layout's large-batch plan has the tensor-core form (perf.md run 28)"
    nodot = replace(dot, use_dot=False)
    on = 2 if interpreted() else 1

    def form(cfg, split, half):
        return plan5_constexprs(cfg, 16, 32, 128, 128, 16, tree=1, split=split, half=half, ordered=True,
                                raw_k=False)["DOT"]

    assert form(dot, True, True) == on
    assert form(dot, False, False) == 0 and form(dot, True, False) == 0
    assert form(nodot, True, True) == 0
    with override("gdn_decode", (5, 16, 1, 1, 8, 0, 1, 1, 8, 13, 96)):
        assert not gdn_decode_config(128, 128, rows=256, split_ckpt=True).use_dot


def test_gdn_decode_split_ckpt_large_state(device, assert_within_baseline):
    """A state ten times the other tests' (std 3): the outputs' half reads of it stay within 2x the
    baseline's own error (whose bf16 output cast grows with it)."""
    K, V = _kv(device, (64, 32))
    with override(*SPLIT):
        gk.test_gdn_decode(2, 1, 2, K, V, 8, bf16, 12, device, assert_within_baseline, key_corr=0.5, state_scale=3.0)


def test_gdn_decode_split_ckpt_fp32_and_correlated_keys(device, assert_within_baseline):
    with override(*SPLIT):
        K, V = _kv(device, (32, 16))
        gk.test_gdn_decode(3, 2, 4, K, V, 4, fp32, 10, device, assert_within_baseline)
        K, V = _kv(device, (64, 32))
        gk.test_gdn_decode(2, 1, 2, K, V, 8, bf16, 12, device, assert_within_baseline, key_corr=0.9)


@pytest.mark.parametrize("products", VERIFY_KERNEL_PLANS)
def test_gdn_verify_split_ckpt(products, device, assert_within_baseline):
    """Every verify kernel and the commit's fold on a split-layout pool."""
    K, V = _kv(device, (48, 40))
    with overrides([SPLIT, ("gdn_verify", products)]):
        gk.test_gdn_verify_commit(2, 1, 3, K, V, 5, 3, bf16, 6, device, assert_within_baseline)


def test_gdn_verify_split_ckpt_fp32_and_k128(device, assert_within_baseline):
    with override(*SPLIT):
        K, V = _kv(device, (32, 16))
        gk.test_gdn_verify_commit(3, 2, 4, K, V, 16, 4, fp32, 10, device, assert_within_baseline)
        gk.test_gdn_verify_commit(2, 1, 2, 128, 128, 8, 4, bf16, 8, device, assert_within_baseline, key_corr=0.9)


def _decode_run(split: bool, dtype, device, steps=6, tamper=None):
    """Outputs and final state of a harness run with the given layout (same inputs either way)."""
    gen = torch.Generator().manual_seed(77)
    B, H, HV, L = 2, 1, 2, 8
    K, V = _kv(device, (32, 16))
    A_log, dt_bias = _params(HV, device, gen)
    S0 = (torch.randn(B, HV, V, K, generator=gen) * 0.3).to(device)
    # No phase flushes: below L steps every output is then a non-flush row's.
    with overrides([("gdn_ckpt_split", (int(split),)), ("gdn_flush_phase", (0,))]):
        h = GDNHarness(batch=B, num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, A_log=A_log,
                       dt_bias=dt_bias, ring_len=L, max_draft_tokens=1, device=device)
    h.set_state(S0)
    if tamper is not None:
        tamper(h)
    outs = []
    for _ in range(steps):
        q, k, v, a, b = _inputs(B, 1, H, HV, K, V, dtype, device, gen)
        outs.append(h.decode(q[:, 0], k[:, 0], v[:, 0], a[:, 0], b[:, 0]))
    assert bool((h.pending() == steps).all()), "no row may flush in this run"
    return torch.stack(outs), h.state()


def test_split_half_reads_only_with_bf16_activations(device):
    """bf16 activations: the outputs read the `hi` planes only, so they differ from the fp32
    layout's by about a bf16 rounding of the checkpoint (and stay within the baseline's error: the
    tests above); fp32 activations read the exact values. The state is the same in every case.

    fp32 outputs: bit for bit under the interpreter. On the GPU the two 16-bit loads give the
    output sums another tile layout, so they may differ in the last bits (measured on an H100:
    7.5e-9, session 36); the bound is a few fp32 roundings, far below the bf16
    case's difference (2.4e-4 there)."""
    o_f, s_f = _decode_run(False, bf16, device)
    o_s, s_s = _decode_run(True, bf16, device)
    assert not torch.equal(o_f, o_s), "bf16 outputs must come from the hi planes"
    assert torch.equal(s_f, s_s)
    o_f, s_f = _decode_run(False, fp32, device)
    o_s, s_s = _decode_run(True, fp32, device)
    assert torch.equal(s_f, s_s)
    if device == "cpu":
        assert torch.equal(o_f, o_s)
    else:
        tol = 64 * torch.finfo(torch.float32).eps * o_f.abs().max().item()
        assert (o_f.double() - o_s.double()).abs().max().item() <= tol


def test_split_lo_plane_feeds_the_state_not_the_bf16_outputs(device):
    """Flip a bit of one `lo` word (2^-9 of the element): bf16 non-flush outputs do not see it (only `hi` is
    read), the committed state does (the exact paths read both planes)."""
    def flip(h):
        pool = h.checkpoint_pool()
        slot = int(h.slot_idx[0])
        words = pool[slot].view(torch.int16).reshape(-1)
        words[pool.shape[-1] * pool.shape[-2] + 3] ^= 0x4000  # head 0's lo plane (after its V*K hi words), element 3

    o_0, s_0 = _decode_run(True, bf16, device)
    o_1, s_1 = _decode_run(True, bf16, device, tamper=flip)
    assert torch.equal(o_0, o_1)
    assert not torch.equal(s_0, s_1)


def test_gdn_fold_split_ckpt_snapshot_equals_fp32_fold(device):
    """The fold with a radix track snapshot on a split-layout pool gives the fp32 fold's states."""
    gen = torch.Generator().manual_seed(13)
    K, V = _kv(device, (32, 16))
    A_log, dt_bias, state, rings = _direct_setup(device, gen, K=K, V=V, L=8, Lm=2, S=8)
    slot = torch.tensor([1, 4], dtype=torch.int32, device=device)
    n = torch.tensor([6, 3], dtype=torch.int32, device=device)
    org = torch.tensor([5, 0], dtype=torch.int32, device=device)
    snap_at = torch.tensor([2, -1], dtype=torch.int32, device=device)
    snap_slot = torch.tensor([6, 7], dtype=torch.int32, device=device)
    ref = state.clone()
    gdn_replay_fold(ref, rings, slot, n, org, snap_at=snap_at, snap_slot=snap_slot)
    packed = split_ckpt_encode(state)
    gdn_replay_fold(packed, rings, slot, n, org, snap_at=snap_at, snap_slot=snap_slot, split_ckpt=True)
    assert torch.equal(split_ckpt_decode(packed).view(torch.int32), ref.view(torch.int32))


def test_gdn_decode_split_ckpt_padding_rows_write_nothing(device):
    gen = torch.Generator().manual_seed(3)
    B, H, HV, L, S = 3, 1, 2, 8, 6
    K, V = _kv(device, (32, 16))
    A_log, dt_bias, state, rings = _direct_setup(device, gen, B=B, H=H, HV=HV, K=K, V=V, L=L, S=S)
    packed = split_ckpt_encode(state[0])
    before = packed.clone()
    slot = torch.tensor([4, -1, 1], dtype=torch.int32, device=device)
    wpos = torch.tensor([0, 2, 0, 0, 7, 0], dtype=torch.int32, device=device)
    origin = torch.tensor([0, 3, 0, 0, 2, 0], dtype=torch.int32, device=device)
    q, k, v, a, b = _inputs(B, 1, H, HV, K, V, bf16, device, gen)
    row_wp, row_flush = decode_prepare(slot, wpos, L)
    assert row_flush.tolist() == [1, 0, 0]  # slot 4's ring is full: it flushes
    gdn_replay_decode(q[:, 0], k[:, 0], v[:, 0], a[:, 0], b[:, 0], A_log, dt_bias, packed, rings.layer(0),
                      slot, row_wp, row_flush, origin, split_ckpt=True)
    changed = [s for s in range(S) if not torch.equal(packed[s].view(torch.int32), before[s].view(torch.int32))]
    assert changed == [4]


def test_split_is_refused_where_the_replay_form_cannot_keep_it(device, monkeypatch):
    """On the GPU the plain replay form (any K but 128, or gdn_k_tree=0) cannot run split
    checkpoints bit-exactly: the kernels refuse them, a harness asked for them explicitly raises,
    and by default it keeps fp32 checkpoints. Under the interpreter every form takes them."""
    from replayssm_kernels import configs
    from replayssm_kernels.gdn import gdn_replay_fold as fold

    monkeypatch.setattr(configs, "interpreted", lambda: False)
    gen = torch.Generator().manual_seed(8)
    A_log, dt_bias, state, rings = _direct_setup(device, gen)  # K = 32: the plain form
    one = torch.zeros(1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="tree or shuffle form"):
        fold(state, rings, one, one, one, split_ckpt=True)
    with override(*SPLIT), pytest.raises(ValueError, match="gdn_ckpt_split=0"):
        configs.gdn_ckpt_split_for(32)
    assert not configs.gdn_ckpt_split_for(32), "by default a plain-form pool keeps fp32 checkpoints"
    with override("gdn_k_tree", (1,)):
        assert configs.gdn_ckpt_split_for(128)
    with override("gdn_k_tree", (0,)):
        assert not configs.gdn_ckpt_split_for(128)
