"""Answering a request: its future set with a view of its IDs, or with a ``list[int]``; a whole
text's list is built outside the pool's lock, in slices that let other threads have the GIL."""
from __future__ import annotations

import time
from collections import deque

from dtok.pool.records import Request
from dtok.pool.shared_sessions import PoolSession, SessionTable

__all__ = ["Answers"]

LIST_SLICE = 1 << 14  # IDs turned into a list between two GIL hand-offs


class Answers:
    def __init__(self, sessions: SessionTable) -> None:
        self._sessions = sessions
        self._finishing: deque = deque()  # results to convert to lists, outside the lock
        self.trace: list | None = None  # set to a list to record per-request timestamps

    def resolve(self, req: Request, value) -> None:
        """Answer ``req`` with ``value`` (IDs); a list it asked for, later if it must be built."""
        if self.trace is not None:
            self.trace.append((req.kind, *req.times))
        if req.as_list and not isinstance(value, list):
            self._finishing.append((req, value))  # a whole text's list: built outside the lock
        elif not req.future.done():
            req.future.set_result(value)

    def resolve_session(self, req: Request, pool_session: PoolSession, keep: int) -> None:
        """Answer ``req`` with its session's IDs (``keep``: the leading IDs left unchanged)."""
        if req.as_list:
            self.resolve(req, self._sessions.as_list(pool_session, req.add_special_tokens, keep))
        else:
            self.resolve(req, self._sessions.view(pool_session, req.add_special_tokens, keep))

    def finish_lists(self) -> None:
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
            for i in range(0, len(view), LIST_SLICE):
                out += view[i : i + LIST_SLICE].tolist()
                time.sleep(5e-5)  # a real pause: the GIL goes to a waiting thread (an event loop)
            if not req.future.done():
                req.future.set_result(out)
