"""Keeping a pool's workers alive: start (the zygote, then one worker per slot), a worker that
does not come up in time, a worker's death (its task failed over, its queue re-homed, the slot
replaced unless it keeps failing), request timeouts, and the two threads that watch it all: the
dispatcher (answers, timeouts, starts) and the zygote's event reader.

:class:`Supervisor` is a part the :class:`dtok.pool.Pool` owns; it works on the pool's shared
state under its lock, through the dispatch, routing, session and failover parts it is given.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import NamedTuple

import posix_ipc

from dtok.pool import protocol
from dtok.pool import shm
from dtok.pool.answers import Answers
from dtok.pool.channel import Channel
from dtok.pool.dispatch import Dispatch
from dtok.pool.failover import Failover, Failure
from dtok.pool.records import PoolError
from dtok.pool.routing import Routing
from dtok.pool.session_flow import SessionFlow
from dtok.pool.state import PoolState
from dtok.pool.zygote_client import Resources, ZygoteClient, tokenizer_bytes

log = logging.getLogger("dtok")

__all__ = ["Supervisor", "Timeouts", "MAX_RESTARTS"]

MAX_RESTARTS = 5  # replacements of one worker slot within a minute before it is left dead


class Timeouts(NamedTuple):
    start: float  # the whole pool's start (the zygote's load, every worker ready)
    worker_start: float  # one worker's, from its fork


class Supervisor:
    def __init__(self, state: PoolState, resources: Resources, timeouts: Timeouts,
                 dispatch: Dispatch, routing: Routing, flow: SessionFlow, failover: Failover,
                 answers: Answers, renew_chars: int = 0) -> None:
        self._state, self._res, self.timeouts = state, resources, timeouts
        self._dispatch, self._routing, self._flow = dispatch, routing, flow
        self._failover, self._answers = failover, answers
        self.zygote: ZygoteClient | None = None
        self.encoder_name: str | None = None
        self._done_sem = None
        self._threads: list[threading.Thread] = []
        self._restarts: dict[int, list[float]] = {}
        # renewal onto the fast encoder (its guard table came after the start) or after
        # renew_chars characters encoded (0: never): the slots still to renew, and the one whose
        # worker was asked to exit (index -> its pid)
        self._renew_chars = renew_chars
        self._to_renew: set[int] = set()
        self._retiring: dict[int, int] = {}

    def start(self, n_workers: int, budget: shm.Budget, tokenizer, config: dict,
              owner: object) -> None:
        """Start the zygote with ``config`` and ``n_workers`` workers forked from it; PoolError
        when that does not happen within the start timeout. The threads hold ``owner`` (the
        Pool): a pool never closed is not collected while they run."""
        state, prefix = self._state, config["prefix"]
        deadline = time.monotonic() + self.timeouts.start
        self._res.lock_fd = shm.hold_owner_lock(prefix, create=True)
        self._done_sem = shm.semaphore(protocol.done_sem_name(prefix), create=True)
        try:
            state.channels = [Channel(prefix, i, budget) for i in range(n_workers)]
        except shm.ShmFull as exc:
            raise PoolError(f"no shared memory for the pool's workers: {exc}") from None
        try:
            self.zygote = ZygoteClient(self._res, config, tokenizer_bytes(tokenizer))
            loaded = self.zygote.wait_loaded(deadline)
        except TimeoutError:
            raise PoolError(f"pool did not start within start_timeout {self.timeouts.start} s") \
                from None
        except (RuntimeError, shm.ShmFull) as exc:
            raise PoolError(str(exc)) from None
        self.encoder_name = loaded["encoder"]
        state.estimator.start(self.encoder_name)
        if self.encoder_name == "reference":
            # a file with no guard table yet: when the probes have written one, the zygote
            # takes it and the workers are renewed one at a time
            state.planning.when_guard_table(self._guard_table_written)
        for ch in state.channels:
            self._launch(ch)
        for target, label in ((self._dispatch_loop, "dispatch"), (self._zygote_loop, "zygote")):
            t = threading.Thread(target=target, args=(owner,), name=f"dtok-pool-{label}",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        with state.ready:
            while not all(ch.alive for ch in state.channels):
                left = deadline - time.monotonic()
                if left <= 0 or state.closed:
                    raise PoolError(f"pool did not start within start_timeout "
                                    f"{self.timeouts.start} s")
                state.ready.wait(min(left, 0.5))

    def stop(self) -> None:
        """Stop the zygote (its workers die with it) and the two threads."""
        if self.zygote is not None:
            self.zygote.exit()
            self.zygote.wait(10)
        if self._done_sem is not None:
            self._done_sem.release()  # wake the dispatcher
        for t in self._threads:
            t.join(5)

    @property
    def renewals_pending(self) -> int:
        """Workers to renew: onto the fast encoder, or after ``renew_chars`` characters."""
        return len(self._to_renew) + len(self._retiring)

    def _guard_table_written(self) -> None:
        with self._state.lock:
            if not self._state.closed and self.zygote is not None:
                self.zygote.take_guards()

    def _zygote_took_guards(self, encoder: str) -> None:
        """The zygote serves with ``encoder`` now: renew the workers forked before."""
        if encoder == self.encoder_name:
            return
        log.info("dtok pool: the %s encoder serves from now on; renewing the workers", encoder)
        self.encoder_name = encoder
        self._state.estimator.start(encoder)
        self._to_renew = {ch.index for ch in self._state.channels}
        self.renew_idle()

    def renew_idle(self) -> None:
        """Ask one idle worker still on the old encoder, or past ``renew_chars``, to exit (its
        slot gets a worker forked from the zygote as it is now, its fast encoder's memo gone);
        one at a time, so the others keep serving. Called as work is handed out (a worker that
        just answered is idle then) and on the dispatcher's rounds (caller holds the lock)."""
        state = self._state
        if self._renew_chars:
            self._to_renew.update(ch.index for ch in state.channels
                                  if ch.alive and ch.encoded_chars > self._renew_chars)
        if not self._to_renew or self._retiring or state.closed \
                or any(ch.ready_by and not ch.alive for ch in state.channels):
            return
        for ch in state.channels:
            if ch.index in self._to_renew and ch.alive and ch.task is None and ch.pid:
                self._to_renew.discard(ch.index)
                self._retiring[ch.index] = ch.pid
                ch.alive = False
                ch.ready_by = time.monotonic() + self.timeouts.worker_start  # a slot still
                self._flow.forget_worker(ch.index)
                for task in state.queues.drain(ch.index):
                    self._routing.push_task(task)
                ch.exit()
                return
            if ch.index in self._to_renew and not ch.alive and not ch.ready_by:
                self._to_renew.discard(ch.index)  # a slot left empty: nothing to renew

    def _launch(self, ch: Channel) -> None:
        """Ask the zygote for a (new) worker in this slot (caller holds the lock or starts)."""
        ch.restart()
        ch.starts += 1
        ch.ready_by = time.monotonic() + self.timeouts.worker_start
        self.zygote.fork(ch.index)

    def _check_starting(self) -> None:
        """Starting workers: ready ones go live; one not ready in time is killed (and replaced
        when the zygote reports its death)."""
        now = time.monotonic()
        for ch in self._state.channels:
            if ch.alive or not ch.ready_by:
                continue
            if self._retiring.get(ch.index) == ch.pid:  # asked to exit for its renewal
                if now > ch.ready_by:
                    shm.sigkill(ch.pid)
                continue
            if ch.pid and ch.control.ready and ch.control.pid == ch.pid:
                ch.alive, ch.ready_by = True, 0.0
                self._state.ready.notify_all()
            elif now > ch.ready_by:
                log.warning("dtok pool: worker %d (pid %d) did not come up in %.0f s; killed",
                            ch.index, ch.pid, self.timeouts.worker_start)
                ch.ready_by = 0.0
                if not ch.pid:  # never forked, as far as the zygote said: replace it now
                    self._on_death(ch.index)
                    continue
                shm.sigkill(ch.pid)
        self.renew_idle()
        self._dispatch.assign()

    def _on_death(self, index: int, replace: bool = True,
                  reason: Failure = Failure.WORKER_DIED) -> None:
        """A worker died (or was killed): fail its task over, re-home its queue, replace it."""
        state = self._state
        ch = state.channels[index]
        was_alive = ch.alive
        ch.alive, ch.ready_by = False, 0.0
        if self._retiring.pop(index, None) is not None and replace and not state.closed:
            state.counts["worker_renewals"] += 1  # it exited as asked: its slot is renewed
            self._launch(ch)
            return
        if was_alive:
            state.counts["worker_deaths"] += 1
            log.warning("dtok pool: worker %d (pid %d) died", index, ch.pid)
        if ch.task is not None:
            task, ch.task = ch.task, None
            self._flow.task_dropped(task)
            self._failover.fail(task.req, reason, f"worker {index}")
        self._flow.forget_worker(index)
        if state.closed:
            return
        now = time.monotonic()
        recent = [t for t in self._restarts.get(index, []) if now - t < 60] + [now]
        self._restarts[index] = recent
        if replace and len(recent) <= MAX_RESTARTS:
            state.counts["replacements"] += 1
            self._launch(ch)
        else:
            log.warning("dtok pool: worker slot %d keeps failing; left empty", index)
        if not state.slots():
            # no worker left or coming: every queued request is answered in process
            for task in state.queues.drain():
                self._flow.task_dropped(task)
                self._failover.fail(task.req, Failure.NO_LIVE_WORKER)
            return
        for task in state.queues.drain(index):  # any worker can serve a session
            self._routing.push_task(task)
        self._dispatch.assign()

    def check_timeouts(self) -> None:
        """Kill and replace each worker whose task ran past the request timeout (the caller
        holds the lock)."""
        now = time.monotonic()
        state = self._state
        for ch in state.channels:
            if ch.alive and ch.task is not None and now - ch.task.sent_at > state.request_timeout:
                state.counts["timeouts"] += 1
                shm.sigkill(ch.pid)
                self._on_death(ch.index, reason=Failure.TIMED_OUT)

    def _dispatch_loop(self, owner: object) -> None:
        state = self._state
        while not state.closed:
            try:
                self._done_sem.acquire(1.0)  # idle: one wake-up a second, no spinning
            except posix_ipc.BusyError:
                pass
            except posix_ipc.ExistentialError:
                return
            with state.lock:
                if state.closed:
                    return
                self._dispatch.harvest()
                self.check_timeouts()
                self._check_starting()
                state.sessions.reap()
            self._answers.finish_lists()

    def _zygote_loop(self, owner: object) -> None:
        state = self._state
        events = self.zygote.events
        while True:
            try:
                ev = events.read()
            except (OSError, ValueError):
                ev = None
            if ev is None:
                break
            with state.lock:
                if ev.get("event") == "started":
                    state.channels[ev["index"]].pid = ev["pid"]
                elif ev.get("event") == "dead":
                    ch = state.channels[ev["index"]]
                    if ch.pid == ev["pid"]:
                        renewed = self._retiring.get(ev["index"]) == ev["pid"]  # asked to exit
                        (log.info if renewed else log.warning)(
                            "dtok pool: worker %d exit status %s", ev["index"], ev.get("status"))
                        self._dispatch.harvest()  # it may have answered before dying
                        self._on_death(ev["index"])
                elif ev.get("event") == "guards":
                    self._zygote_took_guards(ev["encoder"])
                elif ev.get("event") == "error":
                    log.warning("dtok pool: zygote: %s", ev.get("error"))
        with state.lock:  # the zygote is gone: so are the workers, and none can be replaced
            if not state.closed:
                for ch in state.channels:
                    self._on_death(ch.index, replace=False)
            state.ready.notify_all()
