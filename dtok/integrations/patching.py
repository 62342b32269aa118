"""Patching an engine in place: AROUND hooks on dotted targets, and the executor call that
carries the request's context variables."""
from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import sys
from typing import Any, Callable

__all__ = ["resolve", "patch", "run_in_context"]


def resolve(target: str) -> tuple[Any, str]:
    """(owner, attribute) of a dotted target such as ``pkg.mod.Class.method``; owner None when
    it cannot be imported or has no such attribute."""
    import pkgutil

    owner_name, _, attr = target.rpartition(".")
    try:
        owner = pkgutil.resolve_name(owner_name)
    except (ImportError, AttributeError, ValueError):
        return None, attr
    return (owner, attr) if hasattr(owner, attr) else (None, attr)


def patch(targets, package: str) -> list[str]:
    """Wrap each ``(target, hook)`` so that ``hook(original, *args, **kwargs)`` runs instead of
    the target (an AROUND hook; coroutine functions stay coroutine functions). A module-level
    function is also replaced where modules of ``package`` imported it by name. Idempotent;
    returns the targets patched now."""
    done = []
    for target, hook in targets:
        owner, attr = resolve(target)
        if owner is None:
            continue
        orig = getattr(owner, attr)
        if getattr(orig, "__dtok_hook__", False):
            continue
        patched: Any
        if inspect.iscoroutinefunction(orig):
            async def around_async(*a, __orig=orig, __hook=hook, **k):
                return await __hook(__orig, *a, **k)
            patched = functools.wraps(orig)(around_async)
        else:
            def around(*a, __orig=orig, __hook=hook, **k):
                return __hook(__orig, *a, **k)
            patched = functools.wraps(orig)(around)
        patched.__dtok_hook__ = True
        setattr(owner, attr, patched)
        if not isinstance(owner, type):  # a module function: also where it was imported to
            for module in list(sys.modules.values()):
                if (getattr(module, "__name__", "").startswith(package)
                        and getattr(module, attr, None) is orig):
                    setattr(module, attr, patched)
        done.append(target)
    return done


def run_in_context(loop: asyncio.AbstractEventLoop, executor, fn: Callable, *args):
    """``loop.run_in_executor`` that carries the caller's context variables (the session key)
    into the executor thread, which ``run_in_executor`` itself does not."""
    return loop.run_in_executor(executor, functools.partial(
        contextvars.copy_context().run, fn, *args))
