#!/usr/bin/env python3
"""Chunk-parallel encode vs the reference, side by side, exactness checked.

    python benches/bench_chunked.py [--size 1000000] [--repeats 5] [--threads 2]
                                    [--tokenizers qwen3 llama3 ...] [--kinds code multilingual]
                                    [--encoder reference|auto]

For each tokenizer and kind of text, every repeat takes a distinct document and times, in
alternating order: the reference's plain ``encode(x).ids``; the reference's ``encode_batch_fast``
of the whole text (no offsets: the fastest whole-text reference call); and dtok's chunked encode
on --threads threads (planning included), with the reference as chunk encoder by default
(``--encoder auto`` for the fast encoder; see bench_fast.py). It also times the planner alone. Prints medians and
P99, the ratios, and writes bench-results/chunked.json.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SHARED, documents, header, machine, summary, write_json  # noqa: E402

import dtok  # noqa: E402
from dtok.tokenizer import parts_of  # noqa: E402


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokenizers", nargs="*", default=["qwen3", "llama3", "deepseek-v3", "gpt-oss"])
    ap.add_argument("--kinds", nargs="*", default=["code", "multilingual"])
    ap.add_argument("--encoder", default="reference", choices=["reference", "auto", "fast"])
    args = ap.parse_args()
    info = machine()
    print(header(info))
    print(f"# {args.size:,} chars per document, {args.repeats} distinct documents, "
          f"dtok threads={args.threads}, encoder={args.encoder}")
    rows = []
    for name in args.tokenizers:
        tok = dtok.Tokenizer.from_file(SHARED / "tokenizers" / name, threads=args.threads,
                                       encoder=args.encoder, content_lookup=False)
        ref = tok.reference
        for kind in args.kinds:
            docs = documents(kind, args.size, args.repeats + 1)
            tok.encode(docs[-1])  # warm up threads (and the reference's word cache, for both)
            t_ref, t_fast, t_dtok, t_plan, exact = [], [], [], [], True
            for i, doc in enumerate(docs[:-1]):
                runs = [("ref", lambda: ref.encode(doc).ids),
                        ("fast", lambda: ref.encode_batch_fast([doc])[0].ids),
                        ("dtok", lambda: tok.encode(doc))]
                if i % 2:
                    runs.reverse()
                results = {}
                for label, fn in runs:
                    dt, out = timed(fn)
                    results[label] = (dt, out)
                t_ref.append(results["ref"][0])
                t_fast.append(results["fast"][0])
                t_dtok.append(results["dtok"][0])
                exact &= list(results["dtok"][1]) == results["ref"][1]
                t_plan.append(timed(lambda: parts_of(tok).chunker.cuts(doc))[0])
            ex = tok.explain(docs[0])
            row = {
                "tokenizer": name, "kind": kind, "chars": args.size,
                "chunks": len(ex["cuts"]) + 1, "exact": exact,
                "reference_encode": summary(t_ref), "reference_batch_fast": summary(t_fast),
                "dtok": summary(t_dtok), "planner": summary(t_plan),
            }
            row["ratio_vs_encode"] = row["reference_encode"]["median_ms"] / row["dtok"]["median_ms"]
            row["ratio_vs_batch_fast"] = (row["reference_batch_fast"]["median_ms"]
                                          / row["dtok"]["median_ms"])
            row["planner_share"] = row["planner"]["median_ms"] / row["dtok"]["median_ms"]
            rows.append(row)
            print(f"{name:12s} {kind:12s} chunks={row['chunks']:2d} exact={exact}  "
                  f"ref encode {row['reference_encode']['median_ms']:8.1f} ms "
                  f"(p99 {row['reference_encode']['p99_ms']:7.1f})  "
                  f"ref batch_fast {row['reference_batch_fast']['median_ms']:7.1f}  "
                  f"dtok {row['dtok']['median_ms']:7.1f} ms (p99 {row['dtok']['p99_ms']:7.1f})  "
                  f"x{row['ratio_vs_encode']:.2f} vs encode, x{row['ratio_vs_batch_fast']:.2f} vs "
                  f"batch_fast; planner {row['planner']['median_ms']:.2f} ms "
                  f"({100 * row['planner_share']:.2f}%)", flush=True)
        tok.close()
    path = write_json("chunked.json", {"machine": info, "args": vars(args), "rows": rows})
    print("wrote", path)


if __name__ == "__main__":
    main()
