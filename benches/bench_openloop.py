#!/usr/bin/env python3
"""Open-loop scheduling testbed (paper, supplement S6.4-6.5, scaled to this machine).

    python benches/bench_openloop.py [--tokenizer qwen3] [--rate 100] [--seconds 15]
                                     [--sessions 64] [--context 100000] [--seeds 1]

Load: ``--sessions`` sessions whose transcripts start at ``--context`` characters; appends of
about 1,300 characters arrive as a Poisson process at ``--rate`` per second, each to a random
session, with at most one request in flight per session (a request waits for its session's
previous one); on top, clusters of four stateless documents of 1M characters arrive as a
Poisson process at ``--burst-rate`` clusters per second (0.5). Latency = completion - scheduled
arrival, so a turn's wait behind its session's previous request counts. Every design replays the same
arrivals:

* ``per-worker FIFO whole``: stateless requests whole, round robin on the workers' own FIFO
  queues (where the sessions' appends also wait);
* ``shared SJF whole``: stateless requests whole on the shared queue, shortest first;
* ``chunked FIFO`` / ``chunked SJF``: stateless requests cut into chunks on the shared queue;
  ``chunked SJF x8``: eight chunks per worker instead of one; ``aging 1.0`` / ``0.1`` /
  ``0.01``: waiting counts fully / a tenth / a hundredth against a task's estimate (the ``aging``
  knob: the paper's value is 1.0, the pool's default 0.01);
* ``pool defaults``: ``dtok.Pool`` as it comes (shortest first, aging 0.01, one chunk per
  worker);
* ``in-process serial``: one thread encodes everything in arrival order (the front end's own
  event loop doing the work).

A run is backlogged if requests are unfinished at the end, the achieved rate is below 85% of
the offered one, or the P99 exceeds 3 s. Prints P50/P99 per class and design; writes
bench-results/openloop.json and openloop.png. The machine's two cores run the workers, the
load generator and the front end together.
"""
from __future__ import annotations

import argparse
import json
import queue
import random
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS, SHARED, corpus, documents, header, machine, write_json  # noqa: E402

import dtok  # noqa: E402
from dtok.chat import detect_style, render_turns  # noqa: E402

DESIGNS = {
    "per-worker FIFO whole": dict(order="fifo", chunk_threshold=10**12,
                                  stateless_queue="round_robin"),
    "shared SJF whole, aging 1.0": dict(order="sjf", chunk_threshold=10**12, aging=1.0),
    "chunked FIFO": dict(order="fifo", chunk_threshold=65536),
    "chunked SJF, aging 1.0": dict(order="sjf", chunk_threshold=65536, aging=1.0),
    "chunked SJF x8, aging 1.0": dict(order="sjf", chunk_threshold=65536, chunks_per_worker=8,
                                      aging=1.0),
    "chunked SJF x8, aging 0.1": dict(order="sjf", chunk_threshold=65536, chunks_per_worker=8,
                                      aging=0.1),
    "chunked SJF x8, aging 0.01": dict(order="sjf", chunk_threshold=65536, chunks_per_worker=8,
                                       aging=0.01),
    "pool defaults (SJF, aging 0.01)": dict(order="sjf"),
    "in-process serial": None,
}


def build_sources(tok, n_sessions: int, context: int, append_chars: int, appends: int):
    """Per session: the initial context and the stream its appends come from (real transcripts,
    then prose and code), all distinct."""
    style = detect_style(tok.admission.added_tokens)
    parts = []
    for path in sorted((SHARED / "corpus" / "transcripts").glob("*.json")):
        if path.name != "MANIFEST.json":
            parts.append(render_turns(json.loads(path.read_bytes()), style)[-1])
    parts += [corpus("prose", p.name) for p in sorted((SHARED / "corpus" / "prose").iterdir())]
    stream = "".join(parts)
    need = context + append_chars * (appends + 2)
    while len(stream) < n_sessions * need:
        stream += stream
    return [stream[i * need : (i + 1) * need] for i in range(n_sessions)]


def schedule(rate: float, seconds: float, n_sessions: int, burst_rate: float, seed: int):
    rng = random.Random(seed)
    events, t = [], 0.0
    while True:
        t += rng.expovariate(rate)
        if t > seconds:
            break
        events.append((t, "append", rng.randrange(n_sessions)))
    t = 0.0
    while True:
        t += rng.expovariate(burst_rate)
        if t > seconds:
            break
        for j in range(4):
            events.append((t, "document", j))
    events.sort()
    return events


class InProcess:
    """The in-process serial design: one thread, FIFO, the front end's own Tokenizer."""

    def __init__(self, tok):
        self.tok = tok
        self.q: queue.Queue = queue.Queue()
        self.t = threading.Thread(target=self._run, daemon=True)
        self.t.start()

    def _run(self):
        while True:
            item = self.q.get()
            if item is None:
                return
            text, session, callback = item
            self.tok.encode(text, session=session)
            callback()

    def submit(self, text, session, callback):
        self.q.put((text, session, callback))

    def close(self):
        self.q.put(None)
        self.t.join()


