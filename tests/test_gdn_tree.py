"""The tree and shuffle forms of the GDN exact replay (K = 128; `replayssm_kernels/gdn/common.py`).

On the H200 the tree form runs by default at K = 128, and `test_gdn_kernels.py` checks its state
against SGLang's own kernel there (`torch.equal`). Under the interpreter SGLang's sums are numpy's
and the plain form is the one that matches them, so here the tree form is checked against a numpy
model of the order the GPU runs SGLang's kernel in (read from its PTX for sm_90; the module doc of
`gdn/common.py`): each thread's chain over its 4 consecutive K, then pairwise adds across lanes
g ^ 16, 8, 4, 2, 1. The interpreter rounds `fma` twice, so the model does too; the GPU's single
rounding is the GPU tests' business. Every writer of the `k` ring is covered (the tree-form replay
reads its keys from there): decode (one launch and split plans), verify (one launch, two launch,
matrix form). The shuffle form (`gdn_k_tree` = 2) has the tree form's order and keys; here its
cross-lane sums run as the interpreter's tensor sums (gdn/lanes.py), and `test_gdn_lanes.py`
checks its PTX and its lane layout.
"""

import numpy as np
import pytest
import torch

from replayssm_kernels.configs import override, overrides
from sglang_replayssm.testing import GDNHarness

bf16 = torch.bfloat16
F = np.float32


def _dot(h, x):
    """`[..., V, 128]` x `[128]` -> `[...,  V]` in the GPU order (fma rounded twice, as interpreted)."""
    p = (h * x).reshape(*h.shape[:-1], 32, 4)
    s = p[..., 0] + p[..., 1]
    s = s + p[..., 2]
    s = s + p[..., 3]
    for m in (16, 8, 4, 2, 1):
        s = s[..., :m] + s[..., m:2 * m]
    return s[..., 0]


def _norm(x):
    return x / np.sqrt(_dot(x[None, :], x)[0] + F(1e-6))


def _bf16(x):
    """The interpreter's fp32 -> bf16 store (rounds toward zero; the GPU rounds to nearest)."""
    return torch.from_numpy((x.view(np.uint32) & np.uint32(0xFFFF0000)).view(F)).to(bf16)


def _gate(a, b, A_log, dt_bias):
    x = a + dt_bias
    bx = F(1.0) * x
    sp = np.where(bx <= F(20.0), F(1.0) * np.log(F(1.0) + np.exp(bx)), x)
    return -np.exp(A_log) * sp, F(1.0) / (F(1.0) + np.exp(-b))


