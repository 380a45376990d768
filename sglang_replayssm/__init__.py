"""sglang-replayssm: ReplaySSM decode and speculative verify for SGLang hybrid SSM models.

`register()` is the `sglang.srt.plugins` entry point. SGLang 0.5.17 calls it through
`load_plugins()` in the launcher (before argv is parsed) and again in every scheduler process;
`patches/sglang-0.5.17.patch` calls it from `load_plugins()` as well, for installs where the entry
point is filtered out. It is cheap (no torch / kernel import), idempotent, never raises, and
installs only the hooks that change nothing unless `--mamba-backend replayssm` is selected (see
`sglang_replayssm.runtime` for the rest).

Environment:
    SGLANG_REPLAYSSM_ENABLE=0      kill switch: register() installs nothing.
    SGLANG_REPLAYSSM_RING_LEN=L    ring length when --replayssm-ring-len is not given.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Optional

__version__ = "0.1.0"

from sglang_replayssm.hooks import STATUS  # noqa: E402  (cheap: no torch, no SGLang import)

logger = logging.getLogger("sglang_replayssm")

ENABLE_ENV = "SGLANG_REPLAYSSM_ENABLE"

# Set by register(): error string when the installed SGLang is not a supported version.
SGLANG_ERROR: Optional[str] = None
SGLANG_FOUND: Optional[str] = None

_REGISTERED = False
_TABLE = None


def _status():
    return STATUS


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def table():
    """The compat table for the installed SGLang (loaded once)."""
    global _TABLE, SGLANG_ERROR, SGLANG_FOUND
    if _TABLE is None:
        from sglang_replayssm.compat import load_table, sglang_version

        SGLANG_FOUND = sglang_version()
        _TABLE, SGLANG_ERROR = load_table(SGLANG_FOUND)
    return _TABLE


def register() -> dict:
    """Install the plugin's always-on hooks; returns the STATUS dict (hook name -> status)."""
    global _REGISTERED
    try:
        status = _status()
        if not enabled():
            status.clear()
            status["register"] = f"skipped ({ENABLE_ENV}=0)"
            if not _REGISTERED:
                logger.info("sglang-replayssm %s: disabled by %s=0, no hooks installed.", __version__, ENABLE_ENV)
            _REGISTERED = True
            return status
        if _REGISTERED:
            _install_probes()
            return status
        _REGISTERED = True
        from sglang_replayssm.compat import TIER_CLI, TIER_RUNTIME
        from sglang_replayssm.hooks import install, is_failed

        tbl = table()
        for spec in tbl.hooks:
            if spec.tier == TIER_CLI:
                status[spec.name] = install(spec)
            elif spec.tier == TIER_RUNTIME and spec.name not in status:
                status[spec.name] = "skipped (runtime hooks apply only when --mamba-backend replayssm is selected)"
        _install_probes()
        ok = [k for k, v in status.items() if v in ("applied", "already applied")]
        bad = [f"{k} ({v})" for k, v in status.items() if is_failed(v)]
        msg = f"sglang-replayssm {__version__} for SGLang {tbl.sglang_version}: {len(ok)} hooks active ({', '.join(ok)})"
        if SGLANG_ERROR:
            msg += f"; UNSUPPORTED SGLANG: {SGLANG_ERROR}"
        if bad:
            msg += f"; FAILED: {'; '.join(bad)}"
        (logger.warning if (bad or SGLANG_ERROR) else logger.info)(msg.rstrip(".") + ".")
        return status
    except Exception as e:  # noqa: BLE001 - never break SGLang start-up from here
        try:
            _status()["register"] = f"FAILED: {type(e).__name__}: {e}"
        except Exception:  # pragma: no cover
            pass
        logger.exception("sglang-replayssm: register() failed")
        return {}


def _install_probes() -> None:
    """Install probe-tier hooks whose module is already imported (scheduler processes)."""
    from sglang_replayssm.compat import TIER_PROBE
    from sglang_replayssm.hooks import install, is_ok

    status = _status()
    for spec in table().hooks:
        if spec.tier != TIER_PROBE or is_ok(status.get(spec.name)):
            continue
        module = spec.target.split(":", 1)[0]
        mod = sys.modules.get(module)
        cls_name = spec.target.split(":", 1)[1].split(".", 1)[0]
        if mod is None or not hasattr(mod, cls_name):
            status[spec.name] = f"skipped ({module} not imported in this process)"
            continue
        status[spec.name] = install(spec)


def require_registered() -> None:
    """Raise unless the validation hooks are active in this process. Called by the patched
    `ServerArgs._handle_mamba_backend` (patches/sglang-0.5.17.patch) for
    `--mamba-backend replayssm`, so a disabled or unregistered plugin fails at argument
    validation instead of in the scheduler."""
    from sglang_replayssm.hooks import is_ok

    if not enabled():
        raise ValueError(
            f"--mamba-backend replayssm: the sglang-replayssm plugin is disabled by {ENABLE_ENV}=0; "
            f"unset {ENABLE_ENV} or choose another --mamba-backend."
        )
    if not is_ok(STATUS.get("validate.post_init")):
        raise ValueError(
            "--mamba-backend replayssm: the sglang-replayssm plugin is not registered in this process "
            f"(validate.post_init: {STATUS.get('validate.post_init', 'not installed')}). Run "
            "`sglang-replayssm doctor`."
        )


def unregister() -> None:
    """Remove every hook this process installed (tests, doctor)."""
    global _REGISTERED
    from sglang_replayssm import runtime
    from sglang_replayssm.hooks import installed, remove

    runtime.deactivate()
    for name in reversed(installed()):
        remove(name)
    _status().clear()
    _REGISTERED = False


__all__ = ["STATUS", "__version__", "enabled", "register", "require_registered", "table", "unregister"]
