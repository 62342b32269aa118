"""The pool's face to an event loop (``Pool.encode_async`` / ``encode_list_async``): the loop
waits neither behind an encode nor behind the planning. A session's next turn is planned on the
loop where that is quick (and, where its encoding is short too, written here, without a worker's
round trip); every other call is routed by one submit thread, in the order of the calls, and its
answer is chained to the loop's future.
"""
from __future__ import annotations

import asyncio
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable

from dtok.pool.records import Request
from dtok.pool.routing import Routing
from dtok.pool.session_flow import SessionFlow
from dtok.pool.state import PoolState
from dtok.sessions import alignment_budget, scoped_key

__all__ = ["LoopFace", "to_loop"]


def to_loop(loop: asyncio.AbstractEventLoop, answer: asyncio.Future, done: Future | None,
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


class LoopFace:
    """``assign()``: give idle workers their next tasks (dispatch)."""

    def __init__(self, state: PoolState, routing: Routing, flow: SessionFlow,
                 assign: Callable[[], None]) -> None:
        self._state, self._routing, self._flow, self._assign = state, routing, flow, assign
        # one thread: an event loop's requests are planned off the loop, in order
        self._submitter = ThreadPoolExecutor(1, thread_name_prefix="dtok-pool-submit")
        self.submitting: deque = deque()  # a token per call waiting in the submit thread

    async def encode(self, text, session, add_special_tokens, as_list, scope, loop_chars):
        """The IDs of ``text`` for a caller on an event loop (see ``Pool.encode_async``)."""
        # A session's next turn is planned and sent here when that is quick (_submit_on_loop);
        # anything else, by the submit thread, which then chains the request's answer to the
        # loop's future: the loop wakes once, for the answer (not also when it was sent).
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        req = self._submit_on_loop(text, session, add_special_tokens, as_list, scope, loop_chars)
        if req is not None:
            if req.future.done():  # answered on the loop
                return req.future.result()
            req.future.add_done_callback(lambda f: to_loop(loop, answer, f, None))
            return await answer

        def submit() -> None:
            try:
                req = self._routing.submit(text, session, add_special_tokens, as_list, None, scope)
            except BaseException as exc:  # to the caller, as the call itself would raise it
                to_loop(loop, answer, None, exc)
                return
            finally:
                self.submitting.popleft()
            req.future.add_done_callback(lambda f: to_loop(loop, answer, f, None))

        self.submitting.append(None)
        self._submitter.submit(submit)
        return await answer

    def _submit_on_loop(self, text, session, add_special_tokens, as_list, scope, loop_chars: int
                        ) -> Request | None:
        """A session's next turn, submitted from the caller's thread (an event loop) where
        that is quick and keeps the calls' order: the session (keyed, or the one content lookup
        finds an unkeyed text continuing) holds a text, the pool's lock is free, no earlier call
        waits in the submit thread, and (the session idle) its plan, made here, stays within
        the alignment work of ``loop_chars`` characters (:func:`dtok.sessions.alignment_budget`)
        and reuses something. Such a turn whose encoding, too, fits ``loop_chars`` is answered
        here, as an in-process answer on a loop would be (no worker's round trip); a longer
        keyed one goes to a worker. Else None, and nothing changed: the submit thread
        plans it in full (an unkeyed text: looks it up again)."""
        state = self._state
        plan_work = alignment_budget(loop_chars)
        unkeyed = session is None
        if (plan_work <= 0 or self.submitting or type(text) is not str
                or type(add_special_tokens) is not bool or state.closed
                or unkeyed and not self._routing.looks_up(text)):
            return None
        if not state.lock.acquire(blocking=False):
            return None
        try:
            pool_session, keys = self._routing.continued(text, scope) if unkeyed else \
                (state.sessions.find(scoped_key(session, scope)), None)
            if pool_session is None or pool_session.text is None or state.closed \
                    or not state.any_alive():
                return None
            plan = None
            if pool_session.inflight is None and not pool_session.queue:
                plan = state.planning.plan(pool_session.text, pool_session.anchors, text,
                                           edit_budget=plan_work)
                if plan.kind == "encode" or plan.work - plan.prefix_len > plan_work:
                    return None  # nothing reused, or the alignment stopped early
            on_loop = plan is not None and plan.kind != "hit" \
                and state.planning.fits(plan, loop_chars)
            if unkeyed and not on_loop:
                return None  # a worker's (the submit thread's lookup), or no work at all
            req = Request(text, add_special_tokens, "stateless" if unkeyed else "session", as_list)
            state.counts["requests"] += 1
            if unkeyed:  # content lookup found the session
                self._routing.count_lookup(pool_session)
                req.keys = keys
            req.pool_session = pool_session
            if on_loop:
                if self._flow.write_here(pool_session, req, plan):
                    return req
                plan = None  # (rare) planned again: the session may have been reset
            pool_session.queue.append(req)
            self._flow.start_next(pool_session, plan)
            self._assign()
            return req
        finally:
            state.lock.release()

    def close(self) -> None:
        self._submitter.shutdown(wait=True)
