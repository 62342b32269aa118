#!/usr/bin/env python3
"""Pool latency at every request spacing, where the time goes, and transfer overhead.

    python benches/bench_pool.py [--tokenizer qwen3] [--size 1000000] [--spacings 0 1 5 20 100]
                                 [--requests 200] [--repeats 3] [--transfer]

1. **Spacing sweep.** A keyed session of ``--size`` characters (real prose) gets 400-character
   appends. Arrivals are a Poisson process (exponential gaps of mean S ms; S = 0 is back to
   back): each request starts at its scheduled arrival, or when the previous one returned if
   that is later (one client, as an agent is). Latency = return - start of the call. The same
   appends go through ``dtok.Pool(workers=2)`` with default knobs and through the in-process
   ``Tokenizer`` (same encoder, single-threaded), alternating in blocks of 25, so both see the
   same machine state; per spacing, ``--repeats`` repeats. Printed: median and P99 per repeat,
   the median over repeats and the min-max spread, and pool - in process.
2. **Where the time goes** (pool): from timestamps taken in the front end and in the worker
   (CLOCK_MONOTONIC, one clock for both): submit -> sent (front-end planning), sent -> picked
   (worker wake-up), picked -> answered (the worker's work), answered -> harvested (caller
   wake-up), harvested -> returned (building the view).
3. ``--transfer``: the old comparison, back to back, with a pool written for it that pickles
   the transcript and the ID list through a ``multiprocessing`` pipe (the paper's pool design).

``--hold dropped|held|list_held`` sets how the sweep's caller holds results (``held``: the
previous view alive while the next turn is encoded, as ``ids = pool.encode(...)`` in a loop).
``--caller async`` makes the sweep's caller an event loop, as the engine hooks are: the pool
through ``encode_async`` / ``encode_list_async`` (a session's next turn planned on the loop,
and answered there when its encoding fits the loop's budget, ``DTOK_LOOP_CHARS``' default;
the rest planned on the pool's submit thread and answered through its dispatcher thread), in
process through ``run_in_executor`` on one thread; the stages of the turns a worker answered
then begin with the hand-off from the loop, and the count of turns answered on the loop is
printed.

    python benches/bench_pool.py --patterns [--size 1000000] [--repeats 3]

measures the pool against in process for appends and edits in every calling pattern and cache
state of :mod:`patterns` (plus ``local_between``: an in-process encode between two pool calls),
with the pool's stage breakdown per cell.

Writes bench-results/pool.json (pool-patterns.json).
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

os.environ["FASTOKENS_BPE_THREADS"] = "1"  # before fastokens is used: one encoder thread

from common import SHARED, corpus, header, machine, summary, write_json  # noqa: E402
import patterns  # noqa: E402

import dtok  # noqa: E402

BLOCK = 25


def _append_stream(src: str, size: int, n: int):
    """The session's text after each of n 400-character appends."""
    return [src[: size + (i + 1) * 400] for i in range(n)]


def _run_block(fn, texts, gaps_s, trace_out=None, hold="dropped"):
    lat = []
    held = None
    next_at = time.perf_counter()
    for text, gap in zip(texts, gaps_s):
        next_at += gap
        now = time.perf_counter()
        if next_at > now:
            time.sleep(next_at - now)
        t0 = time.perf_counter()
        out = fn(text)
        t1 = _returned(lat, t0, trace_out)
        held = None if hold == "dropped" else out  # alive while the next one is encoded
        del out
        next_at = max(next_at, t1)
    del held
    return lat


def _returned(lat: list, t0: float, trace_out) -> float:
    """Note a call that started at ``t0`` (perf_counter) and has just returned: its latency,
    and (``trace_out``) when it returned on the pool's clock."""
    t1 = time.perf_counter()
    lat.append(t1 - t0)
    if trace_out is not None:
        trace_out.append(time.monotonic())
    return t1


