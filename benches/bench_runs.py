#!/usr/bin/env python3
"""The default threads' runs of chunks: taken a step at a time from both ends, or whole.

    python benches/bench_runs.py [--tokenizers llama3 deepseek-v3 gpt-oss] [--repeats 3]
                                 [--regimes spaced b2b after-gigatoken busy]

A text in many chunks that dtok's default threads split goes in one contiguous run a thread.
Since 2026-12-06 a pool thread takes its run a step at a time from the front (since 2026-12-07
up to ``dtok.pieces.RUN_STEP_CHARS`` characters: two 64K chunks, or one longer piece; before,
two chunks), and the calling thread, done with its own run, takes what is left from the back
(``PieceEncoder._encode_runs``). Since 2026-12-07 Llama-3.1's and DeepSeek-V3's other text goes
in two long pieces a thread, not 64K chunks (``dtok.pieces.LONG_PIECES_PER_THREAD``). This
compares, in one process and one balanced rotation, three loads of the same file: dtok's default
(``steps``), the same with each run taken whole (``whole``: the step set through the private
hook ``_run_step_chars`` to more than a run, what dtok did before) and ``threads=1`` (``one``),
on 1M-character multilingual and adversarial documents (each a fresh str; 12 a repeat), with
every output compared with the reference. Regimes: ``spaced`` (20 ms before each call: the other
core idles in between), ``b2b`` (back to back), ``after-gigatoken`` (gigatoken 0.10.0 encodes
another 1M document right before each call: its own threads are still about on both cores, as in
a process that holds it too) and ``busy`` (another process beside, unpinned, spinning 4 ms of
every 8: a shared machine).
Printed per regime: each variant's median and P99, and the ratios steps / whole, steps / one,
whole / one: the median of the per-document ratios in each repeat, then the median and the
range over the repeats.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (SHARED, balanced_order, documents, header, machine, summary,  # noqa: E402
                    write_json)

REGIMES = ("spaced", "b2b", "after-gigatoken", "busy")
DOCS = 12  # documents a repeat (a whole number of the rotation's periods over three labels)


def spin(on_s: float = 0.004, off_s: float = 0.004) -> None:
    """The ``busy`` regime's neighbour: spin ``on_s``, sleep ``off_s``, for ever."""
    while True:
        t = time.perf_counter()
        while time.perf_counter() - t < on_s:
            pass
        time.sleep(off_s)


def run(name: str, repeats: int, regimes: list[str]) -> list[dict]:
    import dtok
    from dtok.encoders import GigaEncoder

    path = SHARED / "tokenizers" / name
    # each its own load: two views of one load share its fast encoder, and whichever met a
    # document second was faster (bench_fast.py)
    steps = dtok.Tokenizer.from_file(path, content_lookup=False)
    whole = dtok.Tokenizer.from_file(path, content_lookup=False)
    whole.pieces._run_step_chars = 1 << 30  # a step longer than any run: each run taken whole
    one = dtok.Tokenizer.from_file(path, content_lookup=False, threads=1)
    toks = {"steps": steps, "whole": whole, "one": one}
    giga = GigaEncoder(steps.tokenizer_json(), steps.reference)
    rows = []
    for kind in ("multilingual", "adversarial"):
        docs = documents(kind, 1_000_000, DOCS * repeats + 1)
        spare, other = documents(kind, 2_000_000, 1)[0], docs.pop()
        for tok in toks.values():  # every thread's scratch grown, as a serving process has
            tok.encode(spare)
            tok.encode_batch([spare[i:i + 65536] for i in range(0, len(spare), 65536)])
        giga.encode(other)
        wants = [steps.reference.encode(d, add_special_tokens=False).ids for d in docs]
        print(f"{name} {kind}: {steps.explain(docs[0])['why'][:50]}", flush=True)
        for regime in regimes:
            neighbour = None
            if regime == "busy":
                neighbour = multiprocessing.Process(target=spin, daemon=True)
                neighbour.start()
                time.sleep(0.2)
            wall: dict[str, list[float]] = {k: [] for k in toks}
            ratios: dict[str, list[float]] = {"steps/whole": [], "steps/one": [], "whole/one": []}
            exact = True
            try:
                for rep in range(repeats):
                    per: dict[str, list[float]] = {k: [] for k in ratios}
                    for i in range(rep * DOCS, (rep + 1) * DOCS):
                        t = {}
                        for label in balanced_order(list(toks), i):
                            fresh = (docs[i] + " ")[:-1]  # a new str, as a request's text
                            if regime == "after-gigatoken":
                                giga.encode((other + " ")[:-1])
                            elif regime in ("spaced", "busy"):
                                time.sleep(0.02)
                            t0 = time.perf_counter()
                            ids = toks[label].encode(fresh, add_special_tokens=False)
                            t[label] = time.perf_counter() - t0
                            exact &= list(ids) == wants[i]
                            wall[label].append(t[label])
                        for k in per:
                            a, b = k.split("/")
                            per[k].append(t[a] / t[b])
                    for k in per:
                        ratios[k].append(statistics.median(per[k]))
            finally:
                if neighbour is not None:
                    neighbour.terminate()
                    neighbour.join()
            row = {"tokenizer": name, "kind": kind, "regime": regime, "exact": exact,
                   "wall": {k: summary(v) for k, v in wall.items()},
                   "ratios": {k: {"median": statistics.median(v), "min": min(v), "max": max(v)}
                              for k, v in ratios.items()}}
            rows.append(row)
            print(f"  {regime:16s}" + "".join(
                f"  {k} {row['wall'][k]['median_ms']:6.2f} (p99 {row['wall'][k]['p99_ms']:6.2f})"
                for k in toks) + "".join(
                f"  {k} {r['median']:.2f} [{r['min']:.2f}-{r['max']:.2f}]"
                for k, r in row["ratios"].items()) + f"  exact={exact}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizers", nargs="*", default=["llama3", "deepseek-v3", "gpt-oss"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--regimes", nargs="*", default=list(REGIMES), choices=list(REGIMES))
    args = ap.parse_args()
    # fastokens' own BPE threads off: dtok divides a text across its threads itself
    os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
    info = machine()
    print(header(info))
    rows = [row for name in args.tokenizers for row in run(name, args.repeats, args.regimes)]
    print("wrote", write_json("runs.json", {"machine": info, "args": vars(args), "rows": rows}))


if __name__ == "__main__":
    main()