def run_design(name, knobs, tok, sources, docs, events, args):
    context, append_chars = args.context, args.append_chars
    progress = [0] * len(sources)
    lat = {"append": [], "document": []}
    done_at: list[float] = []
    inflight = [False] * len(sources)
    waiting: list[list] = [[] for _ in sources]
    lock = threading.Lock()
    pool = dtok.Pool(tok, workers=args.workers, name="openloop", **knobs) if knobs else None
    serial = InProcess(tok.with_knobs()) if knobs is None else None

    def submit(text, session, on_done):
        if pool is not None:
            pool.submit(text, session=session).add_done_callback(lambda f: on_done())
        else:
            serial.submit(text, session, on_done)

    # initialize every session (not measured)
    inits = []
    for i, src in enumerate(sources):
        ev = threading.Event()
        submit(src[:context], ("s", i), ev.set)
        inits.append(ev)
    for ev in inits:
        ev.wait(600)

    t0 = time.monotonic() + 0.5
    warm = args.warmup

    def fire(t_sched, kind, idx):
        if kind == "append":
            progress[idx] += 1
            text = sources[idx][: context + progress[idx] * append_chars]
            session = ("s", idx)
        else:
            text, session = docs[idx], None

        def on_done():
            now = time.monotonic() - t0
            with lock:
                if t_sched >= warm:
                    lat[kind].append(now - t_sched)
                    done_at.append(now)
                if kind == "append":
                    inflight[idx] = False
                    if waiting[idx]:
                        nxt = waiting[idx].pop(0)
                        inflight[idx] = True
                        threading.Thread(target=fire, args=nxt, daemon=True).start()

        submit(text, session, on_done)

    for t_sched, kind, idx in events:
        delay = t0 + t_sched - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if kind == "append":
            with lock:
                if inflight[idx]:
                    waiting[idx].append((t_sched, kind, idx))
                    continue
                inflight[idx] = True
        fire(t_sched, kind, idx)
    measured = [e for e in events if e[0] >= warm]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with lock:
            if len(lat["append"]) + len(lat["document"]) >= len(measured):
                break
        time.sleep(0.05)
    stats = pool.stats() if pool is not None else {}
    if pool is not None:
        pool.close()
    else:
        serial.close()
    finished = len(lat["append"]) + len(lat["document"])
    span = args.seconds - warm
    achieved = finished / span
    row = {"design": name, "offered_per_s": len(measured) / span, "achieved_per_s": achieved,
           "unfinished": len(measured) - finished}
    for kind in ("append", "document"):
        xs = sorted(x * 1e3 for x in lat[kind])
        row[kind] = ({"n": len(xs), "p50_ms": statistics.median(xs),
                      "p99_ms": xs[min(len(xs) - 1, int(0.99 * len(xs)))]} if xs else {"n": 0})
    all_p99 = max((row[k].get("p99_ms", 0) for k in ("append", "document")), default=0)
    row["backlogged"] = (row["unfinished"] > 0 or achieved < 0.85 * row["offered_per_s"]
                         or all_p99 > 3000)
    row["pool_failovers"] = stats.get("failovers")
    a, d = row["append"], row["document"]
    print(f"{name:22s} appends P50 {a.get('p50_ms', 0):7.2f} P99 {a.get('p99_ms', 0):8.2f} ms | "
          f"documents P50 {d.get('p50_ms', 0):8.1f} P99 {d.get('p99_ms', 0):8.1f} ms | achieved "
          f"{achieved:6.1f}/s of {row['offered_per_s']:6.1f} | backlogged={row['backlogged']}",
          flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default="qwen3")
    ap.add_argument("--rate", type=float, default=100.0, help="appends per second")
    ap.add_argument("--burst-rate", type=float, default=0.5, help="document clusters per second")
    ap.add_argument("--seconds", type=float, default=18.0)
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--sessions", type=int, default=64)
    ap.add_argument("--context", type=int, default=100_000)
    ap.add_argument("--append-chars", type=int, default=1300)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--encoder", default="auto", choices=["auto", "reference"],
                    help="reference: documents take seconds, the regime of the paper's testbed")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--designs", nargs="*", default=list(DESIGNS))
    ap.add_argument("--documents", default="prose", choices=["prose", "code", "multilingual"],
                    help="kind of text of the 1M-character stateless documents")
    args = ap.parse_args()
    info = machine()
    print(header(info))
    tok = dtok.Tokenizer.from_file(SHARED / "tokenizers" / args.tokenizer, content_lookup=False,
                                   encoder=args.encoder)
    print(f"# {args.tokenizer} ({tok.encoder.name}), {args.sessions} sessions x "
          f"{args.context:,} chars, appends {args.append_chars} chars at {args.rate}/s, "
          f"4 x 1M-char documents at {args.burst_rate} clusters/s, {args.workers} workers")
    appends_per_session = int(args.rate * args.seconds / args.sessions * 3) + 10
    sources = build_sources(tok, args.sessions, args.context, args.append_chars,
                            appends_per_session)
    docs = documents(args.documents, 1_000_000, 4)
    rows = []
    for seed in range(args.seeds):
        events = schedule(args.rate, args.seconds, args.sessions, args.burst_rate, seed)
        for name in args.designs:
            row = run_design(name, DESIGNS[name], tok, sources, docs, events, args)
            row["seed"] = seed
            rows.append(row)
    path = write_json("openloop.json", {"machine": info, "args": vars(args), "rows": rows})
    print("wrote", path)
    _plot(rows)


def _plot(rows) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    names = list(dict.fromkeys(r["design"] for r in rows))
    fig, ax = plt.subplots(figsize=(10, 4))
    for j, kind in enumerate(("append", "document")):
        vals = [statistics.median(r[kind].get("p99_ms", float("nan")) for r in rows
                                  if r["design"] == n) for n in names]
        ax.bar([i + (j - 0.5) * 0.38 for i in range(len(names))], vals, 0.38, label=f"{kind} P99")
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("latency from scheduled arrival (ms)")
    ax.legend()
    fig.tight_layout()
    out = RESULTS / "openloop.png"
    fig.savefig(out, dpi=120)
    print("wrote", out)


if __name__ == "__main__":
    main()