async def _run_block_async(fn, texts, gaps_s, trace_out=None, hold="dropped", called_out=None):
    """:func:`_run_block` from an event loop: ``fn`` is awaited; ``called_out`` gets each call's
    start (CLOCK_MONOTONIC, as the pool's trace)."""
    lat = []
    held = None
    loop = asyncio.get_running_loop()
    next_at = loop.time()
    for text, gap in zip(texts, gaps_s):
        next_at += gap
        if next_at > loop.time():
            await asyncio.sleep(next_at - loop.time())
        if called_out is not None:
            called_out.append(time.monotonic())
        t0 = time.perf_counter()
        out = await fn(text)
        _returned(lat, t0, trace_out)
        held = None if hold == "dropped" else out
        del out
        next_at = max(next_at, loop.time())
    del held
    return lat


def sweep(tok, pool, src: str, size: int, spacings, requests: int, repeats: int, check,
          hold: str = "dropped", caller: str = "sync"):
    rows = []
    for spacing in spacings:
        reps = []
        for rep in range(repeats):
            rng = random.Random(1000 * spacing + rep)
            key = f"s{spacing}-{rep}"
            local = tok.with_knobs(threads=1)
            base = src[:size]
            pool.encode(base, session=key)
            local.encode(base, session=key)
            texts = _append_stream(src, size, requests)
            gaps = [rng.expovariate(1e3 / spacing) if spacing else 0.0 for _ in texts]
            lat = {"pool": [], "in_process": []}
            pool.trace = []
            returned: list[float] = []
            listed = hold == "list_held"
            on_pool = pool.encode_list if listed else pool.encode
            on_local = local.encode_list if listed else local.encode
            called: list[float] | None = None
            for b in range(0, requests, BLOCK):
                block = (texts[b : b + BLOCK], gaps[b : b + BLOCK])
                if caller == "async":
                    called = [] if called is None else called
                    lat["pool"] += asyncio.run(_async_block(pool, local, key, listed, block,
                                                            returned, hold, called, "pool"))
                    lat["in_process"] += asyncio.run(_async_block(
                        pool, local, key, listed, block, None, hold, None, "in_process"))
                    continue
                lat["pool"] += _run_block(lambda t: on_pool(t, session=key), *block, returned,
                                          hold)
                lat["in_process"] += _run_block(lambda t: on_local(t, session=key), *block,
                                                hold=hold)
            check(pool.encode(texts[-1], session=key), texts[-1])
            check(local.encode(texts[-1], session=key), texts[-1])
            stages = _stages(pool.trace[: len(returned)], returned, called)
            on_loop = sum(len(rec) == 2 for rec in pool.trace[: len(returned)])  # submit only
            pool.trace = None
            reps.append({k: summary(v) for k, v in lat.items()}
                        | {"stages_ms": stages, "answered_on_the_loop": on_loop})
        row = {"spacing_ms": spacing, "repeats": reps}
        for who in ("pool", "in_process"):
            for stat in ("median_ms", "p99_ms"):
                xs = [r[who][stat] for r in reps]
                row[f"{who}_{stat}"] = statistics.median(xs)
                row[f"{who}_{stat}_spread"] = (min(xs), max(xs))
        row["median_over_ms"] = row["pool_median_ms"] - row["in_process_median_ms"]
        row["p99_over_ms"] = row["pool_p99_ms"] - row["in_process_p99_ms"]
        rows.append(row)
        st = reps[-1]["stages_ms"]
        print(f"spacing {spacing:>5} ms | pool median {row['pool_median_ms']:.3f} "
              f"({row['pool_median_ms_spread'][0]:.3f}-{row['pool_median_ms_spread'][1]:.3f}) "
              f"P99 {row['pool_p99_ms']:.3f} ({row['pool_p99_ms_spread'][0]:.3f}-"
              f"{row['pool_p99_ms_spread'][1]:.3f}) | in process median "
              f"{row['in_process_median_ms']:.3f} ({row['in_process_median_ms_spread'][0]:.3f}-"
              f"{row['in_process_median_ms_spread'][1]:.3f}) P99 {row['in_process_p99_ms']:.3f} "
              f"| pool - in process: median {row['median_over_ms']:+.3f} P99 "
              f"{row['p99_over_ms']:+.3f} ms", flush=True)
        print("      stages (median ms, last repeat; turns a worker answered): " +
              ", ".join(f"{k} {v:.3f}" for k, v in st.items()), flush=True)
        print(f"      answered on the event loop, no worker (last repeat): "
              f"{reps[-1]['answered_on_the_loop']} of {requests}", flush=True)
    return rows


