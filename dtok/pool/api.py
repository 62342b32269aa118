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

This module is the face (the knobs, the sync and future API, stats, close) and the wiring of the
parts, each a module of its own: :mod:`~dtok.pool.routing`, :mod:`~dtok.pool.dispatch`,
:mod:`~dtok.pool.session_flow`, :mod:`~dtok.pool.answers`, :mod:`~dtok.pool.failover`,
:mod:`~dtok.pool.supervision`, :mod:`~dtok.pool.aio` (the event-loop face) and
:mod:`~dtok.pool.stats`, over one :class:`~dtok.pool.state.PoolState`.
"""
from __future__ import annotations

import os
import threading
import time
import weakref
from concurrent.futures import Future
from typing import Any, Hashable

from dtok.admission import bundled_files
from dtok.encoders import available_cpus
from dtok.knobs import POOL_SHARED, WORKER_RENEW_CHARS, default_workers, validate_pool
from dtok.pool import shm
from dtok.pool.aio import LoopFace
from dtok.pool.answers import Answers
from dtok.pool.dispatch import Dispatch
from dtok.pool.failover import Failover, Failure, InProcessRoute
from dtok.pool.records import PoolError
from dtok.pool.routing import Routing
from dtok.pool.scheduler import Estimator, Queues
from dtok.pool.session_flow import SessionFlow
from dtok.pool.shared_sessions import SessionTable
from dtok.pool.state import PoolState, Routes
from dtok.pool.stats import snapshot
from dtok.pool.supervision import Supervisor, Timeouts
from dtok.pool.zygote_client import Resources, ZygoteClient
from dtok.sessions import LOOP_CHARS
from dtok import testing
from dtok.tokenizer import Tokenizer

__all__ = ["Pool", "PoolError", "AGING"]

#: Default aging of shortest-first keys (docs/pool.md, "Choosing aging").
AGING = 0.01


def _pooled_tokenizer(tokenizer_or_path, encode_special_tokens: bool | None
                      ) -> tuple[Tokenizer, dict]:
    """(the tokenizer the pool answers in process with, the knobs its workers load with)."""
    special_knob = {} if encode_special_tokens is None else {
        "encode_special_tokens": encode_special_tokens}
    if isinstance(tokenizer_or_path, Tokenizer):
        tok = tokenizer_or_path.with_knobs(**special_knob) if special_knob and \
            tokenizer_or_path.knobs["encode_special_tokens"] != encode_special_tokens \
            else tokenizer_or_path
        return tok, dict(tok.knobs)
    tok = Tokenizer(bundled_files() if tokenizer_or_path is None else tokenizer_or_path,
                    encoder="reference", **special_knob)
    return tok, {"encoder": "auto", **special_knob}


def _shm_limit(shm_bytes: int | None) -> int | None:
    """The pool's byte budget of shared memory: given, or most of /dev/shm (room for others)."""
    if shm_bytes is not None:
        return shm_bytes
    cap = shm.shm_capacity()
    return None if cap is None else max(64 << 20, cap * 3 // 4)


class Pool:
    """Worker processes that encode for this process, exactly as the reference would.

    Knobs shared with :class:`dtok.Tokenizer` (chunking, session bounds,
    ``encode_special_tokens``) left as None are the tokenizer's. Given a tokenizer, the pool's
    in-process route encodes with its loaded encoders; given a path, it loads the file again
    (fastokens keeps its per-thread state per thread *and* instance: a thread that encodes
    through both loads holds two shares; docs/reliability.md#one-load-per-process).

    >>> with Pool(workers=2) as pool:
    ...     ids = pool.encode("Hello, world!")
    ...     list(ids) == pool.tokenizer.reference.encode("Hello, world!").ids
    True
    """

    def __init__(self, tokenizer_or_path: Tokenizer | str | os.PathLike | None = None, *,
                 workers: int | None = None, order: str = "sjf",
                 chunk_threshold: int | None = None, chunk_target: int | None = None,
                 max_chunks: int | None = None, aging: float = AGING,
                 request_timeout: float = 60.0, start_timeout: float = 300.0,
                 worker_start_timeout: float = 15.0, name: str | None = None,
                 max_sessions: int | None = None, session_bytes: int | None = None,
                 shm_bytes: int | None = None, spin_us: int = 200, chunks_per_worker: int = 1,
                 stateless_queue: str = "shared", worker_nice: int = 5,
                 encode_special_tokens: bool | None = None,
                 worker_renew_chars: int = WORKER_RENEW_CHARS) -> None:
        self.tokenizer, worker_knobs = _pooled_tokenizer(tokenizer_or_path, encode_special_tokens)
        given = dict(zip(POOL_SHARED, (chunk_threshold, chunk_target, max_chunks, max_sessions,
                                       session_bytes)))
        knobs = validate_pool(self.tokenizer.knobs, given, workers=workers, shm_bytes=shm_bytes,
                              chunks_per_worker=chunks_per_worker,
                              stateless_queue=stateless_queue,
                              worker_renew_chars=worker_renew_chars)
        a = self.tokenizer.admission
        # not admitted: no workers, every request is encoded here by the reference
        self.n_workers = (workers or default_workers(available_cpus())) if a.admitted else 0
        self.name = name or f"pool{os.getpid()}"
        self.chunk_threshold, self.chunk_target, self.max_chunks = (
            knobs["chunk_threshold"], knobs["chunk_target"], knobs["max_chunks"])
        # the tokenizer's knobs as the pool uses them, and its own (request_timeout: a property)
        self.knobs = {**knobs, "workers": self.n_workers, "order": order, "aging": aging,
                      "shm_bytes": shm_bytes, "chunks_per_worker": chunks_per_worker,
                      "stateless_queue": stateless_queue, "start_timeout": float(start_timeout),
                      "worker_start_timeout": float(worker_start_timeout), "spin_us": spin_us,
                      "worker_nice": worker_nice, "worker_renew_chars": worker_renew_chars}
        self._estimator = Estimator(order, aging)
        self.prefix = shm.new_prefix()
        self._budget = shm.Budget(_shm_limit(shm_bytes))
        routes = Routes(self.chunk_threshold, self.chunk_target, self.max_chunks,
                        chunks_per_worker, stateless_queue, knobs["content_lookup"],
                        knobs["lookup_entries"])
        self._state = PoolState(
            self.tokenizer.planning, self._estimator,
            Queues(self._estimator, self.n_workers, time.monotonic()),
            SessionTable(self.prefix, self._budget, a.prefix, a.suffix, knobs["max_sessions"],
                         knobs["session_bytes"]),
            routes, (a.prefix, a.suffix), float(request_timeout))
        self._res = Resources(self.prefix)
        self._finalizer = weakref.finalize(self, self._res.release)
        self._assemble()
        if not a.admitted:
            return
        shm.sweep_stale()
        try:
            self._supervisor.start(self.n_workers, self._budget, self.tokenizer,
                                   self._zygote_config(worker_knobs), owner=self)
        except BaseException:
            self.close()
            raise

    def _assemble(self) -> None:
        """The parts, each given the shared state and the parts it calls; a call back to a
        part made later goes through a closure over it."""
        state = self._state
        self._answers = answers = Answers(state.sessions)
        self._failover = failover = Failover(state, InProcessRoute(self.tokenizer), answers,
                                             resume=lambda s: flow.start_next(s))
        flow = SessionFlow(state, answers, failover, push_task=lambda t: routing.push_task(t))
        self._dispatch = dispatch = Dispatch(state, flow, failover, answers,
                                             check_timeouts=lambda: supervisor.check_timeouts(),
                                             renew_idle=lambda: supervisor.renew_idle())
        self._routing = routing = Routing(state, flow, failover, dispatch.assign)
        self._loop_face = LoopFace(state, routing, flow, dispatch.assign)
        self._supervisor = supervisor = Supervisor(
            state, self._res, Timeouts(self.knobs["start_timeout"],
                                       self.knobs["worker_start_timeout"]),
            dispatch, routing, flow, failover, answers, self.knobs["worker_renew_chars"])

    def _zygote_config(self, worker_knobs: dict) -> dict:
        """What the zygote loads and how it runs its workers."""
        files = self.tokenizer.files
        knobs = {**worker_knobs, "threads": 1, "content_lookup": False,
                 "chunk_threshold": self.chunk_threshold, "chunk_target": self.chunk_target,
                 "max_chunks": self.max_chunks,
                 "scan_budget": list(self.tokenizer.knobs["scan_budget"])}
        config = {"prefix": self.prefix, "name": self.name, "path": str(files.path),
                  "config": files.config, "sha256": self.tokenizer.admission.sha256,
                  "knobs": knobs, "spin_us": self.knobs["spin_us"],
                  "worker_nice": self.knobs["worker_nice"]}
        testing.run_hook(testing.ZYGOTE_CONFIG, config)
        return config

    # --- public API -------------------------------------------------------------------------

    def encode(self, text: str, *, session: Hashable | None = None,
               add_special_tokens: bool = True, scope: Hashable | None = None) -> memoryview:
        """IDs of text, exactly as the reference; see :meth:`submit`. The calling thread waits on
        the worker's response directly when its task goes to a worker at once."""
        return self._dispatch.wait(self._routing.submit(
            text, session, add_special_tokens, False, threading.get_ident(), scope))

    def encode_list(self, text: str, *, session: Hashable | None = None,
                    add_special_tokens: bool = True, scope: Hashable | None = None) -> list[int]:
        """:meth:`encode` as a ``list[int]`` (what serving engines take). For a session the list
        is kept and updated for the changed IDs only; a list handed out earlier never changes
        while it is held (see :class:`dtok_ext.buffers.IdList`)."""
        return self._dispatch.wait(self._routing.submit(
            text, session, add_special_tokens, True, threading.get_ident(), scope))

    def submit(self, text: str, *, session: Hashable | None = None,
               add_special_tokens: bool = True, scope: Hashable | None = None) -> Future:
        """Queue a request; the Future's result is a read-only int32 memoryview.

        With ``session=key`` the request goes to the key's home worker and only what changed
        travels (a plan of reused stretches and new text). Long stateless texts are cut into
        chunks that any worker may take. ``scope`` (a tenant) keeps sessions and content lookup
        apart, as in :meth:`dtok.Tokenizer.encode`."""
        return self._routing.submit(text, session, add_special_tokens, False, None, scope).future

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
        return await self._loop_face.encode(text, session, add_special_tokens, False, scope,
                                            loop_chars)

    async def encode_list_async(self, text: str, *, session: Hashable | None = None,
                                add_special_tokens: bool = True, scope: Hashable | None = None,
                                loop_chars: int = LOOP_CHARS) -> list[int]:
        """:meth:`encode_list` for an event loop (as :meth:`encode_async`)."""
        return await self._loop_face.encode(text, session, add_special_tokens, True, scope,
                                            loop_chars)

    def stats(self) -> dict[str, Any]:
        """Workers (pid, alive, starting, busy, tasks done, PSS), queues, counters, estimates,
        shared memory in use; the workers' encoder, the guard probes of a file that had no
        table (``probes``) and the workers still to renew onto the fast encoder once it came.
        The PSS figures are read from ``/proc`` (the kernel walks each process's pages;
        docs/pool.md), so a serving process calls this off its event loop."""
        header = {"name": self.name, "prefix": self.prefix, "encoder": self.encoder_name,
                  "probes": self.tokenizer.probes(),
                  "workers_to_renew": self._supervisor.renewals_pending}
        return snapshot(self._state, header, self._budget, self.zygote_pid)

    @property
    def zygote(self) -> ZygoteClient | None:
        return self._supervisor.zygote

    @property
    def zygote_pid(self) -> int | None:
        return self.zygote.pid if self.zygote is not None else None

    @property
    def encoder_name(self) -> str | None:
        """The workers' encoder ("fastokens", "reference", ...); None without workers."""
        return self._supervisor.encoder_name

    @property
    def content_lookup(self) -> bool:
        """Whether unkeyed texts continue stored sessions (the tokenizer's knob)."""
        return self._state.routes.content_lookup

    @property
    def request_timeout(self) -> float:
        """Seconds a worker may take for a task before it is killed and replaced."""
        return self._state.request_timeout

    @request_timeout.setter
    def request_timeout(self, seconds: float) -> None:
        self._state.request_timeout = float(seconds)

    @property
    def trace(self) -> list | None:
        """None, or a list each answered request's timestamps are appended to (benches)."""
        return self._answers.trace

    @trace.setter
    def trace(self, records: list | None) -> None:
        self._answers.trace = records

    @property
    def _submitting(self):
        """The calls waiting in the submit thread (a test seam: the on-loop route's order)."""
        return self._loop_face.submitting

    def close(self) -> None:
        """Stop the workers and the zygote; unlink every segment and semaphore of the pool.

        Views returned earlier stay valid (their mappings live until they are released)."""
        state = self._state
        with state.lock:
            if state.closed:
                return
            state.closed = True
            for task in state.queues.drain():
                self._failover.cancel(task.req)
            for pool_session in state.sessions.values():
                for req in pool_session.queue:
                    self._failover.cancel(req)
                pool_session.queue.clear()
            state.ready.notify_all()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(ch.task for ch in state.live()):
            time.sleep(0.005)
        with state.lock:
            for ch in state.channels:
                if ch.alive and ch.task is None:
                    ch.exit()
                elif ch.task is not None:
                    self._failover.fail(ch.task.req, Failure.CLOSED)
        self._supervisor.stop()
        with state.lock:
            state.sessions.close()
            for ch in state.channels:
                ch.alive = False
                ch.close()
        self._loop_face.close()
        self._failover.close()
        self._finalizer()  # unlink every name of the pool (idempotent)

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
