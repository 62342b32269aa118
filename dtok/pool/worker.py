"""A pool worker: waits on its request semaphore, does one task, answers in shared memory.

Workers are forked from the zygote, which loaded the tokenizer once and never encoded with
threads, so the vocabulary, tables and encoders are shared copy-on-write. A worker encodes
single-threaded; parallelism comes from the number of workers.

Session state kept here is only what a repair reads: the last ``tail_window`` characters of each
session's text and its body length. The IDs themselves live in the session's shared segment,
which the front end maps and hands to callers without a copy.
"""
from __future__ import annotations

import ctypes
import os
import signal
import time
from collections import OrderedDict

from dtok.pool import protocol as P
from dtok.pool.shm import Segment, semaphore
from dtok.sessions import plan_repair
from dtok_ext.shm import Control, copy_ids, ids_equal, read_str, write_ids


def _die_with_parent() -> None:
    """SIGKILL this process when its parent (the zygote) exits."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Worker:
    def __init__(self, tok, prefix: str, index: int, max_sessions: int) -> None:
        self.tok = tok
        self.prefix = prefix
        self.index = index
        self.ctl_seg = Segment(P.control_name(prefix, index), 0, create=False)
        self.control = Control(self.ctl_seg.map)
        self.req_sem = semaphore(P.request_sem_name(prefix, index), create=False)
        self.done_sem = semaphore(P.done_sem_name(prefix), create=False)
        self.payload: Segment | None = None
        self.payload_gen = -1
        self.result: Segment | None = None
        self.result_gen = -1
        self.max_sessions = max_sessions
        # session id -> (tail text, body length, version)
        self.sessions: OrderedDict[int, tuple[str, int, int]] = OrderedDict()
        self.segments: dict[int, tuple[int, Segment]] = {}  # sid -> (gen, mapping)
        a = tok.admission
        self.prefix_ids, self.suffix_ids = a.prefix, a.suffix
        self.window = P.tail_window(tok.knobs["scan_budget"][-1],
                                    tok.rules.specials.max_len if tok.rules else 0)

    # --- segments -------------------------------------------------------------------------

    def _payload(self) -> memoryview:
        gen = self.control.payload_gen
        if gen != self.payload_gen:
            if self.payload is not None:
                self.payload.close()
            self.payload = Segment(P.payload_name(self.prefix, self.index, gen), 0, False)
            self.payload_gen = gen
        return self.payload.map

    def _result(self):
        gen = self.control.result_gen
        if gen != self.result_gen:
            if self.result is not None:
                self.result.close()
            self.result = Segment(P.result_name(self.prefix, self.index, gen), 0, False)
            self.result_gen = gen
        return self.result.map

    def _segment(self, sid: int, gen: int) -> Segment:
        have = self.segments.get(sid)
        if have is not None and have[0] == gen:
            return have[1]
        return Segment(P.session_name(self.prefix, sid, gen), 0, create=False)

    def _keep_segment(self, sid: int, gen: int, seg: Segment) -> None:
        old = self.segments.get(sid)
        if old is not None and old[1] is not seg:
            old[1].close()
        self.segments[sid] = (gen, seg)

    def _forget(self, sid: int) -> None:
        self.sessions.pop(sid, None)
        seg = self.segments.pop(sid, None)
        if seg is not None:
            seg[1].close()

    # --- the loop -------------------------------------------------------------------------

    def run(self, spin_us: int = 0) -> None:
        """Serve requests until OP_EXIT. After each answer the worker polls its control block
        for ``spin_us`` before sleeping on the semaphore (a request that follows soon is picked
        up without a wake-up); the request number, not the semaphore count, says what is new."""
        c = self.control
        c.pid = os.getpid()
        c.ready = 1
        self.done_sem.release()
        last = 0
        spin = spin_us * 1e-6
        while True:
            seq = c.req_seq
            if seq == last:
                deadline = time.perf_counter() + spin
                while seq == last and time.perf_counter() < deadline:
                    seq = c.req_seq
                if seq == last:
                    self.req_sem.acquire()
                    continue
            last = seq
            op = c.op
            t0 = time.perf_counter()
            try:
                self._drops()
                status = self._do(op)
                c.error = ""
            except Exception as exc:  # reported to the front end, which fails over in process
                status = P.ST_ERROR
                c.error = f"{type(exc).__name__}: {exc}"
            c.status = status
            c.service_ms = (time.perf_counter() - t0) * 1e3
            c.tasks_done = c.tasks_done + 1
            c.publish_response(seq)
            self.done_sem.release()
            if op == P.OP_EXIT:
                return

    def _drops(self) -> None:
        n = self.control.n_drops
        if n:
            view = memoryview(self._payload())[: 8 * n].cast("Q")
            for sid in view.tolist():
                self._forget(sid)
            view.release()

    def _texts(self) -> tuple[str, str]:
        """(old tail, text) from the payload: drops first, then the tail, then the text."""
        c = self.control
        payload = self._payload()
        off = 8 * c.n_drops
        tail = ""
        if c.flags & P.FL_HAS_TAIL:
            tail = read_str(payload, off, c.tail_kind, c.tail_chars)
            off += c.tail_chars * c.tail_kind
        return tail, read_str(payload, off, c.kind, c.text_chars)

    def _do(self, op: int) -> int:
        if op == P.OP_EXIT:
            return P.ST_OK
        if op == P.OP_ENCODE:
            _, text = self._texts()
            parts = self.tok._encode_body(text)
            self.control.n_ids = write_ids(self._result(), 0, parts)
            return P.ST_OK
        if op == P.OP_INIT:
            return self._init()
        if op == P.OP_APPEND:
            return self._append()
        raise ValueError(f"unknown operation {op}")

    def _init(self) -> int:
        c = self.control
        _, text = self._texts()
        sid = c.session_id
        seg = self._segment(sid, c.seg_gen)
        parts = self.tok._encode_body(text)
        n = write_ids(seg.map, 0, [self.prefix_ids, *parts, self.suffix_ids])
        self._keep_segment(sid, c.seg_gen, seg)
        body = n - len(self.prefix_ids) - len(self.suffix_ids)
        self._remember(sid, text, body, c.session_version + 1)
        c.n_ids = body
        c.keep = 0
        return P.ST_OK

    def _append(self) -> int:
        c = self.control
        tail, append = self._texts()
        sid = c.session_id
        if not c.flags & P.FL_HAS_TAIL:
            known = self.sessions.get(sid)
            if known is None or known[2] != c.session_version:
                return P.ST_NEED_TAIL
            tail = known[0]
        window = tail + append
        old_seg = self._segment(sid, c.old_seg_gen)
        n_prefix = len(self.prefix_ids)
        plan = plan_repair(self.tok, window, len(tail), n_prefix + c.n_body,
                           lambda keep, parts: ids_equal(old_seg.map, keep, parts))
        if plan is None:
            return P.ST_NO_CUT
        keep, new_tail = plan
        new_seg = old_seg
        if c.seg_gen != c.old_seg_gen:  # copy on write: callers still hold views of the old IDs
            new_seg = self._segment(sid, c.seg_gen)
            copy_ids(old_seg.map, 0, new_seg.map, 0, keep)
        n = write_ids(new_seg.map, keep, [*new_tail, self.suffix_ids])
        cached = self.segments.get(sid)
        if old_seg is not new_seg and (cached is None or cached[1] is not old_seg):
            old_seg.close()
        self._keep_segment(sid, c.seg_gen, new_seg)
        body = keep - n_prefix + n - len(self.suffix_ids)
        self._remember(sid, window, body, c.session_version + 1)
        c.n_ids = body
        c.keep = keep
        return P.ST_OK

    def _remember(self, sid: int, text: str, body: int, version: int) -> None:
        self.sessions[sid] = (text[-self.window :], body, version)
        self.sessions.move_to_end(sid)
        while len(self.sessions) > self.max_sessions:
            old_sid, _ = self.sessions.popitem(last=False)
            seg = self.segments.pop(old_sid, None)
            if seg is not None:
                seg[1].close()


def main(tok, prefix: str, index: int, max_sessions: int, title: str, spin_us: int = 0) -> None:
    """Entry point in a freshly forked worker process."""
    _die_with_parent()
    try:
        from setproctitle import setproctitle

        setproctitle(title)
    except ImportError:
        pass
    Worker(tok, prefix, index, max_sessions).run(spin_us)
