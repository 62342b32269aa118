"""A pool worker: waits on its request semaphore, does one task, answers in shared memory.

Workers are forked from the zygote, which loaded the tokenizer once and never encoded with
threads, so the vocabulary, tables and encoders are shared copy-on-write. A worker encodes
single-threaded; parallelism comes from the number of workers.

A worker keeps no session state: a session task carries its whole plan (:mod:`dtok.repair`), the
stored IDs are in the session's segment, and the worker only caches the mapping of each session's
latest segment. So any worker can serve any session, and a replaced worker loses nothing.
"""
from __future__ import annotations

import ctypes
import os
import signal
import time

from posix_ipc import BusyError

from dtok.pool import protocol
from dtok.pool.shm import Segment, semaphore
from dtok.repair import PlanFailed, execute
from dtok_ext.shm import Control, copy_ids, read_str, write_ids


def _die_with_parent() -> None:
    """SIGKILL this process when its parent (the zygote) exits."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Worker:
    def __init__(self, tok, prefix: str, index: int) -> None:
        self.planning = tok.planning
        self.prefix = prefix
        self.index = index
        self.ctl_seg = Segment(protocol.control_name(prefix, index), 0, create=False)
        self.control = Control(self.ctl_seg.map)
        self.req_sem = semaphore(protocol.request_sem_name(prefix, index), create=False)
        self.resp_sem = semaphore(protocol.response_sem_name(prefix, index), create=False)
        self.done_sem = semaphore(protocol.done_sem_name(prefix), create=False)
        self.payload: Segment | None = None
        self.payload_gen = -1
        self.result: Segment | None = None
        self.result_gen = -1
        self.segments: dict[int, dict[int, Segment]] = {}  # sid -> {gen: mapping}

    # --- segments -------------------------------------------------------------------------

    def _payload(self):
        return self._current("payload", self.control.payload_gen, protocol.payload_name)

    def _result(self):
        return self._current("result", self.control.result_gen, protocol.result_name)

    def _current(self, which: str, gen: int, name_of):
        """The mapping of this worker's payload or result segment of generation ``gen`` (the
        front end makes a new one, under a new name, when a task needs more room)."""
        if gen != getattr(self, f"{which}_gen"):
            seg = getattr(self, which)
            if seg is not None:
                seg.close()
            setattr(self, which, Segment(name_of(self.prefix, self.index, gen), 0, False))
            setattr(self, f"{which}_gen", gen)
        return getattr(self, which).map

    def _mapping(self, sid: int, gen: int) -> Segment:
        have = self.segments.get(sid, {}).get(gen)
        if have is not None:
            return have
        return Segment(protocol.session_name(self.prefix, sid, gen), 0, create=False)

    def _cache(self, sid: int, keep: dict[int, Segment]) -> None:
        """Keep the mappings of a session's two latest segments (its current one and the one
        its next copy on write reuses); close the others."""
        for gen, seg in self.segments.get(sid, {}).items():
            if keep.get(gen) is not seg:
                seg.close()
        self.segments[sid] = keep

    def _forget(self, sid: int) -> None:
        for seg in self.segments.pop(sid, {}).values():
            seg.close()

    # --- the loop -------------------------------------------------------------------------

    def run(self, spin_us: int) -> None:
        """Serve requests until OP_EXIT.

        After an answer the worker polls its control block for up to ``spin_us`` before sleeping
        on its semaphore, but only while requests come back to back (the last one arrived within
        that window): a request that follows soon is then picked up without a wake-up, and a
        pool whose requests are spread out in time spins not at all. The request number, not the
        semaphore count, says what is new."""
        c = self.control
        last = c.req_seq  # before "ready": the front end sends nothing until it sees that
        c.pid = os.getpid()
        c.ready = 1
        self.done_sem.release()
        spin = spin_us * 1e-6
        idle_since = time.perf_counter()
        back_to_back = False
        while True:
            seq = c.req_seq
            if seq == last and back_to_back and spin:
                seq = self._poll(last, spin)
            if seq == last:
                self.req_sem.acquire()
                continue
            back_to_back = time.perf_counter() - idle_since < spin
            last = seq
            c.picked_at = time.monotonic()
            op = c.op
            t0 = time.perf_counter()
            try:
                self._drops()
                status = self._do(op)
                c.error = ""
            except PlanFailed as exc:
                status = protocol.ST_PLAN_FAILED
                c.error = str(exc)
            except Exception as exc:  # reported to the front end, which fails over in process
                status = protocol.ST_ERROR
                c.error = f"{type(exc).__name__}: {exc}"
            c.status = status
            c.service_ms = (time.perf_counter() - t0) * 1e3
            c.tasks_done = c.tasks_done + 1
            wake_caller = c.flags & protocol.FL_WAKE_CALLER
            c.answered_at = time.monotonic()
            self._drain_wakeups()
            c.publish_response(seq)
            (self.resp_sem if wake_caller else self.done_sem).release()
            idle_since = time.perf_counter()
            if op == protocol.OP_EXIT:
                return

    def _poll(self, last: int, seconds: float) -> int:
        """The request number, polled until it differs from ``last`` or ``seconds`` pass.

        Each round yields the CPU: the worker often shares a CPU with the front end (a woken
        process is placed beside its waker), and polling there would keep the front end from
        sending the very task it waits for, or from taking the answer."""
        c = self.control
        deadline = time.perf_counter() + seconds
        seq = c.req_seq
        while seq == last and time.perf_counter() < deadline:
            os.sched_yield()
            seq = c.req_seq
        return seq

    def _drain_wakeups(self) -> None:
        """Take the wake-up a task picked up by polling left behind (its own post): it would
        wake the worker later only to poll for nothing. The request number, read again before
        sleeping, says whether a task is waiting."""
        try:
            while True:
                self.req_sem.acquire(0)
        except BusyError:
            pass

    def _drops(self) -> None:
        n = self.control.n_drops
        if n:
            view = memoryview(self._payload())[: 8 * n].cast("Q")
            for sid in view.tolist():
                self._forget(sid)
            view.release()

    def _do(self, op: int) -> int:
        if op == protocol.OP_EXIT:
            return protocol.ST_OK
        c = self.control
        payload = self._payload()
        off = 8 * c.n_drops
        if op == protocol.OP_ENCODE:
            text = read_str(payload, off, c.kind, c.text_chars)
            (parts,) = self.planning.encode_texts([text])
            c.n_ids = write_ids(self._result(), 0, parts)
            return protocol.ST_OK
        if op == protocol.OP_SESSION:
            words = c.plan_words
            table = memoryview(payload)[off : off + 8 * words].cast("q")
            plan = protocol.read_plan(
                table, read_str(payload, off + 8 * words, c.kind, c.text_chars))
            table.release()
            return self._session(plan)
        raise ValueError(f"unknown operation {op}")

    def _session(self, plan) -> int:
        """Execute a session's plan into the segment the front end chose (:func:`write_turn`)."""
        c = self.control
        sid = c.session_id
        old = self._mapping(sid, c.old_seg_gen) if c.old_seg_gen else None
        dst = old if c.seg_gen == c.old_seg_gen else self._mapping(sid, c.seg_gen)
        old_map = None if old is None else old.map
        outcome, keep, n_body = write_turn(plan, self.planning, old_map, dst.map, c.n_body,
                                           c.dst_valid)
        self._cache(sid, {c.seg_gen: dst} if old is None else {c.seg_gen: dst, c.old_seg_gen: old})
        c.n_ids = n_body
        c.keep = keep
        words = protocol.report(outcome)
        c.report_words = len(words)
        memoryview(self._result())[: 8 * len(words)] = words.tobytes()
        return protocol.ST_OK


