"""The pool's queues and their keys: FIFO by arrival, or shortest first with aging (paper,
supplement S6.1).

A task's shortest-first key is its estimated service time plus ``aging`` times its arrival time,
both in milliseconds. That orders tasks exactly as the estimate minus a credit that grows by
``aging`` milliseconds per millisecond of waiting, and it never changes while the task waits, so
each queue is a heap (:class:`dtok_ext.heap.TaskHeap`).

The estimate for N characters is ``a + b * N * (1 + 5 s)``, s the non-ASCII share. There are two
per-character costs ``b``: one for encoding a text (stateless requests, chunks, session
initializations), one per appended character of a session append (which also re-encodes a
tail). Each starts from the encoder's typical cost and moves toward the measured one after every
task (exponentially weighted, weight 0.05).

The keys of queued tasks were computed with the costs of their arrival. When a cost moves by
more than a factor of two from those (a cold start, an encoder 50x slower than the default
guess), :meth:`Estimator.observe` says so and the pool re-keys its queues: otherwise a burst
queued with a too-small estimate would keep its place ahead of every later short task.
"""
from __future__ import annotations

import threading

from dtok_ext.heap import nonascii_share

FIXED_MS = 0.2
WEIGHT = 0.05
REKEY_FACTOR = 2.0
# ms per character at the start, by encoder (measured on the development machine, Qwen3)
INITIAL_B = {"fastokens": 3e-5, "reference": 1.5e-3}
CLASS_OF = {"stateless": "encode", "chunk": "encode", "init": "encode", "append": "append"}


class Estimator:
    def __init__(self, order: str, aging: float, encoder: str = "fastokens") -> None:
        if order not in ("sjf", "fifo"):
            raise ValueError(f"order must be 'sjf' or 'fifo', got {order!r}")
        if not aging >= 0:
            raise ValueError(f"aging must be >= 0, got {aging!r}")
        self.order = order
        self.aging = float(aging)
        self._lock = threading.Lock()
        self.start(encoder)

    def start(self, encoder: str | None) -> None:
        """Begin from the typical costs of ``encoder`` (the workers' encoder)."""
        b = INITIAL_B.get(encoder or "", INITIAL_B["fastokens"])
        with self._lock:
            self.b = {"encode": b, "append": b}
            self._keyed_b = dict(self.b)

    def weight(self, text: str) -> float:
        """N * (1 + 5 s) for a text."""
        return len(text) * (1.0 + 5.0 * nonascii_share(text))

    def estimate_ms(self, kind: str, weight: float) -> float:
        return FIXED_MS + self.b[CLASS_OF[kind]] * weight

    def key(self, kind: str, weight: float, arrival_ms: float) -> float:
        if self.order == "fifo":
            return arrival_ms
        return self.estimate_ms(kind, weight) + self.aging * arrival_ms

    def observe(self, kind: str, weight: float, service_ms: float) -> bool:
        """Learn from a finished task; True when queued keys should be recomputed."""
        if weight <= 0:
            return False
        cls = CLASS_OF[kind]
        measured = max(0.0, service_ms - FIXED_MS) / weight
        with self._lock:
            b = self.b[cls] = self.b[cls] + WEIGHT * (measured - self.b[cls])
            old = self._keyed_b[cls]
            if self.order == "sjf" and not old / REKEY_FACTOR <= b <= old * REKEY_FACTOR:
                self._keyed_b = dict(self.b)
                return True
        return False


class Queues:
    """The pool's queues: one shared heap (stateless requests and the chunks of long ones) and
    one local heap per worker (its sessions' tasks). An idle worker takes the smaller key of
    its local head and the shared head, the local one on a tie, and keeps it until done."""

    def __init__(self, estimator: Estimator, n_workers: int, t0: float) -> None:
        from dtok_ext.heap import TaskHeap

        self.estimator = estimator
        self.shared = TaskHeap()
        self.local = [TaskHeap() for _ in range(n_workers)]
        self._seq = 0
        self._t0 = t0

    def arrival_ms(self, now: float) -> float:
        return (now - self._t0) * 1e3

    def push(self, worker: int | None, task, now: float) -> None:
        """Queue a task (worker None: the shared queue); a task queued again keeps its arrival."""
        self._seq += 1
        task.seq = self._seq
        if task.arrival is None:
            task.arrival = self.arrival_ms(now)
        task.key = self.estimator.key(task.kind, task.weight, task.arrival)
        (self.shared if worker is None else self.local[worker]).push(task.key, task.seq, task)

    def pop_for(self, worker: int):
        """The task an idle worker takes next, or None."""
        local = self.local[worker]
        lk, sk = local.peek_key(), self.shared.peek_key()
        if lk is None and sk is None:
            return None
        return local.pop() if sk is None or (lk is not None and lk <= sk) else self.shared.pop()

    def rekey(self) -> None:
        """Recompute every queued task's key with the current estimates."""
        for heap in [self.shared, *self.local]:
            for task in heap.drain():
                task.key = self.estimator.key(task.kind, task.weight, task.arrival)
                heap.push(task.key, task.seq, task)

    def drain(self, worker: int | None = None) -> list:
        """Remove and return the tasks of one local queue, or (None) of every queue."""
        if worker is not None:
            return self.local[worker].drain()
        return [t for heap in [self.shared, *self.local] for t in heap.drain()]

    def sizes(self) -> tuple[int, list[int]]:
        return len(self.shared), [len(h) for h in self.local]
