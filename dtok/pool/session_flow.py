"""A pool session's life: its requests one at a time and in order, each turn planned here and
written by a worker (or, for a short turn on an event loop, by this process), the written turn
accepted as the session's state; sessions adopted from stateless texts, dropped, unmapped from the
workers, and dropped to make room when shared memory runs out. The caller holds the pool's lock.
"""
from __future__ import annotations

import logging
from typing import Callable

from dtok.pool import protocol
from dtok.pool import shm
from dtok.pool.answers import Answers
from dtok.pool.failover import Failover
from dtok.pool.records import Request, Task
from dtok.pool.shared_sessions import PoolSession
from dtok.pool.state import PoolState
from dtok.pool.worker import write_turn
from dtok.repair import Anchors
from dtok.session_core import ROUTE_COUNTERS
from dtok_ext.shm import utf8_length

log = logging.getLogger("dtok")

__all__ = ["SessionFlow"]


class SessionFlow:
    """``push_task(task)``: queue a session's task for its home worker (routing)."""

    def __init__(self, state: PoolState, answers: Answers, failover: Failover,
                 push_task: Callable[[Task], None]) -> None:
        self._state, self._answers, self._failover = state, answers, failover
        self._push_task = push_task

    # --- turns -------------------------------------------------------------------------------

    def start_next(self, pool_session: PoolSession, plan=None) -> None:
        """Start the oldest queued request of a session, unless one is in flight (a session's
        requests run one at a time, in order); ``plan``: the first one's, made already."""
        state = self._state
        while pool_session.inflight is None and pool_session.queue:
            req = pool_session.queue.popleft()
            this = plan if plan is not None else state.planning.plan(
                pool_session.text, pool_session.anchors, req.text)
            plan = None
            if this.kind == "hit":
                state.counts["session_hits"] += 1
                self._answers.resolve_session(req, pool_session, len(pool_session.ids))
                continue
            try:
                task = self.session_task(pool_session, req, this)
            except shm.ShmFull as exc:
                self._failover.shm_full(req, exc)
                continue
            pool_session.inflight = req
            self._push_task(task)
            return

    def _turn_bound(self, pool_session: PoolSession, plan) -> tuple[int, int]:
        """(the most IDs a session's turn by ``plan`` may have, its current body's length: 0
        when the plan reuses nothing)."""
        fresh = sum(utf8_length(t) for t in plan.texts)
        old_n = pool_session.n_body if plan.kind != "encode" else 0
        state = self._state
        return protocol.max_ids(fresh, len(state.prefix_ids) + len(state.suffix_ids)) + old_n, old_n

    def session_task(self, pool_session: PoolSession, req: Request, plan) -> Task:
        """The task that writes a session's turn by ``plan`` (ShmFull: no room for it)."""
        table, joined = protocol.plan_table(plan)
        bound, old_n = self._turn_bound(pool_session, plan)
        task = Task(protocol.OP_SESSION, "init" if plan.kind == "encode" else "append", req, joined,
                    self._state.estimator.weight(joined))
        task.plan, task.table, task.pool_session, task.old_n_body = plan, table, pool_session, old_n
        try:
            task.target = self._state.sessions.target(pool_session, plan, bound)
        except shm.ShmFull:
            self.make_room()
            task.target = self._state.sessions.target(pool_session, plan, bound)
        return task

    def retry_whole(self, task: Task, error: str) -> Task | None:
        """A worker could not follow a session's plan (never expected): the task that encodes
        the text whole instead, or None (failed over: no room)."""
        self._state.counts["plan_failures"] += 1
        log.warning("dtok pool: a session plan failed (%s); encoding whole", error)
        self.task_dropped(task)
        try:
            plan = self._state.planning.plan(None, None, task.req.text)
            return self.session_task(task.pool_session, task.req, plan)
        except shm.ShmFull as exc:
            self._failover.shm_full(task.req, exc)
            return None

    def turn_done(self, pool_session: PoolSession, req: Request, plan, target, n_body: int,
                  report: tuple[list, list], keep: int, worker: int | None) -> None:
        """A session's turn written (by ``worker``; None: by this process, whose mappings
        change nothing for the workers): it becomes the session's state and answers ``req``;
        the session's next request starts. ``report``: the turn's (resolved stretches, counts
        of IDs per encoded text), as :func:`dtok.pool.protocol.report` carries them."""
        state = self._state
        anchors = state.planning.anchors_after(plan, *report, pool_session.anchors)
        if worker is None:
            worker = pool_session.known_by
        elif pool_session.known_by != worker:  # re-homed (a worker died): the last may unmap it
            self._unmap_on(pool_session, pool_session.known_by)
        state.sessions.accept(pool_session, target.gen, target.capacity, req.text, n_body,
                              anchors, worker, keep)
        if pool_session.content:
            state.index.remove(pool_session)
            state.index.add(pool_session, req.keys)
        state.counts["session_" + ROUTE_COUNTERS[plan.kind]] += 1
        self._answers.resolve_session(req, pool_session, keep if plan.kind != "encode" else 0)
        pool_session.inflight = None
        self.start_next(pool_session)
        for victim in state.sessions.victims():
            self.drop_session(victim)

    def write_here(self, pool_session: PoolSession, req: Request, plan) -> bool:
        """Write an idle session's turn in this process with its own encoders, as a worker
        would (:func:`dtok.pool.worker.write_turn`), and answer ``req``. False where that
        failed (no shared memory, a failed plan, an encoder's error), the session as it was
        (reset if its IDs were being written in place)."""
        sessions = self._state.sessions
        bound, old_n = self._turn_bound(pool_session, plan)
        try:
            target = sessions.target(pool_session, plan, bound)
        except shm.ShmFull:
            return False
        old_map = sessions.segment_map(pool_session, target.old_gen) if target.old_gen else None
        try:
            outcome, keep, n_body = write_turn(plan, self._state.planning, old_map,
                                               sessions.segment_map(pool_session, target.gen),
                                               old_n, target.valid)
        except Exception:  # noqa: BLE001 - a worker's turn decides (and fails over)
            if target.gen == target.old_gen:  # in place: its IDs may be half written
                sessions.reset(pool_session)
            else:
                sessions.drop_pending(pool_session, target.gen)
            return False
        self._state.counts["loop_turns"] += 1
        self.turn_done(pool_session, req, plan, target, n_body,
                       (outcome.resolved, outcome.counts), keep, None)
        return True

    # --- lifecycle ---------------------------------------------------------------------------

    def new_content_session(self) -> PoolSession:
        """A session for content lookup, the oldest dropped beyond ``lookup_entries``."""
        state = self._state
        for victim in state.sessions.victims(content_limit=state.routes.lookup_entries - 1):
            self.drop_session(victim)
        return state.sessions.new_content()

    def adopt(self, req: Request, parts: list) -> None:
        """A long unkeyed text missed by content lookup is encoded stateless (its chunks on all
        the workers), then kept as a session so that its next turn continues it; its chunk cuts
        are its first anchors."""
        pool_session = self.new_content_session()
        offsets, tokens = [0], [0]
        for piece_len, ids in zip(req.bounds, parts):
            offsets.append(offsets[-1] + piece_len)
            tokens.append(tokens[-1] + len(ids))
        if self._state.sessions.adopt(pool_session, req.text, parts, Anchors(offsets, tokens)):
            self._state.index.add(pool_session, req.keys)
        else:
            self._state.sessions.drop(pool_session)

    def task_dropped(self, task: Task) -> None:
        """A task that will not complete: release a segment created for it."""
        t = task.target
        if t is not None and t.gen != t.old_gen:
            self._state.sessions.drop_pending(task.pool_session, t.gen)

    def drop_session(self, pool_session: PoolSession) -> None:
        if pool_session.content:
            self._state.index.remove(pool_session)
        self._unmap_on(pool_session, pool_session.known_by)
        self._state.sessions.drop(pool_session)

    def _unmap_on(self, pool_session: PoolSession, index: int | None) -> None:
        """The worker ``index`` may forget its mapping of the session's segment (told with its
        next task): the session was dropped, or moved to another worker."""
        channels = self._state.channels
        if index is not None and channels[index].alive:
            channels[index].drops.append(pool_session.sid)

    def make_room(self) -> None:
        """Shared memory ran out: drop the least recently used idle session."""
        for victim in self._state.sessions.victims(force=True):
            self.drop_session(victim)

    def forget_worker(self, index: int) -> None:
        """Worker ``index`` died: no session's segment is mapped there any more."""
        for pool_session in self._state.sessions.values():
            if pool_session.known_by == index:
                pool_session.known_by = None
