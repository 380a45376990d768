"""`sglang-replayssm doctor`: is this installation able to serve `--mamba-backend replayssm`?

    sglang-replayssm doctor [--no-selftest] [--device auto|cpu|cuda]

Prints one `[ok]` / `[warn]` / `[FAIL]` line per check, every FAIL with its fix, and exits 1 on
any FAIL. Checks: SGLang and sglang-kernel versions, the entry point, the kill switch and the
`SGLANG_PLUGINS` whitelist, the hook STATUS after `register()`, whether each runtime hook could be
installed (probe, nothing is patched), that `triton_kernels` is not shadowed by this checkout,
the kernel launch plans and dispatch thresholds in effect (defaults or `REPLAYSSM_CONFIG`),
and a kernel self-test: the GDN (and Mamba-2) harness decode/verify/commit must leave exactly the
state SGLang's own recurrent kernel computes. The self-test runs in a subprocess, on the GPU when
one is visible, else on the CPU under `TRITON_INTERPRET=1` (triton reads it at import).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

OK, WARN, FAIL = "[ok]", "[warn]", "[FAIL]"
_CHECKOUT = Path(__file__).resolve().parent.parent


class _Report:
    def __init__(self) -> None:
        self.failed = 0

    def line(self, level: str, what: str, fix: Optional[str] = None) -> None:
        if level == FAIL:
            self.failed += 1
        text = f"{level:<6} {what}"
        if fix and level != OK:
            text += f"\n       fix: {fix}"
        print(text, flush=True)


# ------------------------------------------------------------------------------ checks


def _check_versions(r: _Report) -> None:
    from importlib.metadata import PackageNotFoundError, requires, version

    from sglang_replayssm.compat import TABLES

    try:
        sg = version("sglang")
    except PackageNotFoundError:
        r.line(FAIL, "sglang is not installed", "pip install sglang==0.5.17")
        return
    if sg in TABLES:
        r.line(OK, f"sglang {sg}")
    else:
        r.line(FAIL, f"sglang {sg} (supported: {', '.join(sorted(TABLES))})", "pip install sglang==0.5.17")
    want = [q for q in (requires("sglang") or []) if q.replace("_", "-").lower().startswith("sglang-kernel")]
    try:
        sk = version("sglang-kernel")
    except PackageNotFoundError:
        r.line(FAIL, "sglang-kernel is not installed", f"pip install '{want[0] if want else 'sglang-kernel'}'")
        return
    pinned = [q.split("==", 1)[1].split(";")[0].strip() for q in want if "==" in q]
    if pinned and sk != pinned[0]:
        r.line(FAIL, f"sglang-kernel {sk} (sglang {sg} pins {pinned[0]})", f"pip install sglang-kernel=={pinned[0]}")
    else:
        r.line(OK, f"sglang-kernel {sk}")


def _check_entry_point(r: _Report) -> None:
    from importlib.metadata import entry_points

    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.value.startswith("sglang_replayssm")]
    if not eps:
        r.line(
            FAIL,
            "entry point sglang.srt.plugins -> sglang_replayssm:register is not visible",
            f"pip install -e {_CHECKOUT} (or apply patches/sglang-0.5.17.patch)",
        )
    else:
        r.line(OK, f"entry point {eps[0].name} = {eps[0].value}")
        allowed = os.environ.get("SGLANG_PLUGINS")
        if allowed and eps[0].name not in {x.strip() for x in allowed.split(",")}:
            r.line(FAIL, f"SGLANG_PLUGINS={allowed!r} filters out {eps[0].name!r}", f"add {eps[0].name} to SGLANG_PLUGINS")
    from sglang_replayssm import ENABLE_ENV, enabled

    if not enabled():
        r.line(FAIL, f"{ENABLE_ENV}={os.environ.get(ENABLE_ENV)} disables the plugin", f"unset {ENABLE_ENV}")


def _check_hooks(r: _Report) -> None:
    import sglang_replayssm
    from sglang_replayssm.compat import TIER_PROBE, TIER_RUNTIME
    from sglang_replayssm.hooks import is_failed, probe

    status = dict(sglang_replayssm.register())
    if sglang_replayssm.SGLANG_ERROR:
        r.line(FAIL, sglang_replayssm.SGLANG_ERROR, "pip install sglang==0.5.17")
    specs = {s.name: s for s in sglang_replayssm.table().hooks}
    for name, st in status.items():
        spec = specs.get(name)
        if spec is None:
            r.line(FAIL if is_failed(st) else WARN, f"{name}: {st}")
        elif spec.tier == TIER_RUNTIME:
            continue
        elif is_failed(st):
            r.line(FAIL, f"hook {name}: {st}", spec.fix or "report it: the SGLang target moved")
        elif spec.tier == TIER_PROBE and st.startswith("skipped"):
            r.line(OK, f"hook {name}: installed in scheduler processes ({spec.target})")
        else:
            r.line(OK, f"hook {name}: {st}")
    for spec in sglang_replayssm.table().hooks:
        if spec.tier != TIER_RUNTIME:
            continue
        st = probe(spec)
        fams = "/".join(spec.families) + (", speculative" if spec.spec_only else "")
        if is_failed(st):
            r.line(FAIL, f"runtime hook {spec.name} ({fams}): {st}", spec.fix or "report it: the SGLang target moved")
        else:
            r.line(OK, f"runtime hook {spec.name} ({fams}): installable")


def _check_triton_kernels(r: _Report) -> None:
    try:
        import triton_kernels  # noqa: F401  (sglang-kernel's vendored OpenAI package)
    except Exception as e:  # noqa: BLE001
        r.line(WARN, f"import triton_kernels failed ({type(e).__name__}: {e}); SGLang disables its triton_kernels MoE path")
        return
    where = Path(getattr(triton_kernels, "__file__", None) or list(triton_kernels.__path__)[0]).resolve()
    ours = (_CHECKOUT / "triton_kernels").resolve()
    # Only our own folder shadows it; a virtualenv inside the checkout (CI) is not a shadow.
    if where == ours or ours in where.parents:
        r.line(
            FAIL,
            f"triton_kernels resolves to this checkout ({where}), shadowing sglang-kernel's package",
            f"run from outside {_CHECKOUT} and never add triton_kernels/__init__.py",
        )
    else:
        r.line(OK, f"triton_kernels from {where.parent}")


def _check_launch_plans(r: _Report) -> None:
    try:
        from replayssm_kernels import configs
    except Exception as e:  # noqa: BLE001
        r.line(FAIL, f"kernel launch plans: {type(e).__name__}: {e}", "fix or unset REPLAYSSM_CONFIG")
        return
    src = "REPLAYSSM_CONFIG" if os.environ.get("REPLAYSSM_CONFIG") else "defaults"
    try:
        text = configs.describe()  # each value is checked as it is read (e.g. a register cap's range)
    except ValueError as e:
        r.line(FAIL, f"kernel launch plans: {e}", "fix or unset REPLAYSSM_CONFIG")
        return
    for line in text.splitlines():
        r.line(OK, f"launch plan ({src}): {line}")


def _check_selftest(r: _Report, device: str) -> None:
    if device == "auto":
        device = "cuda" if _cuda_visible() else "cpu"
    env = dict(os.environ)
    if device == "cpu":
        env["TRITON_INTERPRET"] = "1"
    else:
        env.pop("TRITON_INTERPRET", None)
    cmd = [sys.executable, "-m", "sglang_replayssm.cli", "_selftest", "--device", device]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, cwd=str(Path.home()))
    except subprocess.TimeoutExpired:
        r.line(FAIL, f"kernel self-test on {device} timed out", "run `python -m sglang_replayssm.cli _selftest` by hand")
        return
    results = None
    for line in proc.stdout.splitlines():
        if line.startswith("SELFTEST "):
            results = json.loads(line[len("SELFTEST "):])
    if results is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        r.line(FAIL, f"kernel self-test on {device} crashed: {' | '.join(tail)}", "see the traceback of `python -m sglang_replayssm.cli _selftest`")
        return
    for item in results:
        r.line(OK if item["ok"] else FAIL, f"self-test {item['name']} on {device}: {item['detail']}", item.get("fix"))


def _cuda_visible() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def doctor(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="sglang-replayssm doctor")
    p.add_argument("--no-selftest", action="store_true", help="skip the kernel self-test")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    a = p.parse_args(argv)
    r = _Report()
    import sglang_replayssm

    print(f"sglang-replayssm {sglang_replayssm.__version__} ({_CHECKOUT})", flush=True)
    _check_versions(r)
    _check_entry_point(r)
    _check_hooks(r)
    _check_triton_kernels(r)
    _check_launch_plans(r)
    if not a.no_selftest:
        _check_selftest(r, a.device)
    print(f"{r.failed} failure(s)" if r.failed else "all checks passed", flush=True)
    return 1 if r.failed else 0


# ------------------------------------------------------------------------------ self-test


def _selftest_gdn(device: str) -> dict:
    """GDN: harness decode (with flushes and a forced flush) and verify+commit must leave
    bit-for-bit the state of SGLang's fused_sigmoid_gating_delta_rule_update."""
    import torch
    from sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent import (
        fused_sigmoid_gating_delta_rule_update as sglang_gdn,
    )

    from sglang_replayssm.testing import GDNHarness

    small = device == "cpu"
    batch, H, HV = (2, 1, 2) if small else (3, 2, 4)
    K = V = 16 if small else 128
    act = torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(1234)

    def rnd(*shape, scale=1.0, dtype=act):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    A_log = rnd(HV, dtype=torch.float32)
    dt_bias = rnd(HV, dtype=torch.float32)
    S0 = rnd(batch, HV, V, K, scale=0.1, dtype=torch.float32)
    kw = dict(use_qk_l2norm_in_kernel=True, softplus_beta=1.0, softplus_threshold=20.0)

    def ref_step(pool, idx, q, k, v, a, b, cu):
        sglang_gdn(A_log=A_log, dt_bias=dt_bias, q=q.unsqueeze(0), k=k.unsqueeze(0), v=v.unsqueeze(0),
                   a=a, b=b, initial_state_source=pool, initial_state_indices=idx, cu_seqlens=cu, **kw)

    # decode: L = 4, 7 steps, a forced flush on step 1 for row 0
    h = GDNHarness(batch=batch, num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, A_log=A_log,
                   dt_bias=dt_bias, ring_len=4, max_draft_tokens=0, device=device)
    h.set_state(S0)
    pool = torch.zeros(batch + 1, HV, V, K, device=device)
    pool[1:] = S0
    idx = torch.arange(1, batch + 1, dtype=torch.int32, device=device)
    cu = torch.arange(batch + 1, dtype=torch.int32, device=device)
    for step in range(7):
        q, k, v = rnd(batch, H, K), rnd(batch, H, K), rnd(batch, HV, V)
        a, b = rnd(batch, HV), rnd(batch, HV)
        force = [1] + [0] * (batch - 1) if step == 1 else None
        h.decode(q, k, v, a, b, force_flush=force)
        ref_step(pool, idx, q, k, v, a, b, cu)
        if not torch.equal(h.state(), pool[1:]):
            err = (h.state() - pool[1:]).abs().max().item()
            return {"ok": False, "detail": f"GDN decode state differs at step {step} (max |diff| {err:g})",
                    "fix": "the ReplaySSM GDN decode/fold kernels are not bit-exact on this GPU/triton"}

    # verify + commit: L = 8, T_max = 3, two rounds with different accept counts
    h = GDNHarness(batch=batch, num_k_heads=H, num_v_heads=HV, head_k_dim=K, head_v_dim=V, A_log=A_log,
                   dt_bias=dt_bias, ring_len=8, max_draft_tokens=3, device=device)
    h.set_state(S0)
    pool = torch.zeros(batch + 1, HV, V, K, device=device)
    pool[1:] = S0
    for rnd_i, acc in enumerate(([3] + [1] * (batch - 1), [2] + [3] * (batch - 1), [1] * batch)):
        T = 3
        q, k, v = rnd(batch, T, H, K), rnd(batch, T, H, K), rnd(batch, T, HV, V)
        a, b = rnd(batch, T, HV), rnd(batch, T, HV)
        h.verify(q, k, v, a, b)
        h.commit(acc)
        sel = [(i, t) for i in range(batch) for t in range(acc[i])]
        cu_acc = torch.tensor([0] + list(torch.tensor(acc).cumsum(0)), dtype=torch.int32, device=device)
        take = lambda x: torch.stack([x[i, t] for i, t in sel])  # noqa: E731
        ref_step(pool, idx, take(q), take(k), take(v), take(a), take(b), cu_acc)
        if not torch.equal(h.state(), pool[1:]):
            err = (h.state() - pool[1:]).abs().max().item()
            return {"ok": False, "detail": f"GDN verify/commit state differs in round {rnd_i} (max |diff| {err:g})",
                    "fix": "the ReplaySSM GDN verify/fold kernels are not bit-exact on this GPU/triton"}
    layout = "split" if h.split_ckpt else "fp32"
    return {"ok": True, "detail": f"decode + verify/commit state bit-exact vs SGLang (B={batch}, H={H}, HV={HV}, "
                                  f"K=V={K}, {layout} checkpoints)"}


