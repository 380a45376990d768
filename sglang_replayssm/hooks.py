"""Hook engine: install, probe and remove the entries of a compat table.

We do not route through SGLang's `HookRegistry`: its `apply_hooks()` logs and swallows failures
and keeps no per-hook result, while the plugin needs an exact status per hook to refuse
`--mamba-backend replayssm` loudly. The mechanics are the usual ones:

* wrappers carry `_replayssm_wrapped = True` and `_replayssm_hook = <name>`, so a second install
  (a re-imported plugin module, a patched SGLang tree calling `register()` as well as the entry
  point) reports "already applied" instead of wrapping twice;
* module-level targets are also rebound in `sglang.*` modules that imported the old object by
  name (`from X import f`), the way SGLang's own registry does;
* every install records how to undo it (`remove()`), for tests and `doctor`.

`STATUS` maps hook name -> "applied" | "already applied" | "skipped (why)" | "FAILED: why".
"""

from __future__ import annotations

import functools
import logging
import pkgutil
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from sglang_replayssm.compat import (
    AFTER,
    AROUND,
    BEFORE,
    DICT_ITEM,
    FUNCTION_KINDS,
    LIST_APPEND,
    REPLACE_CLASS,
    SET_ATTR,
    HookSpec,
)

logger = logging.getLogger("sglang_replayssm")

STATUS: dict[str, str] = {}

MARK = "_replayssm_wrapped"
MARK_NAME = "_replayssm_hook"


@dataclass
class _Installed:
    spec: HookSpec
    owner: Any
    attr: Optional[str]
    original: Any  # raw original (descriptor for static/class methods)
    new: Any
    rebound: list = field(default_factory=list)  # (module, name) rebound to `new`


_INSTALLED: dict[str, _Installed] = {}


def is_ok(status: Optional[str]) -> bool:
    return status in ("applied", "already applied")


def is_failed(status: Optional[str]) -> bool:
    return bool(status) and status.startswith("FAILED")


def _split(target: str) -> tuple[str, list[str]]:
    if ":" not in target:
        raise ValueError(f"target {target!r} must use the 'module:qualname' form")
    mod, qual = target.split(":", 1)
    return mod, qual.split(".")


def resolve_owner(target: str) -> tuple[Any, str]:
    """Import the module of `target` and return `(owner object, attribute name)`."""
    mod, parts = _split(target)
    obj = pkgutil.resolve_name(mod)
    for p in parts[:-1]:
        obj = getattr(obj, p)
    return obj, parts[-1]


def resolve(ref: str) -> Any:
    return pkgutil.resolve_name(ref)


def _raw_attr(owner: Any, attr: str) -> Any:
    """The attribute as stored (keeps staticmethod/classmethod descriptors)."""
    if isinstance(owner, type):
        for klass in owner.__mro__:
            if attr in vars(klass):
                return vars(klass)[attr]
        raise AttributeError(f"{owner.__name__} has no attribute {attr!r}")
    return getattr(owner, attr)


def _func_of(raw: Any) -> Any:
    return raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw


def _chain_find(fn: Any, name: str) -> Any:
    """Our wrapper called `name` in a `__wrapped__` chain (other plugins may wrap on top)."""
    seen = 0
    while fn is not None and seen < 64:
        if getattr(fn, MARK_NAME, None) == name:
            return fn
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return None


def _make_wrapper(kind: str, original: Callable, impl: Callable, name: str) -> Callable:
    # `_replayssm_disabled` turns a wrapper into a pass-through when it cannot be unlinked
    # because another plugin wrapped it afterwards (see `remove`).
    if kind == BEFORE:

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if not wrapper._replayssm_disabled:
                impl(*args, **kwargs)
            return original(*args, **kwargs)

    elif kind == AFTER:

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            result = original(*args, **kwargs)
            if not wrapper._replayssm_disabled:
                impl(result, *args, **kwargs)
            return result

    elif kind == AROUND:

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            if wrapper._replayssm_disabled:
                return original(*args, **kwargs)
            return impl(original, *args, **kwargs)

    else:  # pragma: no cover - table error
        raise ValueError(f"not a function hook kind: {kind}")
    wrapper.__wrapped__ = original
    wrapper._replayssm_disabled = False
    setattr(wrapper, MARK, True)
    setattr(wrapper, MARK_NAME, name)
    return wrapper


