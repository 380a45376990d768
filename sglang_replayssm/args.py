"""`--replayssm-ring-len` and how the ring length reaches every process.

ServerArgs is a dataclass with a fixed field set, so the option cannot become a field. The value
travels like this:

1. argparse: `after_add_cli_args` adds `--replayssm-ring-len` (default None = not given).
2. `ServerArgs.from_cli_args` keeps dataclass fields only; `around_from_cli_args` publishes the
   parsed value in a context variable for the duration of the constructor, where the validation
   (`validation.around_post_init`) reads it.
3. The validation stores the resolved length as a plain instance attribute,
   `server_args._replayssm_ring_len` (with `_replayssm_family` and a `_replayssm_validated`
   marker; ServerArgs rejects assignments to non-underscore names once resolved). SGLang 0.5.17 hands the ServerArgs *object* to every scheduler process:
   `mp.Process(target=run_scheduler_process, args=(server_args, ...))` with the spawn start
   method (engine.py L870, L1670), the DP controller likewise (kwargs), Ray actors through
   cloudpickle, draft workers through `deepcopy`. Pickle and deepcopy carry the instance
   `__dict__`, so the attribute arrives wherever the ServerArgs does, without touching
   `os.environ` of the launcher (an environment variable would leak into later servers built in
   the same Python process).
4. Programmatic use (`Engine(**kwargs)` builds ServerArgs directly, no argparse): set
   `SGLANG_REPLAYSSM_RING_LEN` in the environment; the validation reads it when the flag is
   absent.

Precedence: flag > attribute already on the instance > `SGLANG_REPLAYSSM_RING_LEN` > 16.
"""

from __future__ import annotations

import argparse
import contextvars
import os
from typing import Optional

RING_LEN_FLAG = "--replayssm-ring-len"
RING_LEN_ENV = "SGLANG_REPLAYSSM_RING_LEN"
DEFAULT_RING_LEN = 16
BACKEND = "replayssm"

ATTR_RING_LEN = "_replayssm_ring_len"
ATTR_FAMILY = "_replayssm_family"
ATTR_VALIDATED = "_replayssm_validated"

# Value of --replayssm-ring-len while ServerArgs.from_cli_args runs (None: flag not given).
_CLI_RING_LEN: contextvars.ContextVar[Optional[int]] = contextvars.ContextVar(
    "replayssm_cli_ring_len", default=None
)


def after_add_cli_args(_result, parser: argparse.ArgumentParser, *args, **kwargs) -> None:
    """AFTER `ServerArgs.add_cli_args(parser)`."""
    for action in parser._actions:  # argparse has no public accessor
        if action.dest == "mamba_backend" and action.choices is not None and BACKEND not in action.choices:
            # The choices list is normally MAMBA_BACKEND_CHOICES itself (already extended);
            # this covers a copied list.
            action.choices = list(action.choices) + [BACKEND]
    if any(RING_LEN_FLAG in a.option_strings for a in parser._actions):
        return
    parser.add_argument(
        RING_LEN_FLAG,
        dest="replayssm_ring_len",
        type=int,
        default=None,
        metavar="L",
        help=(
            "ReplaySSM ring length (entries per slot and SSM layer; default "
            f"{DEFAULT_RING_LEN}, or ${RING_LEN_ENV}). Only with --mamba-backend replayssm. "
            "Must be >= --speculative-num-draft-tokens when speculative decoding is on."
        ),
    )


def around_from_cli_args(original, cls, args: argparse.Namespace, *rest, **kwargs):
    """AROUND `ServerArgs.from_cli_args(args)` (classmethod)."""
    token = _CLI_RING_LEN.set(getattr(args, "replayssm_ring_len", None))
    try:
        return original(cls, args, *rest, **kwargs)
    finally:
        _CLI_RING_LEN.reset(token)


def cli_ring_len() -> Optional[int]:
    """The flag value while a ServerArgs is being built from the command line, else None."""
    return _CLI_RING_LEN.get()


def resolve_ring_len(server_args) -> tuple[int, str]:
    """Return `(ring_len, source)` by the precedence above. Raises ValueError on a malformed
    environment value (it is an explicit choice that cannot be honoured)."""
    flag = cli_ring_len()
    if flag is not None:
        return int(flag), RING_LEN_FLAG
    attr = getattr(server_args, ATTR_RING_LEN, None) if server_args is not None else None
    if attr is not None:
        return int(attr), f"server_args.{ATTR_RING_LEN}"
    env = os.environ.get(RING_LEN_ENV)
    if env is not None and env.strip() != "":
        try:
            return int(env), RING_LEN_ENV
        except ValueError:
            raise ValueError(
                f"{RING_LEN_ENV}={env!r} is not an integer; set it to the ring length "
                f"(e.g. {RING_LEN_ENV}={DEFAULT_RING_LEN}) or pass {RING_LEN_FLAG} L."
            ) from None
    return DEFAULT_RING_LEN, "default"


def validated_ring_len(server_args) -> int:
    """The ring length a validated ServerArgs carries into this (possibly child) process."""
    value = getattr(server_args, ATTR_RING_LEN, None)
    if value is None or getattr(server_args, ATTR_VALIDATED, None) is None:
        raise RuntimeError(
            "--mamba-backend replayssm: this ServerArgs was not validated by sglang-replayssm "
            "(no _replayssm_ring_len attribute). The plugin must be registered before ServerArgs "
            "is built: keep the `sglang.srt.plugins` entry point enabled (SGLANG_PLUGINS must "
            "include 'replayssm' if set) and do not set SGLANG_REPLAYSSM_ENABLE=0."
        )
    return int(value)


def is_selected(server_args) -> bool:
    return getattr(server_args, "mamba_backend", None) == BACKEND


def validated_family(server_args) -> str:
    """'gdn' or 'mamba2' as decided by the validation (raises if it did not run)."""
    validated_ring_len(server_args)
    return getattr(server_args, ATTR_FAMILY)
