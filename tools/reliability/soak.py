"""A soak: a dtok.Pool and an in-process dtok.Tokenizer in one front end under open-loop mixed
load for N minutes, with faults injected at random; every answer the reference re-encodes must
be identical, every request answered once, nothing left in /dev/shm.

    python tools/reliability/soak.py --minutes 30 [--rate 8] [--workers 2] [--seed 1] [--out DIR]

Three processes of its own: this one (the controller: faults, the reference check, the report),
the front end (``--front-end``: the pool, the tokenizer, the load, memory samples each second)
and, now and then, a process that fills /dev/shm. The controller runs in a private mount
namespace with its own small tmpfs on /dev/shm (``unshare -m``, as tests/test_pool_hardening.py
does), so filling it touches no other process on the machine; without the namespace the fill
fault is left out (the report says so).

Load (Poisson arrivals, never waiting for answers): keyed appends and edits and unkeyed
content-lookup turns through the pool and through the tokenizer, stateless 1M-character bursts
(chunked), batches, ``encode_list``, and tokenizer sessions dropped while their request is in
flight. Faults: a worker SIGKILLed; a worker SIGSTOPped past ``request_timeout`` (the pool's
timeout kills it) and continued; the zygote SIGKILLed (the front end then starts a new pool,
as a server would: dtok does not restart its zygote); /dev/shm filled by another process for a
while; the front end SIGKILLed, alone or with its zygote and workers (then only the restarted
front end's sweep can remove their names), and restarted.

Checks: every chunked answer (a text of at least ``chunk_threshold`` characters) and
``--check`` (default 10%) of the others are written to a spool with a CRC of their IDs; the
controller re-encodes them with the reference (the real ``tokenizers``) and counts differences
(an exception where the reference gives IDs counts as one). Unanswered: a request of a front end
that stopped cleanly without an answer, or of a killed one that had waited more than
``--patience`` seconds when it was killed (younger ones died with their client and are counted
apart). Leaked: names in /dev/shm of a pool after its front end closed it, of a killed front
end's pools once its successor started, and of any pool at the end. The last line is
``soak: N differences, N unanswered, N leaked``.

Memory: each second the front end samples its RSS and PSS, malloc's live bytes (``heap``:
glibc's mallinfo2, in use plus mmapped chunks; RSS also holds pages glibc keeps after a free)
and what it holds by design (``held_mib``: the tokenizer's and the pool's stores as they account
them against ``session_bytes``, the client's conversation texts, the texts of requests not
answered yet and of answers waiting for the spool); workers' RSS and PSS too. The report gives,
per front-end incarnation, growth and slope after warm-up of each, and ``rss_growth_beyond_held``
(with ``--mem-detail`` also ``malloc_free_growth``: how much of it is free memory glibc keeps
in its arenas).
At a clean stop the front end closes its pools, clears its sessions and texts and samples again
(``front_end_end_probe_mib``): malloc's live bytes back at their level after loading mean nothing
was kept. Bisecting: ``--kinds``, ``--faults`` (``''``: none), ``--mem-detail`` (every 5 s:
anonymous, /dev/shm and file mappings, malloc arenas, gc objects, threads) and ``--trim-every``
(malloc_trim(0) now and then: RSS after it is what is live). Which allocations stay live (private
flags, with ``--faults`` leaving out the front-end kills): ``--_heaptrack --_exit-after S`` runs
the front end under heaptrack and ends it S seconds into the load without freeing anything, so
heaptrack's "leaked" bytes are what it held then; two runs (an early and a late S) and
``heaptrack_print -f LATE.zst -d EARLY.zst -l`` give what grew, by allocation site.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from array import array
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHM = Path("/dev/shm")
SHARED = Path(os.environ.get("DTOK_SHARED", ROOT.parent / "shared"))

# request kinds and their weights in the arrival mix
KINDS = {"pool_keyed": 22, "pool_lookup": 12, "pool_burst": 0.6, "pool_batch": 4,
         "pool_list": 10, "tok_keyed": 14, "tok_lookup": 8, "tok_batch": 4, "tok_drop": 5}
# faults and their weights
FAULTS = {"worker_kill": 5, "worker_stop": 3, "zygote_kill": 1.2, "shm_fill": 2,
          "front_end_kill": 1, "front_end_kill_all": 0.6}
CALLERS = 24  # the front end's caller threads (an executor, as a server's)
BURST_CHARS = 1_000_000
CONV_CAP = 250_000  # a conversation this long starts over under a new key
POOL_KNOBS = dict(max_sessions=16, session_bytes=48 << 20)
POOL_COUNTERS = ("requests", "timeouts", "worker_deaths", "replacements", "failovers",
                 "in_process", "shm_full", "plan_failures", "errors")


def now() -> float:
    return time.time()


def mem_of(pid: int) -> tuple[float, float] | None:
    """(RSS, PSS) in MiB of a process, from smaps_rollup."""
    rss = pss = None
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1]) / 1024
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1]) / 1024
    except OSError:
        return None
    return None if rss is None or pss is None else (round(rss, 1), round(pss, 1))


def mem_detail(pid: int) -> dict:
    """Where a process's resident memory is, from /proc/PID/smaps (MiB, and mapping counts):
    anonymous (heap and mmap'd), /dev/shm segments, other files; the anonymous mappings of 8 MiB
    or more by size (``big_anon``: fastokens maps a 16 MiB table per thread and instance) and the
    process's threads, its native ones included (``os_threads``)."""
    out = {"anon": 0.0, "shm": 0.0, "file": 0.0, "n_shm": 0, "n_anon": 0, "n_maps": 0}
    big: dict[str, list] = {}  # anonymous mappings of 8 MiB or more: size -> [count, RSS]
    kind = size = None
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                head = line.split(None, 6)
                if "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's header
                    path = head[5].strip() if len(head) > 5 else ""
                    lo, hi = (int(x, 16) for x in head[0].split("-"))
                    size = (hi - lo) >> 20
                    out["n_maps"] += 1
                    if path.startswith("/dev/shm/"):
                        kind = "shm"
                        out["n_shm"] += 1
                    elif path == "" or path.startswith("["):
                        kind = "anon"
                        out["n_anon"] += 1
                    else:
                        kind = "file"
                elif head[0] == "Rss:":
                    out[kind] += int(head[1]) / 1024
                    if kind == "anon" and size >= 8:
                        entry = big.setdefault(f"{size}M", [0, 0.0])
                        entry[0] += 1
                        entry[1] = round(entry[1] + int(head[1]) / 1024, 1)
        out["os_threads"] = len(os.listdir(f"/proc/{pid}/task"))  # Rust's threads too
    except OSError:
        return {}
    out["big_anon"] = big
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in out.items()}


