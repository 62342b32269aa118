"""Tasks to workers and answers back: an idle worker is given the better of its own queue's head
and the shared queue's head, the task's text or plan goes through its channel, and its answer is
harvested (by the dispatcher thread, or by a synchronous caller that waits on the worker's
response semaphore itself) and completes the request or the session's turn.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

import posix_ipc

from dtok.pool import protocol
from dtok.pool import shm
from dtok.pool.answers import Answers
from dtok.pool.channel import Channel, payload_bytes
from dtok.pool.failover import Failover, Failure
from dtok.pool.records import Request, Task
from dtok.pool.session_flow import SessionFlow
from dtok.pool.state import PoolState
from dtok_ext.buffers import IdBuffer
from dtok_ext.shm import utf8_length

__all__ = ["Dispatch"]


class Dispatch:
    """``check_timeouts()``: kill and replace the workers past the request timeout
    (supervision). Every method but :meth:`wait` runs with the pool's lock held."""

    def __init__(self, state: PoolState, flow: SessionFlow, failover: Failover, answers: Answers,
                 check_timeouts: Callable[[], None], renew_idle: Callable[[], None]) -> None:
        self._state, self._flow, self._failover, self._answers = state, flow, failover, answers
        self._check_timeouts, self._renew_idle = check_timeouts, renew_idle

    def assign(self) -> None:
        """Give each idle live worker its next task (one due for renewal first leaves)."""
        self._renew_idle()
        for ch in self._state.channels:
            while ch.alive and ch.task is None:
                task = self._state.queues.pop_for(ch.index)
                if task is None:
                    break
                if task.req.failed:
                    self._flow.task_dropped(task)
                    continue
                self._send(ch, task)

    def _send(self, ch: Channel, task: Task) -> None:
        if task.op == protocol.OP_ENCODE:
            result = 4 * protocol.max_ids(utf8_length(task.text), 0)
        else:
            result = 8 * (2 * len(task.plan.ops) + len(task.plan.texts) + 4)
        try:
            ch.reserve(payload_bytes(task, len(ch.drops)), result)
        except shm.ShmFull as exc:
            self._flow.task_dropped(task)
            self._failover.shm_full(task.req, exc)
            return
        req = task.req
        direct = req.waiter == threading.get_ident()
        if direct:
            req.direct.append((ch, task))
        task.sent_at = time.monotonic()
        req.times.append(task.sent_at)
        ch.send(task, wake_caller=direct)

    def harvest(self) -> None:
        """Complete every task a live worker has answered."""
        for ch in self._state.channels:
            if ch.alive and ch.answered():
                self._harvest_one(ch)

    def _harvest_one(self, ch: Channel) -> None:
        task, ch.task = ch.task, None
        ch.done += 1
        ch.encoded_chars += len(task.text)
        c = ch.control
        task.req.times += [c.picked_at, c.answered_at, time.monotonic()]
        if self._state.estimator.observe(task.kind, task.weight, c.service_ms):
            self._state.queues.rekey()
        self._complete(ch, task)

    def _complete(self, ch: Channel, task: Task) -> None:
        c = ch.control
        status = c.status
        if status == protocol.ST_ERROR:
            self._state.counts["errors"] += 1
            self._flow.task_dropped(task)
            self._failover.fail(task.req, Failure.WORKER_ERROR, c.error)
        elif task.op == protocol.OP_ENCODE:
            self._complete_encode(ch, task)
        elif status == protocol.ST_PLAN_FAILED:  # never expected: encode it whole
            retry = self._flow.retry_whole(task, c.error)
            if retry is not None:
                self._state.queues.push(ch.index, retry, time.monotonic())
        else:
            self._flow.turn_done(task.pool_session, task.req, task.plan, task.target, c.n_ids,
                                 ch.report(), c.keep, ch.index)

    def _complete_encode(self, ch: Channel, task: Task) -> None:
        """A whole text or one of its chunks encoded: the request is answered with the last."""
        req = task.req
        if req.failed:
            return
        state = self._state
        affix = (state.prefix_ids, state.suffix_ids) if req.add_special_tokens else ((), ())
        if req.kind != "chunked":
            req.parts, req.bounds = [ch.encoded_ids()], [len(req.text)]
        else:
            req.parts[task.index] = ch.encoded_ids()
            req.pending -= 1
            if req.pending:
                return
        self._answers.resolve(req, memoryview(IdBuffer.concat(req.parts, *affix)))
        if req.keys is not None:
            self._flow.adopt(req, req.parts)
        req.parts = None

    def wait(self, req: Request):
        """A synchronous caller waits for its tasks that went to workers from its own thread on
        those workers' response semaphores, and harvests them itself (the chunks of a long text
        too); what the dispatcher sent, the dispatcher answers through the future."""
        state = self._state
        while not req.future.done() and not state.closed:
            with state.lock:
                req.direct = [(ch, t) for ch, t in req.direct if ch.task is t]
                if not req.direct:
                    break
                ch, task = req.direct[0]
            left = task.sent_at + state.request_timeout - time.monotonic()
            try:
                ch.resp_sem.acquire(min(0.5, max(0.0, left)))
            except posix_ipc.BusyError:
                pass
            with state.lock:
                if ch.task is task and ch.answered():
                    self._harvest_one(ch)
                    self.assign()  # a next chunk sent from here is waited on here too
                elif left <= 0:
                    self._check_timeouts()
            self._answers.finish_lists()
        req.direct = []  # the tasks refer to the request: no cycle keeps its result alive
        return req.future.result()
