"""The pool's front end: session table, queues, dispatcher, collector, failover.

Requests enter queues in this process; an idle worker is given the better of its own queue's
head (its sessions' tasks) and the shared queue's head (stateless requests and chunks), the local
one on a tie, and keeps it until done (a running encode is never interrupted). A worker holds at
most one task, so its request "ring" is one slot: the task's integers in the worker's control
block and its text in the worker's payload segment. Results come back in shared memory: a
session's IDs in its own segment, which callers see through read-only views without a copy;
stateless IDs in the worker's result segment, copied once into the caller's buffer.

Any failure of the pool (an error, a worker's death, a timeout) fails the request once and it is
encoded in this process on the route it would have taken without the pool, so the IDs never
depend on the pool.
"""
from __future__ import annotations

import asyncio
import itertools
from array import array
import json
import logging
import math
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
import zlib
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Hashable

import posix_ipc

from dtok.pool import protocol as P
from dtok.pool import shm
from dtok.pool.scheduler import Estimator
from dtok.tokenizer import Tokenizer
from dtok_ext.buffers import IdBuffer
from dtok_ext.heap import TaskHeap
from dtok_ext.shm import Control, MappedIds, read_ids, str_nbytes, write_str

log = logging.getLogger("dtok")

__all__ = ["Pool", "PoolError"]


class PoolError(RuntimeError):
    """The pool could not start, or was used after close()."""


class _Request:
    __slots__ = ("future", "text", "special", "session", "parts", "pending", "failed", "kind",
                 "created")

    def __init__(self, text, special, session, kind):
        self.future: Future = Future()
        self.text = text
        self.special = special
        self.session = session
        self.kind = kind  # "stateless", "chunked", "session"
        self.parts: list | None = None
        self.pending = 0
        self.failed = False
        self.created = time.monotonic()


class _Task:
    __slots__ = ("op", "kind", "req", "index", "text", "tail", "weight", "seq", "key",
                 "arrival", "seg_gen", "old_seg_gen", "capacity", "sent_at")

    def __init__(self, op, kind, req, text, weight, index=0):
        self.op, self.kind, self.req, self.text, self.weight, self.index = (
            op, kind, req, text, weight, index)
        self.tail = ""
        self.seq = 0
        self.key = 0.0
        self.arrival = None  # ms since the pool started, set when first queued
        self.seg_gen = self.old_seg_gen = self.capacity = 0
        self.sent_at = 0.0


class _Session:
    __slots__ = ("key", "sid", "text", "gen", "seg", "ids", "capacity", "n_body", "version",
                 "known_by", "queue", "busy", "nbytes")

    def __init__(self, key, sid):
        self.key, self.sid = key, sid
        self.text: str | None = None
        self.gen = 0
        self.seg: shm.Segment | None = None
        self.ids: MappedIds | None = None
        self.capacity = 0
        self.n_body = 0
        self.version = 0
        self.known_by: int | None = None
        self.queue: deque[_Request] = deque()
        self.busy = False
        self.nbytes = 0


class _Worker:
    __slots__ = ("index", "pid", "ctl", "control", "req_sem", "payload", "payload_gen", "result",
                 "result_gen", "task", "alive", "local", "seq", "drops", "done")

    def __init__(self, index):
        self.index = index
        self.pid = 0
        self.ctl: shm.Segment | None = None
        self.control: Control | None = None
        self.req_sem = None
        self.payload: shm.Segment | None = None
        self.payload_gen = 0
        self.result: shm.Segment | None = None
        self.result_gen = 0
        self.task: _Task | None = None
        self.alive = False
        self.local = TaskHeap()
        self.seq = 0
        self.drops: list[int] = []
        self.done = 0


def _utf8_bound(text: str) -> int:
    """Upper bound on the UTF-8 bytes of text, without encoding it."""
    if text.isascii():
        return len(text)
    kind = str_nbytes(text) // max(1, len(text))
    return len(text) * {1: 2, 2: 3, 4: 4}[kind]


def _key_bytes(key: Hashable) -> bytes:
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8", "surrogatepass")
    return repr(key).encode("utf-8", "surrogatepass")


def _pss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