def write_turn(plan, planning, old_map, dst_map, n_body: int, dst_valid: int):
    """Execute a session's plan and write its IDs into ``dst_map``: the current segment
    ``old_map`` itself (in place) only when nothing but new IDs follow the kept ones; else one
    whose first ``dst_valid`` IDs already equal the current ones, so only the rest of the kept
    prefix is copied. ``n_body``: the current IDs without the post-processor's. Returns (the
    outcome, its tail released; the leading IDs kept, prefix included; the new body's length).
    A worker does this for every session task; the front end, for a turn it answers on its
    event loop (:meth:`dtok.Pool.encode_async`)."""
    p = len(planning.prefix)
    old_body = memoryview(old_map)[4 * p : 4 * (p + n_body)].cast("i") \
        if old_map is not None else None
    outcome = None
    try:
        outcome = execute(plan, planning.encode_texts, old_body)
        keep = p + outcome.keep
        if dst_map is not old_map:
            if old_map is not None:
                valid = min(dst_valid, keep)
                copy_ids(old_map, valid, dst_map, valid, keep - valid)
            else:
                write_ids(dst_map, 0, [planning.prefix])
        n = write_ids(dst_map, keep, [*outcome.tail, planning.suffix])
    finally:
        if outcome is not None:
            outcome.tail.clear()
        if old_body is not None:
            old_body.release()
    return outcome, keep, keep - p + n - len(planning.suffix)


def main(tok, prefix: str, index: int, title: str, spin_us: int, nice: int) -> None:
    """Entry point in a freshly forked worker process."""
    _die_with_parent()
    if nice:  # below the front end: its event loop gets a core first
        os.nice(nice)
    try:
        from setproctitle import setproctitle

        setproctitle(title)
    except ImportError:
        pass
    Worker(tok, prefix, index).run(spin_us)
