"""Hooks for tests: moments inside dtok that a test cannot reach from outside (a race it must
force), named here so that no test sets a private attribute of a production class.

dtok calls :func:`run_hook` where each moment is; it does nothing unless a test installed a
function for that hook with :func:`hooked`:

>>> from dtok import testing
>>> seen = []
>>> with testing.hooked(testing.AFTER_PUBLISH, seen.append):
...     testing.run_hook(testing.AFTER_PUBLISH, "entry")
>>> testing.run_hook(testing.AFTER_PUBLISH, "after")
>>> seen
['entry']
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

#: The session store made a content-lookup entry visible to other requests (its caller's
#: result already taken); called with the entry (:mod:`dtok.sessions`).
AFTER_PUBLISH = "after_publish"

#: A pool encodes a request in its own process (failover, or no worker); called with the text,
#: on the thread that encodes it (:mod:`dtok.pool.failover`).
IN_PROCESS_ENCODE = "in_process_encode"

#: A pool is about to start its zygote; called with the configuration it sends, which the
#: function may change (:mod:`dtok.pool.api`; the zygote's own test hooks, such as
#: ``_hang_starts``: {worker index: starts that never come up}).
ZYGOTE_CONFIG = "zygote_config"

_installed: dict[str, Callable] = {}


def run_hook(name: str, *args) -> None:
    """Call the function a test installed for ``name``, if any."""
    fn = _installed.get(name)
    if fn is not None:
        fn(*args)


@contextmanager
def hooked(name: str, fn: Callable) -> Iterator[None]:
    """Run ``fn`` at the moment ``name`` while the block runs (one function a hook)."""
    if name in _installed:
        raise RuntimeError(f"hook {name!r} is installed already")
    _installed[name] = fn
    try:
        yield
    finally:
        del _installed[name]
