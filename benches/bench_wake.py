#!/usr/bin/env python3
"""What a second thread is worth on this machine, with no tokenizer involved.

    python benches/bench_wake.py [--job-ms 2] [--calls 200] [--repeats 3] [--pause-ms 20]
                                 [--pools plain dtok]

dtok's ``threads`` split a long encode between the calling thread and a pool thread. Whether
that pays depends on the machine as much as on dtok: this script measures it with a job that
releases the GIL and touches no tokenizer (SHA-256 of a buffer sized to take ``--job-ms`` on one
thread). Each call: a pause (``--pause-ms``, or back to back), then one job handed to a pool
thread and one run in the calling thread at once, against the same job on the calling thread
alone. Printed per condition: median and P99 of the wake-up (submit to the pool thread's
start), of each thread's job and of the wall time of the pair, with the spread over
``--repeats`` repeats; then the ratio "both jobs on two threads / one job alone" (1.0: perfect
parallelism; 2.0: none), and how often the pool thread ran its job on the CPU the calling
thread was on when it handed the job out (``sched_getcpu``). ``--pools``: the pool threads are
a plain ``ThreadPoolExecutor`` (``plain``) or dtok's encoding threads, which run such a job off
the caller's CPU (``dtok``, :mod:`dtok.encode_threads`); both are measured in one run,
alternating call by call.
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
from dtok.encode_threads import EncodeThreads  # noqa: E402
from dtok_ext.cpus import current_cpu  # noqa: E402


def sized_job(job_ms: float):
    buf = os.urandom(8 << 20)
    t0 = time.perf_counter()
    hashlib.sha256(buf).digest()
    per_byte = (time.perf_counter() - t0) / len(buf)
    data = buf[: max(4096, int(job_ms / 1e3 / per_byte))]

    def job() -> tuple[float, float, int]:
        start = time.perf_counter()
        cpu = current_cpu()
        hashlib.sha256(data).digest()  # releases the GIL
        return start, time.perf_counter(), cpu
    return job


def dtok_submit():
    """Hand one job to dtok's encoding threads, off the caller's CPU."""
    threads = EncodeThreads(1)
    return lambda job: threads.beside([job])[0]


POOLS = {"plain": lambda: ThreadPoolExecutor(1).submit, "dtok": dtok_submit}


def one_repeat(job, submits: dict, calls: int, pause_s: float) -> dict:
    """``calls`` rounds; in each, for every pool in turn: the job alone, then the pair."""
    out = {}
    for name in submits:
        out[name] = {"wake": [], "pool thread's job": [], "calling thread's job": [],
                     "pair wall": [], "job alone": [], "same_cpu": 0}
    for _ in range(calls):
        for name, submit in submits.items():
            rec = out[name]
            time.sleep(pause_s)
            s, e, _ = job()
            rec["job alone"].append(e - s)
            time.sleep(pause_s)
            t0 = time.perf_counter()
            caller_cpu = current_cpu()
            fut = submit(job)
            ms, me, _ = job()
            ps, pe, pool_cpu = fut.result()
            rec["pair wall"].append(time.perf_counter() - t0)
            rec["wake"].append(ps - t0)
            rec["pool thread's job"].append(pe - ps)
            rec["calling thread's job"].append(me - ms)
            rec["same_cpu"] += pool_cpu == caller_cpu
    return {name: {k: v if k == "same_cpu" else summary(v) for k, v in rec.items()}
            for name, rec in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--job-ms", type=float, default=2.0)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pause-ms", type=float, default=20.0)
    ap.add_argument("--pools", nargs="+", choices=list(POOLS), default=list(POOLS))
    args = ap.parse_args()
    info = machine()
    print(header(info))
    job = sized_job(args.job_ms)
    submits = {name: POOLS[name]() for name in args.pools}
    for submit in submits.values():
        submit(job).result()
    rows = []
    for pause in (args.pause_ms, 0.0):
        reps = [one_repeat(job, submits, args.calls, pause / 1e3) for _ in range(args.repeats)]
        for name in submits:
            row = {"pause_ms": pause, "pool": name, "repeats": [r[name] for r in reps]}
            for key in reps[0][name]:
                if key == "same_cpu":
                    continue
                med = [r[name][key]["median_ms"] for r in reps]
                p99 = [r[name][key]["p99_ms"] for r in reps]
                print(f"pause {pause:4.0f} ms  {name:5s}  {key:22s} median "
                      f"{statistics.median(med):6.3f} ms (repeats {min(med):.3f}-{max(med):.3f})"
                      f"  P99 {statistics.median(p99):6.3f}")
            ratio = [r[name]["pair wall"]["median_ms"] / r[name]["job alone"]["median_ms"]
                     for r in reps]
            same = [r[name]["same_cpu"] for r in reps]
            row["pair_over_alone"] = ratio
            print(f"pause {pause:4.0f} ms  {name:5s}  two jobs on two threads / one job alone: "
                  f"{statistics.median(ratio):.2f} (repeats {min(ratio):.2f}-{max(ratio):.2f}); "
                  f"pool thread on the caller's CPU in {min(same)}-{max(same)} of {args.calls}")
            rows.append(row)
    path = write_json("wake.json", {"machine": info, "args": vars(args), "rows": rows})
    print(f"# wrote {path}")


if __name__ == "__main__":
    main()
