"""Queue keys: FIFO by arrival, or shortest first with aging (paper, supplement S6.1).

A task's shortest-first key is its estimated service time plus ``aging`` times its arrival time,
both in milliseconds. That orders tasks exactly as the estimate minus a credit that grows by
``aging`` milliseconds per millisecond of waiting, and it never changes while the task waits, so
each queue is a heap (:class:`dtok_ext.heap.TaskHeap`).

The estimate for N characters is ``a + b_kind * N * (1 + 5 s)``, s the non-ASCII share; each
kind's per-character cost ``b`` moves toward the measured one after every task (exponentially
weighted, weight 0.05). The estimate only orders queues, so it may be rough.
"""
from __future__ import annotations

import threading

from dtok_ext.heap import nonascii_share

FIXED_MS = 0.2
WEIGHT = 0.05
INITIAL_B = {"stateless": 3e-5, "chunk": 3e-5, "init": 3e-5, "append": 1e-5}


class Estimator:
    def __init__(self, order: str, aging: float) -> None:
        if order not in ("sjf", "fifo"):
            raise ValueError(f"order must be 'sjf' or 'fifo', got {order!r}")
        self.order = order
        self.aging = float(aging)
        self.b = dict(INITIAL_B)
        self._lock = threading.Lock()

    def weight(self, text: str) -> float:
        """N * (1 + 5 s) for a text."""
        return len(text) * (1.0 + 5.0 * nonascii_share(text))

    def estimate_ms(self, kind: str, weight: float) -> float:
        return FIXED_MS + self.b[kind] * weight

    def key(self, kind: str, weight: float, arrival_ms: float) -> float:
        if self.order == "fifo":
            return arrival_ms
        return self.estimate_ms(kind, weight) + self.aging * arrival_ms

    def observe(self, kind: str, weight: float, service_ms: float) -> None:
        if weight <= 0:
            return
        measured = max(0.0, service_ms - FIXED_MS) / weight
        with self._lock:
            self.b[kind] += WEIGHT * (measured - self.b[kind])