def _rebind_stale(original: Any, new: Any, owner: Any) -> list:
    """Rebind `from owner import x` copies held by other `sglang.*` modules."""
    rebound = []
    for mod_name, mod in list(sys.modules.items()):
        if mod is owner or not isinstance(mod, types.ModuleType):
            continue
        if not (mod_name == "sglang" or mod_name.startswith("sglang.")):
            continue
        try:
            items = list(vars(mod).items())
        except TypeError:  # pragma: no cover
            continue
        for k, v in items:
            if v is original:
                try:
                    setattr(mod, k, new)
                    rebound.append((mod, k))
                except (AttributeError, TypeError):  # pragma: no cover
                    pass
    return rebound


def install(spec: HookSpec) -> str:
    """Install one hook; returns its status string (never raises)."""
    try:
        return _install(spec)
    except Exception as e:  # noqa: BLE001 - a hook failure must not break startup
        return f"FAILED: {type(e).__name__}: {e}"


def _install(spec: HookSpec) -> str:
    try:
        owner, attr = resolve_owner(spec.target)
        current = _raw_attr(owner, attr)
    except Exception as e:  # noqa: BLE001
        return f"FAILED: cannot resolve {spec.target}: {type(e).__name__}: {e}"

    if spec.kind == LIST_APPEND:
        if not isinstance(current, list):
            return f"FAILED: {spec.target} is {type(current).__name__}, expected a list"
        if spec.value in current:
            if spec.name in _INSTALLED:
                return "already applied"
            return f"skipped (SGLang already lists {spec.value!r}: patched source tree)"
        current.append(spec.value)
        _INSTALLED[spec.name] = _Installed(spec, current, None, None, spec.value)
        return "applied"

    try:
        impl = resolve(spec.impl)
    except Exception as e:  # noqa: BLE001
        return f"FAILED: cannot import {spec.impl}: {type(e).__name__}: {e}"

    if spec.kind == DICT_ITEM:
        if not isinstance(current, dict):
            return f"FAILED: {spec.target} is {type(current).__name__}, expected a dict"
        existing = current.get(spec.key)
        if existing is impl or (existing is not None and getattr(existing, MARK_NAME, None) == spec.name):
            return "already applied"
        if existing is not None:
            return f"FAILED: {spec.target}[{spec.key!r}] is already taken by {existing!r}"
        current[spec.key] = impl
        _INSTALLED[spec.name] = _Installed(spec, current, spec.key, None, impl)
        return "applied"

    if spec.kind == SET_ATTR:
        if current is impl:
            return "already applied"
        if isinstance(current, type) and isinstance(impl, type) and not issubclass(impl, current):
            return f"FAILED: {spec.impl} must subclass {current.__module__}.{current.__qualname__}"
        own = vars(owner).get(attr, _MISSING) if isinstance(owner, type) else current
        setattr(owner, attr, impl)
        _INSTALLED[spec.name] = _Installed(spec, owner, attr, own, impl)
        return "applied"

    if spec.kind == REPLACE_CLASS:
        if current is impl or vars(current).get(MARK_NAME) == spec.name:
            return "already applied"
        if not isinstance(impl, type) or not issubclass(impl, current):
            return f"FAILED: {spec.impl} must be a subclass of {current.__module__}.{current.__qualname__}"
        setattr(impl, MARK, True)
        setattr(impl, MARK_NAME, spec.name)
        setattr(owner, attr, impl)
        rebound = _rebind_stale(current, impl, owner)
        _INSTALLED[spec.name] = _Installed(spec, owner, attr, current, impl, rebound)
        return "applied"

    if spec.kind in FUNCTION_KINDS:
        func = _func_of(current)
        if not callable(func):
            return f"FAILED: {spec.target} is not callable"
        ours = _chain_find(func, spec.name)
        if ours is not None:
            if ours._replayssm_disabled:  # removed earlier under another plugin's wrapper
                ours._replayssm_disabled = False
                _INSTALLED[spec.name] = _Installed(spec, owner, attr, None, ours)
                return "applied"
            return "already applied"
        wrapper = _make_wrapper(spec.kind, func, impl, spec.name)
        if isinstance(current, staticmethod):
            new = staticmethod(wrapper)
        elif isinstance(current, classmethod):
            new = classmethod(wrapper)
        else:
            new = wrapper
        own = vars(owner).get(attr, _MISSING) if isinstance(owner, type) else current
        setattr(owner, attr, new)
        rebound = [] if isinstance(owner, type) else _rebind_stale(current, new, owner)
        _INSTALLED[spec.name] = _Installed(spec, owner, attr, own, new, rebound)
        return "applied"

    return f"FAILED: unknown hook kind {spec.kind!r}"  # pragma: no cover


