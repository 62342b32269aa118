"""What a pool keeps of what it was asked: a caller's request (its future, its parts, its
timestamps) and the tasks it becomes (a whole text, a chunk, a session's plan), and the pool's
error."""
from __future__ import annotations

import time
from concurrent.futures import Future
from typing import TYPE_CHECKING, Hashable

if TYPE_CHECKING:
    from dtok.pool.channel import Channel
    from dtok.pool.shared_sessions import PoolSession

__all__ = ["PoolError", "Request", "Task", "key_bytes"]


class PoolError(RuntimeError):
    """The pool could not start, or was used after close()."""


class Request:
    __slots__ = ("future", "text", "add_special_tokens", "pool_session", "kind", "parts", "pending",
                 "failed", "as_list", "waiter", "direct", "times", "keys", "bounds")

    def __init__(self, text, add_special_tokens, kind, as_list=False, waiter=None):
        self.future: Future = Future()
        self.text, self.add_special_tokens, self.kind = text, add_special_tokens, kind
        self.pool_session: PoolSession | None = None
        self.parts: list | None = None
        self.pending = 0
        self.failed = False
        self.as_list = as_list
        self.waiter = waiter  # thread id of a synchronous caller that may wait directly
        self.direct: list[tuple[Channel, Task]] = []  # tasks that caller waits on itself
        self.times = [time.monotonic()]  # submit, sent, picked, answered, harvested
        self.keys = None  # content lookup: the text's keys in the pool's ContentIndex
        self.bounds: list[int] = []  # chunked: the chunks' lengths

class Task:
    __slots__ = ("op", "kind", "req", "text", "weight", "index", "seq", "key", "arrival",
                 "sent_at", "plan", "table", "pool_session", "target", "old_n_body")

    def __init__(self, op, kind, req, text, weight, index=0):
        self.op, self.kind, self.req, self.text, self.weight, self.index = (
            op, kind, req, text, weight, index)
        self.seq = 0
        self.key = 0.0
        self.arrival = None  # ms since the pool started, set when first queued
        self.sent_at = 0.0
        self.plan = self.table = self.pool_session = self.target = None
        self.old_n_body = 0


def key_bytes(key: Hashable) -> bytes:
    """A session key as bytes, for hashing it to its home worker."""
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8", "surrogatepass")
    return repr(key).encode("utf-8", "surrogatepass")