def malloc_mib() -> dict:
    """glibc's view of this process's heap (mallinfo2): in use, free but kept, mmap'd chunks."""
    import ctypes

    class Info(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks",
                    "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = Info
    except (OSError, AttributeError):
        return {}
    i = libc.mallinfo2()
    mib = 1 << 20
    return {"arena": round(i.arena / mib, 1), "in_use": round(i.uordblks / mib, 1),
            "free": round(i.fordblks / mib, 1), "mmapped": round(i.hblkhd / mib, 1)}


def release_free_heap() -> None:
    """malloc_trim(0): glibc gives back the free pages of its heap (glibc only)."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


# threads that run encodes in the front end: the soak's callers, the tokenizer's and the pool's
ENCODING_THREADS = ("soak-call", "dtok-encode", "dtok-pool-failover")


def thread_state_mib(tok) -> float:
    """RSS one thread adds once it has encoded, measured on fresh threads (the least of 3):
    fastokens 0.3.5 keeps ~16 MiB of state per thread that called it, for as long as the
    thread lives."""
    tries = []
    for _ in range(3):
        ready, done = threading.Event(), threading.Event()

        def run():
            tok.encode("a thread's first encode, on the fast encoder " * 40)
            ready.set()
            done.wait()

        before = mem_of(os.getpid())[0]
        th = threading.Thread(target=run)
        th.start()
        ready.wait()
        tries.append(mem_of(os.getpid())[0] - before)
        done.set()
        th.join()
    return max(0.0, round(min(tries), 1))


def copy_ids(view: memoryview) -> array:
    a = array("i")
    a.frombytes(view.tobytes())
    return a


def digest(result) -> tuple[int, int]:
    """CRC32 and count of IDs: a view, a list, or (a batch) a list of those."""
    if isinstance(result, list) and result and not isinstance(result[0], int):
        crc, n = 0, 0
        for r in result:
            b = r if isinstance(r, (memoryview, array)) else array("i", r)
            crc, n = zlib.crc32(b, crc), n + len(r)
        return crc, n
    b = result if isinstance(result, (memoryview, array)) else array("i", result)
    return zlib.crc32(b), len(result)


def load_corpus(limit_chars: int = 6_000_000) -> list[str]:
    """Real text: the shared corpus when present, else the package's demo files."""
    import gzip

    files = sorted((SHARED / "corpus").rglob("*.txt")) if (SHARED / "corpus").is_dir() else []
    rng = random.Random(7)
    rng.shuffle(files)
    out, total = [], 0
    for p in files:
        t = p.read_text(encoding="utf-8", errors="replace")
        out.append(t)
        total += len(t)
        if total > limit_chars:
            break
    if not out:
        for p in sorted((ROOT / "dtok" / "data" / "demo").glob("*.gz")):
            out.append(gzip.decompress(p.read_bytes()).decode("utf-8"))
    return out


# --- the front end ---------------------------------------------------------------------------


class Log:
    """JSON lines, flushed at once (the process may be SIGKILLed at any moment)."""

    def __init__(self, path: Path) -> None:
        self.f = open(path, "a", buffering=1)
        self.lock = threading.Lock()

    def write(self, **rec) -> None:
        line = json.dumps(rec, separators=(",", ":"))
        with self.lock:
            self.f.write(line + "\n")


class Conversation:
    def __init__(self, rng: random.Random, corpus: "Texts", tag: str, keyed: bool) -> None:
        self.rng, self.corpus, self.tag, self.keyed = rng, corpus, tag, keyed
        self.n = 0
        self.restart()

    def restart(self) -> None:
        self.n += 1
        self.key = f"{self.tag}-{self.n}" if self.keyed else None
        self.text = self.corpus.piece(self.rng.randint(5_000, 30_000))

    def next(self) -> str:
        r = self.rng
        if len(self.text) > CONV_CAP:
            self.restart()
        elif r.random() < 0.7 or len(self.text) < 6000:
            self.text += self.corpus.piece(r.randint(200, 4000))
        else:  # an edit: a span replaced somewhere in the text
            pos = r.randrange(len(self.text))
            self.text = (self.text[:pos] + self.corpus.piece(r.randint(1, 300))
                         + self.text[pos + r.randint(0, 300):])
        return self.text


class Texts:
    def __init__(self, corpus: list[str], rng: random.Random) -> None:
        self.corpus, self.rng = corpus, rng

    def piece(self, n: int) -> str:
        out, left = [], n
        while left > 0:
            t = self.rng.choice(self.corpus)
            a = self.rng.randrange(max(1, len(t) - min(left, len(t)) + 1))
            s = t[a : a + left]
            out.append(s)
            left -= len(s)
        return "".join(out)


class PoolHolder:
    """The front end's current pool; a pool that lost every worker (its zygote was killed) is
    replaced by a new one, as a server would, and closed once its requests are answered."""

    def __init__(self, make, log: Log) -> None:
        self.make, self.log = make, log
        self.current = None
        self.prefixes: list[str] = []
        self.outstanding: dict = {}
        self.lock = threading.Lock()
        self.starting = False
        self.dead_since = None
        self.start()

    def start(self) -> None:
        with self.lock:
            if self.starting:
                return
            self.starting = True

        def run():
            while True:
                try:
                    pool = self.make()
                    break
                except Exception as exc:  # noqa: BLE001 - e.g. /dev/shm full: try again
                    self.log.write(t="pool_start_failed", at=now(), error=f"{type(exc).__name__}: {exc}")
                    time.sleep(2)
            with self.lock:
                self.current = pool
                self.outstanding[pool] = 0
                self.prefixes.append(pool.prefix)
                self.starting = False
                self.dead_since = None
            self.log.write(t="pool_started", at=now(), prefix=pool.prefix)

        threading.Thread(target=run, daemon=True).start()

    def take(self):
        with self.lock:
            pool = self.current
            if pool is not None:
                self.outstanding[pool] += 1
            return pool

    def give(self, pool) -> None:
        with self.lock:
            if pool in self.outstanding:  # not if retire() gave up waiting and let it go
                self.outstanding[pool] -= 1

    def supervise(self) -> None:
        """Once a second: a pool with no live or starting worker for 3 s is retired."""
        pool = self.current
        if pool is not None:
            s = pool.stats()
            dead = not any(w["alive"] or w["starting"] for w in s["workers"])
            if not dead:
                self.dead_since = None
            elif self.dead_since is None:
                self.dead_since = now()
            elif now() - self.dead_since > 3:
                with self.lock:
                    self.current = None
                self.log.write(t="pool_retired", at=now(), prefix=pool.prefix)
                threading.Thread(target=self.retire, args=(pool,), daemon=True).start()
                self.start()

    def retire(self, pool, wait: float = 120) -> None:
        deadline = now() + wait
        while now() < deadline and self.outstanding.get(pool, 0) > 0:
            time.sleep(0.2)
        pool.close()
        with self.lock:  # let go of it (and of its tokenizer) as a server would
            del self.outstanding[pool]


def front_end(args) -> None:
    import dtok
    from dtok.pool import shm

    out = Path(args.out)
    inc = args.incarnation
    log = Log(out / f"fe-{inc}.jsonl")
    internal = {"errors": 0}

    class Count(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.ERROR:
                internal["errors"] += 1
                log.write(t="internal", at=now(), msg=record.getMessage()[:300])

    logging.getLogger("dtok").addHandler(Count())

    def hook(a):
        internal["errors"] += 1
        log.write(t="internal", at=now(), msg=f"{a.exc_type.__name__}: {a.exc_value}"[:300])

    threading.excepthook = hook
    if args._tracemalloc:
        import tracemalloc

        tracemalloc.start()
    rng = random.Random(args.seed * 1000 + inc)
    texts = Texts(load_corpus(), rng)
    tok = dtok.Tokenizer.default(**POOL_KNOBS)
    chunk_threshold = tok.knobs["chunk_threshold"]

    def make_pool():
        # each pool gets its own session state but the tokenizer's loaded encoders, as dtok's
        # hooks build theirs: a second load would cost a second share of the fast encoder's
        # state in every thread that encodes through both (fastokens 0.3.5: 16 MiB per thread
        # and instance, and 32 MiB per instance; tests/test_memory.py), which a caller thread
        # answering a pool request in process (no worker up) picks up minutes into the run
        return dtok.Pool(tok.with_knobs(), workers=args.workers,
                         request_timeout=args.request_timeout, name=f"soak{inc}", **POOL_KNOBS)

    per_thread = thread_state_mib(tok)  # before any other thread runs: the least of 3 tries
    pools = PoolHolder(make_pool, log)
    executor = ThreadPoolExecutor(CALLERS, thread_name_prefix="soak-call")
    spool = out / "spool"
    spool_q: list = []
    spool_cv = threading.Condition()
    pending: dict[str, tuple[str, float]] = {}
    pending_lock = threading.Lock()
    stop = threading.Event()
    convs = {k: [Conversation(rng, texts, f"{inc}-{k}-{i}", keyed=not k.endswith("lookup"))
                 for i in range(12)]
             for k in ("pool_keyed", "pool_lookup", "pool_list", "tok_keyed", "tok_lookup",
                       "tok_drop")}
    seq = iter(range(1 << 62))
    corrupt = args._corrupt_every  # private control: flip one ID of every n-th answer

    def answered(rid, kind, special, tx, fut, pool=None):
        if pool is not None:
            pools.give(pool)
        with pending_lock:
            entry = pending.pop(rid, None)
        if entry is None:
            log.write(t="twice", rid=rid, at=now())
            return
        exc = fut.exception()
        lat = round((now() - entry[1]) * 1000, 2)
        if exc is not None:
            log.write(t="a", rid=rid, at=now(), lat=lat, err=f"{type(exc).__name__}: {exc}"[:200])
            return
        crc, n = digest(fut.result())
        if corrupt and int(rid.split("-")[1].split(".")[0]) % corrupt == 0:
            crc ^= 1
        long = any(len(t) >= chunk_threshold for t in tx)
        check = long or rng.random() < args.check
        log.write(t="a", rid=rid, at=now(), lat=lat, n=n, chk=int(check), long=int(long))
        if check:
            with spool_cv:
                spool_q.append({"rid": rid, "kind": kind, "special": special, "texts": tx,
                                "crc": crc, "n": n})
                spool_cv.notify()

    def spooler():
        while True:
            with spool_cv:
                while not spool_q:
                    spool_cv.wait()
                item = spool_q.pop(0)
            if item is None:
                return
            tmp = spool / f".{item['rid']}.tmp"
            tmp.write_text(json.dumps(item))
            tmp.rename(spool / f"{item['rid']}.json")

    spool_thread = threading.Thread(target=spooler, daemon=True)
    spool_thread.start()

    def issue(kind: str) -> None:
        rid = f"{inc}-{next(seq)}"
        special = rng.random() < 0.8
        pool = None
        if kind.startswith("pool"):
            pool = pools.take()
            if pool is None:
                log.write(t="skip", kind=kind, at=now())
                return
        if kind in ("pool_keyed", "pool_lookup", "tok_keyed", "tok_lookup", "tok_drop", "pool_list"):
            conv = rng.choice(convs[kind])
            tx = [conv.next()]
            key = conv.key
        elif kind == "pool_burst":
            tx, key = [texts.piece(BURST_CHARS)], None
        else:  # batches
            tx, key = [texts.piece(rng.randint(100, 20_000)) for _ in range(8)], None
        with pending_lock:
            pending[rid] = (kind, now(), sum(map(len, tx)))
        log.write(t="s", rid=rid, kind=kind, at=now(), chars=sum(map(len, tx)))
        if kind == "pool_batch":  # each text its own request, submitted together
            with pending_lock:
                pending.pop(rid)
            for j, t in enumerate(tx):
                sub = f"{rid}.{j}"
                with pending_lock:
                    pending[sub] = (kind, now(), len(t))
                if j:
                    pools.take()
                f = pool.submit(t, add_special_tokens=special)
                f.add_done_callback(lambda f, sub=sub, t=t: answered(sub, kind, special, [t], f, pool))
            log.write(t="batch", rid=rid, n=len(tx))
            return
        if kind in ("pool_keyed", "pool_lookup", "pool_burst"):
            f = pool.submit(tx[0], session=key, add_special_tokens=special)
        elif kind == "pool_list":
            f = executor.submit(pool.encode_list, tx[0], session=key, add_special_tokens=special)
        elif kind == "tok_batch":
            f = executor.submit(lambda: [list(v) for v in tok.encode_batch(tx, add_special_tokens=special)])
        else:
            as_list = rng.random() < 0.4

            def call(t=tx[0], key=key, as_list=as_list):
                if as_list:
                    return tok.encode_list(t, session=key, add_special_tokens=special)
                return copy_ids(tok.encode(t, session=key, add_special_tokens=special))

            f = executor.submit(call)
            if kind == "tok_drop":  # the session goes while its request runs
                threading.Timer(rng.random() * 0.01, tok.sessions.drop, args=(key,)).start()
        f.add_done_callback(lambda f: answered(rid, kind, special, tx, f, pool))

    trimmed = [now()]
    # a server's caller threads exist from the start: the executor's all start now, each with
    # its first encode (its share of the fast encoder's state) before the warm-up is over
    gate = threading.Barrier(CALLERS)

    def first_encode():
        tok.encode("a caller thread's first encode " * 40)
        gate.wait(timeout=60)

    for f in [executor.submit(first_encode) for _ in range(CALLERS)]:
        f.result()

    def sampler():
        while not stop.is_set():
            t = now()
            rec = {"t": "m", "at": t, "fe": mem_of(os.getpid())}
            heap = malloc_mib()
            if heap:  # live malloc'd memory (glibc keeps freed pages resident: RSS alone says less)
                rec["heap"] = round(heap["in_use"] + heap["mmapped"], 1)
            if args.trim_every and t - trimmed[0] >= args.trim_every:
                t_trim = time.perf_counter()
                release_free_heap()
                trimmed[0] = t
                rec["trim_ms"] = round(1000 * (time.perf_counter() - t_trim), 1)
                rec["fe_trimmed"] = mem_of(os.getpid())
            pool = pools.current
            if pool is not None:
                s = pool.stats()
                rec["workers"] = {w["pid"]: mem_of(w["pid"]) for w in s["workers"]
                                  if w["alive"] and w["pid"]}
                rec["zygote"] = mem_of(pool.zygote_pid) if pool.zygote_pid else None
                rec["sessions"] = s["sessions"]
                rec["session_bytes"] = s["session_bytes"]
                rec["shm_bytes"] = s["shm_bytes"]
                rec["pool"] = {"prefix": pool.prefix, **{k: s[k] for k in POOL_COUNTERS}}
                status = {"pid": os.getpid(), "ready": True, "prefixes": list(pools.prefixes),
                          "workers": [w["pid"] for w in s["workers"] if w["alive"] and w["pid"]],
                          "zygote": pool.zygote_pid}
                tmp = out / f".status-{inc}.tmp"
                tmp.write_text(json.dumps(status))
                tmp.rename(out / f"status-{inc}.json")
                try:
                    pools.supervise()
                except Exception as exc:  # noqa: BLE001
                    log.write(t="internal", at=now(), msg=f"supervise: {exc}")
                    internal["errors"] += 1
            ts = tok.sessions.stats()
            rec["tok_sessions"] = ts["entries"]
            rec["held_mib"] = {  # what the stores account and the client's own texts
                "tok": round(ts["bytes"] / (1 << 20), 1),
                "pool": round(rec.get("session_bytes", 0) / (1 << 20), 1),
                "client": round(sum(sys.getsizeof(c.text) for cs in convs.values()
                                    for c in cs) / (1 << 20), 1),
                # texts of requests not answered yet (an open-loop backlog grows when the
                # machine falls behind) and of answers waiting to be written to the spool
                "in_flight": round(sum(e[2] for e in list(pending.values())) / (1 << 20), 1),
                "spool": round(sum(len(t) for i in list(spool_q) if i for t in i["texts"])
                               / (1 << 20), 1),
                # the fast encoder's state in each live thread that encodes
                "threads": round(per_thread * sum(th.name.startswith(ENCODING_THREADS)
                                                  for th in threading.enumerate()), 1)}
            if args.mem_detail and int(t) % 5 == 0:  # where the front end's memory is
                import gc

                rec["detail"] = {**mem_detail(os.getpid()), "malloc": malloc_mib(),
                                 "gc_objects": len(gc.get_objects()),
                                 "threads": threading.active_count(),
                                 "pending": len(pending), "spool_q": len(spool_q),
                                 "py_blocks": sys.getallocatedblocks()}
            log.write(**rec)
            time.sleep(max(0.0, 1.0 - (now() - t)))

    threading.Thread(target=sampler, daemon=True).start()
    while pools.current is None:
        time.sleep(0.1)
    log.write(t="ready", at=now(), pid=os.getpid(), thread_state_mib=per_thread,
              heap=malloc_mib())
    kinds = {k: w for k, w in KINDS.items() if not args.kinds or k in args.kinds.split(",")}
    names, weights = list(kinds), list(kinds.values())
    stop_file = out / "stop"
    next_at = time.monotonic()
    exit_at = next_at + args._exit_after if args._exit_after else None
    while not stop_file.exists():
        if exit_at is not None and time.monotonic() >= exit_at:
            # private: end here without freeing anything, so that a heap profiler's "leaked"
            # bytes are what the front end held live at this moment
            log.write(t="exit_after", at=now(), fe=mem_of(os.getpid()), heap=malloc_mib(),
                      threads=sorted(th.name for th in threading.enumerate()))
            os._exit(0)
        next_at += rng.expovariate(args.rate)
        delay = next_at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        try:
            issue(rng.choices(names, weights)[0])
        except Exception as exc:  # noqa: BLE001 - a submit that raised: an answer too
            internal["errors"] += 1
            log.write(t="internal", at=now(), msg=f"issue: {type(exc).__name__}: {exc}"[:300])
    # clean stop: every request answered, then close and look for names left behind
    deadline = now() + args.patience
    while pending and now() < deadline:
        time.sleep(0.1)
    with pending_lock:
        left = dict(pending)
    stop.set()
    time.sleep(1.2)
    with pools.lock:
        all_pools = list(pools.outstanding)
    for p in all_pools:
        p.close()
    tok.close()
    executor.shutdown(wait=True)
    with spool_cv:
        spool_q.append(None)
        spool_cv.notify()
    spool_thread.join(timeout=60)
    leaked = {p: shm.names_with_prefix(p) for p in pools.prefixes}
    # what the front end holds once dtok holds nothing: the pools closed, the tokenizer's
    # sessions and the client's texts gone, and the heap glibc keeps given back
    import gc

    probe = {"closed": mem_of(os.getpid()), "spool_left": len(spool_q), "pending": len(pending)}
    tok.sessions.clear()
    convs.clear()
    gc.collect()
    probe["cleared"] = mem_of(os.getpid())
    probe["cleared_malloc"] = malloc_mib()
    release_free_heap()
    probe["trimmed"] = mem_of(os.getpid())
    probe["trimmed_malloc"] = malloc_mib()
    if args._tracemalloc:  # private: where the front end's memory went
        import tracemalloc

        top = tracemalloc.take_snapshot().statistics("lineno")[:30]
        (out / f"tracemalloc-{inc}.txt").write_text("\n".join(map(str, top)))
    log.write(t="end", at=now(), unanswered=sorted(left), leaked=leaked, probe=probe,
              internal=internal["errors"], tok_stats=tok.sessions.stats())


# --- the controller ----------------------------------------------------------------------------


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 1)


class Checker(threading.Thread):
    """Re-encodes spooled answers with the reference and counts differences."""

    def __init__(self, spool: Path, diffs: Path) -> None:
        super().__init__(daemon=True)
        import dtok

        self.ref = dtok.Tokenizer.default().reference
        self.spool, self.diffs = spool, diffs
        self.checked: dict[str, int] = {}
        self.differences = 0
        self.done = threading.Event()
        self.stopping = False

    def run(self) -> None:
        while True:
            files = sorted(self.spool.glob("*.json"), key=lambda p: p.stat().st_mtime)
            if not files:
                if self.stopping:
                    self.done.set()
                    return
                time.sleep(0.5)
                continue
            for p in files:
                item = json.loads(p.read_text())
                crc, n = 0, 0
                for t in item["texts"]:
                    ids = array("i", self.ref.encode(t, add_special_tokens=item["special"]).ids)
                    crc, n = zlib.crc32(ids, crc), n + len(ids)
                kind = item["kind"]
                self.checked[kind] = self.checked.get(kind, 0) + 1
                if (crc, n) != (item["crc"], item["n"]):
                    self.differences += 1
                    shutil.move(str(p), self.diffs / p.name)
                else:
                    p.unlink()


def dtok_names() -> list[str]:
    return sorted(n for n in os.listdir(SHM) if n.startswith(("dtok-", "sem.dtok-")))


def names_of(prefixes) -> list[str]:
    return [n for n in dtok_names() if any(n.startswith((p + "-", "sem." + p + "-"))
                                           for p in prefixes)]


def controller(args) -> int:
    out = Path(args.out)
    if out.exists():
        shutil.rmtree(out)
    (out / "spool").mkdir(parents=True)
    (out / "diffs").mkdir()
    private_shm = args.in_namespace
    faults_log = Log(out / "faults.jsonl")
    rng = random.Random(args.seed)
    checker = Checker(out / "spool", out / "diffs")
    checker.start()
    fe_cmd = [sys.executable, __file__, "--front-end", "--out", str(out), "--seed", str(args.seed),
              "--rate", str(args.rate), "--workers", str(args.workers), "--check", str(args.check),
              "--request-timeout", str(args.request_timeout), "--patience", str(args.patience),
              "--_corrupt-every", str(args._corrupt_every), "--kinds", args.kinds]
    if args.mem_detail:
        fe_cmd.append("--mem-detail")
    if args.trim_every:
        fe_cmd += ["--trim-every", str(args.trim_every)]
    if args._exit_after:
        fe_cmd += ["--_exit-after", str(args._exit_after)]
    inc = 0
    leaked_after_restart: list[str] = []
    restarts = []

    def start_front_end():
        nonlocal inc
        inc += 1
        profiler = (["heaptrack", "-o", str(out / f"heaptrack-fe-{inc}")]
                    if args._heaptrack else [])  # private: the front end under heaptrack
        proc = subprocess.Popen(profiler + fe_cmd + ["--incarnation", str(inc)],
                                stderr=open(out / f"fe-{inc}.stderr", "w"))
        t0 = now()
        while not (out / f"status-{inc}.json").exists():
            if proc.poll() is not None:
                raise RuntimeError(f"front end {inc} exited {proc.returncode}; see fe-{inc}.stderr")
            time.sleep(0.1)
        return proc, now() - t0

    def status():
        try:
            return json.loads((out / f"status-{inc}.json").read_text())
        except (OSError, ValueError):
            return {}

    fe, _ = start_front_end()
    t_end = now() + args.minutes * 60
    faults = {k: w for k, w in FAULTS.items() if args.faults is None or k in args.faults.split(",")}
    if not private_shm:
        faults.pop("shm_fill", None)
    names, weights = list(faults), list(faults.values())
    quiet_until = now() + 20  # warm-up, no faults
    first_round = rng.sample(names, len(names))  # every fault once, then at random
    while now() < t_end:
        time.sleep(0.2)
        if now() < quiet_until or not names:
            continue
        kind = first_round.pop(0) if first_round else rng.choices(names, weights)[0]
        st = status()
        start = now()
        info: dict = {}
        if kind in ("worker_kill", "worker_stop") and st.get("workers"):
            pid = rng.choice(st["workers"])
            info["pid"] = pid
            try:
                if kind == "worker_kill":
                    os.kill(pid, signal.SIGKILL)
                    end = start + 5
                else:
                    os.kill(pid, signal.SIGSTOP)
                    hold = args.request_timeout + rng.uniform(0.5, 4)
                    time.sleep(hold)
                    os.kill(pid, signal.SIGCONT)
                    end = now() + 5
            except ProcessLookupError:
                first_round.append(kind)  # not applied now: again later
                continue
        elif kind == "zygote_kill" and st.get("zygote"):
            try:
                os.kill(st["zygote"], signal.SIGKILL)
            except ProcessLookupError:
                first_round.append(kind)  # not applied now: again later
                continue
            end = start + 15  # the front end retires the pool after 3 s and starts another
        elif kind == "shm_fill":
            hold = rng.uniform(5, 20)
            filler = subprocess.run([sys.executable, "-c", FILLER, str(hold)],
                                    capture_output=True, text=True)
            info["filled_mb"] = filler.stdout.strip()
            end = now() + 3
        elif kind.startswith("front_end_kill"):
            victims = [fe.pid]
            if kind == "front_end_kill_all":
                victims += st.get("workers", []) + ([st["zygote"]] if st.get("zygote") else [])
            for pid in victims:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            fe.wait()
            old = st.get("prefixes", [])
            left_at_kill = names_of(old)
            fe, took = start_front_end()
            restarts.append(round(took, 1))
            wait_until = now() + 15  # the zygote unlinks on its own; the sweep has run
            while names_of(old) and now() < wait_until:
                time.sleep(0.2)
            left = names_of(old)
            leaked_after_restart += left
            info.update(prefixes=old, names_left_at_kill=len(left_at_kill),
                        names_left_after_restart=len(left), restart_s=round(took, 1))
            end = now() + 5
        else:
            first_round.append(kind)
            continue
        faults_log.write(kind=kind, start=start, end=end, **info)
        quiet_until = end + rng.expovariate(1 / args.fault_every)
    (out / "stop").touch()
    fe.wait(timeout=args.patience + 120)
    checker.stopping = True
    checker.done.wait()
    end_names = dtok_names() if private_shm else names_of(
        [p for s in out.glob("status-*.json") for p in json.loads(s.read_text())["prefixes"]])
    report = analyze(out, args, checker, leaked_after_restart, end_names, restarts, private_shm)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))
    print(f"soak: {report['differences']} differences, {report['unanswered']} unanswered, "
          f"{report['leaked']} leaked")
    return 0