_MISSING = object()


def probe(spec: HookSpec) -> str:
    """Check that a hook could be installed here, without installing it."""
    if spec.name in _INSTALLED:
        return "applied"
    try:
        owner, attr = resolve_owner(spec.target)
        current = _raw_attr(owner, attr)
    except Exception as e:  # noqa: BLE001
        return f"FAILED: cannot resolve {spec.target}: {type(e).__name__}: {e}"
    if spec.kind == LIST_APPEND:
        return "ok" if isinstance(current, list) else f"FAILED: {spec.target} is not a list"
    try:
        impl = resolve(spec.impl)
    except Exception as e:  # noqa: BLE001
        return f"FAILED: cannot import {spec.impl}: {type(e).__name__}: {e}"
    if spec.kind == REPLACE_CLASS:
        if not isinstance(impl, type) or not isinstance(current, type) or not issubclass(impl, current):
            return f"FAILED: {spec.impl} must be a subclass of {spec.target}"
    if spec.kind in FUNCTION_KINDS and not callable(impl):
        return f"FAILED: {spec.impl} is not callable"
    return "ok"


def remove(name: str) -> bool:
    """Undo one installed hook (tests, doctor). Returns False if it was not installed here."""
    rec = _INSTALLED.pop(name, None)
    if rec is None:
        return False
    spec = rec.spec
    if spec.kind == LIST_APPEND:
        if spec.value in rec.owner:
            rec.owner.remove(spec.value)
    elif spec.kind == DICT_ITEM:
        if rec.owner.get(rec.attr) is rec.new:
            rec.owner.pop(rec.attr)
    else:
        if not isinstance(rec.owner, type) and rec.original is not _MISSING:
            # modules that imported the hooked object by name, before or after the install
            _rebind_stale(rec.new, rec.original, rec.owner)
        current = vars(rec.owner).get(rec.attr) if isinstance(rec.owner, type) else getattr(rec.owner, rec.attr, None)
        if current is rec.new:
            if isinstance(rec.owner, type) and rec.original is _MISSING:
                delattr(rec.owner, rec.attr)
            else:
                setattr(rec.owner, rec.attr, rec.original)
        elif spec.kind in FUNCTION_KINDS:
            # Wrapped again by someone else since: cannot unlink, make ours a pass-through.
            _func_of(rec.new)._replayssm_disabled = True
        else:
            logger.warning("sglang-replayssm: %s was replaced again by another plugin; not restored", spec.target)
    STATUS.pop(name, None)
    return True


def installed() -> list[str]:
    return list(_INSTALLED)


def original_of(name: str) -> Any:
    """The object a hook replaced (e.g. SGLang's GDNAttnBackend), or None."""
    rec = _INSTALLED.get(name)
    return None if rec is None else rec.original
