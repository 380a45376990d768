"""Version adapter: which SGLang release this build targets and where its hook points live.

Everything that names an SGLang symbol (dotted hook targets, class-attribute swaps, the version
check) is data in one per-version module (`sglang_0_5_17.py`). The hook engine
(`sglang_replayssm.hooks`) only interprets that table, so porting to another SGLang release means
adding one table module and one line to `TABLES`.

Importing this package must stay cheap: it imports neither torch nor SGLang.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Optional

# Hook kinds. Function kinds wrap a callable; the others rebind or extend an object in place.
BEFORE = "before"  # impl(*args, **kwargs) runs first; its return value is ignored
AFTER = "after"  # impl(result, *args, **kwargs) runs after; the original result is returned
AROUND = "around"  # impl(original, *args, **kwargs) replaces the call
REPLACE_CLASS = "replace_class"  # module attribute := impl (must subclass the original class)
SET_ATTR = "set_attr"  # class attribute := impl
DICT_ITEM = "dict_item"  # target_dict[key] := impl
LIST_APPEND = "list_append"  # target_list.append(value)

FUNCTION_KINDS = (BEFORE, AFTER, AROUND)

# Tiers: when a hook is installed.
TIER_CLI = "cli"  # by register(), in every process; changes nothing unless replayssm is selected
TIER_PROBE = "probe"  # by register() when the target module is already imported (scheduler processes)
TIER_RUNTIME = "runtime"  # only in a process that serves --mamba-backend replayssm (see runtime.py)

FAMILIES = ("gdn", "mamba2")


@dataclass(frozen=True)
class HookSpec:
    """One entry of a compat table.

    `target` and `impl` use the `module:qualname` form of `pkgutil.resolve_name`. `impl` is
    resolved lazily (at install time), so a missing module only fails its own hook.
    """

    name: str
    target: str
    kind: str
    tier: str
    why: str
    impl: Optional[str] = None
    key: Optional[str] = None  # DICT_ITEM
    value: Any = None  # LIST_APPEND
    families: tuple = FAMILIES  # model families that need this hook (required-ness)
    spec_only: bool = False  # required only with --speculative-algorithm
    fix: str = ""  # what to do when it fails (doctor / validation messages)


TABLES = {"0.5.17": "sglang_replayssm.compat.sglang_0_5_17"}
DEFAULT_TABLE = "0.5.17"


def sglang_version() -> Optional[str]:
    """Installed SGLang version from the distribution metadata (no SGLang import), or None."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("sglang")
        except PackageNotFoundError:
            return None
    except Exception:  # pragma: no cover - broken metadata
        return None


@dataclass(frozen=True)
class CompatTable:
    sglang_version: str
    hooks: tuple
    module: str


def load_table(found: Optional[str] = None) -> tuple[CompatTable, Optional[str]]:
    """Return `(table, error)`. For an unsupported SGLang version the 0.5.17 table is returned
    with an error string: the CLI hooks are still tried so that `--mamba-backend replayssm` can
    be refused with a clear message, and the runtime hooks are never installed."""
    found = sglang_version() if found is None else found
    name = TABLES.get(found or "")
    error = None
    if name is None:
        error = (
            f"sglang-replayssm supports SGLang {', '.join(sorted(TABLES))} only; found "
            f"{found or 'no sglang installation'}. Install sglang=={DEFAULT_TABLE} "
            f"(pip install sglang=={DEFAULT_TABLE}) or use another --mamba-backend."
        )
        name = TABLES[DEFAULT_TABLE]
    mod = importlib.import_module(name)
    return CompatTable(sglang_version=mod.SGLANG_VERSION, hooks=tuple(mod.HOOKS), module=name), error
