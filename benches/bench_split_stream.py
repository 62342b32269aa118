#!/usr/bin/env python3
"""dtok's default threads against the split rule before, ``threads=1`` and ``threads=2``, on a
server's mixed stream of long requests.

    python benches/bench_split_stream.py [--tokenizers llama3 qwen3] [--repeats 3]
                                         [--pause-ms 20 0] [--requests 40]
                                         [--variants default "threads never renewed"]

Each variant runs in a process of its own (the order rotated over the repeats) that answers one
stream of requests, the text kinds taking turns: 1M-character windows of the coding-agent
transcripts (raw JSON), corpus prose (words met again and again), prose with its letters
permuted anew for each request (every word new), Python code, multilingual and adversarial
text, and 400K characters of multilingual text; ``--requests`` of each kind, each request a
fresh string, ``--pause-ms`` apart. A server's process lives through many requests, and
fastokens keeps its memo of words met per thread: a benchmark whose process meets a few
documents measures a second thread that has met no words. Variants: dtok's default
(``AUTO_SPLIT_SAVING``), the bound before 2026-12-06 (1,250,000: 1M characters of Latin text
and 400K of other text on one thread, 1M of other text split), ``threads=1`` and ``threads=2``.
``--variants`` picks some (the first is compared with the others), among them ``threads never
renewed`` (knob ``thread_renew_chars=0``: the encoding threads, and their memos, live on) and
one ``no <mechanism>`` for each scheduling mechanism of ``dtok.testing.MECHANISMS``, switched
off alone for the whole process (``dtok.testing.switched_off``; docs/benchmarks.md#scheduling-
mechanisms-each-switched-off).
fastokens is held to one thread of its own on 2 CPUs, as dtok's default does. Every output's
digest is compared with the reference's, computed first in this process. Printed per repeat
and kind: each variant's mean, median and P99; then the default's median over the others'
(the per-repeat ratio of medians), median and range over repeats, and the whole stream's time
(the sum of the means).
"""
from __future__ import annotations

import argparse
from array import array
import hashlib
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dtok.testing import MECHANISMS  # noqa: E402
from dtok.tokenizer import parts_of  # noqa: E402
from common import (LETTERS, SHARED, balanced_order, documents, header, machine,  # noqa: E402
                    permuted_letters, summary, transcript_windows, write_json)

VARIANTS = ["default", "before", "threads=1", "threads=2", "threads never renewed",
            *(f"no {m}" for m in MECHANISMS)]
KINDS = ["transcripts", "prose", "prose, new words", "code", "multilingual", "adversarial",
         "multilingual, 400K"]
BOUND_BEFORE = 1_250_000  # dtok.chunk_encoder.AUTO_SPLIT_SAVING until 2026-12-06


def stream(requests: int) -> list[tuple[str, str]]:
    """(kind, text) of every request, in order: the same in every process."""
    pools = {"transcripts": transcript_windows(1_000_000), "prose": documents("prose", 1_000_000, 12),
             "code": documents("code", 1_000_000, 12),
             "multilingual": documents("multilingual", 1_000_000, 12),
             "adversarial": documents("adversarial", 1_000_000, 12),
             "multilingual, 400K": documents("multilingual", 400_000, 12)}
    rng = random.Random(11)
    prose = pools["prose"]
    out = []
    for i in range(requests):
        for kind in KINDS:
            if kind == "prose, new words":
                text = permuted_letters(prose[i % len(prose)], rng)
            else:
                text = pools[kind][i % len(pools[kind])]
            out.append((kind, text))
    return out


def digest(ids) -> str:
    """Of int32 IDs (a buffer or an ``array``)."""
    return hashlib.blake2b(memoryview(ids).cast("B"), digest_size=16).hexdigest()


