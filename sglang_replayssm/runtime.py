"""Runtime hooks: installed only in a process that serves `--mamba-backend replayssm`.

Decision (see docs in compat/sglang_0_5_17.py): behaviour-changing hooks (SSU registry entry,
pool class, memory solver, backend classes, commit hooks) are **not** installed by `register()`.
They are installed

* in the launcher, by the final argument validation, when the ServerArgs selects replayssm
  (cheap there: the launcher imports these modules anyway); and
* in every scheduler process, by the `Scheduler.__init__` probe, from the pickled ServerArgs
  (which carries `_replayssm_family` / `_replayssm_ring_len`).

So with another backend none of them exists in any process and the stock path is byte-identical
by construction. Only the hooks the model needs are installed: the family's backend class, and the
commit hooks only with speculative decoding. A failure of a needed hook raises (validation error
in the launcher, scheduler start-up error in a scheduler process).
"""

from __future__ import annotations

import logging

from sglang_replayssm import args as _args
from sglang_replayssm.compat import TIER_RUNTIME

logger = logging.getLogger("sglang_replayssm")

_ACTIVE: dict = {}  # {"family": ..., "spec": bool} once installed in this process


def needed(spec, family: str, speculative: bool) -> bool:
    return family in spec.families and (speculative or not spec.spec_only)


def activate(server_args) -> list[str]:
    """Install the runtime hooks for this ServerArgs; return the failures of needed hooks."""
    from sglang_replayssm import SGLANG_ERROR, table
    from sglang_replayssm.hooks import STATUS, install, is_ok

    if SGLANG_ERROR:
        return [f"sglang version: {SGLANG_ERROR}"]
    family = getattr(server_args, _args.ATTR_FAMILY, None)
    if family is None:
        return ["model family: unknown (ServerArgs not validated by sglang-replayssm)"]
    speculative = getattr(server_args, "speculative_algorithm", None) is not None
    failures = []
    for spec in table().hooks:
        if spec.tier != TIER_RUNTIME:
            continue
        if not needed(spec, family, speculative):
            if spec.name not in STATUS or not is_ok(STATUS[spec.name]):
                STATUS[spec.name] = f"skipped (not needed for {family}{' + speculative' if speculative else ''})"
            continue
        status = install(spec)
        STATUS[spec.name] = status
        if not is_ok(status):
            failures.append(f"{spec.name} ({spec.target}): {status}" + (f" -> {spec.fix}" if spec.fix else ""))
    # Scheduler processes built in this process (Ray actors, tests) need the probe as well.
    for spec in table().hooks:
        if spec.name == "runtime.scheduler_probe" and not is_ok(STATUS.get(spec.name)):
            STATUS[spec.name] = install(spec)
    if not failures:
        _ACTIVE.update(family=family, spec=speculative)
    return failures


def is_active() -> bool:
    return bool(_ACTIVE)


def deactivate() -> None:
    """Remove the runtime hooks from this process (tests, doctor)."""
    from sglang_replayssm import table
    from sglang_replayssm.hooks import STATUS, remove

    for spec in reversed(table().hooks):
        if spec.tier == TIER_RUNTIME:
            remove(spec.name)
            STATUS[spec.name] = "skipped (runtime hooks apply only when --mamba-backend replayssm is selected)"
    _ACTIVE.clear()


def before_scheduler_init(self, *args, **kwargs) -> None:
    """BEFORE `Scheduler.__init__(server_args, ...)`: install the runtime hooks in a scheduler
    process whose ServerArgs selects replayssm; a pass-through otherwise."""
    server_args = kwargs.get("server_args", args[0] if args else None)
    if not _args.is_selected(server_args):
        return
    ring_len = _args.validated_ring_len(server_args)  # raises if the launcher skipped validation
    failures = activate(server_args)
    if failures:
        raise RuntimeError(
            "--mamba-backend replayssm: required hooks are missing in the scheduler process "
            "(no fallback to the stock path):\n  " + "\n  ".join(failures)
        )
    logger.info(
        "sglang-replayssm: runtime hooks active in scheduler (family=%s, ring_len=%d).",
        getattr(server_args, _args.ATTR_FAMILY), ring_len,
    )
