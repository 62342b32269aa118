#!/usr/bin/env python3
"""Start a pool many times in a row, some starts with the CPUs busy; count hangs.

    python tools/reliability/pool_start_campaign.py [--starts 200] [--under-load-every 3]
                                                    [--workers 2] [--tokenizer qwen3] [--timeout 60]

Each start builds ``dtok.Pool(tokenizer, workers=N)``, encodes one keyed text, checks it against
the reference and closes the pool. Every ``--under-load-every``-th start runs while as many
busy-looping processes as there are CPUs compete for them. A start that does not finish within
``--timeout`` seconds is a hang (the pool would raise PoolError after its start_timeout). Prints
the start times (median, P99, max) with and without load, replacements seen, and the number of
hangs; exits non-zero on any hang or difference.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("DTOK_SHARED", ROOT.parent / "shared"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--starts", type=int, default=200)
    ap.add_argument("--under-load-every", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--tokenizer", default="qwen3")
    ap.add_argument("--timeout", type=float, default=60.0)
    args = ap.parse_args()

    import dtok
    from dtok.pool import Pool, PoolError

    path = SHARED / "tokenizers" / args.tokenizer
    tok = dtok.Tokenizer.from_file(path) if path.exists() else dtok.Tokenizer.default()
    text = "a keyed text to encode after the start " * 200
    want = tok.reference.encode(text).ids
    times = {"idle": [], "load": []}
    hangs, bad, replacements = 0, 0, 0
    for i in range(args.starts):
        loaded = args.under_load_every and i % args.under_load_every == 0
        burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                   for _ in range(os.cpu_count() or 2)] if loaded else []
        t0 = time.monotonic()
        try:
            with Pool(tok, workers=args.workers, name=f"campaign{i}",
                      start_timeout=args.timeout) as pool:
                bad += list(pool.encode(text, session="k")) != want
                replacements += pool.stats()["replacements"]
        except PoolError as exc:
            hangs += 1
            print(f"start {i}: {exc}", flush=True)
        finally:
            for b in burners:
                b.kill()
                b.wait()
        dt = time.monotonic() - t0
        times["load" if loaded else "idle"].append(dt)
        if (i + 1) % 20 == 0:
            print(f"{i + 1} starts: hangs {hangs}, differences {bad}, replacements "
                  f"{replacements}", flush=True)
    for label, xs in times.items():
        if xs:
            xs.sort()
            print(f"{label:4s}: {len(xs)} starts, median {statistics.median(xs):.2f} s, P99 "
                  f"{xs[min(len(xs) - 1, round(0.99 * (len(xs) - 1)))]:.2f} s, max {xs[-1]:.2f} s")
    print(f"{args.starts} starts, {hangs} hangs, {bad} differences, {replacements} replacements")
    return 1 if hangs or bad else 0


if __name__ == "__main__":
    sys.exit(main())
