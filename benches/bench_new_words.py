#!/usr/bin/env python3
"""A split of 1M characters of Latin text on text whose words are new to the process.

    python benches/bench_new_words.py [--tokenizers llama3 qwen3] [--repeats 3]
                                      [--pause-ms 20 0]

fastokens keeps state across calls that makes words it has met cheaper (its segment cache off:
docs/encoders.md, "gigatoken's memory"), so a benchmark that meets the same corpus words again
and again measures Latin text at its cheapest, where dtok's default kept 1M characters in one
piece on one thread until the 2026-12-06 bound (``dtok.chunk_encoder.AUTO_SPLIT_SAVING``; its memo is
kept per thread, benches/bench_split_stream.py measures a long-lived process). This measures
``threads=1`` against ``threads=2`` where every document is new to the process: each variant
runs in a process of its own that encodes each document once (the two in alternating order,
``--repeats`` times), on
1M-character windows of the coding-agent transcripts (raw JSON, as a stateless request holds
them) and on prose with its letters permuted per document (new words, the same layout). dtok's
defaults otherwise (fastokens held to one thread of its own on 2 CPUs). Every output is
compared with the reference's, computed first. Printed per repeat: each variant's median and
P99 and the median of the per-document ratios threads=2 / threads=1; then their median and
range over the repeats.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (LETTERS, SHARED, documents, header, machine, permuted_letters,  # noqa: E402
                    summary, transcript_windows, write_json)


def texts() -> dict[str, list[str]]:
    """The documents of each kind: the same in every process."""
    rng = random.Random(7)
    permuted = [permuted_letters(doc, rng) for doc in documents("prose", 1_000_000, 9)[:8]]
    return {"transcripts": transcript_windows(1_000_000), "prose, new words": permuted}


def child(threads: int, name: str, pause_s: float) -> dict[str, list[float]]:
    """Wall times of one variant, each document encoded once in this fresh process."""
    from tokenizers import Tokenizer as HF

    import dtok

    path = SHARED / "tokenizers" / name
    tok = dtok.Tokenizer.from_file(path, content_lookup=False, threads=threads)
    ref = HF.from_file(str(path / "tokenizer.json"))
    # every thread started and its encoder's scratch grown, on words the documents lack
    spare = documents("code", 2_000_000, 1)[0].translate(str.maketrans(LETTERS, LETTERS[::-1]))
    out = {}
    for kind, docs in texts().items():
        wants = [e.ids for e in ref.encode_batch_fast(docs, add_special_tokens=False)]
        tok.encode(spare)
        wall = []
        for doc, want in zip(docs, wants):
            time.sleep(pause_s)
            fresh = (doc + " ")[:-1]
            t0 = time.perf_counter()
            got = tok.encode(fresh, add_special_tokens=False)
            wall.append(time.perf_counter() - t0)
            if list(got) != want:
                raise SystemExit(f"WRONG: {name} {kind} threads={threads}")
        out[kind] = wall
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizers", nargs="*", default=["llama3", "qwen3"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pause-ms", nargs="*", type=float, default=[20.0, 0.0])
    ap.add_argument("--child", nargs=3, metavar=("THREADS", "TOKENIZER", "PAUSE_MS"))
    args = ap.parse_args()
    if args.child:
        threads, name, pause_ms = args.child
        print(json.dumps(child(int(threads), name, float(pause_ms) / 1e3)))
        return 0
    info = machine()
    print(header(info), flush=True)
    rows = []
    for name in args.tokenizers:
        for pause_ms in args.pause_ms:
            ratios: dict[str, list[float]] = {}
            for repeat in range(args.repeats):
                walls = {}
                for threads in (1, 2) if repeat % 2 == 0 else (2, 1):
                    run = subprocess.run([sys.executable, __file__, "--child", str(threads), name,
                                          str(pause_ms)], capture_output=True, text=True)
                    if run.returncode:
                        print(run.stdout + run.stderr)
                        return 1
                    walls[threads] = json.loads(run.stdout.strip().splitlines()[-1])
                for kind in walls[1]:
                    one, two = summary(walls[1][kind]), summary(walls[2][kind])
                    ratio = statistics.median(b / a for a, b in zip(walls[1][kind],
                                                                    walls[2][kind]))
                    ratios.setdefault(kind, []).append(ratio)
                    rows.append({"tokenizer": name, "pause_ms": pause_ms, "repeat": repeat,
                                 "kind": kind, "threads=1": one, "threads=2": two,
                                 "ratio": ratio})
                    print(f"{name:8s} {pause_ms:4.0f} ms apart, repeat {repeat}, {kind:17s} "
                          f"threads=1 {one['median_ms']:6.2f} (P99 {one['p99_ms']:6.2f})  "
                          f"threads=2 {two['median_ms']:6.2f} (P99 {two['p99_ms']:6.2f}) ms  "
                          f"2/1 {ratio:.2f}", flush=True)
            for kind, values in ratios.items():
                print(f"== {name} {pause_ms:.0f} ms apart, {kind}: threads=2 / threads=1 "
                      f"{statistics.median(values):.2f} [{min(values):.2f}-{max(values):.2f}]",
                      flush=True)
    path = write_json("new-words.json", {"machine": info, "args": vars(args), "rows": rows})
    print(f"every output equal to the reference's; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