async def _async_block(pool, local, key, listed, block, returned, hold, called, who):
    if who == "pool":
        on = pool.encode_list_async if listed else pool.encode_async
        return await _run_block_async(lambda t: on(t, session=key), *block, returned, hold,
                                      called)
    loop = asyncio.get_running_loop()
    on_local = local.encode_list if listed else local.encode
    with ThreadPoolExecutor(1) as ex:  # as the engine hooks run dtok in process
        return await _run_block_async(
            lambda t: loop.run_in_executor(ex, lambda: on_local(t, session=key)), *block,
            hold=hold)


def _stages(trace, returned, called=None):
    """Median ms of each stage of the traced pool requests (submit, sent, picked, answered,
    harvested from the pool's trace; returned from the benchmark; with ``called``, the calls'
    starts on an event loop, before the hand-off to the pool's submit thread)."""
    names = ["plan+send", "worker wake", "worker work", "caller wake", "view+return"]
    if called is not None:
        names = ["loop to submit thread", *names]
        names[-2:] = ["dispatcher wake", "harvest+wake the loop"]
    cols: dict[str, list[float]] = {n: [] for n in names}
    for i, (rec, ret) in enumerate(zip(trace, returned)):
        if len(rec) != 6:  # (kind, submit, sent, picked, answered, harvested)
            continue
        t = [*rec[1:], ret] if called is None else [called[i], *rec[1:], ret]
        for name, a, b in zip(names, t, t[1:]):
            cols[name].append((b - a) * 1e3)
    return {k: statistics.median(v) if v else float("nan") for k, v in cols.items()}


# --- the old transfer comparison -----------------------------------------------------------


def _pipe_worker(conn, path: str) -> None:
    tok = dtok.Tokenizer.from_file(path, content_lookup=False, threads=1)
    while True:
        msg = conn.recv()
        if msg is None:
            return
        key, text = msg
        conn.send(list(tok.encode(text, session=key) if key else tok.encode(text)))


class PipePool:
    """One worker process, requests and IDs pickled through a Pipe."""

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


