"""One worker's end of the wire, held by the front end: the worker's control block, its request
and response semaphores, and its payload and result segments.

A worker holds at most one task, so its request "ring" is one slot: the task's integers in the
control block and its text (and a session plan's table) in the payload segment. The answer comes
back in the control block and in the result segment (stateless IDs, a session plan's report) or
the session's own segment (its IDs). The sequence numbers, not the semaphore counts, say what is
new: a semaphore is only a wake-up.
"""
from __future__ import annotations

from array import array

from dtok.pool import protocol
from dtok.pool import shm
from dtok_ext.shm import CONTROL_SIZE, Control, read_ids, str_nbytes, write_str


class Channel:
    def __init__(self, prefix: str, index: int, budget: shm.Budget) -> None:
        self.prefix, self.index, self.budget = prefix, index, budget
        self.ctl = shm.Segment(protocol.control_name(prefix, index), CONTROL_SIZE, True, budget)
        self.control = Control(self.ctl.map)
        self.control.clear()
        self.req_sem = shm.semaphore(protocol.request_sem_name(prefix, index), create=True)
        self.resp_sem = shm.semaphore(protocol.response_sem_name(prefix, index), create=True)
        self.payload: shm.Segment | None = None
        self.payload_gen = 0
        self.result: shm.Segment | None = None
        self.result_gen = 0
        self._grow("payload", protocol.PAYLOAD_MIN)
        self._grow("result", protocol.RESULT_MIN)
        self.pid = 0
        self.alive = False
        self.ready_by = 0.0  # monotonic deadline for a starting worker to become ready
        self.task = None
        self.seq = 0
        self.drops: list[int] = []  # session ids the worker may forget (sent with the next task)
        self.done = 0
        self.starts = 0
        self.encoded_chars = 0  # by the worker in this slot now (its renewal: Supervisor)

    # --- segments -------------------------------------------------------------------------

    def _grow(self, which: str, need: int) -> None:
        """A bigger payload or result segment (a new name: the worker maps it by generation)."""
        old = getattr(self, which)
        least = protocol.PAYLOAD_MIN if which == "payload" else protocol.RESULT_MIN
        size = max(need, 2 * (old.size if old else 0), least)
        gen = getattr(self, f"{which}_gen") + 1
        name_of = protocol.payload_name if which == "payload" else protocol.result_name
        name = name_of(self.prefix, self.index, gen)
        seg = shm.Segment(name, size, True, self.budget)  # ShmFull: the old one stays
        if old is not None:
            old.close()
            old.unlink()
        setattr(self, which, seg)
        setattr(self, f"{which}_gen", gen)

    def reserve(self, payload_bytes: int, result_bytes: int) -> None:
        """Make sure a task fits (ShmFull when it cannot)."""
        if payload_bytes > self.payload.size:
            self._grow("payload", payload_bytes)
        if result_bytes > self.result.size:
            self._grow("result", result_bytes)

    # --- one task -------------------------------------------------------------------------

    def send(self, task, wake_caller: bool) -> None:
        """Write the task into the payload and control block and wake the worker."""
        c = self.control
        drops, self.drops = self.drops, []
        mem = self.payload.map
        off = 0
        if drops:
            memoryview(mem)[: 8 * len(drops)] = array("Q", drops).tobytes()
            off = 8 * len(drops)
        c.n_drops = len(drops)
        c.op = task.op
        c.flags = protocol.FL_WAKE_CALLER if wake_caller else 0
        c.payload_gen = self.payload_gen
        c.result_gen = self.result_gen
        if task.op == protocol.OP_SESSION:
            table = task.table
            memoryview(mem)[off : off + 8 * len(table)] = table.tobytes()
            off += 8 * len(table)
            c.plan_words = len(table)
            c.session_id = task.pool_session.sid
            t = task.target
            c.seg_gen, c.old_seg_gen, c.seg_capacity, c.dst_valid = (t.gen, t.old_gen,
                                                                    t.capacity, t.valid)
            c.n_body = task.old_n_body
        c.kind = write_str(mem, off, task.text)
        c.text_chars = len(task.text)
        self.task = task
        self._post()

    def answered(self) -> bool:
        return self.task is not None and self.control.resp_seq == self.seq

    def encoded_ids(self):
        """A private copy of a stateless task's IDs."""
        return read_ids(self.result.map, 0, self.control.n_ids)

    def report(self) -> tuple[list[tuple[int, int]], list[int]]:
        words = memoryview(self.result.map)[: 8 * self.control.report_words].cast("q")
        try:
            return protocol.read_report(words)
        finally:
            words.release()

    def exit(self) -> None:
        """Ask an idle worker to exit."""
        c = self.control
        c.op = protocol.OP_EXIT
        c.n_drops = 0
        c.flags = 0
        self._post()

    def _post(self) -> None:
        """Publish the request written in the control block, then wake the worker (in this
        order: the request number, not the wake-up, says what is new)."""
        self.seq += 1
        self.control.publish_request(self.seq)
        self.req_sem.release()

    def restart(self) -> None:
        """A fresh worker process takes this slot: clear what the last one left."""
        self.control.clear()
        self.seq = 0
        self.task = None
        self.drops = []
        self.encoded_chars = 0
        self.alive = False
        self.pid = 0  # until the zygote reports the new one: no signal reaches a stale pid

    def close(self) -> None:
        for seg in (self.payload, self.result, self.ctl):
            if seg is not None:
                seg.close()
        self.control.release()
        # the semaphores are closed when the channel is collected: a caller may still be
        # waiting on one (briefly) while the pool closes


def payload_bytes(task, n_drops: int) -> int:
    table = 8 * len(task.table) if task.table is not None else 0
    return 8 * n_drops + table + str_nbytes(task.text)