def _selftest_mamba2(device: str) -> dict:
    """Mamba-2: harness decode (with flushes) and verify+commit must leave bit-for-bit the state of
    SGLang's selective_state_update stepped over the same (accepted) tokens."""
    try:
        from sglang_replayssm.testing import Mamba2Harness
    except ImportError as e:
        return {"ok": False, "detail": f"Mamba2Harness is not importable from sglang_replayssm.testing ({e})",
                "fix": "install a build that ships the Mamba-2 kernels (replayssm_kernels.mamba2) and Mamba2Harness"}
    import contextlib

    import torch
    from sglang.kernels.ops.mamba.triton_ops.mamba_ssm import selective_state_update

    if device == "cpu" and not hasattr(torch.cpu, "device"):
        # SGLang's launcher enters torch.get_device_module(dev).device(idx); torch.cpu lacks it.
        torch.cpu.device = lambda index=None: contextlib.nullcontext()
    small = device == "cpu"
    batch, NH, P, G, N = (2, 2, 16, 1, 16) if small else (3, 8, 64, 2, 128)
    act = torch.bfloat16
    g = torch.Generator(device="cpu").manual_seed(4321)

    def rnd(*shape, scale=1.0, dtype=act):
        return (torch.randn(*shape, generator=g) * scale).to(device=device, dtype=dtype)

    A = (-(torch.rand(NH, generator=g) * 7.5 + 0.5)).to(device)
    dt_bias = torch.log(torch.expm1(torch.rand(NH, generator=g) * 0.29 + 0.01)).to(device)
    D = torch.randn(NH, generator=g).to(device)
    S0 = rnd(batch, NH, P, N, scale=0.1, dtype=torch.float32)
    A_full = A[:, None, None].expand(NH, P, N)

    def ref_step(pool, idx, x, dt, B, C):
        out = torch.empty_like(x)
        selective_state_update(pool, x, dt[..., None].expand(*dt.shape, P), A_full, B, C,
                               D=D[:, None].expand(NH, P), z=None, dt_bias=dt_bias[:, None].expand(NH, P),
                               dt_softplus=True, state_batch_indices=idx, out=out)

    def harness(L, T_max):
        h = Mamba2Harness(batch=batch, num_heads=NH, head_dim=P, num_groups=G, state_size=N, A=A, D=D,
                          dt_bias=dt_bias, ring_len=L, max_draft_tokens=T_max, device=device)
        h.set_state(S0)
        pool = torch.zeros(batch + 1, NH, P, N, device=device)
        pool[1:] = S0
        return h, pool

    idx = torch.arange(1, batch + 1, dtype=torch.int32, device=device)
    try:
        h, pool = harness(4, 0)
    except TypeError as e:
        return {"ok": False, "detail": f"Mamba2Harness API differs from the doctor's expectation ({e})",
                "fix": "update sglang_replayssm/cli.py::_selftest_mamba2 to the harness API"}
    for step in range(7):
        x, dt, B, C = rnd(batch, NH, P), rnd(batch, NH, scale=0.5), rnd(batch, G, N), rnd(batch, G, N)
        force = [1] + [0] * (batch - 1) if step == 1 else None
        h.decode(x, dt, B, C, force_flush=force)
        ref_step(pool, idx, x, dt, B, C)
        if not torch.equal(h.state(), pool[1:]):
            err = (h.state() - pool[1:]).abs().max().item()
            return {"ok": False, "detail": f"Mamba-2 decode state differs at step {step} (max |diff| {err:g})",
                    "fix": "the ReplaySSM Mamba-2 decode/fold kernels are not bit-exact on this GPU/triton"}

    h, pool = harness(8, 3)
    for rnd_i, acc in enumerate(([3] + [1] * (batch - 1), [2] + [3] * (batch - 1), [1] * batch)):
        T = 3
        x, dt, B, C = rnd(batch, T, NH, P), rnd(batch, T, NH, scale=0.5), rnd(batch, T, G, N), rnd(batch, T, G, N)
        h.verify(x, dt, B, C)
        h.commit(acc)
        for t in range(max(acc)):
            rows = [i for i in range(batch) if t < acc[i]]
            sel = torch.tensor(rows, device=device)
            ref_step(pool, idx[sel], x[sel, t], dt[sel, t], B[sel, t], C[sel, t])
        if not torch.equal(h.state(), pool[1:]):
            err = (h.state() - pool[1:]).abs().max().item()
            return {"ok": False, "detail": f"Mamba-2 verify/commit state differs in round {rnd_i} (max |diff| {err:g})",
                    "fix": "the ReplaySSM Mamba-2 verify/fold kernels are not bit-exact on this GPU/triton"}
    return {"ok": True, "detail": f"decode + verify/commit state bit-exact vs SGLang (B={batch}, NH={NH}, P={P}, G={G}, N={N})"}


def _selftest(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="sglang-replayssm _selftest")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    a = p.parse_args(argv)
    results = []
    for name, fn in (("gdn", _selftest_gdn), ("mamba2", _selftest_mamba2)):
        try:
            res = fn(a.device)
        except Exception as e:  # noqa: BLE001 - report, do not crash the doctor
            res = {"ok": False, "detail": f"crashed: {type(e).__name__}: {e}", "fix": "see the traceback above"}
            import traceback

            traceback.print_exc()
        res["name"] = name
        results.append(res)
    print("SELFTEST " + json.dumps(results), flush=True)
    return 0 if all(r["ok"] for r in results) else 1


def main(argv: Optional[list] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "doctor":
        return doctor(rest)
    if cmd == "_selftest":
        return _selftest(rest)
    print(f"unknown command {cmd!r}; try `sglang-replayssm doctor`", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