def transfer(tok, pool, path: str, src: str, size: int, calls: int) -> dict:
    pipe = PipePool(path)
    local = tok.with_knobs(threads=1)
    for enc in (lambda t: pool.encode(t, session="tr"), lambda t: pipe.encode(t, "tr"),
                lambda t: local.encode(t, session="tr")):
        enc(src[:size])
    texts = _append_stream(src, size + 10**6, calls)
    lat = {"pool": [], "pipe": [], "in_process": []}
    fns = {"pool": lambda t: pool.encode(t, session="tr"), "pipe": lambda t: pipe.encode(t, "tr"),
           "in_process": lambda t: local.encode(t, session="tr")}
    texts = _append_stream(src, size, calls)
    for b in range(0, calls, BLOCK):
        for who, fn in fns.items():
            lat[who] += _run_block(fn, texts[b : b + BLOCK], [0.0] * BLOCK)
    pipe.close()
    s = {k: summary(v) for k, v in lat.items()}
    base = s["in_process"]["median_ms"]
    print(f"transfer, back to back, {size:,} chars: pool {s['pool']['median_ms']:.3f} ms, "
          f"pickled pipe {s['pipe']['median_ms']:.3f} ms, in process {base:.3f} ms "
          f"(overhead: pool {s['pool']['median_ms'] - base:+.3f}, pipe "
          f"{s['pipe']['median_ms'] - base:+.3f})", flush=True)
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default="qwen3")
    ap.add_argument("--size", type=int, default=1_000_000)
    ap.add_argument("--spacings", type=float, nargs="*", default=[0, 1, 5, 20, 100])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--transfer", action="store_true")
    ap.add_argument("--hold", default="dropped", choices=patterns.PATTERNS)
    ap.add_argument("--caller", default="sync", choices=["sync", "async"])
    ap.add_argument("--patterns", action="store_true")
    ap.add_argument("--kinds", nargs="*", default=["append", "edit"], help="--patterns: turns")
    args = ap.parse_args()
    info = machine()
    print(header(info))
    print(f"# arrivals: Poisson (exponential gaps), one client; {args.requests} appends of 400 "
          f"characters per spacing and repeat, session of {args.size:,} characters")
    path = str(SHARED / "tokenizers" / args.tokenizer)
    tok = dtok.Tokenizer.from_file(path, content_lookup=False, session_bytes=1 << 31)
    src = "".join(corpus("prose", p.name) for p in sorted((SHARED / "corpus" / "prose").iterdir()))
    while len(src) < args.size + (args.requests + 2) * 400 * 2:
        src += src
    bad = []

    def check(view, text):
        if list(view) != tok.reference.encode(text).ids:
            bad.append(len(text))

    with dtok.Pool(tok, workers=2, name="bench") as pool:
        print(f"# pool: {pool.n_workers} workers, encoder {pool.encoder_name}, "
              f"spin_us {pool.knobs['spin_us']}, in process: {tok.encoder.name}")
        if args.patterns:
            return patterns_pool(args, info, tok, pool, src, check, bad)
        print(f"# results: {args.hold}, caller: {args.caller}")
        rows = sweep(tok, pool, src, args.size, args.spacings, args.requests, args.repeats, check,
                     args.hold, args.caller)
        tr = transfer(tok, pool, path, src, args.size, 100) if args.transfer else None
        stats = pool.stats()
    print(f"exact: {'yes' if not bad else 'NO ' + str(bad)}")
    path_json = write_json("pool.json", {"machine": info, "args": vars(args), "sweep": rows,
                                         "transfer": tr, "pool_stats": stats, "exact": not bad})
    print("wrote", path_json)


def patterns_pool(args, info, tok, pool, src, check, bad) -> None:
    """The pool against in process in every pattern and cache state (see patterns.py)."""
    import tokenizers

    local = tok.with_knobs(threads=1)
    other = dtok.Tokenizer.from_file(SHARED / "tokenizers" / args.tokenizer, content_lookup=False)
    cold = patterns.Cold(tokenizers.Tokenizer.from_file(
        str(SHARED / "tokenizers" / args.tokenizer / "tokenizer.json")), local=other.encode)
    encoders = {
        "pool": lambda t, k, as_list: (pool.encode_list(t, session=k) if as_list
                                       else pool.encode(t, session=k)),
        "in process": lambda t, k, as_list: (local.encode_list(t, session=k) if as_list
                                             else local.encode(t, session=k)),
    }
    rows = []
    while len(src) < args.size * 2:
        src += src
    for kind in args.kinds:
        pool.trace = []
        rows += patterns.table("pool", encoders, kind, src, args.size, 40, args.repeats, cold,
                               check, conditions=(*patterns.CONDITIONS, "local_between"))
        st = _stages(pool.trace, [r[5] for r in pool.trace if len(r) == 6])
        pool.trace = None
        print(f"  pool stages, {kind} (median ms, all cells; caller return not traced): " +
              ", ".join(f"{k} {v:.3f}" for k, v in st.items() if k != "view+return"), flush=True)
        for r in rows:
            if r["kind"] == kind:
                r["pool_minus_in_process_ms"] = (r["pool"]["median_ms"]
                                                 - r["in process"]["median_ms"],
                                                 r["pool"]["p99_ms"] - r["in process"]["p99_ms"])
    stats = pool.stats()
    print(f"segments made {stats['session_segments_made']}, lists made {stats['lists_made']}, "
          f"failovers {stats['failovers']}")
    print(f"exact: {'yes' if not bad else 'NO ' + str(bad)}")
    print("wrote", write_json("pool-patterns.json", {"machine": info, "args": vars(args),
                                                     "rows": rows, "pool_stats": stats,
                                                     "exact": not bad}))


if __name__ == "__main__":
    main()