FILLER = r"""
import os, sys, time
p = '/dev/shm/soak-fill'
n = 0
with open(p, 'wb') as f:
    try:
        while True:
            f.write(b'\0' * (1 << 20)); f.flush(); n += 1
    except OSError:
        pass
    print(n, flush=True)
    time.sleep(float(sys.argv[1]))
os.unlink(p)
"""


def rss_points(series, submitted_at, end):
    """The front end's RSS (MiB) at seed 004's four points: idle after loading (its first
    sample), after its first 100 requests, during the load (the median sample), and after
    the load stopped (the clean stop's probe, pools closed and sessions cleared)."""
    if not series:
        return None
    after_100 = next((x[1] for x in series if len(submitted_at) >= 100
                      and x[0] >= submitted_at[99]), None)
    cleared = ((end or {}).get("probe") or {}).get("cleared")
    return {"cold_idle": series[0][1], "after_100_requests": after_100,
            "during_load": statistics.median(x[1] for x in series),
            "after_load": cleared[0] if cleared else None}


def analyze(out: Path, args, checker, leaked_after_restart, end_names, restarts, private_shm):
    faults = [json.loads(l) for l in (out / "faults.jsonl").read_text().splitlines()]
    windows = [(f["start"], f["end"]) for f in faults]
    counts: dict[str, int] = {}
    for f in faults:
        counts[f["kind"]] = counts.get(f["kind"], 0) + 1
    kills = {}  # incarnation -> time it was killed
    for f in faults:
        if f["kind"].startswith("front_end_kill"):
            kills[len(kills) + 1] = f["start"]
    submitted, answered = {}, {}
    errors, twice, internal, skipped, long_answers = [], 0, 0, 0, 0
    lat = {"quiet": {}, "faults": {}}
    mem_fe, mem_w, leaked_close, details, probes, trims = [], {}, [], [], [], []
    points = []
    unanswered, died_with_client, oldest_died = [], 0, 0.0
    tok_stats = None
    pool_counts: dict[str, dict] = {}
    for path in sorted(out.glob("fe-*.jsonl"), key=lambda p: int(p.stem.split("-")[1])):
        inc = int(path.stem.split("-")[1])
        sub, ans, end = {}, {}, None
        fe_mem, fe_detail, fe_trim = [], [], []
        for line in path.read_text().splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue  # a line cut by SIGKILL
            t = r["t"]
            if t == "s":
                sub[r["rid"]] = r
            elif t == "batch":
                s = sub.pop(r["rid"])
                for j in range(r["n"]):
                    sub[f"{r['rid']}.{j}"] = s
            elif t == "a":
                if r["rid"] in ans:
                    twice += 1
                ans[r["rid"]] = r
                if "err" in r:
                    errors.append(r)
                long_answers += r.get("long", 0)
            elif t == "twice":
                twice += 1
            elif t == "internal":
                internal += 1
            elif t == "skip":
                skipped += 1
            elif t == "m":
                if r.get("pool"):  # the last sample of each pool: its counters
                    pool_counts[r["pool"]["prefix"]] = r["pool"]
                if r.get("fe"):
                    held = r.get("held_mib")
                    fe_mem.append((r["at"], *r["fe"],
                                   round(sum(held.values()), 1) if held else None,
                                   r.get("heap")))
                if r.get("fe_trimmed"):
                    fe_trim.append((r["at"], *r["fe_trimmed"], r["trim_ms"]))
                if r.get("detail"):
                    fe_detail.append((r["at"], r["detail"]))
                for pid, m in (r.get("workers") or {}).items():
                    if m:
                        mem_w.setdefault(pid, []).append((r["at"], *m))
            elif t == "end":
                end = r
        mem_fe.append(fe_mem)
        points.append(rss_points(fe_mem, sorted(r["at"] for r in sub.values()), end))
        if fe_trim:
            trims.append({"incarnation": inc, "n": len(fe_trim),
                          "trim_ms_p50": pct([x[3] for x in fe_trim], 0.5),
                          "trim_ms_max": max(x[3] for x in fe_trim),
                          "rss_after_trims": [x[1] for x in fe_trim]})
        if fe_detail:
            after = [d for d in fe_detail if d[0] - fe_detail[0][0] >= 60] or fe_detail
            first, last = after[0][1], after[-1][1]
            # what glibc keeps free in its arenas (fragmentation, per-thread arenas) grew by
            # this much: part of rss_growth_beyond_held that no object of the front end holds
            free_growth = (round(last["malloc"]["free"] - first["malloc"]["free"], 1)
                           if first.get("malloc") and last.get("malloc") else None)
            details.append({"seconds": round(after[-1][0] - after[0][0]),
                            "after_warmup": first, "end": last,
                            "malloc_free_growth": free_growth})
        for rid, a in ans.items():
            s = sub.get(rid)
            if s is None:
                continue
            during = any(w0 <= a["at"] and s["at"] <= w1 for w0, w1 in windows)
            lat["faults" if during else "quiet"].setdefault(s["kind"], []).append(a["lat"])
        missing = [rid for rid in sub if rid not in ans]
        if end is not None:
            unanswered += missing
            leaked_close += [n for names in end["leaked"].values() for n in names]
            internal += end["internal"]
            tok_stats = end["tok_stats"]
            if end.get("probe"):
                probes.append({"incarnation": inc, **end["probe"]})
        else:
            killed_at = kills.get(inc, now())
            for rid in missing:
                age = killed_at - sub[rid]["at"]
                if age > args.patience:
                    unanswered.append(rid)
                else:
                    died_with_client += 1
                    oldest_died = max(oldest_died, age)
        submitted.update({f"{rid}": 1 for rid in sub})
        answered.update({rid: 1 for rid in ans})

    def lat_table(d):
        return {k: {"n": len(v), "p50_ms": pct(v, 0.5), "p99_ms": pct(v, 0.99)}
                for k, v in sorted(d.items())}

    def flat(series, warm_s):
        """Growth (MiB) of RSS and PSS after warm-up (one sample a second): the median of the
        last 20 samples minus the median of the first 20 after warm-up."""
        if not series:
            return None
        t0 = series[0][0]
        s = [x for x in series if x[0] - t0 >= warm_s]
        if len(s) < 40:
            return None
        first, last = s[:20], s[-20:]

        def growth(i):
            return round(statistics.median(x[i] for x in last)
                         - statistics.median(x[i] for x in first), 1)

        def per_min(i, part):  # least-squares slope, MiB a minute
            try:
                return round(60 * statistics.linear_regression(
                    [x[0] for x in part], [x[i] for x in part]).slope, 2)
            except statistics.StatisticsError:  # fewer than two samples, or all at one time
                return None

        out = {"seconds": round(s[-1][0] - s[0][0]),
               "rss_after_warmup": statistics.median(x[1] for x in first),
               "rss_end": statistics.median(x[1] for x in last),
               "rss_growth": growth(1), "pss_growth": growth(2),
               "rss_per_min": per_min(1, s), "pss_per_min": per_min(2, s),
               "rss_per_min_last_half": per_min(1, s[len(s) // 2:]),
               # the growth goal's measure: after the first 10 minutes of a lifetime
               "rss_per_hour_after_10_min": (None if s[-1][0] - t0 < 900 else round(
                   60 * per_min(1, [x for x in s if x[0] - t0 >= 600]), 1)),
               "rss_max": max(x[1] for x in s), "pss_max": max(x[2] for x in s)}
        if len(s[0]) > 3 and all(x[3] is not None for x in s):  # the front end: what it holds
            out.update(held_after_warmup=statistics.median(x[3] for x in first),
                       held_growth=growth(3), held_per_min=per_min(3, s))
            out["rss_growth_beyond_held"] = round(out["rss_growth"] - out["held_growth"], 1)
        if len(s[0]) > 4 and all(x[4] is not None for x in s):  # malloc's live bytes
            out.update(heap_after_warmup=statistics.median(x[4] for x in first),
                       heap_growth=growth(4), heap_per_min=per_min(4, s))
        return out

    fe_flat = [f for f in (flat(s, 60) for s in mem_fe) if f]
    w_flat = [f for f in (flat(s, 20) for s in mem_w.values()) if f]
    differences = checker.differences + len(errors)
    leaked = len(leaked_close) + len(leaked_after_restart) + len(end_names)
    return {
        "minutes": args.minutes, "rate_per_s": args.rate, "workers": args.workers,
        "request_timeout_s": args.request_timeout, "private_shm": private_shm,
        "load_average": os.getloadavg(),
        "requests": len(submitted), "answered": len(answered), "skipped_no_pool": skipped,
        "checked_by_reference": checker.checked, "chunked_answers": long_answers,
        "differences": differences, "reference_differences": checker.differences,
        "error_answers": len(errors), "errors_sample": errors[:5],
        "unanswered": len(unanswered), "unanswered_sample": unanswered[:10],
        "answered_twice": twice, "internal_errors": internal,
        "died_with_killed_front_end": died_with_client,
        "oldest_request_at_a_kill_s": round(oldest_died, 1),
        "faults": counts, "front_end_restart_s": restarts,
        "leaked": leaked, "leaked_after_close": leaked_close,
        "leaked_after_restart": leaked_after_restart, "left_at_end": end_names,
        "latency_quiet": lat_table(lat["quiet"]), "latency_during_faults": lat_table(lat["faults"]),
        "front_end_memory_mib": fe_flat, "front_end_rss_points_mib": [p for p in points if p],
        "front_end_memory_detail": details,
        "front_end_end_probe_mib": probes, "front_end_trims": trims,
        "worker_memory_mib": {
            "lifetimes_measured": len(w_flat),
            "max_rss_growth": max((f["rss_growth"] for f in w_flat), default=None),
            "max_pss_growth": max((f["pss_growth"] for f in w_flat), default=None),
            "max_rss": max((f["rss_max"] for f in w_flat), default=None)},
        "bounds": POOL_KNOBS, "tokenizer_sessions_at_end": tok_stats,
        "pool_counters": {k: sum(c[k] for c in pool_counts.values()) for k in POOL_COUNTERS},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--rate", type=float, default=8, help="requests per second (Poisson)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--check", type=float, default=0.1,
                    help="fraction of the answers that are not chunked re-encoded by the reference")
    ap.add_argument("--request-timeout", type=float, default=5.0)
    ap.add_argument("--fault-every", type=float, default=12.0, help="mean seconds between faults")
    ap.add_argument("--patience", type=float, default=120.0)
    ap.add_argument("--shm-mb", type=int, default=256, help="the private /dev/shm's size")
    ap.add_argument("--out", default=str(Path(tempfile.gettempdir()) / "dtok-soak"),
                    help="folder for the spool, samples and report (default: dtok-soak in the "
                         "system's temporary folder)")
    ap.add_argument("--kinds", default="", help="only these request kinds (comma-separated; "
                    "default all: " + ",".join(KINDS) + ")")
    ap.add_argument("--faults", default=None, help="only these faults (comma-separated; '' for "
                    "none; default all: " + ",".join(FAULTS) + ")")
    ap.add_argument("--mem-detail", action="store_true", help="every 5 s, where the front end's "
                    "memory is: anonymous, /dev/shm and file mappings, malloc, gc objects")
    ap.add_argument("--trim-every", type=float, default=0, help="a diagnostic: the front end "
                    "calls malloc_trim(0) every S seconds and samples its RSS after it")
    ap.add_argument("--no-namespace", action="store_true")
    ap.add_argument("--in-namespace", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--front-end", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--incarnation", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--_corrupt-every", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--_tracemalloc", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_heaptrack", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--_exit-after", type=float, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.front_end:
        front_end(args)
        return 0
    if not args.in_namespace and not args.no_namespace and shutil.which("unshare"):
        probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                               capture_output=True)
        if probe.returncode == 0:
            cmd = (f"mount -t tmpfs -o size={args.shm_mb}m,mode=1777 tmpfs /dev/shm && exec "
                   f"{sys.executable} \"$0\" --in-namespace \"$@\"")
            return subprocess.call(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd,
                                    __file__, *sys.argv[1:]])
    return controller(args)


if __name__ == "__main__":
    sys.exit(main())
