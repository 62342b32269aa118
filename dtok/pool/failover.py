"""The route a request takes when the pool cannot serve it (a worker's death or timeout, no
shared memory, no live worker, an input the workers do not take): encoded in this process on the
route it would have taken without the pool, so the IDs never depend on the pool — inline for a
synchronous caller, on a thread otherwise (an event loop never waits behind an encode).

Why a request failed is a :class:`Failure`; that value alone decides what happens to its session.
"""
from __future__ import annotations

import enum
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from dtok import testing
from dtok.pool.answers import Answers
from dtok.pool.records import PoolError, Request
from dtok.pool.state import PoolState

log = logging.getLogger("dtok")

__all__ = ["Failure", "Failover", "InProcessRoute"]


class Failure(enum.Enum):
    """Why the pool gave a request up."""
    WORKER_DIED = "worker died"
    TIMED_OUT = "worker timed out"
    WORKER_ERROR = "worker error"
    SHM_FULL = "shared memory"
    NO_LIVE_WORKER = "no live worker"
    CLOSED = "pool closed"

    @property
    def keeps_session(self) -> bool:
        """Whether the session's state stays: only a failure before any worker touched it."""
        return self is Failure.SHM_FULL


class InProcessRoute:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer.with_knobs(content_lookup=False)  # no session state
        self.executor = ThreadPoolExecutor(2, thread_name_prefix="dtok-pool-failover")

    def encode(self, text, add_special_tokens):
        """The request's exact IDs, or the reference's own exception."""
        testing.run_hook(testing.IN_PROCESS_ENCODE, text)
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def answer(self, req: Request, resolve: Callable, then: Callable, inline: bool = False) -> None:
        """Encode ``req`` here and ``resolve`` it (or set the reference's exception), then call
        ``then``; inline, or on one of the route's threads."""
        def run():
            try:
                resolve(req, self.encode(req.text, req.add_special_tokens))
            except BaseException as exc:  # noqa: BLE001 - the reference's own error
                if not req.future.done():
                    req.future.set_exception(exc)
            finally:
                then()

        if inline:
            run()
        else:
            self.executor.submit(run)

    def close(self) -> None:
        self.executor.shutdown(wait=True)


class Failover:
    """Fails a request over to the :class:`InProcessRoute`, once; cancels requests on close.
    ``resume(pool_session)`` (the caller holds the lock) starts a session's next request."""

    def __init__(self, state: PoolState, route: InProcessRoute, answers: Answers,
                 resume: Callable) -> None:
        self._state, self.route, self._answers, self._resume = state, route, answers, resume

    def cancel(self, req: Request) -> None:
        if not req.future.done():
            req.failed = True
            req.future.set_exception(PoolError("the pool was closed before this request ran"))

    def shm_full(self, req: Request, exc: Exception) -> None:
        self._state.counts["shm_full"] += 1
        self.fail(req, Failure.SHM_FULL, str(exc))

    def fail(self, req: Request, reason: Failure, detail: str = "") -> None:
        """The first failure of a request: encode it in this process (on a worker thread),
        exactly; drop its other answers. A session's state is dropped unless ``reason`` keeps
        it."""
        if req.failed or req.future.done():
            return
        req.failed = True
        state = self._state
        state.counts["failovers"] += 1
        log.warning("dtok pool: request failed over to in-process encoding: %s%s", reason.value,
                    f": {detail}" if detail else "")
        pool_session = req.pool_session
        if pool_session is not None and not reason.keeps_session:
            state.sessions.reset(pool_session)
            if pool_session.content:
                state.index.remove(pool_session)

        def then():
            if pool_session is not None:  # the session's next request may start
                with state.lock:
                    if pool_session.inflight is req:
                        pool_session.inflight = None
                    self._resume(pool_session)
            self._answers.finish_lists()

        self.route.answer(req, self._answers.resolve, then)

    def in_process(self, req: Request, inline: bool) -> None:
        """No worker for this request: encode it here — inline for a synchronous caller, on a
        worker thread otherwise."""
        with self._state.lock:  # reentrant: some callers hold it already
            self._state.counts["in_process"] += 1
        self.route.answer(req, self._answers.resolve, self._answers.finish_lists, inline)

    def close(self) -> None:
        self.route.close()