class _Model:
    """SGLang's recurrence per (row, value head), in the GPU order."""

    def __init__(self, S0, A_log, dt_bias, H):
        self.S = S0.numpy().astype(F).copy()  # [B, HV, V, K]
        self.A_log, self.dt_bias = A_log.numpy().astype(F), dt_bias.numpy().astype(F)
        self.G = self.S.shape[1] // H

    def step(self, r, q, k, v, a, b, scale):
        """One token of row r (q, k [H, K]; v [HV, V]; a, b [HV], torch); returns outputs [HV, V]."""
        o = np.zeros(self.S.shape[1:3], dtype=F)
        for hv in range(self.S.shape[1]):
            kn = _norm(k[hv // self.G].float().numpy())
            qn = _norm(q[hv // self.G].float().numpy()) * F(scale)
            g, beta = _gate(F(a[hv].float()), F(b[hv].float()), self.A_log[hv], self.dt_bias[hv])
            h = self.S[r, hv] * np.exp(g)
            u = (v[hv].float().numpy() - _dot(h, kn)) * beta
            h = h + kn[None, :] * u[:, None]
            self.S[r, hv] = h
            o[hv] = _dot(h, qn)
        return o


def _setup(B, H, HV, V, L, T_max, seed):
    gen = torch.Generator().manual_seed(seed)
    A_log = torch.log(torch.rand(HV, generator=gen) * 0.9 + 0.05)
    dt_bias = torch.randn(HV, generator=gen) - 1.0
    h = GDNHarness(batch=B, num_k_heads=H, num_v_heads=HV, head_k_dim=128, head_v_dim=V, A_log=A_log,
                   dt_bias=dt_bias, ring_len=L, max_draft_tokens=T_max, device="cpu")
    S0 = torch.randn(B, HV, V, 128, generator=gen) * 0.3
    h.set_state(S0)
    return gen, h, _Model(S0, A_log, dt_bias, H)


def _inputs(gen, B, T, H, HV, V):
    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(bf16)

    return r(B, T, H, 128), r(B, T, H, 128), r(B, T, HV, V), r(B, T, HV), r(B, T, HV, scale=2.0)


DECODE_PLANS = [
    pytest.param((), id="default-split2"),
    pytest.param((("gdn_decode", (0, 32, 1, 3, 32, 0, 1)),), id="one-launch"),
    pytest.param((("gdn_decode", (1, 32, 1, 3, 8, 0, 1)),), id="split1-flushcols8"),
    pytest.param((("gdn_decode", (3, 16, 1, 3, 8, 0, 1)),), id="plan3"),
    pytest.param((("gdn_decode", (3, 16, 2, 3, 16, 0, 1)),), id="plan3-two-warps"),
    # Plans 4 and 5 write the token's normalised key into the `k` ring themselves (the fold replays it).
    pytest.param((("gdn_decode", (4, 16, 1, 3, 8, 0, 1)),), id="plan4"),
    pytest.param((("gdn_decode", (5, 16, 1, 3, 8, 0, 1)),), id="plan5"),
    # Two programs per row and value head (loop split), one 8-row tile each: the first writes the keys.
    pytest.param((("gdn_decode", (5, 8, 1, 3, 8, 0, 1, 2)),), id="plan5-split2"),
]


FORMS = [pytest.param(1, id="tree"), pytest.param(2, id="shuffle")]
# The shuffle form's cross-lane sums need the tile in one warp (gdn/lanes.py).
FORM_PLANS = [(1, p) for p in DECODE_PLANS] + [(2, p) for p in DECODE_PLANS if "two-warps" not in p.id]


# The verify launches the tree forms are checked on: the default two-launch verify, the one-launch
# verify, its matrix form, and the one-launch looping verify (products 6: its own ring writes of
# the window's keys, normalised in the form's order, which the fold replays on rings without raw keys).
VERIFY_CFGS = [
    pytest.param(None, id="default-two-launch"),
    pytest.param((32, 1, 2, 0), id="one-launch"),
    pytest.param((16, 1, 2, 2), id="matrix-form"),
    pytest.param((16, 1, 2, 6), id="fused-vloop"),
]


@pytest.mark.parametrize("form,plan", [pytest.param(f, p.values[0], id=f"{('tree', 'shuffle')[f - 1]}-{p.id}")
                                       for f, p in FORM_PLANS])
def test_tree_decode_state_follows_gpu_order(form, plan):
    """Decode in the tree or shuffle form, L = 4: after every step the committed state (pending
    entries folded) equals the GPU-order model, and so do the outputs of flush steps."""
    B, H, HV, V, L = 2, 1, 2, 16, 4
    gen, h, model = _setup(B, H, HV, V, L, 1, seed=3)
    flushes = 0
    with overrides((("gdn_k_tree", (form,)), *plan)):
        for step in range(2 * L + 1):
            q, k, v, a, b = (t[:, 0] for t in _inputs(gen, B, 1, H, HV, V))
            o = h.decode(q, k, v, a, b)
            flush = (h.pending() == 0).tolist()  # this step flushed the row (full ring or its slot's phase)
            for r in range(B):
                o_ref = model.step(r, q[r], k[r], v[r], a[r], b[r], 128 ** -0.5)
                if flush[r]:
                    flushes += 1
                    assert torch.equal(o[r], _bf16(o_ref)), f"flush output, step {step} row {r}"
            assert torch.equal(h.state(), torch.from_numpy(model.S)), f"state after step {step}"
    assert flushes >= 2 * B


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("verify_cfg", VERIFY_CFGS)
def test_tree_verify_commit_state_follows_gpu_order(verify_cfg, form):
    """Verify + commit in the tree or shuffle form (L = 8, T = 3, a different accept count per
    row, several folds): the committed state equals the GPU-order model after every commit."""
    B, H, HV, V, L, T = 2, 1, 2, 16, 8, 3
    gen, h, model = _setup(B, H, HV, V, L, T, seed=5)
    items = [("gdn_k_tree", (form,))] + ([("gdn_verify", verify_cfg)] if verify_cfg else [])
    with overrides(items):
        for step in range(5):
            q, k, v, a, b = _inputs(gen, B, T, H, HV, V)
            h.verify(q, k, v, a, b)
            acc = torch.tensor([T, 1 + step % T])
            h.commit(acc)
            for r in range(B):
                for t in range(int(acc[r])):
                    model.step(r, q[r, t], k[r, t], v[r, t], a[r, t], b[r, t], 128 ** -0.5)
            assert torch.equal(h.state(), torch.from_numpy(model.S)), f"state after commit {step}"


def test_tree_model_tells_the_orders_apart():
    """The model is not a stand-in for any order: the plain form (numpy's own sums under the
    interpreter) ends in other bits, so the tests above would catch a tree that fell back to it,
    and a tree with two pairings swapped ends in other bits too."""
    B, H, HV, V, L = 2, 1, 2, 16, 4
    gen, h, model = _setup(B, H, HV, V, L, 1, seed=3)
    with override("gdn_k_tree", (0,)):
        for _ in range(L):
            q, k, v, a, b = (t[:, 0] for t in _inputs(gen, B, 1, H, HV, V))
            h.decode(q, k, v, a, b)
            for r in range(B):
                model.step(r, q[r], k[r], v[r], a[r], b[r], 128 ** -0.5)
    assert not torch.equal(h.state(), torch.from_numpy(model.S))

    x = np.random.default_rng(0).standard_normal((64, 128)).astype(F)
    y = np.random.default_rng(1).standard_normal(128).astype(F)

    def butterfly(order):
        p = (x * y).reshape(64, 32, 4)
        s = ((p[..., 0] + p[..., 1]) + p[..., 2]) + p[..., 3]
        for m in order:
            s = s + s[:, [g ^ m for g in range(32)]]
        return s[:, 0]

    assert np.array_equal(butterfly((16, 8, 4, 2, 1)), _dot(x, y))
    assert not np.array_equal(butterfly((8, 16, 4, 2, 1)), _dot(x, y))


def test_shuffle_form_needs_one_warp():
    """A decode plan with a two-warp state launch is refused in the shuffle form (its cross-lane
    sums assume one warp), with the setting named; the plain form refuses it too."""
    B, H, HV, V, L = 2, 1, 2, 16, 4
    gen, h, _ = _setup(B, H, HV, V, L, 1, seed=3)
    q, k, v, a, b = (t[:, 0] for t in _inputs(gen, B, 1, H, HV, V))
    for form in (0, 2):
        with overrides((("gdn_k_tree", (form,)), ("gdn_decode", (3, 16, 2, 3, 16, 0, 1)))):
            with pytest.raises(ValueError, match="one warp.*gdn_k_tree=1"):
                h.decode(q, k, v, a, b)


def test_replay_form_setting_is_checked(monkeypatch):
    """gdn_k_tree takes 0, 1 or 2 (REPLAYSSM_CONFIG); another number is refused with the choices.
    Default: the shuffle form on the GPU (session 18), the plain form under the interpreter."""
    import os

    from replayssm_kernels import configs
    from replayssm_kernels.configs import gdn_k_tree

    monkeypatch.setattr(configs, "_OVERRIDES", {})
    on_gpu = os.environ.get("TRITON_INTERPRET", "0") != "1"
    assert gdn_k_tree(128) == (2 if on_gpu else 0) and gdn_k_tree(64) == 0

    with override("gdn_k_tree", (3,)):
        with pytest.raises(ValueError, match="gdn_k_tree=3.*2 = shuffle"):
            gdn_k_tree(128)
    with override("gdn_k_tree", (2,)):
        assert gdn_k_tree(128) == 2 and gdn_k_tree(64) == 0


# Rings without raw keys: allocated while a tree form is in effect (the GPU default at K = 128),
# `rawk` has a zero-length ring axis and no kernel stores to it (gdn/rings.py).

RING_NAMES = ("d", "k", "g", "rawv", "beta")  # every ring but `rawk`


def _setup_in_form(alloc_form, *args, **kwargs):
    """`_setup` with the harness built while `gdn_k_tree` = alloc_form (its rings keep raw keys iff 0)."""
    with override("gdn_k_tree", (alloc_form,)):
        return _setup(*args, **kwargs)


@pytest.mark.parametrize("form", FORMS)
def test_tree_forms_allocate_rings_without_raw_keys(form):
    """In the tree and shuffle forms new rings keep no raw keys: `rawk` has no elements but valid
    strides and views, the checks pass, and the rings are smaller by exactly the raw-key bytes;
    `raw_keys` overrides the form; K != 128 (always the plain form) keeps them."""
    from replayssm_kernels.gdn import alloc_gdn_rings, gdn_ring_bytes_per_slot
    from replayssm_kernels.gdn.rings import check_gdn_rings

    Lm, S, H, HV, V, L = 2, 3, 2, 4, 16, 8
    args = (Lm, S, H, HV, 128, V, L, bf16, "cpu")
    with override("gdn_k_tree", (0,)):
        kept = alloc_gdn_rings(*args)
    with override("gdn_k_tree", (form,)):
        lean = alloc_gdn_rings(*args)
        assert alloc_gdn_rings(*args, raw_keys=True).has_raw_keys
        assert alloc_gdn_rings(Lm, S, H, HV, 64, V, L, bf16, "cpu").has_raw_keys
        per_slot = gdn_ring_bytes_per_slot(H, HV, 128, V, L, bf16, Lm)
    assert not alloc_gdn_rings(*args, raw_keys=False).has_raw_keys
    assert kept.has_raw_keys and not lean.has_raw_keys
    assert lean.rawk.numel() == 0 and tuple(lean.rawk.shape) == (Lm, S, H, 0, 128) and lean.rawk.dtype == bf16
    assert kept.nbytes() - lean.nbytes() == Lm * S * H * L * 128 * 2
    assert lean.nbytes() == S * per_slot
    assert lean.ring_len == L and not lean.per_layer
    one = lean.layer(1)
    assert one.per_layer and one.ring_len == L and not one.has_raw_keys and tuple(one.rawk.shape) == (S, H, 0, 128)
    assert not one.all_layers().has_raw_keys and one.all_layers().nbytes() == lean.nbytes() // Lm
    for r in (lean, one, kept, kept.layer(0)):
        check_gdn_rings(r, H, HV, 128, V)
    assert lean.replay_keys(form) is lean.k


@pytest.mark.parametrize("form,plan", [
    pytest.param(1, DECODE_PLANS[0].values[0], id="tree-default-split2"),
    pytest.param(1, DECODE_PLANS[1].values[0], id="tree-one-launch"),
    pytest.param(2, DECODE_PLANS[0].values[0], id="shuffle-default-split2"),
    pytest.param(2, DECODE_PLANS[1].values[0], id="shuffle-one-launch"),
    pytest.param(2, DECODE_PLANS[3].values[0], id="shuffle-plan3"),
])
def test_decode_without_raw_keys_matches_with_them(form, plan):
    """Decode over several flushes (L = 4) on rings without raw keys gives, after every step, the
    outputs and committed state of the same run on rings with them (torch.equal), and the
    GPU-order model's state; at the end every other ring holds the same bits (the skipped store
    went nowhere else)."""
    B, H, HV, V, L = 2, 1, 2, 16, 4
    runs = []
    for alloc_form in (0, form):
        gen, h, model = _setup_in_form(alloc_form, B, H, HV, V, L, 1, seed=3)
        outs, states = [], []
        with overrides((("gdn_k_tree", (form,)), *plan)):
            for step in range(2 * L + 1):
                q, k, v, a, b = (t[:, 0] for t in _inputs(gen, B, 1, H, HV, V))
                outs.append(h.decode(q, k, v, a, b))
                for r in range(B):
                    model.step(r, q[r], k[r], v[r], a[r], b[r], 128 ** -0.5)
                states.append(h.state())
                assert torch.equal(states[-1], torch.from_numpy(model.S)), f"state after step {step}"
        runs.append((h, outs, states))
    (h_kept, o_kept, s_kept), (h_lean, o_lean, s_lean) = runs
    assert h_kept._rings.has_raw_keys and not h_lean._rings.has_raw_keys and h_lean._rings.rawk.numel() == 0
    for step in range(2 * L + 1):
        assert torch.equal(o_lean[step], o_kept[step]), f"outputs of step {step}"
        assert torch.equal(s_lean[step], s_kept[step]), f"state after step {step}"
    assert torch.equal(h_lean.checkpoint_pool().view(torch.int32), h_kept.checkpoint_pool().view(torch.int32))
    for name in RING_NAMES:
        assert torch.equal(getattr(h_lean._rings, name), getattr(h_kept._rings, name)), name


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("verify_cfg", VERIFY_CFGS)
def test_verify_commit_without_raw_keys_matches_with_them(verify_cfg, form):
    """Verify + commit (L = 8, T = 3, a different accept count per row, several folds) on rings
    without raw keys: outputs and committed state equal the run with them and the GPU-order
    model after every commit, and every other ring holds the same bits."""
    B, H, HV, V, L, T = 2, 1, 2, 16, 8, 3
    items = [("gdn_k_tree", (form,))] + ([("gdn_verify", verify_cfg)] if verify_cfg else [])
    runs = []
    for alloc_form in (0, form):
        gen, h, model = _setup_in_form(alloc_form, B, H, HV, V, L, T, seed=5)
        outs, states = [], []
        with overrides(items):
            for step in range(5):
                q, k, v, a, b = _inputs(gen, B, T, H, HV, V)
                outs.append(h.verify(q, k, v, a, b))
                acc = torch.tensor([T, 1 + step % T])
                h.commit(acc)
                for r in range(B):
                    for t in range(int(acc[r])):
                        model.step(r, q[r, t], k[r, t], v[r, t], a[r, t], b[r, t], 128 ** -0.5)
                states.append(h.state())
                assert torch.equal(states[-1], torch.from_numpy(model.S)), f"state after commit {step}"
        runs.append((h, outs, states))
    (h_kept, o_kept, s_kept), (h_lean, o_lean, s_lean) = runs
    assert h_kept._rings.has_raw_keys and not h_lean._rings.has_raw_keys
    for step in range(5):
        assert torch.equal(o_lean[step], o_kept[step]), f"outputs of verify {step}"
        assert torch.equal(s_lean[step], s_kept[step]), f"state after commit {step}"
    for name in RING_NAMES:
        assert torch.equal(getattr(h_lean._rings, name), getattr(h_kept._rings, name)), name


def test_plain_form_replay_refused_on_rings_without_raw_keys():
    """The plain form replays from raw keys: on rings allocated without them its decode (any row
    may flush), fold and commit are refused with the setting named, before any kernel writes a
    ring or checkpoint (commit: before any cursor moves); the form the rings were allocated for
    still runs on them afterwards."""
    from replayssm_kernels.gdn import alloc_gdn_rings, gdn_commit, gdn_replay_fold

    B, H, HV, V, L = 2, 1, 2, 16, 4
    gen, h, _ = _setup_in_form(2, B, H, HV, V, L, 1, seed=3)
    q, k, v, a, b = (t[:, 0] for t in _inputs(gen, B, 1, H, HV, V))
    with override("gdn_k_tree", (2,)):
        h.decode(q, k, v, a, b)
        committed = h.state()
    assert not h._rings.has_raw_keys
    refused = "keep no raw keys.*REPLAYSSM_CONFIG gdn_k_tree.*gdn_k_tree=0"
    with override("gdn_k_tree", (0,)), pytest.raises(ValueError, match=refused):
        h.state()
    with override("gdn_k_tree", (2,)):
        assert torch.equal(h.state(), committed)
    ckpt, rings = h.checkpoint_pool().clone(), [t.clone() for t in h._rings.tensors()]
    with override("gdn_k_tree", (0,)):
        with pytest.raises(ValueError, match=refused):
            h.decode(q, k, v, a, b, force_flush=torch.ones(B))
        with pytest.raises(ValueError, match=refused):
            h.decode(q, k, v, a, b)
    assert torch.equal(h.checkpoint_pool().view(torch.int32), ckpt.view(torch.int32))  # bits (split layout)
    assert all(torch.equal(t, t0) for t, t0 in zip(h._rings.tensors(), rings))

    # The kernels' entry points themselves (all-layer rings, as the pool passes them).
    S = B + 2
    rings = alloc_gdn_rings(1, S, H, HV, 128, V, L, bf16, "cpu", raw_keys=False)
    state = torch.zeros(1, S, HV, V, 128)
    slots = torch.arange(B, dtype=torch.int32)
    wpos, origin = torch.ones(S, dtype=torch.int32), torch.zeros(S, dtype=torch.int32)
    tickets = torch.zeros(S, dtype=torch.int32)
    with override("gdn_k_tree", (0,)):
        with pytest.raises(ValueError, match=refused):
            gdn_replay_fold(state, rings, slots, None, None, cursors=(wpos, origin))
        for fused_below in (0, 64):  # the two-launch commit moves no cursor before refusing
            with override("gdn_commit_fused_below", (fused_below,)), pytest.raises(ValueError, match=refused):
                gdn_commit(state, rings, slots, wpos, origin, torch.ones(B, dtype=torch.int32), 1, tickets)
    assert wpos.tolist() == [1] * S and origin.tolist() == [0] * S
