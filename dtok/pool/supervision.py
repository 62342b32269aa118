"""Keeping a pool's workers alive: start (the zygote, then one worker per slot), a worker that
does not come up in time, a worker's death (its task failed over, its queue re-homed, the slot
replaced unless it keeps failing), request timeouts, and the two threads that watch it all: the
dispatcher (answers, timeouts, starts) and the zygote's event reader.

:class:`Supervision` is the part of :class:`dtok.pool.Pool` that does this; it works on the
pool's channels, queues and sessions under the pool's lock, and calls the pool's routing
(``_assign``, ``_push_task``) and failure (``_fail``, ``_task_dropped``) steps.
"""
from __future__ import annotations

import logging
import threading
import time

import posix_ipc

from dtok.pool import protocol as P
from dtok.pool import shm
from dtok.pool.channel import Channel
from dtok.pool.records import PoolError
from dtok.pool.zygote_client import ZygoteClient, tokenizer_bytes

log = logging.getLogger("dtok")

__all__ = ["Supervision", "MAX_RESTARTS", "pss_mb"]

MAX_RESTARTS = 5  # replacements of one worker slot within a minute before it is left dead


def pss_mb(pid: int) -> float | None:
    """A process's proportional set size in MiB (its share of pages shared with others)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


class Supervision:
    """Start, watch and replace a pool's workers (mixed into :class:`dtok.pool.Pool`)."""

    def _start(self, worker_knobs: dict) -> None:
        deadline = time.monotonic() + self.start_timeout
        self._res.lock_fd = shm.hold_owner_lock(self.prefix, create=True)
        self._done_sem = shm.semaphore(P.done_sem_name(self.prefix), create=True)
        try:
            self._channels = [Channel(self.prefix, i, self._budget) for i in range(self.n_workers)]
        except shm.ShmFull as exc:
            raise PoolError(f"no shared memory for the pool's workers: {exc}") from None
        files = self.tokenizer.files
        knobs = {**worker_knobs, "threads": 1, "content_lookup": False,
                 "chunk_threshold": self.chunk_threshold, "chunk_target": self.chunk_target,
                 "max_chunks": self.max_chunks, "scan_budget": list(self.tokenizer.knobs["scan_budget"])}
        config = {"prefix": self.prefix, "name": self.name, "path": str(files.path),
                  "config": files.config, "sha256": self.tokenizer.admission.sha256,
                  "knobs": knobs, "spin_us": self.spin_us, "worker_nice": self.worker_nice,
                  **self._test_config}
        try:
            self.zygote = ZygoteClient(self._res, config, tokenizer_bytes(self.tokenizer))
            loaded = self.zygote.wait_loaded(deadline)
        except TimeoutError:
            raise PoolError(f"pool did not start within start_timeout {self.start_timeout} s") \
                from None
        except (RuntimeError, shm.ShmFull) as exc:
            raise PoolError(str(exc)) from None
        self.encoder_name = loaded["encoder"]
        self.estimator.start(self.encoder_name)
        for ch in self._channels:
            self._launch(ch)
        for target, label in ((self._dispatch_loop, "dispatch"), (self._zygote_loop, "zygote")):
            t = threading.Thread(target=target, name=f"dtok-pool-{label}", daemon=True)
            t.start()
            self._threads.append(t)
        with self._ready:
            while not all(ch.alive for ch in self._channels):
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    raise PoolError(f"pool did not start within start_timeout "
                                    f"{self.start_timeout} s")
                self._ready.wait(min(left, 0.5))

    def _launch(self, ch: Channel) -> None:
        """Ask the zygote for a (new) worker in this slot (caller holds the lock or starts)."""
        ch.restart()
        ch.starts += 1
        ch.ready_by = time.monotonic() + self.worker_start_timeout
        self.zygote.fork(ch.index)

    def _check_starting(self) -> None:
        """Starting workers: ready ones go live; one not ready in time is killed (and replaced
        when the zygote reports its death)."""
        now = time.monotonic()
        for ch in self._channels:
            if ch.alive or not ch.ready_by:
                continue
            if ch.pid and ch.control.ready and ch.control.pid == ch.pid:
                ch.alive, ch.ready_by = True, 0.0
                self._ready.notify_all()
            elif now > ch.ready_by:
                log.warning("dtok pool: worker %d (pid %d) did not come up in %.0f s; killed",
                            ch.index, ch.pid, self.worker_start_timeout)
                ch.ready_by = 0.0
                if not ch.pid:  # never forked, as far as the zygote said: replace it now
                    self._on_death(ch.index)
                    continue
                shm.sigkill(ch.pid)
        self._assign()

    def _on_death(self, index: int, replace: bool = True) -> None:
        """A worker died (or was killed): fail its task over, re-home its queue, replace it."""
        ch = self._channels[index]
        was_alive = ch.alive
        ch.alive, ch.ready_by = False, 0.0
        if was_alive:
            self._counts["worker_deaths"] += 1
            log.warning("dtok pool: worker %d (pid %d) died", index, ch.pid)
        if ch.task is not None:
            task, ch.task = ch.task, None
            self._task_dropped(task)
            self._fail(task.req, f"worker {index} died")
        for pool_session in self.sessions.values():
            if pool_session.known_by == index:
                pool_session.known_by = None
        if self._closed:
            return
        now = time.monotonic()
        recent = [t for t in self._restarts.get(index, []) if now - t < 60] + [now]
        self._restarts[index] = recent
        if replace and len(recent) <= MAX_RESTARTS:
            self._counts["replacements"] += 1
            self._launch(ch)
        else:
            log.warning("dtok pool: worker slot %d keeps failing; left empty", index)
        if not any(c.alive or c.ready_by for c in self._channels):
            # no worker left or coming: every queued request is answered in process
            for task in self.queues.drain():
                self._task_dropped(task)
                self._fail(task.req, "no live worker")
            return
        for task in self.queues.drain(index):  # any worker can serve a session
            self._push_task(task)
        self._assign()

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        for ch in self._channels:
            if ch.alive and ch.task is not None and now - ch.task.sent_at > self.request_timeout:
                self._counts["timeouts"] += 1
                shm.sigkill(ch.pid)
                self._on_death(ch.index)

    def _dispatch_loop(self) -> None:
        while not self._closed:
            try:
                self._done_sem.acquire(1.0)  # idle: one wake-up a second, no spinning
            except posix_ipc.BusyError:
                pass
            except posix_ipc.ExistentialError:
                return
            with self._lock:
                if self._closed:
                    return
                self._harvest()
                self._check_timeouts()
                self._check_starting()
                self.sessions.reap()
            self._finish_lists()

    def _zygote_loop(self) -> None:
        events = self.zygote.events
        while True:
            try:
                ev = events.read()
            except (OSError, ValueError):
                ev = None
            if ev is None:
                break
            with self._lock:
                if ev.get("event") == "started":
                    self._channels[ev["index"]].pid = ev["pid"]
                elif ev.get("event") == "dead":
                    ch = self._channels[ev["index"]]
                    if ch.pid == ev["pid"]:
                        log.warning("dtok pool: worker %d exit status %s", ev["index"], ev.get("status"))
                        self._harvest()  # it may have answered before dying
                        self._on_death(ev["index"])
                elif ev.get("event") == "error":
                    log.warning("dtok pool: zygote: %s", ev.get("error"))
        with self._lock:  # the zygote is gone: so are the workers, and none can be replaced
            if not self._closed:
                for ch in self._channels:
                    self._on_death(ch.index, replace=False)
            self._ready.notify_all()