def child(variant: str, name: str, pause_s: float, requests: int) -> dict:
    """Wall times and output digests of one variant's stream, in this fresh process."""
    import dtok
    from dtok import testing

    if variant.startswith("no "):
        with testing.switched_off(variant[3:]):
            return child("default", name, pause_s, requests)
    threads = {"threads=1": 1, "threads=2": 2}.get(variant)
    renew = {"thread_renew_chars": 0} if variant == "threads never renewed" else {}
    tok = dtok.Tokenizer.from_file(SHARED / "tokenizers" / name, content_lookup=False,
                                   threads=threads, **renew)
    if variant == "before":
        parts_of(tok).chunk_encoder.split_saving = BOUND_BEFORE
    # every thread started (8.2M characters: split by every variant with two threads) and its
    # encoder's scratch grown, on words the stream lacks
    spare = documents("code", 8_200_000, 1)[0].translate(str.maketrans(LETTERS, LETTERS[::-1]))
    tok.encode(spare)
    walls: dict[str, list[float]] = {k: [] for k in KINDS}
    digests: dict[str, list[str]] = {k: [] for k in KINDS}
    for kind, text in stream(requests):
        time.sleep(pause_s)
        fresh = (text + " ")[:-1]
        t0 = time.perf_counter()
        got = tok.encode(fresh, add_special_tokens=False)
        walls[kind].append(time.perf_counter() - t0)
        digests[kind].append(digest(got))
    return {"walls": walls, "digests": digests}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizers", nargs="*", default=["llama3", "qwen3"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pause-ms", nargs="*", type=float, default=[20.0, 0.0])
    ap.add_argument("--requests", type=int, default=40, help="requests of each kind")
    ap.add_argument("--variants", nargs="*", default=VARIANTS[:4], choices=VARIANTS,
                    help="the first is the one the others are compared with")
    ap.add_argument("--child", nargs=4, metavar=("VARIANT", "TOKENIZER", "PAUSE_MS", "REQUESTS"))
    args = ap.parse_args()
    if args.child:
        variant, name, pause_ms, requests = args.child
        print(json.dumps(child(variant, name, float(pause_ms) / 1e3, int(requests))))
        return 0
    from tokenizers import Tokenizer as HF

    variants, first = args.variants, args.variants[0]

    info = machine()
    print(header(info), flush=True)
    rows = []
    for name in args.tokenizers:
        ref = HF.from_file(str(SHARED / "tokenizers" / name / "tokenizer.json"))
        want: dict[str, list[str]] = {k: [] for k in KINDS}
        seen: dict[str, str] = {}
        for kind, text in stream(args.requests):
            if text not in seen:
                ids = ref.encode(text, add_special_tokens=False).ids
                seen[text] = digest(array("i", ids))
            want[kind].append(seen[text])
        del seen
        for pause_ms in args.pause_ms:
            ratios: dict[tuple, list[float]] = {}
            for repeat in range(args.repeats):
                runs = {}
                for variant in balanced_order(variants, repeat):
                    run = subprocess.run([sys.executable, __file__, "--child", variant, name,
                                          str(pause_ms), str(args.requests)],
                                         capture_output=True, text=True)
                    if run.returncode:
                        print(run.stdout + run.stderr)
                        return 1
                    runs[variant] = json.loads(run.stdout.strip().splitlines()[-1])
                    wrong = [(k, i) for k in KINDS for i, (a, b) in
                             enumerate(zip(runs[variant]["digests"][k], want[k])) if a != b]
                    if wrong:
                        raise SystemExit(f"WRONG: {name} {variant} {wrong[:5]}")
                print(f"{name} {pause_ms:.0f} ms apart, repeat {repeat}:", flush=True)
                for kind in KINDS:
                    means = {v: statistics.fmean(runs[v]["walls"][kind]) * 1e3 for v in variants}
                    stats = {v: summary(runs[v]["walls"][kind]) for v in variants}
                    rows.append({"tokenizer": name, "pause_ms": pause_ms, "repeat": repeat,
                                 "kind": kind, "mean_ms": means, "summary": stats})
                    for v in variants[1:]:
                        ratios.setdefault((kind, v), []).append(
                            stats[first]["median_ms"] / stats[v]["median_ms"])
                    print(f"  {kind:18s} " + "  ".join(
                        f"{v} {means[v]:5.2f}/{stats[v]['median_ms']:5.2f}/"
                        f"{stats[v]['p99_ms']:5.2f}" for v in variants)
                        + "  (mean/median/P99 ms)", flush=True)
                for v in variants[1:]:
                    ratios.setdefault(("whole stream", v), []).append(
                        sum(r["mean_ms"][first] for r in rows[-len(KINDS):])
                        / sum(r["mean_ms"][v] for r in rows[-len(KINDS):]))
            for kind in [*KINDS, "whole stream"]:
                print(f"== {name} {pause_ms:.0f} ms apart, {kind:18s} {first} / " + ", ".join(
                    f"{v} {statistics.median(r):.2f} [{min(r):.2f}-{max(r):.2f}]"
                    for v in variants[1:] for r in [ratios[(kind, v)]]), flush=True)
    path = write_json("split-stream.json", {"machine": info, "args": vars(args), "rows": rows})
    print(f"every output equal to the reference's; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
