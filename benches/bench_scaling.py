#!/usr/bin/env python3
"""dtok's stateless encode on more cores: threads 1, 2, 4, ... against the encoders alone.

    python benches/bench_scaling.py [--tokenizers qwen3 llama3] [--sizes 1000000 4000000]
                                    [--threads 1 2 4 8 16] [--docs 6] [--pause-ms 20]
                                    [--repeats 1]

A text cut at safe cuts is encoded on several threads (docs/encoders.md, "Threads"); on the
2-vCPU development machine that can show little. This measures it where there are more cores:
for each tokenizer, text kind and size, distinct documents (every call on a fresh copy, after
``--pause-ms``) are encoded by dtok with an explicit ``threads=N`` for each N, dtok with its
default threads (the usable CPUs, where the split pays), fastokens alone and
gigatoken alone (each with its own threads: fastokens' BPE threads, one per CPU by default,
gigatoken's own), each its own instance, in a balanced rotation. dtok's runs are in a process
with ``FASTOKENS_BPE_THREADS=1`` (dtok divides the work itself, docs/encoders.md; dtok's own
default on 2 CPUs or fewer), and in another with fastokens' own default given explicitly (one
BPE thread per CPU), the encoders alone in another with their defaults, each warmed with a
spare document of twice the timed size on every thread first. With ``--repeats``, every side's
process runs again, the sides in another order each repeat. Every output is compared with the
reference's (computed before the timing); a wrong one is printed. Printed: medians in ms, P99,
speed-up against dtok ``threads=1`` and the ratio to fastokens alone (per repeat; over repeats
their median and range); JSON to bench-results/scaling.json.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (SHARED, balanced_order, balanced_period, documents, header,  # noqa: E402
                    machine, summary, write_json)

KINDS = ("prose", "code", "multilingual", "adversarial")


# Each side runs in a process of its own: (what it holds, FASTOKENS_BPE_THREADS, which fastokens
# reads once per process; "cpus": fastokens' own default, one BPE thread per CPU, given
# explicitly because dtok holds an unset variable to 1 on few CPUs; None: left unset)
SIDES = {"dtok": ("dtok", "1"), "dtok, fastokens' threads": ("dtok-default", "cpus"),
         "alone": ("peers", None), "alone, 1 thread": ("fastokens", "1")}


def encoders(side: str, name: str, threads: list[int]) -> dict:
    """The encoders of one side (:data:`SIDES`): dtok with every N of ``threads`` and its
    default, dtok's default and threads=1 only, fastokens and gigatoken alone (their own
    parallelism), or fastokens alone."""
    path = SHARED / "tokenizers" / name
    holds, _bpe = SIDES[side]
    suffix = "" if side == "dtok" else f" ({side})"
    if holds.startswith("dtok"):
        import dtok

        out = {}
        for n in threads if holds == "dtok" else [1]:
            tok = dtok.Tokenizer.from_file(path, content_lookup=False, threads=n)
            out[f"dtok threads={n}{suffix}"] = (
                tok, lambda d, t=tok: t.encode(d, add_special_tokens=False))
        tok = dtok.Tokenizer.from_file(path, content_lookup=False)
        out[f"dtok default{suffix}"] = (tok, lambda d, t=tok: t.encode(d, add_special_tokens=False))
        return out
    import fastokens

    raw = (path / "tokenizer.json").read_text(encoding="utf-8")
    ft = fastokens.Tokenizer.from_json_str(raw)
    out = {f"fastokens{suffix if holds == 'fastokens' else ''}": (
        None, lambda d: ft.encode_batch_flat([d], add_special_tokens=False)[0])}
    if holds == "peers":
        import gigatoken

        gt = gigatoken.Tokenizer.from_json(raw)
        out["gigatoken"] = (None, lambda d: gt.encode(d))
    return out


def as_list(label: str, out) -> list[int]:
    if label.startswith("fastokens"):
        return memoryview(out).cast("I").tolist()
    if label == "gigatoken":
        return out.tolist()
    return list(out)


def run_side(side: str, name: str, sizes: list[int], threads: list[int], n_docs: int,
             pause_ms: float) -> list[dict]:
    from tokenizers import Tokenizer as HF

    ref = HF.from_file(str(SHARED / "tokenizers" / name / "tokenizer.json"))
    encs = encoders(side, name, threads)
    labels = list(encs)
    period = balanced_period(len(labels))
    n_docs = period * -(-n_docs // period)
    rows = []
    for size in sizes:
        for kind in KINDS:
            docs = documents(kind, size, n_docs + 1)[:-1]
            spare = documents(kind, 2 * size, 1)[0]
            for label, (tok, fn) in encs.items():
                fn((spare + " ")[:-1])
                if tok is not None:  # every thread of dtok's past fastokens' scratch growth
                    tok.encode_batch([spare[i:i + 65536] for i in range(0, len(spare), 65536)])
            wants = [e.ids for e in ref.encode_batch_fast(docs, add_special_tokens=False)]
            wall: dict[str, list[float]] = {k: [] for k in labels}
            wrong: dict[str, int] = {k: 0 for k in labels}
            for i, (doc, want) in enumerate(zip(docs, wants)):
                for label in balanced_order(labels, i):
                    fresh = (doc + " ")[:-1]
                    time.sleep(pause_ms / 1e3)
                    t0 = time.perf_counter()
                    got = encs[label][1](fresh)
                    wall[label].append(time.perf_counter() - t0)
                    if as_list(label, got) != want:
                        wrong[label] += 1
            row = {"tokenizer": name, "side": side, "kind": kind, "chars": size,
                   "docs": len(docs), "wall": {k: summary(v) for k, v in wall.items()},
                   "wrong": {k: v for k, v in wrong.items() if v}}
            rows.append(row)
            print(f"{name:12s} {kind:12s} {size:>9,}  " + "  ".join(
                f"{k} {row['wall'][k]['median_ms']:7.2f}" + (f" WRONG {wrong[k]}/{len(docs)}"
                                                            if wrong[k] else "")
                for k in labels) + " ms", flush=True)
    return rows


def report(rows: list[dict]) -> None:
    """Speed-ups against dtok threads=1 and ratios to fastokens alone, per cell: each a ratio
    of medians within one repeat, then (several repeats) their median [range]."""
    cells: dict[tuple, list[dict]] = {}
    rows = sorted(rows, key=lambda r: list(SIDES).index(r["side"]))
    for r in rows:
        runs = cells.setdefault((r["tokenizer"], r["kind"], r["chars"]), [])
        while len(runs) <= r.get("repeat", 0):
            runs.append({})
        runs[r.get("repeat", 0)].update({k: v["median_ms"] for k, v in r["wall"].items()})

    def spread(values: list[float], fmt: str) -> str:
        if len(values) == 1:
            return format(values[0], fmt)
        return (f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-"
                f"{max(values):{fmt}}]")

    print("\n| tokenizer | text | chars | " + " | ".join(
        k for k in next(iter(cells.values()))[0]) + " |")
    for (name, kind, size), runs in cells.items():
        parts = []
        for k in runs[0]:
            ms = [run[k] for run in runs if k in run]
            extra = []
            ones = [run["dtok threads=1"] / run[k] for run in runs
                    if k.startswith("dtok") and "dtok threads=1" in run]
            if ones:
                extra.append("x" + spread(ones, ".2f"))
            alone = [run[k] / run["fastokens"] for run in runs if "fastokens" in run]
            if alone:
                extra.append(spread(alone, ".2f") + " of fastokens")
            parts.append(f"{spread(ms, '.2f')} ms ({', '.join(extra)})")
        print(f"| {name} | {kind} | {size:,} | " + " | ".join(parts) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizers", nargs="*", default=["qwen3", "llama3"])
    ap.add_argument("--sizes", nargs="*", type=int, default=[1_000_000, 4_000_000])
    ap.add_argument("--threads", nargs="*", type=int, default=None,
                    help="dtok's explicit thread counts (default: 1, 2, 4, ... up to the CPUs)")
    ap.add_argument("--docs", type=int, default=6, help="distinct documents per cell")
    ap.add_argument("--pause-ms", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=1,
                    help="every side's process this many times, the sides' order rotated")
    ap.add_argument("--sides", nargs="*", default=list(SIDES), choices=list(SIDES))
    ap.add_argument("--child", choices=list(SIDES))
    ap.add_argument("--out")
    args = ap.parse_args()
    cpus = len(os.sched_getaffinity(0))
    threads = args.threads or [n for n in (1, 2, 4, 8, 16, 32, 64) if n <= cpus]
    if args.child:
        rows = [r for name in args.tokenizers for r in run_side(
            args.child, name, args.sizes, threads, args.docs, args.pause_ms)]
        Path(args.out).write_text(json.dumps(rows))
        return 0
    info = machine()
    print(header(info), flush=True)
    rows: list[dict] = []
    scratch = Path(tempfile.mkdtemp(prefix="dtok-scaling-"))  # each child's rows
    for repeat in range(args.repeats):
        shift = repeat % len(args.sides)
        for i, side in enumerate(args.sides[shift:] + args.sides[:shift]):
            env = dict(os.environ)
            env.pop("FASTOKENS_BPE_THREADS", None)
            bpe = SIDES[side][1]
            if bpe is not None:
                env["FASTOKENS_BPE_THREADS"] = str(cpus) if bpe == "cpus" else bpe
            out = scratch / f"side-{i}.json"
            cmd = [sys.executable, __file__, "--child", side, "--out", str(out), "--docs",
                   str(args.docs), "--pause-ms", str(args.pause_ms), "--tokenizers",
                   *args.tokenizers, "--sizes", *map(str, args.sizes), "--threads",
                   *map(str, threads)]
            subprocess.run(cmd, env=env, check=True)
            rows += [{**r, "repeat": repeat} for r in json.loads(out.read_text())]
            out.unlink()
    scratch.rmdir()
    report(rows)
    wrong = [(r["tokenizer"], r["kind"], r["wrong"]) for r in rows if r["wrong"]]
    print(f"wrong outputs: {wrong or 'none'}")
    path = write_json("scaling.json", {"machine": info, "args": vars(args), "rows": rows})
    print(f"wrote {path}")
    return 1 if any(k.startswith("dtok") for _, _, w in wrong for k in w) else 0


if __name__ == "__main__":
    sys.exit(main())
