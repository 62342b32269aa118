#!/usr/bin/env python3
"""What a second thread is worth on this machine, with no tokenizer involved.

    python benches/bench_wake.py [--job-ms 2] [--calls 200] [--repeats 3] [--pause-ms 20]

dtok's ``threads`` split a long encode between the calling thread and a pool thread. Whether
that pays depends on the machine as much as on dtok: this script measures it with a job that
releases the GIL and touches no tokenizer (SHA-256 of a buffer sized to take ``--job-ms`` on one
thread). Each call: a pause (``--pause-ms``, or back to back), then one job handed to a pool
thread and one run in the calling thread at once, against the same job on the calling thread
alone. Printed per condition: median and P99 of the wake-up (submit to the pool thread's
start), of each thread's job and of the wall time of the pair, with the spread over
``--repeats`` repeats; then the ratio "both jobs on two threads / one job alone" (1.0: perfect
parallelism; 2.0: none).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import header, machine, summary, write_json  # noqa: E402


def sized_job(job_ms: float):
    buf = os.urandom(8 << 20)
    t0 = time.perf_counter()
    hashlib.sha256(buf).digest()
    per_byte = (time.perf_counter() - t0) / len(buf)
    data = buf[: max(4096, int(job_ms / 1e3 / per_byte))]

    def job() -> tuple[float, float]:
        start = time.perf_counter()
        hashlib.sha256(data).digest()  # releases the GIL
        return start, time.perf_counter()
    return job


def one_repeat(job, pool: ThreadPoolExecutor, calls: int, pause_s: float) -> dict:
    wake, pool_job, own_job, pair, alone = [], [], [], [], []
    for i in range(calls):
        time.sleep(pause_s)
        if i % 2:  # alternate: the job alone, then the pair
            s, e = job()
            alone.append(e - s)
            continue
        t0 = time.perf_counter()
        fut = pool.submit(job)
        ms, me = job()
        ps, pe = fut.result()
        pair.append(time.perf_counter() - t0)
        wake.append(ps - t0)
        pool_job.append(pe - ps)
        own_job.append(me - ms)
    return {"wake": summary(wake), "pool thread's job": summary(pool_job),
            "calling thread's job": summary(own_job), "pair wall": summary(pair),
            "job alone": summary(alone)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--job-ms", type=float, default=2.0)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pause-ms", type=float, default=20.0)
    args = ap.parse_args()
    info = machine()
    print(header(info))
    job = sized_job(args.job_ms)
    pool = ThreadPoolExecutor(1)
    pool.submit(job).result()
    rows = []
    for pause in (args.pause_ms, 0.0):
        reps = [one_repeat(job, pool, args.calls, pause / 1e3) for _ in range(args.repeats)]
        row = {"pause_ms": pause, "repeats": reps}
        for key in reps[0]:
            med = [r[key]["median_ms"] for r in reps]
            p99 = [r[key]["p99_ms"] for r in reps]
            print(f"pause {pause:4.0f} ms  {key:22s} median {statistics.median(med):6.3f} ms "
                  f"(repeats {min(med):.3f}-{max(med):.3f})  P99 {statistics.median(p99):6.3f}")
        ratio = [r["pair wall"]["median_ms"] / r["job alone"]["median_ms"] for r in reps]
        row["pair_over_alone"] = ratio
        print(f"pause {pause:4.0f} ms  two jobs on two threads / one job alone: "
              f"{statistics.median(ratio):.2f} (repeats {min(ratio):.2f}-{max(ratio):.2f})")
        rows.append(row)
    path = write_json("wake.json", {"machine": info, "args": vars(args), "rows": rows})
    print(f"# wrote {path}")


if __name__ == "__main__":
    main()
