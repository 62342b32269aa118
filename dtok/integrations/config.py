"""How the engine hooks of this process are configured, and the pool each dtok tokenizer gets.

:func:`configure` overrides the environment: ``DTOK_POOL_WORKERS`` (0: everything in
process), ``DTOK_POOL_MIN_CHARS`` (default 16384: shorter stateless prompts stay in process),
``DTOK_LOOP_CHARS`` (default 32768: in process, an engine that tokenizes in an executor gets
answers that encode at most this many characters on its event loop instead; through the pool,
a session's next turn is planned on the loop within the same budget; 0: never),
``DTOK_KNOBS`` (JSON: keyword arguments of :class:`dtok.Tokenizer`). A pool starts in a
background thread (:class:`PoolSlot`); until it is ready, requests are encoded in process.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

from dtok.sessions import LOOP_CHARS

log = logging.getLogger("dtok.integrations")

__all__ = ["configure", "knobs", "pool_workers", "pool_min_chars", "loop_chars",
           "POOL_DEFAULTS", "PoolSlot"]

_CONFIG: dict[str, Any] = {"workers": None, "min_chars": None, "loop_chars": None,
                           "options": None, "knobs": None}


def configure(*, pool_workers: int | None = None, pool_min_chars: int | None = None,
              loop_chars: int | None = None, pool_options: dict[str, Any] | None = None,
              knobs: dict[str, Any] | None = None) -> None:
    """Configure every hook in this process (overrides ``DTOK_POOL_WORKERS``,
    ``DTOK_POOL_MIN_CHARS``, ``DTOK_LOOP_CHARS`` and ``DTOK_KNOBS``; None: the environment's
    value). ``pool_workers=0`` keeps everything in process; ``loop_chars=0`` sends every
    in-process encode of an executor-backed engine to its executor, and has the pool plan
    every call on its submit thread (never on the loop); ``pool_options`` go to
    :class:`dtok.Pool`; ``knobs`` to :class:`dtok.Tokenizer` (e.g.
    ``{"session_bytes": 1 << 30}``) for tokenizers built after this call."""
    for name, value in (("pool_workers", pool_workers), ("pool_min_chars", pool_min_chars),
                        ("loop_chars", loop_chars)):
        if value is not None and (type(value) is not int or value < 0):
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    _CONFIG.update(workers=pool_workers, min_chars=pool_min_chars, loop_chars=loop_chars,
                   options=pool_options, knobs=knobs)


def knobs() -> dict[str, Any]:
    """The keyword arguments for a new :class:`dtok.Tokenizer`."""
    if _CONFIG["knobs"] is not None:
        return dict(_CONFIG["knobs"])
    raw = os.environ.get("DTOK_KNOBS")
    try:
        value = json.loads(raw) if raw else {}
        if not isinstance(value, dict):
            raise ValueError("not a JSON object")
        return value
    except ValueError as exc:
        log.warning("dtok: DTOK_KNOBS=%r ignored: %s", raw, exc)
        return {}


def _env_int(name: str, default: int) -> int:
    try:
        return max(0, int(os.environ.get(name, default)))
    except ValueError:
        log.warning("dtok: %s=%r is not an int; using %d", name, os.environ.get(name), default)
        return default


def pool_workers() -> int:
    return (_CONFIG["workers"] if _CONFIG["workers"] is not None
            else _env_int("DTOK_POOL_WORKERS", 0))


def pool_min_chars() -> int:
    return (_CONFIG["min_chars"] if _CONFIG["min_chars"] is not None
            else _env_int("DTOK_POOL_MIN_CHARS", 16384))


def loop_chars() -> int:
    return (_CONFIG["loop_chars"] if _CONFIG["loop_chars"] is not None
            else _env_int("DTOK_LOOP_CHARS", LOOP_CHARS))


# The open-loop testbed's best design (README, Benchmarks): the Pool's own shortest-first order
# and aging, with small chunks.
POOL_DEFAULTS = {"chunks_per_worker": 8, "name": "serving"}


class PoolSlot:
    """One pool for one dtok tokenizer, started in a background thread on first use."""

    def __init__(self, tok, workers: int) -> None:
        self.pool = None
        self.error: str | None = None
        self.ready = threading.Event()
        threading.Thread(target=self._start, args=(tok, workers), name="dtok-pool-start",
                         daemon=True).start()

    def _start(self, tok, workers: int) -> None:
        import dtok

        try:
            self.pool = dtok.Pool(tok, workers=workers,
                                  **{**POOL_DEFAULTS, **(_CONFIG["options"] or {})})
            log.info("dtok: pool of %d workers ready", workers)
        except Exception as exc:  # noqa: BLE001 - in process is always exact
            self.error = f"{type(exc).__name__}: {exc}"
            log.warning("dtok: no pool, encoding in process: %s", self.error)
        finally:
            self.ready.set()
