#!/usr/bin/env python3
"""Pool transfer overhead: pool call minus in-process work, against a pickled-pipe pool, same run.

    python benches/bench_pool.py [--tokenizer qwen3] [--sizes 100000 1000000] [--calls 300]

For each context size: a keyed session is initialized, then 400-character appends are sent
through (1) dtok.Pool (shared memory; only the append travels, the IDs come back as a view of
shared memory), (2) a baseline pool written for this comparison that pickles the whole
transcript down a multiprocessing Pipe to a worker keeping dtok sessions and pickles the ID list
back (the paper's pool design), and (3) the same work in process (Tokenizer sessions). Stateless
requests of the same sizes are timed the same way (no chunking, so it is transfer alone).
Overhead = median(pool call) - median(in-process). The three run in alternating blocks of 50
calls (each back to back, as on a busy server), all single-threaded encoders
(FASTOKENS_BPE_THREADS=1, so the in-process work is what one worker does). Writes
bench-results/pool.json and a PNG.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ["FASTOKENS_BPE_THREADS"] = "1"  # before fastokens is used: one encoder thread

from common import RESULTS, SHARED, corpus, header, machine, summary, write_json  # noqa: E402

import dtok  # noqa: E402


def _pipe_worker(conn, path: str) -> None:
    tok = dtok.Tokenizer.from_file(path, content_lookup=False, threads=1)
    while True:
        msg = conn.recv()
        if msg is None:
            return
        key, text = msg
        conn.send(list(tok.encode(text, session=key) if key else tok.encode(text)))


class PipePool:
    """The baseline: one worker process, requests and IDs pickled through a Pipe."""

    def __init__(self, path: str) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_pipe_worker, args=(child, path), daemon=True)
        self.proc.start()

    def encode(self, text: str, session=None):
        self.conn.send((session, text))
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join(10)


def timed(fn, *a, **k):
    t0 = time.perf_counter()
    out = fn(*a, **k)
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default="qwen3")
    ap.add_argument("--sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--stateless-calls", type=int, default=40)
    args = ap.parse_args()
    info = machine()
    print(header(info))
    path = str(SHARED / "tokenizers" / args.tokenizer)
    tok = dtok.Tokenizer.from_file(path, content_lookup=False)
    src = corpus("prose", "gutenberg-2701_moby-dick.txt") * 2
    pipe = PipePool(path)
    rows = []
    with dtok.Pool(tok, workers=2, name="bench", chunk_threshold=10**9) as pool:
        for size in args.sizes:
            local = tok.with_knobs()
            base = src[:size]
            for f in (lambda t: pool.encode(t, session=size), lambda t: pipe.encode(t, size),
                      lambda t: local.encode(t, session=size)):
                f(base)
            t = {"pool": [], "pipe": [], "in_process": []}
            calls = {"pool": lambda text: pool.encode(text, session=size),
                     "pipe": lambda text: pipe.encode(text, size),
                     "in_process": lambda text: local.encode(text, session=size)}
            exact = True
            step = {label: 0 for label in calls}
            for block in range(0, args.calls, 50):
                for label, fn in calls.items():
                    for _ in range(min(50, args.calls - block)):
                        step[label] += 1
                        text = src[: size + step[label] * 400]
                        dt, out = timed(fn, text)
                        t[label].append(dt)
                        if step[label] % 50 == 0:
                            exact &= list(out) == tok.reference.encode(text).ids
                        del out
            rows.append(_row("keyed append", size, t, exact))
            ts = {"pool": [], "pipe": [], "in_process": []}
            stateless = tok.with_knobs(chunk_threshold=10**9)
            for label, fn in (("pool", pool.encode), ("pipe", pipe.encode),
                              ("in_process", stateless.encode)):
                for i in range(args.stateless_calls):
                    text = src[i * 997 : i * 997 + size]
                    dt, out = timed(fn, text)
                    ts[label].append(dt)
                    del out
            rows.append(_row("stateless", size, ts, True))
        rows.append({"pool_stats": pool.stats()})
    pipe.close()
    path_json = write_json("pool.json", {"machine": info, "args": vars(args), "rows": rows})
    print("wrote", path_json)
    _plot([r for r in rows if "kind" in r])


def _row(kind: str, size: int, t: dict, exact: bool) -> dict:
    s = {k: summary(v) for k, v in t.items()}
    base = s["in_process"]["median_ms"]
    row = {"kind": kind, "chars": size, "exact": exact, **s,
           "overhead_pool_ms": s["pool"]["median_ms"] - base,
           "overhead_pipe_ms": s["pipe"]["median_ms"] - base}
    row["overhead_ratio"] = row["overhead_pipe_ms"] / max(row["overhead_pool_ms"], 1e-6)
    print(f"{kind:13s} {size:>9,} chars: pool {s['pool']['median_ms']:.3f} ms (p99 "
          f"{s['pool']['p99_ms']:.3f}), pipe {s['pipe']['median_ms']:.3f} ms (p99 "
          f"{s['pipe']['p99_ms']:.3f}), in-process {base:.3f} ms | overhead pool "
          f"{row['overhead_pool_ms']:.3f} ms, pipe {row['overhead_pipe_ms']:.3f} ms "
          f"(x{row['overhead_ratio']:.1f}) exact={exact}", flush=True)
    return row


def _plot(rows: list[dict]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, kind in zip(axes, ("keyed append", "stateless")):
        sel = [r for r in rows if r["kind"] == kind]
        labels = [f"{r['chars'] // 1000}K" for r in sel]
        x = range(len(sel))
        ax.bar([i - 0.2 for i in x], [r["overhead_pool_ms"] for r in sel], 0.4,
               label="dtok pool (shared memory)")
        ax.bar([i + 0.2 for i in x], [r["overhead_pipe_ms"] for r in sel], 0.4,
               label="pickled-pipe pool")
        ax.set_xticks(list(x), labels)
        ax.set_yscale("log")
        ax.set_ylabel("median call - in-process work (ms)")
        ax.set_title(kind)
        ax.legend()
    fig.tight_layout()
    out = RESULTS / "pool.png"
    fig.savefig(out, dpi=120)
    print("wrote", out)


if __name__ == "__main__":
    main()
