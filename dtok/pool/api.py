"""dtok.Pool: worker processes that encode for this process, exactly as the reference would.

Requests enter queues in this process (:mod:`dtok.pool.scheduler`); an idle worker is given the
better of its own queue's head (its sessions' tasks) and the shared queue's head (stateless
requests and the chunks of long ones), the local one on a tie, and keeps it until done (a running
encode is never interrupted). Text and IDs move through shared memory
(:mod:`dtok.pool.channel`); a session's IDs stay in its own segment, which callers see through
read-only views without a copy (:mod:`dtok.pool.shared_sessions`). Workers are forked by a zygote
(:mod:`dtok.pool.zygote_client`); a worker that dies, is killed on a timeout, or does not come up
in time is replaced.

Waiting: a synchronous ``encode`` whose task goes to a worker at once waits on that worker's
response semaphore and harvests the answer itself (two wake-ups: the worker's and the
caller's); everything else is answered by the dispatcher thread, which sleeps on the shared
"done" semaphore. Nothing spins while the pool is idle.

Any failure of the pool (an error, a worker's death, a timeout, shared memory that cannot be
had) fails the request once, and it is encoded in this process on the route it would have taken
without the pool — on a worker thread, never on the caller's event loop — so the IDs never
depend on the pool.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
import weakref
import zlib
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Hashable

import posix_ipc

from dtok.admission import bundled_files
from dtok.chunking import chunk_count, split_at
from dtok.encoders import available_cpus
from dtok.knobs import positive_int
from dtok.pool import protocol as P
from dtok.pool import shm
from dtok.pool.channel import Channel, payload_bytes
from dtok.pool.failover import InProcessRoute
from dtok.pool.records import PoolError, Request, Task, key_bytes
from dtok.pool.scheduler import Estimator, Queues
from dtok.pool.shared_sessions import PoolSession, SessionTable
from dtok.pool.supervision import Supervision, pss_mb
from dtok.pool.worker import write_turn
from dtok.pool.zygote_client import Resources, ZygoteClient
from dtok.repair import Anchors
from dtok.session_core import ROUTE_COUNTERS
from dtok.sessions import (LOOKUP_MIN_CHARS, LOOP_CHARS, ContentIndex, alignment_budget,
                           is_continuation, plan_fits, scoped_key)
from dtok.tokenizer import Tokenizer
from dtok_ext.align import common_prefix
from dtok_ext.buffers import IdBuffer
from dtok_ext.shm import utf8_length

log = logging.getLogger("dtok")

__all__ = ["Pool", "PoolError", "AGING"]

#: Default aging of shortest-first keys, from the open-loop testbed (README, "Choosing aging"):
#: with 1.0 (the paper's) appends behind a burst that takes seconds on a few workers waited for
#: most of it; 0.01 kept their P99 under bursts ~40x lower on both encoders.
AGING = 0.01

def _to_loop(loop: asyncio.AbstractEventLoop, answer: asyncio.Future, done: Future | None,
             error: BaseException | None) -> None:
    """Settle an event loop's future from another thread: with the outcome of ``done`` (a
    request's future), else with ``error``. A loop already closed has no caller left."""
    def settle() -> None:
        if answer.done():  # the caller gave up (cancelled)
            return
        if done is not None and done.cancelled():
            answer.cancel()
            return
        exc = error if done is None else done.exception()
        if exc is not None:
            answer.set_exception(exc)
        else:
            answer.set_result(done.result())
    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:
        pass


