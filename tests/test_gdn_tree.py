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
]


FORMS = [pytest.param(1, id="tree"), pytest.param(2, id="shuffle")]
# The shuffle form's cross-lane sums need the tile in one warp (gdn/lanes.py).
FORM_PLANS = [(1, p) for p in DECODE_PLANS] + [(2, p) for p in DECODE_PLANS if "two-warps" not in p.id]


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
            flush = (h.pending() + 1 >= L).tolist()
            o = h.decode(q, k, v, a, b)
            for r in range(B):
                o_ref = model.step(r, q[r], k[r], v[r], a[r], b[r], 128 ** -0.5)
                if flush[r]:
                    flushes += 1
                    assert torch.equal(o[r], _bf16(o_ref)), f"flush output, step {step} row {r}"
            assert torch.equal(h.state(), torch.from_numpy(model.S)), f"state after step {step}"
    assert flushes >= 2 * B


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("verify_cfg", [
    pytest.param(None, id="default-two-launch"),
    pytest.param((32, 1, 2, 0), id="one-launch"),
    pytest.param((16, 1, 2, 2), id="matrix-form"),
])
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
