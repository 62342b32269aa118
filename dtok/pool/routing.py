"""Where a request goes: a keyed session's turn to the key's home worker; an unkeyed text that
content lookup finds continuing a stored session, to that session; a long stateless text, cut
into chunks that any worker may take; any other text, whole, to the shared queue (or round robin
to the workers' own queues); and to the in-process route when no worker can take it.
"""
from __future__ import annotations

import itertools
import time
import zlib
from typing import Callable

from dtok.chunking import chunk_count
from dtok.pool import protocol
from dtok.pool.failover import Failover, Failure
from dtok.pool.records import PoolError, Request, Task, key_bytes
from dtok.pool.session_flow import SessionFlow
from dtok.pool.shared_sessions import PoolSession
from dtok.pool.state import PoolState
from dtok.sessions import LOOKUP_MIN_CHARS, is_continuation, scoped_key
from dtok_ext.align import common_prefix

__all__ = ["Routing"]


class Routing:
    """``assign()``: give idle workers their next tasks (dispatch); the caller holds the lock."""

    def __init__(self, state: PoolState, flow: SessionFlow, failover: Failover,
                 assign: Callable[[], None]) -> None:
        self._state, self._flow, self._failover, self._assign = state, flow, failover, assign
        self._rr = itertools.count()

    def submit(self, text, session, add_special_tokens, as_list, waiter, scope=None) -> Request:
        """A request routed and queued (the workers idle take it at once); ``waiter``: the
        thread id of a synchronous caller that waits on the workers itself."""
        state = self._state
        if state.closed:
            raise PoolError("the pool is closed")
        req = Request(text, add_special_tokens, "session" if session is not None else "stateless",
                      as_list, waiter)
        if type(text) is not str or type(add_special_tokens) is not bool or not state.channels:
            self._failover.in_process(req, inline=waiter is not None)
            return req
        # A long stateless text is planned and cut before the lock is taken: other threads
        # (the dispatcher, an event loop's next request) do not wait behind the copies.
        found = None
        if session is None and self.looks_up(text):
            with state.lock:
                found = self._lookup(req, scope)  # sets req.keys
        chunks = self._chunks(text) if session is None and found is None \
            and len(text) >= state.routes.chunk_threshold else None
        with state.lock:
            if not state.slots():
                self._failover.in_process(req, inline=waiter is not None)
                return req
            state.counts["requests"] += 1
            if found is not None and not state.sessions.holds(found):
                found = None  # dropped since the lookup: this text starts a session of its own
            if session is not None or found is not None or (req.keys and chunks is None):
                # a keyed session, the stored text content lookup found, or a short unkeyed
                # text a new session keeps for content lookup
                pool_session = (state.sessions.get(scoped_key(session, scope))
                                if session is not None else
                                found if found is not None else self._flow.new_content_session())
                req.pool_session = pool_session
                pool_session.queue.append(req)
                self._flow.start_next(pool_session)
            elif chunks is not None and len(chunks) > 1:
                self._submit_chunked(req, chunks)
            else:
                state.counts["stateless"] += 1
                self._push_stateless(Task(protocol.OP_ENCODE, "stateless", req, text,
                                          state.estimator.weight(text)))
            self._assign()
        return req

    # --- content lookup ------------------------------------------------------------------------

    def looks_up(self, text: str) -> bool:
        """Whether an unkeyed ``text`` is looked up by content."""
        return self._state.routes.content_lookup and len(text) >= LOOKUP_MIN_CHARS

    def _lookup(self, req: Request, scope) -> PoolSession | None:
        """Content lookup (dtok.sessions.ContentIndex): the session an unkeyed text continues —
        the stored text found, when it is idle and the new text shares at least half of it as
        a prefix — or None (a fork sharing a shorter prefix, two conversations with one system
        prompt, leaves the stored one as it is); only texts stored under ``scope``."""
        found, req.keys = self.continued(req.text, scope)
        self.count_lookup(found)
        return found

    def count_lookup(self, found: PoolSession | None) -> None:
        self._state.counts["lookups"] += 1
        if found is not None:
            self._state.counts["lookup_hits"] += 1

    def continued(self, text: str, scope) -> tuple[PoolSession | None, tuple]:
        """(the idle session an unkeyed ``text`` continues, or None; the text's keys in the
        content index): :meth:`_lookup`'s rule, without its counters."""
        found, keys = self._state.index.find(text, scope)
        if (found is not None and found.text is not None and found.inflight is None
                and not found.queue
                and is_continuation(common_prefix(found.text, text), len(found.text))):
            return found, keys
        return None, keys

    # --- stateless texts and chunks -------------------------------------------------------------

    def _chunks(self, text: str) -> list[str]:
        """The chunks of a long stateless text: as many as the live workers take
        (``chunks_per_worker`` each), cut by the in-process planner."""
        routes = self._state.routes
        live = max(1, len(self._state.live()))
        k = min(chunk_count(len(text), routes.chunk_target, routes.max_chunks),
                live * routes.chunks_per_worker)
        return self._state.planning.cut(text, k)

    def _submit_chunked(self, req: Request, chunks: list[str]) -> None:
        state = self._state
        req.kind = "chunked"
        req.bounds = [len(p) for p in chunks]
        req.parts = [None] * len(chunks)
        req.pending = len(chunks)
        state.counts["chunked"] += 1
        state.counts["chunks"] += len(chunks)
        for i, chunk in enumerate(chunks):
            self._push_stateless(Task(protocol.OP_ENCODE, "chunk", req, chunk,
                                      state.estimator.weight(chunk), index=i))

    # --- queues --------------------------------------------------------------------------------

    def _home(self, pool_session: PoolSession) -> int | None:
        slots = self._state.slots()
        if not slots:
            return None
        return slots[zlib.crc32(key_bytes(pool_session.key)) % len(slots)].index

    def push_task(self, task: Task) -> None:
        """Queue a task: a session's for its home worker, any other for the workers' share."""
        if task.pool_session is not None:
            home = self._home(task.pool_session)
            if home is None:
                self._flow.task_dropped(task)
                self._failover.fail(task.req, Failure.NO_LIVE_WORKER)
                return
            self._state.queues.push(home, task, time.monotonic())
        else:
            self._push_stateless(task)

    def _push_stateless(self, task: Task) -> None:
        """A whole stateless request or a chunk: the shared queue, or (the per-worker FIFO design
        of the scheduling comparison) the next live worker's own queue, round robin."""
        live = self._state.live()
        worker = None
        if self._state.routes.stateless_queue == "round_robin" and live \
                and task.kind == "stateless":
            worker = live[next(self._rr) % len(live)].index
        self._state.queues.push(worker, task, time.monotonic())