class Pool(Supervision):
    """Worker processes that encode for this process, exactly as the reference would.

    Knobs shared with :class:`dtok.Tokenizer` (chunking, session bounds,
    ``encode_special_tokens``) left as None are the tokenizer's. Given a tokenizer, the pool's
    in-process route encodes with its loaded encoders; given a path, it loads the file again
    (fastokens keeps ~16 MiB per thread *and* instance: a thread that encodes through both
    loads holds two shares).

    >>> with Pool(workers=2) as pool:
    ...     ids = pool.encode("Hello, world!")
    ...     list(ids) == pool.tokenizer.reference.encode("Hello, world!").ids
    True
    """

    _test_config: dict = {}  # private test hooks passed to the zygote

    def __init__(self, tokenizer_or_path: Tokenizer | str | os.PathLike | None = None, *,
                 workers: int | None = None, order: str = "sjf",
                 chunk_threshold: int | None = None, chunk_target: int | None = None,
                 max_chunks: int | None = None, aging: float = AGING,
                 request_timeout: float = 60.0, start_timeout: float = 300.0,
                 worker_start_timeout: float = 15.0, name: str | None = None,
                 max_sessions: int | None = None, session_bytes: int | None = None,
                 shm_bytes: int | None = None, spin_us: int = 200, chunks_per_worker: int = 1,
                 stateless_queue: str = "shared", worker_nice: int = 5,
                 encode_special_tokens: bool | None = None) -> None:
        literal = {} if encode_special_tokens is None else {
            "encode_special_tokens": encode_special_tokens}
        if isinstance(tokenizer_or_path, Tokenizer):
            self.tokenizer = tokenizer_or_path.with_knobs(**literal) if literal and \
                tokenizer_or_path.knobs["encode_special_tokens"] != encode_special_tokens \
                else tokenizer_or_path
            worker_knobs = dict(self.tokenizer.knobs)
        else:
            self.tokenizer = Tokenizer(
                bundled_files() if tokenizer_or_path is None else tokenizer_or_path,
                encoder="reference", **literal)
            worker_knobs = {"encoder": "auto", **literal}
        # A knob left unset is the tokenizer's (one rule: the tokenizer's knobs, themselves
        # validated and defaulted from KNOBS).
        tk = self.tokenizer.knobs
        chunk_threshold, chunk_target, max_chunks, max_sessions, session_bytes = (
            tk[k] if v is None else v for k, v in (
                ("chunk_threshold", chunk_threshold), ("chunk_target", chunk_target),
                ("max_chunks", max_chunks), ("max_sessions", max_sessions),
                ("session_bytes", session_bytes)))
        for label, value in (("chunk_threshold", chunk_threshold), ("chunk_target", chunk_target),
                             ("max_chunks", max_chunks), ("max_sessions", max_sessions),
                             ("session_bytes", session_bytes),
                             ("chunks_per_worker", chunks_per_worker)):
            positive_int(label, value)
        for label, value in (("workers", workers), ("shm_bytes", shm_bytes)):
            if value is not None:
                positive_int(label, value)
        if stateless_queue not in ("shared", "round_robin"):
            raise ValueError("stateless_queue must be 'shared' or 'round_robin'")
        self.n_workers = workers or available_cpus()
        self.name = name or f"pool{os.getpid()}"
        self.chunk_threshold, self.chunk_target, self.max_chunks = (
            chunk_threshold, chunk_target, max_chunks)
        self.request_timeout, self.start_timeout = float(request_timeout), float(start_timeout)
        self.worker_start_timeout = float(worker_start_timeout)
        self.spin_us = spin_us
        self.worker_nice = worker_nice
        self.chunks_per_worker = chunks_per_worker
        self.stateless_queue = stateless_queue
        self._rr = itertools.count()
        self.estimator = Estimator(order, aging)
        a = self.tokenizer.admission
        self._prefix_ids, self._suffix_ids = a.prefix, a.suffix
        self._lock = threading.RLock()
        self._finishing: deque = deque()  # results to convert to lists, outside the lock
        self._closed = False
        self._t0 = time.monotonic()
        self.prefix = shm.new_prefix()
        if shm_bytes is None:  # most of /dev/shm, leaving room for others
            cap = shm.shm_capacity()
            shm_bytes = None if cap is None else max(64 << 20, cap * 3 // 4)
        self._budget = shm.Budget(shm_bytes)
        self.sessions = SessionTable(self.prefix, self._budget, a.prefix, a.suffix,
                                     max_sessions, session_bytes)
        self.content_lookup = tk["content_lookup"]  # unkeyed texts continue stored sessions
        self._lookup_entries = tk["lookup_entries"]
        self.index = ContentIndex()
        self.in_process_route = InProcessRoute(self.tokenizer)  # failover
        # one thread: an event loop's requests are planned off the loop, in order
        self._submitter = ThreadPoolExecutor(1, thread_name_prefix="dtok-pool-submit")
        self._submitting: deque = deque()  # a token per call waiting in the submit thread
        self._counts = dict(requests=0, stateless=0, chunked=0, chunks=0, lookups=0,
                            lookup_hits=0, session_hits=0,
                            session_repairs=0, session_edits=0, session_full_encodes=0,
                            plan_failures=0, failovers=0, timeouts=0, worker_deaths=0,
                            replacements=0, errors=0, in_process=0, shm_full=0, loop_turns=0)
        self._res = Resources(self.prefix)
        self._finalizer = weakref.finalize(self, self._res.release)
        self._threads: list[threading.Thread] = []
        self._channels: list[Channel] = []
        self._restarts: dict[int, list[float]] = {}
        self._ready = threading.Condition(self._lock)
        self.zygote: ZygoteClient | None = None
        self._done_sem = None
        self.encoder_name = None
        self.trace: list | None = None  # set to a list to record per-request timestamps
        if not a.admitted:  # not admitted: every request is encoded here by the reference
            self.n_workers = 0
            self.queues = Queues(self.estimator, 0, self._t0)
            return
        self.queues = Queues(self.estimator, self.n_workers, self._t0)
        shm.sweep_stale()
        try:
            self._start(worker_knobs)
        except BaseException:
            self.close()
            raise

    # --- public API -------------------------------------------------------------------------

    def encode(self, text: str, *, session: Hashable | None = None,
               add_special_tokens: bool = True, scope: Hashable | None = None) -> memoryview:
        """IDs of text, exactly as the reference; see :meth:`submit`. The calling thread waits on
        the worker's response directly when its task goes to a worker at once."""
        return self._wait(self._submit(text, session, add_special_tokens, False,
                                       threading.get_ident(), scope))

    def encode_list(self, text: str, *, session: Hashable | None = None,
                    add_special_tokens: bool = True, scope: Hashable | None = None) -> list[int]:
        """:meth:`encode` as a ``list[int]`` (what serving engines take). For a session the list
        is kept and updated for the changed IDs only; a list handed out earlier never changes
        while it is held (see :class:`dtok_ext.buffers.IdList`)."""
        return self._wait(self._submit(text, session, add_special_tokens, True,
                                       threading.get_ident(), scope))

    def submit(self, text: str, *, session: Hashable | None = None,
               add_special_tokens: bool = True, scope: Hashable | None = None) -> Future:
        """Queue a request; the Future's result is a read-only int32 memoryview.

        With ``session=key`` the request goes to the key's home worker and only what changed
        travels (a plan of reused stretches and new text). Long stateless texts are cut into
        chunks that any worker may take. ``scope`` (a tenant) keeps sessions and content lookup
        apart, as in :meth:`dtok.Tokenizer.encode`."""
        return self._submit(text, session, add_special_tokens, False, None, scope).future

    async def encode_async(self, text: str, *, session: Hashable | None = None,
                           add_special_tokens: bool = True, scope: Hashable | None = None,
                           loop_chars: int = LOOP_CHARS) -> memoryview:
        """:meth:`encode` for an event loop: the loop waits neither behind an encode nor behind
        the planning (comparing a long text with the stored one, cutting a long document:
        milliseconds), which runs on the pool's submit thread, in the order of the calls.
        Only a session's next turn (keyed, or an unkeyed text content lookup finds continuing
        a stored one) may be planned on the loop itself (one thread hop less), where its
        alignment stays within the work an in-process answer of ``loop_chars`` characters may
        do on a loop (``DTOK_LOOP_CHARS`` in the engine hooks; 0: never); and where its
        encoding, too, is at most ``loop_chars`` characters, it is answered there, without a
        worker's round trip, as an in-process answer would be."""
        return await self._submit_off_loop(text, session, add_special_tokens, False, scope,
                                           loop_chars)

    async def encode_list_async(self, text: str, *, session: Hashable | None = None,
                                add_special_tokens: bool = True, scope: Hashable | None = None,
                                loop_chars: int = LOOP_CHARS) -> list[int]:
        """:meth:`encode_list` for an event loop (as :meth:`encode_async`)."""
        return await self._submit_off_loop(text, session, add_special_tokens, True, scope,
                                           loop_chars)

    async def _submit_off_loop(self, text, session, add_special, want_list, scope, loop_chars):
        # A session's next turn is planned and sent here when that is quick (_submit_on_loop);
        # anything else, by the submit thread, which then chains the request's answer to the
        # loop's future: the loop wakes once, for the answer (not also when it was sent).
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        req = self._submit_on_loop(text, session, add_special, want_list, scope, loop_chars)
        if req is not None:
            if req.future.done():  # answered on the loop
                return req.future.result()
            req.future.add_done_callback(lambda f: _to_loop(loop, answer, f, None))
            return await answer

        def submit() -> None:
            try:
                req = self._submit(text, session, add_special, want_list, None, scope)
            except BaseException as exc:  # to the caller, as the call itself would raise it
                _to_loop(loop, answer, None, exc)
                return
            finally:
                self._submitting.popleft()
            req.future.add_done_callback(lambda f: _to_loop(loop, answer, f, None))

        self._submitting.append(None)
        self._submitter.submit(submit)
        return await answer

    def _submit_on_loop(self, text, session, add_special, want_list, scope, loop_chars: int
                        ) -> Request | None:
        """A session's next turn, submitted from the caller's thread (an event loop) where
        that is quick and keeps the calls' order: the session (keyed, or the one content lookup
        finds an unkeyed text continuing) holds a text, the pool's lock is free, no earlier call
        waits in the submit thread, and (the session idle) its plan, made here, stays within
        the alignment work of ``loop_chars`` characters (:func:`dtok.sessions.alignment_budget`)
        and reuses something. Such a turn whose encoding, too, fits ``loop_chars`` is answered
        here, as an in-process answer on a loop would be (:meth:`_answer_on_loop`: no worker's
        round trip, ~0.3 ms); a longer keyed one goes to a worker. Else None, and nothing
        changed: the submit thread plans it in full (an unkeyed text: looks it up again)."""
        plan_work = alignment_budget(loop_chars)
        unkeyed = session is None
        if (plan_work <= 0 or self._submitting or type(text) is not str
                or type(add_special) is not bool or self._closed
                or unkeyed and not (self.content_lookup and len(text) >= LOOKUP_MIN_CHARS)):
            return None
        if not self._lock.acquire(blocking=False):
            return None
        try:
            pool_session, keys = self._continued(text, scope) if unkeyed else \
                (self.sessions.find(scoped_key(session, scope)), None)
            if pool_session is None or pool_session.text is None or self._closed \
                    or not any(ch.alive for ch in self._channels):
                return None
            plan = None
            if pool_session.inflight is None and not pool_session.queue:
                plan = self.tokenizer.planner.plan(pool_session.text, pool_session.anchors,
                                                   text, edit_budget=plan_work)
                if plan.kind == "encode" or plan.work - plan.prefix_len > plan_work:
                    return None  # nothing reused, or the alignment stopped early
            on_loop = plan is not None and plan.kind != "hit" \
                and plan_fits(self.tokenizer.pieces, plan, loop_chars)
            if unkeyed and not on_loop:
                return None  # a worker's (the submit thread's lookup), or no work at all
            req = Request(text, add_special, "stateless" if unkeyed else "session", want_list)
            self._counts["requests"] += 1
            if unkeyed:  # content lookup found the session
                self._count_lookup(pool_session)
                req.keys = keys
            req.pool_session = pool_session
            if on_loop:
                if self._answer_on_loop(pool_session, req, plan):
                    return req
                plan = None  # (rare) planned again: the session may have been reset
            pool_session.queue.append(req)
            self._start_session_request(pool_session, plan)
            self._assign()
            return req
        finally:
            self._lock.release()

    def _answer_on_loop(self, pool_session: PoolSession, req: Request, plan) -> bool:
        """Write an idle session's turn here (the lock held) with this process's encoders,
        as a worker would (:func:`dtok.pool.worker.write_turn`), and answer ``req``. False
        where that failed (no shared memory, a failed plan, an encoder's error), the session
        as it was (reset if its IDs were being written in place): a worker does it then, or
        the in-process route answers what the reference answers."""
        bound, old_n = self._turn_bound(pool_session, plan)
        try:
            target = self.sessions.target(pool_session, plan, bound)
        except shm.ShmFull:
            return False
        old_map = self.sessions.segment_map(pool_session, target.old_gen) \
            if target.old_gen else None
        try:
            outcome, keep, n_body = write_turn(plan, self.tokenizer.pieces, old_map,
                                               self.sessions.segment_map(pool_session, target.gen),
                                               old_n, target.valid)
        except Exception:  # noqa: BLE001 - a worker's turn decides (and fails over)
            if target.gen == target.old_gen:  # in place: its IDs may be half written
                self.sessions.reset(pool_session)
            else:
                self.sessions.drop_pending(pool_session, target.gen)
            return False
        self._counts["loop_turns"] += 1
        self._turn_done(pool_session, req, plan, target, n_body,
                        (outcome.resolved, outcome.counts), keep, None)
        return True

    def _wait(self, req: Request):
        """A synchronous caller waits for its tasks that went to workers from its own thread on
        those workers' response semaphores, and harvests them itself (the chunks of a long text
        too); what the dispatcher sent, the dispatcher answers through the future."""
        while not req.future.done() and not self._closed:
            with self._lock:
                req.direct = [(ch, t) for ch, t in req.direct if ch.task is t]
                if not req.direct:
                    break
                ch, task = req.direct[0]
            left = task.sent_at + self.request_timeout - time.monotonic()
            try:
                ch.resp_sem.acquire(min(0.5, max(0.0, left)))
            except posix_ipc.BusyError:
                pass
            with self._lock:
                if ch.task is task and ch.answered():
                    self._harvest_one(ch)
                    self._assign()  # a next chunk sent from here is waited on here too
                elif left <= 0:
                    self._check_timeouts()
            self._finish_lists()
        req.direct = []  # the tasks refer to the request: no cycle keeps its result alive
        return req.future.result()

    def stats(self) -> dict[str, Any]:
        """Workers (pid, alive, starting, busy, tasks done, PSS), queues, counters, estimates,
        shared memory in use. The PSS figures are read from ``/proc`` (the kernel walks each
        process's pages: 10-16 ms measured in a server for a worker and the zygote), so a
        serving process calls this off its event loop."""
        with self._lock:
            shared, local = self.queues.sizes()
            workers = [{"index": ch.index, "pid": ch.pid, "alive": ch.alive,
                        "starting": bool(ch.ready_by), "busy": ch.task is not None,
                        "tasks_done": ch.done, "starts": ch.starts,
                        "queued_local": local[ch.index]} for ch in self._channels]
            out = {"name": self.name, "prefix": self.prefix, "encoder": self.encoder_name,
                   "order": self.estimator.order, "aging": self.estimator.aging,
                   "workers": workers, "queued_shared": shared,
                   "sessions": len(self.sessions), "session_bytes": self.sessions.bytes_used,
                   "session_segments_made": self.sessions.segments_made,
                   "lists_made": sum(m.lists.made for m in self.sessions.values()),
                   "shm_bytes": self._budget.used, "shm_limit": self._budget.limit,
                   **self._counts, "per_char_ms": dict(self.estimator.b),
                   "session_inits": self._counts["session_full_encodes"]}  # old name, one release
        for w in out["workers"]:
            w["pss_mb"] = pss_mb(w["pid"]) if w["alive"] else None
        zpid = self.zygote_pid
        out["zygote_pss_mb"] = pss_mb(zpid) if zpid else None
        return out

    @property
    def zygote_pid(self) -> int | None:
        return self.zygote.pid if self.zygote is not None else None

    def close(self) -> None:
        """Stop the workers and the zygote; unlink every segment and semaphore of the pool.

        Views returned earlier stay valid (their mappings live until they are released)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for task in self.queues.drain():
                self._cancel(task.req)
            for pool_session in self.sessions.values():
                for req in pool_session.queue:
                    self._cancel(req)
                pool_session.queue.clear()
            self._ready.notify_all()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(ch.task for ch in self._channels if ch.alive):
            time.sleep(0.005)
        with self._lock:
            for ch in self._channels:
                if ch.alive and ch.task is None:
                    ch.exit()
                elif ch.task is not None:
                    self._fail(ch.task.req, "pool closed")
        if self.zygote is not None:
            self.zygote.exit()
            self.zygote.wait(10)
        if self._done_sem is not None:
            self._done_sem.release()  # wake the dispatcher
        for t in self._threads:
            t.join(5)
        with self._lock:
            self.sessions.close()
            for ch in self._channels:
                ch.alive = False
                ch.close()
        self._submitter.shutdown(wait=True)
        self.in_process_route.close()
        self._finalizer()  # unlink every name of the pool (idempotent)

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- routing (under the pool's lock; _submit takes it itself, around the planning) ------

    def _submit(self, text, session, add_special, want_list, waiter, scope=None) -> Request:
        if self._closed:
            raise PoolError("the pool is closed")
        req = Request(text, add_special, "session" if session is not None else "stateless",
                      want_list, waiter)
        if type(text) is not str or type(add_special) is not bool or not self._channels:
            self._in_process(req, inline=waiter is not None)
            return req
        # A long stateless text is planned and cut before the lock is taken: other threads
        # (the dispatcher, an event loop's next request) do not wait behind the copies.
        found = None
        if session is None and self.content_lookup and len(text) >= LOOKUP_MIN_CHARS:
            with self._lock:
                found = self._lookup(req, scope)  # sets req.keys
        pieces = self._chunks(text) if session is None and found is None \
            and len(text) >= self.chunk_threshold else None
        with self._lock:
            if not any(ch.alive or ch.ready_by for ch in self._channels):
                self._in_process(req, inline=waiter is not None)
                return req
            self._counts["requests"] += 1
            if found is not None and not self.sessions.holds(found):
                found = None  # dropped since the lookup: this text starts a session of its own
            if session is not None or found is not None or (req.keys and pieces is None):
                # a keyed session, the stored text content lookup found, or a short unkeyed
                # text a new session keeps for content lookup
                pool_session = (self.sessions.get(scoped_key(session, scope))
                                if session is not None else
                                found if found is not None else self._new_content_session())
                req.pool_session = pool_session
                pool_session.queue.append(req)
                self._start_session_request(pool_session)
            elif pieces is not None and len(pieces) > 1:
                self._submit_chunked(req, pieces)
            else:
                self._counts["stateless"] += 1
                self._push_stateless(Task(P.OP_ENCODE, "stateless", req, text,
                                          self.estimator.weight(text)))
            self._assign()
        return req

    def _live(self) -> list[Channel]:
        return [ch for ch in self._channels if ch.alive]

    def _home(self, pool_session: PoolSession) -> int | None:
        slots = [ch for ch in self._channels if ch.alive or ch.ready_by]
        if not slots:
            return None
        return slots[zlib.crc32(key_bytes(pool_session.key)) % len(slots)].index

    def _push_task(self, task: Task) -> None:
        if task.pool_session is not None:
            home = self._home(task.pool_session)
            if home is None:
                self._task_dropped(task)
                self._fail(task.req, "no live worker")
                return
            self.queues.push(home, task, time.monotonic())
        else:
            self._push_stateless(task)

    def _push_stateless(self, task: Task) -> None:
        """A whole stateless request or a chunk: the shared queue, or (the per-worker FIFO design
        of the scheduling comparison) the next live worker's own queue, round robin."""
        live = self._live()
        worker = None
        if self.stateless_queue == "round_robin" and live and task.kind == "stateless":
            worker = live[next(self._rr) % len(live)].index
        self.queues.push(worker, task, time.monotonic())

    def _lookup(self, req: Request, scope) -> PoolSession | None:
        """Content lookup (dtok.sessions.ContentIndex): the session an unkeyed text continues —
        the stored text found, when it is idle and the new text shares at least half of it as
        a prefix — or None (a fork sharing a shorter prefix, two conversations with one system
        prompt, leaves the stored one as it is); only texts stored under ``scope``."""
        found, req.keys = self._continued(req.text, scope)
        self._count_lookup(found)
        return found

    def _count_lookup(self, found: PoolSession | None) -> None:
        self._counts["lookups"] += 1
        if found is not None:
            self._counts["lookup_hits"] += 1

    def _continued(self, text: str, scope) -> tuple[PoolSession | None, tuple]:
        """(the idle session an unkeyed ``text`` continues, or None; the text's keys in the
        content index): :meth:`_lookup`'s rule, without its counters."""
        found, keys = self.index.find(text, scope)
        if (found is not None and found.text is not None and found.inflight is None
                and not found.queue
                and is_continuation(common_prefix(found.text, text), len(found.text))):
            return found, keys
        return None, keys

    def _new_content_session(self) -> PoolSession:
        for victim in self.sessions.victims(content_limit=self._lookup_entries - 1):
            self._drop_session(victim)
        return self.sessions.new_content()

    def _adopt(self, req: Request, parts: list) -> None:
        """A long unkeyed text missed by content lookup is encoded stateless (its chunks on all
        the workers), then kept as a session so that its next turn continues it; its chunk cuts
        are its first anchors."""
        pool_session = self._new_content_session()
        offsets, tokens = [0], [0]
        for piece_len, ids in zip(req.bounds, parts):
            offsets.append(offsets[-1] + piece_len)
            tokens.append(tokens[-1] + len(ids))
        if self.sessions.adopt(pool_session, req.text, parts, Anchors(offsets, tokens)):
            self.index.add(pool_session, req.keys)
        else:
            self.sessions.drop(pool_session)

    def _chunks(self, text: str) -> list[str]:
        """The chunks of a long stateless text: as many as the live workers take
        (``chunks_per_worker`` each), cut by the in-process planner."""
        live = max(1, sum(ch.alive for ch in self._channels))
        k = min(chunk_count(len(text), self.chunk_target, self.max_chunks),
                live * self.chunks_per_worker)
        return split_at(text, self.tokenizer.chunker.cuts(text, k))

    def _submit_chunked(self, req: Request, pieces: list[str]) -> None:
        req.kind = "chunked"
        req.bounds = [len(p) for p in pieces]
        req.parts = [None] * len(pieces)
        req.pending = len(pieces)
        self._counts["chunked"] += 1
        self._counts["chunks"] += len(pieces)
        for i, piece in enumerate(pieces):
            self._push_stateless(Task(P.OP_ENCODE, "chunk", req, piece,
                                      self.estimator.weight(piece), index=i))

    def _start_session_request(self, pool_session: PoolSession, plan=None) -> None:
        """Start the oldest queued request of a session, unless one is in flight (a session's
        requests run one at a time, in order); ``plan``: the first one's, made already."""
        while pool_session.inflight is None and pool_session.queue:
            req = pool_session.queue.popleft()
            this = plan if plan is not None else self.tokenizer.planner.plan(
                pool_session.text, pool_session.anchors, req.text)
            plan = None
            if this.kind == "hit":
                self._counts["session_hits"] += 1
                self._resolve_session(req, pool_session, len(pool_session.ids))
                continue
            try:
                task = self._session_task(pool_session, req, this)
            except shm.ShmFull as exc:
                self._shm_full(req, exc)
                continue
            pool_session.inflight = req
            self._push_task(task)
            return

    def _turn_bound(self, pool_session: PoolSession, plan) -> tuple[int, int]:
        """(the most IDs a session's turn by ``plan`` may have, its current body's length: 0
        when the plan reuses nothing)."""
        fresh = sum(utf8_length(t) for t in plan.texts)
        old_n = pool_session.n_body if plan.kind != "encode" else 0
        return P.max_ids(fresh, len(self._prefix_ids) + len(self._suffix_ids)) + old_n, old_n

    def _session_task(self, pool_session: PoolSession, req: Request, plan) -> Task:
        table, joined = P.plan_table(plan)
        bound, old_n = self._turn_bound(pool_session, plan)
        task = Task(P.OP_SESSION, "init" if plan.kind == "encode" else "append", req, joined,
                    self.estimator.weight(joined))
        task.plan, task.table, task.pool_session, task.old_n_body = plan, table, pool_session, old_n
        try:
            task.target = self.sessions.target(pool_session, plan, bound)
        except shm.ShmFull:
            self._make_room()
            task.target = self.sessions.target(pool_session, plan, bound)
        return task

    # --- dispatch (caller holds the lock) ---------------------------------------------------

    def _assign(self) -> None:
        for ch in self._channels:
            while ch.alive and ch.task is None:
                task = self.queues.pop_for(ch.index)
                if task is None:
                    break
                if task.req.failed:
                    self._task_dropped(task)
                    continue
                self._send(ch, task)

    def _send(self, ch: Channel, task: Task) -> None:
        result = 4 * P.max_ids(utf8_length(task.text), 0) if task.op == P.OP_ENCODE else \
            8 * (2 * len(task.plan.ops) + len(task.plan.texts) + 4)
        try:
            ch.reserve(payload_bytes(task, len(ch.drops)), result)
        except shm.ShmFull as exc:
            self._task_dropped(task)
            self._shm_full(task.req, exc)
            return
        req = task.req
        direct = req.waiter == threading.get_ident()
        if direct:
            req.direct.append((ch, task))
        task.sent_at = time.monotonic()
        req.times.append(task.sent_at)
        ch.send(task, wake_caller=direct)

    def _harvest(self) -> None:
        for ch in self._channels:
            if ch.alive and ch.answered():
                self._harvest_one(ch)

    def _harvest_one(self, ch: Channel) -> None:
        task, ch.task = ch.task, None
        ch.done += 1
        c = ch.control
        task.req.times += [c.picked_at, c.answered_at, time.monotonic()]
        if self.estimator.observe(task.kind, task.weight, c.service_ms):
            self.queues.rekey()
        self._complete(ch, task)

    def _complete(self, ch: Channel, task: Task) -> None:
        c = ch.control
        req = task.req
        status = c.status
        if status == P.ST_ERROR:
            self._counts["errors"] += 1
            self._task_dropped(task)
            self._fail(req, c.error)
            return
        if task.op == P.OP_ENCODE:
            if req.failed:
                return
            affix = (self._prefix_ids, self._suffix_ids) if req.add_special else ((), ())
            if req.kind != "chunked":
                req.parts, req.bounds = [ch.encoded_ids()], [len(req.text)]
            else:
                req.parts[task.index] = ch.encoded_ids()
                req.pending -= 1
                if req.pending:
                    return
            self._resolve(req, memoryview(IdBuffer.concat(req.parts, *affix)))
            if req.keys is not None:
                self._adopt(req, req.parts)
            req.parts = None
            return
        pool_session = task.pool_session
        if status == P.ST_PLAN_FAILED:  # never expected: encode it whole
            self._counts["plan_failures"] += 1
            log.warning("dtok pool: a session plan failed (%s); encoding whole", c.error)
            self._task_dropped(task)
            try:
                plan = self.tokenizer.planner.plan(None, None, req.text)
                retry = self._session_task(pool_session, req, plan)
            except shm.ShmFull as exc:
                self._shm_full(req, exc)
                return
            self.queues.push(ch.index, retry, time.monotonic())
            return
        self._turn_done(pool_session, req, task.plan, task.target, c.n_ids, ch.report(), c.keep,
                        ch.index)

    def _turn_done(self, pool_session: PoolSession, req: Request, plan, target, n_body: int,
                   report: tuple[list, list], keep: int, worker: int | None) -> None:
        """A session's turn written (by ``worker``; None: by this process, whose mappings
        change nothing for the workers): it becomes the session's state and answers ``req``;
        the session's next request starts. ``report``: the turn's (resolved stretches, counts
        of IDs per encoded text), as :func:`dtok.pool.protocol.report` carries them."""
        anchors = self.tokenizer.planner.anchors_after(plan, *report, pool_session.anchors)
        if worker is None:
            worker = pool_session.known_by
        elif pool_session.known_by != worker:  # re-homed (a worker died): the last may unmap it
            self._unmap_on(pool_session, pool_session.known_by)
        self.sessions.accept(pool_session, target.gen, target.capacity, req.text, n_body,
                             anchors, worker, keep)
        if pool_session.content:
            self.index.remove(pool_session)
            self.index.add(pool_session, req.keys)
        self._counts["session_" + ROUTE_COUNTERS[plan.kind]] += 1
        self._resolve_session(req, pool_session, keep if plan.kind != "encode" else 0)
        pool_session.inflight = None
        self._start_session_request(pool_session)
        for victim in self.sessions.victims():
            self._drop_session(victim)

    def _resolve_session(self, req: Request, pool_session: PoolSession, keep: int) -> None:
        if req.want_list:
            self._resolve(req, self.sessions.as_list(pool_session, req.add_special, keep))
        else:
            self._resolve(req, self.sessions.view(pool_session, req.add_special, keep))

    def _resolve(self, req: Request, value) -> None:
        if self.trace is not None:
            self.trace.append((req.kind, *req.times))
        if req.want_list and not isinstance(value, list):
            self._finishing.append((req, value))  # a whole text's list: built outside the lock
        elif not req.future.done():
            req.future.set_result(value)

    def _finish_lists(self) -> None:
        """Turn whole texts' results into lists, outside the pool's lock, in the threads that
        answer requests (the dispatcher, the failover threads, a synchronous caller) — never the
        caller's event loop: a list of a million IDs takes milliseconds to build, in slices that
        let other threads have the GIL in between."""
        while self._finishing:
            try:
                req, view = self._finishing.popleft()
            except IndexError:
                break
            out: list[int] = []
            for i in range(0, len(view), 1 << 14):
                out += view[i : i + (1 << 14)].tolist()
                time.sleep(5e-5)  # a real pause: the GIL goes to a waiting thread (an event loop)
            if not req.future.done():
                req.future.set_result(out)

    def _task_dropped(self, task: Task) -> None:
        """A task that will not complete: release a segment created for it."""
        t = task.target
        if t is not None and t.gen != t.old_gen:
            self.sessions.drop_pending(task.pool_session, t.gen)

    def _drop_session(self, pool_session: PoolSession) -> None:
        if pool_session.content:
            self.index.remove(pool_session)
        self._unmap_on(pool_session, pool_session.known_by)
        self.sessions.drop(pool_session)

    def _unmap_on(self, pool_session: PoolSession, index: int | None) -> None:
        """The worker ``index`` may forget its mapping of the session's segment (told with its
        next task): the session was dropped, or moved to another worker."""
        if index is not None and self._channels[index].alive:
            self._channels[index].drops.append(pool_session.sid)

    def _make_room(self) -> None:
        """Shared memory ran out: drop the least recently used idle session."""
        for victim in self.sessions.victims(force=True):
            self._drop_session(victim)

    # --- failure ------------------------------------------------------------------------------

    def _cancel(self, req: Request) -> None:
        if not req.future.done():
            req.failed = True
            req.future.set_exception(PoolError("the pool was closed before this request ran"))

    def _shm_full(self, req: Request, exc: Exception) -> None:
        self._counts["shm_full"] += 1
        self._fail(req, f"shared memory: {exc}")

    def _fail(self, req: Request, reason: str) -> None:
        """The first failure of a request: encode it in this process (on a worker thread),
        exactly; drop its other answers. A session's state is dropped unless the failure came
        before the workers touched it."""
        if req.failed or req.future.done():
            return
        req.failed = True
        self._counts["failovers"] += 1
        log.warning("dtok pool: request failed over to in-process encoding: %s", reason)
        pool_session = req.pool_session
        if pool_session is not None and not reason.startswith("shared memory"):
            self.sessions.reset(pool_session)
            if pool_session.content:
                self.index.remove(pool_session)

        def then():
            if pool_session is not None:  # the session's next request may start
                with self._lock:
                    if pool_session.inflight is req:
                        pool_session.inflight = None
                    self._start_session_request(pool_session)
            self._finish_lists()

        self.in_process_route.answer(req, self._resolve, then)

    def _in_process(self, req: Request, inline: bool) -> None:
        """No worker for this request: encode it here — inline for a synchronous caller, on a
        worker thread otherwise."""
        with self._lock:  # reentrant: some callers hold it already
            self._counts["in_process"] += 1
        self.in_process_route.answer(req, self._resolve, self._finish_lists, inline)
