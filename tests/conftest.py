"""Shared test setup: CPU runs use the Triton interpreter; tolerance rule for outputs.

Output rule (flash-attention style): per call,
    max|out - ref64| <= 2 * max|baseline - ref64| + atol,   atol = 1e-3 (bf16/fp16) or 1e-4 (fp32)
where `baseline` is SGLang's own kernel on the same inputs and `ref64` an fp64 recurrence.
"""

import os

import torch

if not torch.cuda.is_available():
    # Triton reads this at import time; CPU tensors need the interpreter.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

ATOL = {torch.bfloat16: 1e-3, torch.float16: 1e-3, torch.float32: 1e-4}


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture
def assert_within_baseline():
    def check(name, out, base, ref, dtype):
        err = (out.double() - ref.double()).abs().max().item()
        err_base = (base.double() - ref.double()).abs().max().item()
        bound = 2 * err_base + ATOL[dtype]
        assert err <= bound, (
            f"{name}: max err {err:.3e} > 2 * baseline err {err_base:.3e} + {ATOL[dtype]:.0e}; "
            f"mean err {(out.double() - ref.double()).abs().mean().item():.3e}"
        )
        return err, err_base

    return check


@pytest.fixture
def plugin_env():
    """register() active (as the entry point does); SGLang's exported env vars cleared, then
    restored, and the runtime hooks that validating a replayssm ServerArgs installs removed, so
    later tests see stock SGLang classes."""
    import sglang_replayssm
    from sglang_replayssm import args as rargs
    from sglang_replayssm import runtime

    saved = {k: os.environ.get(k) for k in ("SGLANG_MAMBA_SSM_DTYPE", rargs.RING_LEN_ENV, sglang_replayssm.ENABLE_ENV)}
    for k in saved:
        os.environ.pop(k, None)
    sglang_replayssm.register()
    yield
    runtime.deactivate()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