class _Resources:
    """What must be cleaned up even if the Pool object is never closed (atexit, GC)."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.zygote: subprocess.Popen | None = None
        self.loaded = False  # the zygote has workers to stop only once it has loaded

    def release(self) -> None:
        z = self.zygote
        if z is not None and z.poll() is None:
            try:
                if not self.loaded:
                    z.kill()  # still loading the tokenizer: nothing of its own to clean up
                else:
                    z.stdin.close()  # the zygote kills the workers and unlinks everything
                z.wait(10)
            except Exception:  # noqa: BLE001
                z.kill()
                z.wait()
        shm.unlink_prefix(self.prefix)


class Pool:
    """Worker processes that encode for this process, exactly as the reference would.

    >>> with Pool(workers=2) as pool:
    ...     ids = pool.encode("Hello, world!")
    ...     list(ids) == pool.tokenizer.reference.encode("Hello, world!").ids
    True
    """

    def __init__(self, tokenizer_or_path: Tokenizer | str | os.PathLike | None = None, *,
                 workers: int | None = None, order: str = "sjf",
                 chunk_threshold: int = 131072, chunk_target: int = 65536, max_chunks: int = 16,
                 aging: float = 1.0, request_timeout: float = 60.0, start_timeout: float = 300.0,
                 name: str | None = None, max_sessions: int = 4096,
                 session_bytes: int = 128 << 20, spin_us: int = 1000,
                 chunks_per_worker: int = 1, stateless_queue: str = "shared") -> None:
        if isinstance(tokenizer_or_path, Tokenizer):
            self.tokenizer = tokenizer_or_path
            worker_knobs = {k: v for k, v in tokenizer_or_path.knobs.items()}
        else:
            self.tokenizer = (Tokenizer.default(encoder="reference") if tokenizer_or_path is None
                              else Tokenizer.from_file(tokenizer_or_path, encoder="reference"))
            worker_knobs = {"encoder": "auto"}
        for label, value in (("chunk_threshold", chunk_threshold), ("chunk_target", chunk_target),
                             ("max_chunks", max_chunks), ("max_sessions", max_sessions),
                             ("session_bytes", session_bytes)):
            if type(value) is not int or value < 1:
                raise ValueError(f"{label} must be a positive int, got {value!r}")
        self.n_workers = workers or max(1, len(os.sched_getaffinity(0)))
        self.name = name or f"pool{os.getpid()}"
        self.chunk_threshold, self.chunk_target, self.max_chunks = (
            chunk_threshold, chunk_target, max_chunks)
        self.request_timeout, self.start_timeout = float(request_timeout), float(start_timeout)
        self.max_sessions, self.session_bytes = max_sessions, session_bytes
        self.spin_us = spin_us
        if type(chunks_per_worker) is not int or chunks_per_worker < 1:
            raise ValueError(f"chunks_per_worker must be a positive int, got {chunks_per_worker!r}")
        if stateless_queue not in ("shared", "round_robin"):
            raise ValueError("stateless_queue must be 'shared' or 'round_robin'")
        self.chunks_per_worker = chunks_per_worker
        self.stateless_queue = stateless_queue
        self._rr = itertools.count()
        self.estimator = Estimator(order, aging)
        a = self.tokenizer.admission
        self._prefix_ids, self._suffix_ids = a.prefix, a.suffix
        self._affixes = len(a.prefix) + len(a.suffix)
        self._window = P.tail_window(self.tokenizer.knobs["scan_budget"][-1],
                                     self.tokenizer.rules.specials.max_len
                                     if self.tokenizer.rules else 0)
        self._lock = threading.RLock()
        self._closed = False
        self._shared = TaskHeap()
        self._seq = itertools.count(1)
        self._sids = itertools.count(1)
        self._t0 = time.monotonic()
        self._sessions: OrderedDict[Hashable, _Session] = OrderedDict()
        self._session_bytes_used = 0
        self._retired: list[tuple[shm.Segment, MappedIds | None]] = []
        # session segments created for tasks in flight: (sid, gen) -> segment
        self._pending_segments: dict[tuple[int, int], shm.Segment] = {}
        self._here = self.tokenizer.with_knobs(content_lookup=False)  # failover route
        self._failover = ThreadPoolExecutor(2, thread_name_prefix="dtok-pool-failover")
        self._counts = dict(requests=0, stateless=0, chunked=0, chunks=0, session_hits=0,
                            session_repairs=0, session_inits=0, need_tail=0, no_cut=0,
                            failovers=0, timeouts=0, worker_deaths=0, errors=0, in_process=0)
        self._workers = [_Worker(i) for i in range(self.n_workers)]
        self.prefix = shm.new_prefix()
        self._res = _Resources(self.prefix)
        self._finalizer = weakref.finalize(self, self._res.release)
        self._threads: list[threading.Thread] = []
        self.zygote_pid = None
        self.encoder_name = None
        if not a.admitted:  # not admitted: every request is encoded here by the reference
            self.n_workers = 0
            self._workers = []
            return
        shm.sweep_stale()
        try:
            self._start(worker_knobs)
        except BaseException:
            self.close()
            raise

    # --- startup --------------------------------------------------------------------------

    def _start(self, worker_knobs: dict) -> None:
        self._done_sem = shm.semaphore(P.done_sem_name(self.prefix), create=True)
        for w in self._workers:
            w.ctl = shm.Segment(P.control_name(self.prefix, w.index), 4096, create=True)
            w.control = Control(w.ctl.map)
            w.control.clear()
            w.req_sem = shm.semaphore(P.request_sem_name(self.prefix, w.index), create=True)
            self._grow_payload(w, P.PAYLOAD_MIN)
            self._grow_result(w, P.RESULT_MIN)
        knobs = {**worker_knobs, "threads": 1, "content_lookup": False,
                 "chunk_threshold": self.chunk_threshold, "chunk_target": self.chunk_target,
                 "max_chunks": self.max_chunks,
                 "scan_budget": list(self.tokenizer.knobs["scan_budget"])}
        files = self.tokenizer.files
        config = {"prefix": self.prefix, "name": self.name,
                  "bundled": str(files.path).endswith(".gz"), "path": str(files.path),
                  "sha256": self.tokenizer.admission.sha256, "knobs": knobs,
                  "worker_sessions": max(64, 2 * self.max_sessions // self.n_workers),
                  "spin_us": self.spin_us}
        env = dict(os.environ)
        env.pop("FASTOKENS_INPUT_CACHE", None)
        env.pop("FASTOKENS_SEGMENT_CACHE", None)
        z = subprocess.Popen([sys.executable, "-m", "dtok.pool.zygote"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, env=env, close_fds=True)
        self._res.zygote = z
        z.stdin.write((json.dumps(config) + "\n").encode())
        z.stdin.flush()
        deadline = time.monotonic() + self.start_timeout
        event = self._read_event(deadline)
        if event.get("event") != "loaded":
            raise PoolError(f"pool workers could not load the tokenizer: {event.get('error')}")
        self.zygote_pid = event["pid"]
        self._res.loaded = True
        self.encoder_name = event["encoder"]
        self.estimator.start(self.encoder_name)
        for w in self._workers:
            self._zygote_send({"cmd": "fork", "index": w.index})
        for _ in self._workers:
            ev = self._read_event(deadline)
            if ev.get("event") != "started":
                raise PoolError(f"pool worker did not start: {ev}")
            self._workers[ev["index"]].pid = ev["pid"]
        while not all(w.control.ready for w in self._workers):
            if time.monotonic() > deadline:
                raise PoolError(f"pool workers not ready within start_timeout "
                                f"{self.start_timeout} s")
            try:
                self._done_sem.acquire(0.05)
            except posix_ipc.BusyError:
                pass
        for w in self._workers:
            w.alive = True
        for target, label in ((self._dispatch_loop, "dispatch"), (self._zygote_loop, "zygote")):
            t = threading.Thread(target=target, name=f"dtok-pool-{label}", daemon=True)
            t.start()
            self._threads.append(t)

    def _read_event(self, deadline: float) -> dict:
        import select

        out = self._res.zygote.stdout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PoolError(f"pool did not start within start_timeout {self.start_timeout} s")
            ready, _, _ = select.select([out], [], [], min(left, 0.5))
            if ready:
                line = out.readline()
                if not line:
                    raise PoolError("the pool's zygote exited during startup")
                return json.loads(line)

    def _zygote_send(self, msg: dict) -> None:
        z = self._res.zygote
        if z is not None and z.poll() is None:
            try:
                z.stdin.write((json.dumps(msg) + "\n").encode())
                z.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass

    def _grow_payload(self, w: _Worker, need: int) -> None:
        size = max(need, 2 * (w.payload.size if w.payload else 0), P.PAYLOAD_MIN)
        if w.payload is not None:
            w.payload.close()
            w.payload.unlink()
        w.payload_gen += 1
        w.payload = shm.Segment(P.payload_name(self.prefix, w.index, w.payload_gen), size, True)

    def _grow_result(self, w: _Worker, need: int) -> None:
        size = max(need, 2 * (w.result.size if w.result else 0), P.RESULT_MIN)
        if w.result is not None:
            w.result.close()
            w.result.unlink()
        w.result_gen += 1
        w.result = shm.Segment(P.result_name(self.prefix, w.index, w.result_gen), size, True)

    # --- public API -----------------------------------------------------------------------

    def encode(self, text: str, *, session: Hashable | None = None,
               add_special_tokens: bool = True) -> memoryview:
        """IDs of text, exactly as the reference; see :meth:`submit`.

        The calling thread waits by polling the workers' control blocks for up to ``spin_us``
        (short tasks come back without two thread wake-ups), then sleeps on the Future."""
        fut = self.submit(text, session=session, add_special_tokens=add_special_tokens)
        if not fut.done() and self.spin_us:
            deadline = time.perf_counter() + self.spin_us * 1e-6
            while time.perf_counter() < deadline:
                if self._poll() and fut.done():
                    break
        return fut.result()

    def _poll(self) -> bool:
        """Harvest answers that are already in shared memory; True if there were any."""
        for w in self._workers:
            if w.task is not None and w.control is not None and w.control.resp_seq == w.seq:
                with self._lock:
                    if not self._closed:
                        self._harvest()
                        self._assign()
                return True
        return False

    async def encode_async(self, text: str, *, session: Hashable | None = None,
                           add_special_tokens: bool = True) -> memoryview:
        """:meth:`encode` for an event loop: the loop never waits behind an encode."""
        return await asyncio.wrap_future(
            self.submit(text, session=session, add_special_tokens=add_special_tokens))

    def submit(self, text: str, *, session: Hashable | None = None,
               add_special_tokens: bool = True) -> Future:
        """Queue a request; the Future's result is a read-only int32 memoryview.

        With ``session=key`` the request goes to the key's home worker, and an extension of
        the key's stored text moves only the appended text. Long stateless texts are cut into
        chunks that any worker may take.
        """
        if self._closed:
            raise PoolError("the pool is closed")
        if (type(text) is not str or type(add_special_tokens) is not bool or not self._workers
                or not any(w.alive for w in self._workers)):
            return self._in_process(text, add_special_tokens)
        with self._lock:
            self._counts["requests"] += 1
            if session is not None:
                req = _Request(text, add_special_tokens, None, "session")
                meta = self._sessions.get(session)
                if meta is None:
                    meta = self._sessions[session] = _Session(session, next(self._sids))
                req.session = meta
                meta.queue.append(req)
                if not meta.busy:
                    self._start_session_request(meta)
            elif len(text) >= self.chunk_threshold:
                req = self._submit_chunked(text, add_special_tokens)
            else:
                req = _Request(text, add_special_tokens, None, "stateless")
                self._counts["stateless"] += 1
                self._push_stateless(_Task(P.OP_ENCODE, "stateless", req, text,
                                           self.estimator.weight(text)))
            self._assign()
        return req.future

    def stats(self) -> dict[str, Any]:
        """Workers (pid, alive, busy, tasks done, PSS), queues, counters, estimates."""
        with self._lock:
            workers = [{"index": w.index, "pid": w.pid, "alive": w.alive,
                        "busy": w.task is not None, "tasks_done": w.done,
                        "queued_local": len(w.local)} for w in self._workers]
            out = {"name": self.name, "prefix": self.prefix, "encoder": self.encoder_name,
                   "order": self.estimator.order, "workers": workers,
                   "queued_shared": len(self._shared), "sessions": len(self._sessions),
                   "session_bytes": self._session_bytes_used, **self._counts,
                   "per_char_ms": dict(self.estimator.b)}
        for w in out["workers"]:
            w["pss_mb"] = _pss_mb(w["pid"]) if w["alive"] else None
        out["zygote_pss_mb"] = _pss_mb(self.zygote_pid) if self.zygote_pid else None
        return out

    def close(self) -> None:
        """Stop the workers and the zygote; unlink every segment and semaphore of the pool.

        Views returned earlier stay valid (their mappings live until they are released)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for w in self._workers:
                for task in w.local.drain():
                    self._cancel(task.req)
            for task in self._shared.drain():
                self._cancel(task.req)
            for meta in self._sessions.values():
                for req in meta.queue:
                    self._cancel(req)
                meta.queue.clear()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(w.task for w in self._workers if w.alive):
            time.sleep(0.005)
        with self._lock:
            for w in self._workers:
                if w.alive and w.task is None:
                    c = w.control
                    c.op = P.OP_EXIT
                    c.n_drops = 0
                    w.seq += 1
                    c.publish_request(w.seq)
                    w.req_sem.release()
                elif w.task is not None:
                    self._fail(w.task.req, "pool closed")
        self._zygote_send({"cmd": "exit"})
        z = self._res.zygote
        if z is not None:
            try:
                z.wait(10)
            except subprocess.TimeoutExpired:
                z.kill()
                z.wait()
        for t in self._threads:
            t.join(5)
        with self._lock:
            for meta in list(self._sessions.values()):
                self._drop_session(meta, notify=False)
            self._reap_retired(force=True)
            for w in self._workers:
                w.alive = False
                for seg in (w.payload, w.result, w.ctl):
                    if seg is not None:
                        seg.close()
                if w.control is not None:
                    w.control.release()
        self._failover.shutdown(wait=True)
        self._finalizer()  # unlink every name of the pool (idempotent)

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- routing (caller holds the lock) --------------------------------------------------

    def _arrival_ms(self) -> float:
        return (time.monotonic() - self._t0) * 1e3

    def _push(self, worker: _Worker | None, task: _Task) -> None:
        task.seq = next(self._seq)
        if task.arrival is None:  # a task queued again (a tail was needed) keeps its place
            task.arrival = self._arrival_ms()
        task.key = self.estimator.key(task.kind, task.weight, task.arrival)
        (worker.local if worker is not None else self._shared).push(task.key, task.seq, task)

    def _rekey(self) -> None:
        """Recompute every queued task's key with the current estimates."""
        for heap in [self._shared] + [w.local for w in self._workers]:
            for task in heap.drain():
                task.key = self.estimator.key(task.kind, task.weight, task.arrival)
                heap.push(task.key, task.seq, task)

    def _push_stateless(self, task: _Task) -> None:
        """A whole stateless request: the shared queue, or (the per-worker FIFO design of the
        scheduling comparison) the next live worker's own queue, round robin."""
        live = self._live()
        if self.stateless_queue == "round_robin" and live:
            self._push(live[next(self._rr) % len(live)], task)
        else:
            self._push(None, task)

    def _live(self) -> list[_Worker]:
        return [w for w in self._workers if w.alive]

    def _home(self, meta: _Session) -> _Worker | None:
        live = self._live()
        if not live:
            return None
        return live[zlib.crc32(_key_bytes(meta.key)) % len(live)]

    def _submit_chunked(self, text: str, special: bool) -> _Request:
        n = len(text)
        live = max(1, len(self._live()))
        k = min(math.ceil(n / self.chunk_target), self.max_chunks, live * self.chunks_per_worker)
        cuts = self.tokenizer.rules.plan(text, k, max(16, min(1024, n // (4 * k))),
                                         self.tokenizer.knobs["scan_budget"]) if k > 1 else []
        if not cuts:
            req = _Request(text, special, None, "stateless")
            self._counts["stateless"] += 1
            self._push_stateless(_Task(P.OP_ENCODE, "stateless", req, text,
                                       self.estimator.weight(text)))
        else:
            req = _Request(text, special, None, "chunked")
            bounds = [0, *cuts, n]
            req.parts = [None] * (len(bounds) - 1)
            req.pending = len(req.parts)
            self._counts["chunked"] += 1
            self._counts["chunks"] += len(req.parts)
            for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
                piece = text[a:b]
                self._push(None, _Task(P.OP_ENCODE, "chunk", req, piece,
                                       self.estimator.weight(piece), index=i))
        return req

    def _start_session_request(self, meta: _Session) -> None:
        """Start the oldest queued request of a session (one at a time per session)."""
        while meta.queue:
            req = meta.queue.popleft()
            text, old = req.text, meta.text
            if old is not None and len(text) == len(old) and text == old:
                self._counts["session_hits"] += 1
                self._resolve(req, self._session_view(meta, req.special))
                continue
            home = self._home(meta)
            if home is None:
                self._fail(req, "no live worker")
                continue
            meta.busy = True
            if old is not None and meta.ids is not None and text.startswith(old):
                task = self._append_task(meta, req, home)
            else:
                task = self._init_task(meta, req)
            self._push(home, task)
            return
        meta.busy = False

    def _init_task(self, meta: _Session, req: _Request) -> _Task:
        capacity = P.max_ids(_utf8_bound(req.text), self._affixes)
        capacity += max(4096, capacity >> 3)  # room for appends before a new segment
        task = _Task(P.OP_INIT, "init", req, req.text, self.estimator.weight(req.text))
        task.seg_gen = self._new_segment(meta, capacity)
        task.old_seg_gen = task.seg_gen
        task.capacity = capacity
        return task

    def _append_task(self, meta: _Session, req: _Request, home: _Worker) -> _Task:
        append = req.text[len(meta.text):]
        task = _Task(P.OP_APPEND, "append", req, append, self.estimator.weight(append))
        if meta.known_by != home.index:
            task.tail = meta.text[-self._window:]
        # bound on the new IDs: kept IDs + re-encoded old tail + append (>= 1 byte per token)
        need = meta.n_body + self._affixes + 4 * (self._window + len(append))
        task.old_seg_gen = meta.gen
        if need <= meta.capacity and (meta.ids is None or meta.ids.exports == 0):
            task.seg_gen, task.capacity = meta.gen, meta.capacity
        else:  # a view is alive or the segment is full: the worker writes a new one
            capacity = need + max(4096, need >> 3)
            task.seg_gen = self._new_segment(meta, capacity)
            task.capacity = capacity
        return task

    def _new_segment(self, meta: _Session, capacity: int) -> int:
        """A fresh segment for a session's next IDs; its generation number."""
        gen = meta.gen + 1
        while (meta.sid, gen) in self._pending_segments:
            gen += 1
        seg = shm.Segment(P.session_name(self.prefix, meta.sid, gen), 4 * capacity, True)
        self._pending_segments[(meta.sid, gen)] = seg
        return gen

    # --- dispatch (caller holds the lock) -------------------------------------------------

    def _assign(self) -> None:
        for w in self._workers:
            if not w.alive or w.task is not None:
                continue
            lk, sk = w.local.peek_key(), self._shared.peek_key()
            if lk is None and sk is None:
                continue
            task = w.local.pop() if sk is None or (lk is not None and lk <= sk) else \
                self._shared.pop()
            if task.req.failed:
                self._task_dropped(task)
                continue
            self._send(w, task)

    def _send(self, w: _Worker, task: _Task) -> None:
        c = w.control
        drops, w.drops = w.drops, []
        tail, text = task.tail, task.text
        need = 8 * len(drops) + str_nbytes(tail) + str_nbytes(text)
        if need > w.payload.size:
            self._grow_payload(w, need)
        mem = w.payload.map
        off = 0
        if drops:
            memoryview(mem)[: 8 * len(drops)] = array("Q", drops).tobytes()
            off = 8 * len(drops)
        c.flags = 0
        c.tail_chars = 0
        if tail:
            c.tail_kind = write_str(mem, off, tail)
            c.tail_chars = len(tail)
            c.flags = P.FL_HAS_TAIL
            off += str_nbytes(tail)
        c.kind = write_str(mem, off, text)
        c.text_chars = len(text)
        c.n_drops = len(drops)
        c.op = task.op
        c.payload_gen = w.payload_gen
        if task.op == P.OP_ENCODE:
            need_out = 4 * P.max_ids(_utf8_bound(text), 0)
            if need_out > w.result.size:
                self._grow_result(w, need_out)
            c.result_gen = w.result_gen
        else:
            meta = task.req.session
            c.session_id = meta.sid
            c.seg_gen = task.seg_gen
            c.old_seg_gen = task.old_seg_gen
            c.seg_capacity = task.capacity
            c.n_body = meta.n_body
            c.session_version = meta.version
        w.seq += 1
        w.task = task
        task.sent_at = time.monotonic()
        c.publish_request(w.seq)
        w.req_sem.release()

    def _harvest(self) -> None:
        for w in self._workers:
            if w.alive and w.task is not None and w.control.resp_seq == w.seq:
                task, w.task = w.task, None
                w.done += 1
                self._complete(w, task)

    def _complete(self, w: _Worker, task: _Task) -> None:
        c = w.control
        status = c.status
        if self.estimator.observe(task.kind, task.weight, c.service_ms):
            self._rekey()
        req = task.req
        if status == P.ST_ERROR:
            self._counts["errors"] += 1
            self._task_dropped(task)
            self._fail(req, c.error)
            return
        if task.op == P.OP_ENCODE:
            if req.failed:
                return
            ids = memoryview(w.result.map)[: 4 * c.n_ids].cast("i")
            if req.kind == "stateless":
                affix = (self._prefix_ids, self._suffix_ids) if req.special else ((), ())
                out = IdBuffer.concat((ids,), affix[0], affix[1])
                ids.release()
                self._resolve(req, memoryview(out))
                return
            req.parts[task.index] = read_ids(w.result.map, 0, c.n_ids)
            ids.release()
            req.pending -= 1
            if req.pending == 0:
                affix = (self._prefix_ids, self._suffix_ids) if req.special else ((), ())
                self._resolve(req, memoryview(IdBuffer.concat(req.parts, *affix)))
            return
        meta = req.session
        if status == P.ST_NEED_TAIL:
            self._counts["need_tail"] += 1
            task.tail = meta.text[-self._window:]
            self._push(w, task)
            return
        if status == P.ST_NO_CUT:
            self._counts["no_cut"] += 1
            self._task_dropped(task)
            self._push(w, self._init_task(meta, req))
            return
        self._accept_session(meta, task, w, c.n_ids)
        self._counts["session_inits" if task.op == P.OP_INIT else "session_repairs"] += 1
        self._resolve(req, self._session_view(meta, req.special))
        self._start_session_request(meta)
        self._evict()

    def _accept_session(self, meta: _Session, task: _Task, w: _Worker, n_body: int) -> None:
        if task.seg_gen != meta.gen or meta.seg is None:
            self._retire(meta)
            meta.seg = self._pending_segments.pop((meta.sid, task.seg_gen))
            meta.gen = task.seg_gen
            meta.ids = MappedIds(meta.seg.map, task.capacity)
            meta.capacity = task.capacity
        meta.text = task.req.text
        meta.n_body = n_body
        meta.ids.length = n_body + self._affixes
        meta.version += 1
        meta.known_by = w.index
        size = sys.getsizeof(meta.text) + 4 * meta.ids.length
        self._session_bytes_used += size - meta.nbytes
        meta.nbytes = size
        self._sessions.move_to_end(meta.key)

    def _session_view(self, meta: _Session, special: bool) -> memoryview:
        if special:
            return meta.ids.view()
        return meta.ids.view(len(self._prefix_ids), meta.ids.length - len(self._suffix_ids))

    def _task_dropped(self, task: _Task) -> None:
        """A task that will not complete: release a segment created for it."""
        if task.op == P.OP_ENCODE:
            return
        seg = self._pending_segments.pop((task.req.session.sid, task.seg_gen), None)
        if seg is not None:
            seg.close()
            seg.unlink()

    # --- failure ---------------------------------------------------------------------------

    def _resolve(self, req: _Request, value) -> None:
        if not req.future.done():
            req.future.set_result(value)

    def _cancel(self, req: _Request) -> None:
        if not req.future.done():
            req.failed = True
            req.future.set_exception(PoolError("the pool was closed before this request ran"))

    def _fail(self, req: _Request, reason: str) -> None:
        """The first failure of a request: encode it in this process, exactly; drop its other
        answers. A session's state is dropped (its IDs may be half written)."""
        if req.failed or req.future.done():
            return
        req.failed = True
        self._counts["failovers"] += 1
        log.warning("dtok pool: request failed over to in-process encoding: %s", reason)
        meta = req.session
        if meta is not None:
            self._retire(meta)
            meta.text, meta.known_by, meta.n_body = None, None, 0
            meta.version += 1
        fut = req.future

        def run():
            try:
                fut.set_result(self._encode_here(req.text, req.special))
            except BaseException as exc:  # noqa: BLE001 - the reference's own error
                fut.set_exception(exc)
            finally:
                if meta is not None:
                    with self._lock:
                        self._start_session_request(meta)

        self._failover.submit(run)

    def _encode_here(self, text, special):
        """The in-process route (no session state): the request's exact IDs, or the
        reference's own exception."""
        return self._here.encode(text, add_special_tokens=special)

    def _in_process(self, text, special) -> Future:
        fut: Future = Future()
        self._counts["in_process"] += 1
        try:
            fut.set_result(self._encode_here(text, special))
        except BaseException as exc:  # noqa: BLE001
            fut.set_exception(exc)
        return fut

    def _on_death(self, index: int) -> None:
        w = self._workers[index]
        if not w.alive:
            return
        w.alive = False
        self._counts["worker_deaths"] += 1
        log.warning("dtok pool: worker %d (pid %d) died; retired", index, w.pid)
        if w.task is not None:
            task, w.task = w.task, None
            self._task_dropped(task)
            self._fail(task.req, f"worker {index} died")
        for task in w.local.drain():  # re-home: its sessions' next home is another live worker
            meta = task.req.session
            if meta is None:
                self._push_stateless(task)
                continue
            home = self._home(meta)
            if home is None:
                self._task_dropped(task)
                self._fail(task.req, "no live worker")
            else:
                if task.op == P.OP_APPEND and not task.tail:
                    task.tail = meta.text[-self._window:]
                self._push(home, task)
        for meta in self._sessions.values():
            if meta.known_by == index:
                meta.known_by = None
        self._assign()

    def _check_timeouts(self) -> None:
        now = time.monotonic()
        for w in self._workers:
            if w.alive and w.task is not None and now - w.task.sent_at > self.request_timeout:
                self._counts["timeouts"] += 1
                try:
                    os.kill(w.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._on_death(w.index)

    # --- segments and eviction (caller holds the lock) -------------------------------------

    def _retire(self, meta: _Session) -> None:
        if meta.seg is not None:
            meta.seg.unlink()
            self._retired.append((meta.seg, meta.ids))
            meta.seg, meta.ids, meta.capacity = None, None, 0
        self._reap_retired()

    def _reap_retired(self, force: bool = False) -> None:
        keep = []
        for seg, ids in self._retired:
            if ids is not None and ids.exports:
                if not force:
                    keep.append((seg, ids))
                continue  # a caller still holds a view: the mapping lives as long as it does
            if ids is not None:
                ids.release()
            seg.close()
        self._retired = keep

    def _drop_session(self, meta: _Session, notify: bool = True) -> None:
        self._sessions.pop(meta.key, None)
        self._session_bytes_used -= meta.nbytes
        meta.nbytes = 0
        self._retire(meta)
        if notify and meta.known_by is not None and self._workers[meta.known_by].alive:
            self._workers[meta.known_by].drops.append(meta.sid)
        meta.text = None

    def _evict(self) -> None:
        while (len(self._sessions) > self.max_sessions
               or self._session_bytes_used > self.session_bytes):
            victim = next((m for m in self._sessions.values() if not m.busy and not m.queue),
                          None)
            if victim is None:
                return
            self._drop_session(victim)

    # --- background threads ----------------------------------------------------------------

    def _dispatch_loop(self) -> None:
        while not self._closed:
            try:
                self._done_sem.acquire(0.02)
            except posix_ipc.BusyError:
                pass
            except posix_ipc.ExistentialError:
                return
            with self._lock:
                if self._closed:
                    return
                self._harvest()
                self._check_timeouts()
                self._assign()

    def _zygote_loop(self) -> None:
        out = self._res.zygote.stdout
        for line in out:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("event") == "dead":
                with self._lock:
                    self._harvest()  # it may have answered before dying
                    self._on_death(ev["index"])
        with self._lock:  # the zygote is gone: so are the workers
            if not self._closed:
                for w in self._workers:
                    self._on_death(w.index)
