#!/usr/bin/env python3
"""What weighing other text by the file's measured work would buy dtok's default threads.

    python benches/bench_split_weight.py [--tokenizers NAME ...] [--sizes N ...]
                                         [--kinds KIND ...] [--pause-ms MS] [--repeats R]

The default threads (``threads=None``) share a text's work out only where the split pays
(docs/knobs.md#threads), every character of other text weighed 3 Latin ones
(``dtok.pieces.TEXT_WEIGHT``). The guard tables record what fastokens take on each file's
other text against Latin text (``speed.text_weight``, tools/data/build_guards.py
--long-pieces). Four encoders, each its own load, in one balanced rotation on distinct
documents, every call on a fresh copy after a pause (``--pause-ms``, 20: requests spaced out;
0: back to back): dtok default (``fixed``), dtok default with other text weighed by the
table's measurement (``measured``), dtok ``threads=1`` and fastokens alone. Each repeat is 12 documents; printed per cell: median and P99 times, the
per-document median ratio of each pair in each repeat, and their range over the repeats. Every
dtok output is compared with the reference's. Run with ``FASTOKENS_BPE_THREADS=1`` (set here
unless set) as bench_fast.py does.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

if os.environ.get("FASTOKENS_BPE_THREADS") is None:  # read when fastokens starts
    os.execve(sys.executable, [sys.executable, *sys.argv],
              {**os.environ, "FASTOKENS_BPE_THREADS": "1"})

import dtok  # noqa: E402
from common import (SHARED, balanced_order, documents, header, machine,  # noqa: E402
                    summary)

DOCS = 12  # documents a repeat: whole periods of the rotation of four encoders
PAIRS = (("measured", "threads=1"), ("fixed", "threads=1"), ("measured", "fixed"),
         ("measured", "fastokens"))


def run(name: str, sizes: list[int], kinds: list[str], pause_ms: float, repeats: int) -> None:
    from fastokens import Tokenizer as Fastokens

    from dtok import guards
    from dtok.encoders import FASTOKENS_VERSION

    path = SHARED / "tokenizers" / name
    fixed = dtok.Tokenizer.from_file(path, content_lookup=False)
    measured = dtok.Tokenizer.from_file(path, content_lookup=False)
    table = guards.BUNDLED_DIR / guards.file_name(measured.admission.sha256, FASTOKENS_VERSION)
    weight = json.loads(table.read_text())["speed"]["text_weight"]
    measured.pieces.text_weight = {**measured.pieces.text_weight, **weight}
    one = dtok.Tokenizer.from_file(path, content_lookup=False, threads=1)
    fast = Fastokens.from_file(str(path / "tokenizer.json"))
    ref = measured.reference
    encoders = {"measured": measured, "fixed": fixed, "threads=1": one}
    calls = {label: (lambda t: lambda s: t.encode(s, add_special_tokens=False))(t)
             for label, t in encoders.items()}
    calls["fastokens"] = lambda s: fast.encode(s, add_special_tokens=False)
    print(f"# {name}: other text weighed {measured.pieces.text_weight['other']} (measured) "
          f"and {fixed.pieces.text_weight['other']} (fixed); pause {pause_ms} ms", flush=True)
    for kind in ("prose", "code", "multilingual", "adversarial"):  # warm every word cache
        warm = documents(kind, 300_000, 7)[-1]
        for fn in calls.values():
            fn((warm + " ")[:-1])
    for size in sizes:
        for kind in kinds:
            docs = documents(kind, size, repeats * DOCS + 1)
            spare = documents(kind, 2 * size, 1)[0]  # each thread's scratch grown first
            for fn in calls.values():
                fn((spare + " ")[:-1])
            for t in encoders.values():
                t.encode_batch([spare[i:i + 65536] for i in range(0, len(spare), 65536)])
            wall = {label: [] for label in calls}
            wrong = 0
            for i, doc in enumerate(docs[:-1]):
                want = ref.encode(doc, add_special_tokens=False).ids
                for label in balanced_order(list(calls), i):
                    s = (doc + " ")[:-1]  # a fresh str, as a request's text arrives
                    time.sleep(pause_ms / 1e3)
                    t0 = time.perf_counter()
                    got = calls[label](s)
                    wall[label].append(time.perf_counter() - t0)
                    if label in encoders and list(got) != want:
                        wrong += 1
            times = "  ".join(f"{label} {summary(v)['median_ms']:.2f} (p99 "
                              f"{summary(v)['p99_ms']:.2f})" for label, v in wall.items())
            ratios = []
            for a, b in PAIRS:
                per_repeat = [statistics.median(x / y for x, y in zip(
                    wall[a][r * DOCS:(r + 1) * DOCS], wall[b][r * DOCS:(r + 1) * DOCS]))
                    for r in range(repeats)]
                ratios.append(f"{a}/{b} {statistics.median(per_repeat):.2f} "
                              f"[{min(per_repeat):.2f}-{max(per_repeat):.2f}]")
            why = {label: encoders[label].explain(docs[0])["why"].split(",")[0]
                   for label in ("measured", "fixed")}
            print(f"{name:12s} {kind:12s} {size:>9,}  {times} ms\n    {'  '.join(ratios)}"
                  f"  (median of the repeats' medians [range]); exact={wrong == 0}; measured: "
                  f"{why['measured']}; fixed: {why['fixed']}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizers", nargs="*", default=["llama3", "deepseek-v3", "gpt-oss",
                                                        "qwen3"])
    ap.add_argument("--sizes", nargs="*", type=int, default=[1_000_000])
    ap.add_argument("--kinds", nargs="*", default=["multilingual", "adversarial"])
    ap.add_argument("--pause-ms", type=float, default=20.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print(header(machine()), flush=True)
    for name in args.tokenizers:
        run(name, args.sizes, args.kinds, args.pause_ms, args.repeats)


if __name__ == "__main__":
    main()
