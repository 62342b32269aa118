"""dtok's encoding threads: a thread pool whose threads, handed work that the calling thread
works on beside them, run it on other CPUs than the caller's.

Why: Linux places a woken thread near the thread that woke it unless it finds another CPU
idle, and on a small VM a vCPU that idled does not count as idle, so a plain pool thread often
wakes on the caller's own CPU and the two shares run one after the other. The thread keeps off
the caller's CPU until its job ends (each chunk's GIL hand-off is another wake-up); the caller
itself is never narrowed. Measured: ``docs/benchmarks.md#default-threads``
(``benches/bench_wake.py``).
"""
from __future__ import annotations

import os
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, Callable, Iterable, Iterator

from dtok import testing
from dtok.allocator import release_free_heap
from dtok_ext.cpus import current_cpu

__all__ = ["EncodeThreads"]


class EncodeThreads:
    """``n`` encoding threads (named ``dtok-encode``), started when first needed, stopped by
    :meth:`shutdown` or when this object is collected; with ``renew_chars``, replaced by fresh
    threads each time they have taken that many characters of text (see :meth:`_handing`).

    >>> threads = EncodeThreads(2)
    >>> [f.result() for f in threads.beside([lambda: 1, lambda: 2])]
    [1, 2]
    >>> list(threads.map(len, ["ab", "c"]))
    [2, 1]
    >>> threads.shutdown()
    >>> threads = EncodeThreads(2, renew_chars=10)
    >>> [f.result() for f in threads.beside([lambda: 1], chars=8)], threads.renewals
    ([1], 0)
    >>> [f.result() for f in threads.beside([lambda: 2], chars=8)], threads.renewals
    ([2], 1)
    >>> threads.shutdown()
    """

    def __init__(self, n: int, renew_chars: int = 0) -> None:
        self.n = n
        self.renew_chars = renew_chars  # 0: the threads live until shutdown
        self.renewals = 0
        self._handed = 0  # characters handed to the current threads
        self._lock = threading.Lock()
        self._start()

    def _start(self) -> None:
        """Fresh threads (started when first given work); the threads hold the placement (their
        initializer), not this object, so that collecting it stops them."""
        self._placement = _Placement()
        self._executor = ThreadPoolExecutor(self.n, thread_name_prefix="dtok-encode",
                                            initializer=self._placement.started)
        self._stop = weakref.finalize(self, self._executor.shutdown, wait=False)

    def _handing(self, chars: int) -> tuple["_Placement", ThreadPoolExecutor]:
        """The placement and executor that take work of ``chars`` characters: once the threads
        have taken ``renew_chars``, fresh ones, and the old end when their jobs are done (a
        native encoder's per-thread state ends with its thread: the memory it holds is bounded
        by what ``renew_chars`` characters put there, whatever the number of threads)."""
        with self._lock:
            self._handed += chars
            if self.renew_chars and self._handed > self.renew_chars:
                stop, old = self._stop, self._executor
                self._handed = chars
                self._start()
                self.renewals += 1
                stop()  # queued jobs still run; idle threads end now, busy ones when done
                # what they held is free once they end; glibc keeps it unless asked
                threading.Thread(target=_release_after, args=(old,), name="dtok-release",
                                 daemon=True).start()
            return self._placement, self._executor

    def beside(self, jobs: Iterable[Callable[[], Any]], chars: int = 0) -> list[Future]:
        """Hand ``jobs`` (of ``chars`` characters of text in all) to the threads while the
        calling thread works on something else: where it may use another CPU, the threads run
        them off the caller's CPU, and take back every CPU the caller may use when each job
        ends."""
        placement, executor = self._handing(chars)
        allowed = None if testing.is_off(testing.OFF_AFFINITY) else placement.keep_off_caller()
        if allowed is None:
            return [executor.submit(job) for job in jobs]
        return [executor.submit(_then_on_cpus, allowed, job) for job in jobs]

    def map(self, fn: Callable[[Any], Any], items: Iterable, chars: int = 0) -> Iterator:
        """``fn`` of each item (of ``chars`` characters of text in all) on the threads while
        the caller waits (no placement: the caller's CPU is free for them; a thread narrowed for
        a job it did not get takes it back)."""
        placement, executor = self._handing(chars)
        allowed = None if testing.is_off(testing.OFF_AFFINITY) else placement.caller_cpus()
        if allowed is None:
            return executor.map(fn, items)
        return executor.map(lambda item: _on_cpus(allowed, partial(fn, item)), items)

    def shutdown(self, wait: bool = True) -> None:
        self._executor.shutdown(wait=wait)
        self._stop.detach()


def _release_after(executor: ThreadPoolExecutor) -> None:
    """Once ``executor``'s threads have ended, give the heap they freed back to the system."""
    executor.shutdown(wait=True)
    release_free_heap()


class _Placement:
    """The pool threads' native IDs, and the CPUs a thread that starts now is narrowed to."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tids: list[int] = []
        self.others: set[int] | None = None
        self.placing = hasattr(os, "sched_setaffinity")

    def keep_off_caller(self) -> set[int] | None:
        """Narrow every pool thread to the caller's CPUs but its current one (a thread that
        starts now is narrowed as it starts: it may be the one woken) and return the caller's
        CPUs, which a thread takes back when its job ends; None where there is no other CPU
        to run on, or no placing."""
        allowed = self.caller_cpus()
        cpu = current_cpu()
        if allowed is None or cpu not in allowed:
            return None
        others = allowed - {cpu}
        with self.lock:
            self.others = others
            tids = list(self.tids)
        for tid in tids:
            _set_cpus(tid, others)
        return allowed

    def caller_cpus(self) -> set[int] | None:
        """The CPUs the calling thread may run on, where placing is possible (Linux, two or
        more of them)."""
        if not self.placing:
            return None
        allowed = os.sched_getaffinity(0)
        return allowed if len(allowed) > 1 else None

    def started(self) -> None:
        tid = threading.get_native_id()
        with self.lock:
            self.tids.append(tid)
            others = self.others
        if others is not None:
            _set_cpus(tid, others)


def _on_cpus(cpus: set[int], job: Callable[[], Any]) -> Any:
    """Run ``job`` on this pool thread after giving it back ``cpus``."""
    _set_cpus(0, cpus)
    return job()


def _then_on_cpus(cpus: set[int], job: Callable[[], Any]) -> Any:
    """Run ``job`` on this pool thread where it was placed, then give it back ``cpus``."""
    try:
        return job()
    finally:
        _set_cpus(0, cpus)


def _set_cpus(tid: int, cpus: set[int]) -> None:
    try:
        os.sched_setaffinity(tid, cpus)
    except OSError:  # the thread is gone, or a cpuset no longer holds those CPUs
        pass
