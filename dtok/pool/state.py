"""What every part of a pool shares, all of it under one lock: the channels to the workers, the
queues, the sessions and the content index, the counters, and the knobs the parts read.

The parts (:mod:`~dtok.pool.routing`, :mod:`~dtok.pool.dispatch`,
:mod:`~dtok.pool.session_flow`, :mod:`~dtok.pool.failover`, :mod:`~dtok.pool.supervision`, the
faces in :mod:`~dtok.pool.api` and :mod:`~dtok.pool.aio`) each hold this one object; none holds
the :class:`~dtok.pool.Pool`.
"""
from __future__ import annotations

import threading
from typing import NamedTuple

from dtok.pool.channel import Channel
from dtok.pool.scheduler import Estimator, Queues
from dtok.pool.shared_sessions import SessionTable
from dtok.sessions import ContentIndex

__all__ = ["PoolState", "Routes", "COUNTERS"]

#: the events a pool counts (``Pool.stats()`` reports each under this name)
COUNTERS = ("requests", "stateless", "chunked", "chunks", "lookups", "lookup_hits",
            "session_hits", "session_repairs", "session_edits", "session_full_encodes", "plan_failures",
            "failovers", "timeouts", "worker_deaths", "replacements", "worker_renewals", "errors",
            "in_process",
            "shm_full", "loop_turns")


class Routes(NamedTuple):
    """The knobs that decide a request's route."""
    chunk_threshold: int  # stateless texts this long or longer are cut into chunks
    chunk_target: int
    max_chunks: int
    chunks_per_worker: int  # chunks a long text gets per live worker
    stateless_queue: str  # "shared", or "round_robin" over the workers' own queues
    content_lookup: bool  # unkeyed texts continue stored sessions
    lookup_entries: int  # content-lookup sessions kept


class PoolState:
    """The shared state of one pool (see the module's docstring)."""

    def __init__(self, planning, estimator: Estimator, queues: Queues, sessions: SessionTable,
                 routes: Routes, affix: tuple[tuple, tuple], request_timeout: float) -> None:
        self.lock = threading.RLock()
        self.ready = threading.Condition(self.lock)  # a worker came up (or the pool closed)
        self.closed = False
        self.planning = planning  # the tokenizer's planning interface (dtok.planning.Planning)
        self.estimator, self.queues, self.sessions = estimator, queues, sessions
        self.index = ContentIndex()
        self.routes = routes
        self.prefix_ids, self.suffix_ids = affix  # the post-processor's IDs
        self.request_timeout = request_timeout
        self.channels: list[Channel] = []
        self.counts = dict.fromkeys(COUNTERS, 0)

    def live(self) -> list[Channel]:
        """The workers that take tasks now."""
        return [ch for ch in self.channels if ch.alive]

    def any_alive(self) -> bool:
        return any(ch.alive for ch in self.channels)

    def slots(self) -> list[Channel]:
        """The workers that take tasks now or soon (starting)."""
        return [ch for ch in self.channels if ch.alive or ch.ready_by]
