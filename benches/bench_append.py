#!/usr/bin/env python3
"""400-character appends to long sessions: dtok's repair vs a full reference encode, same run.

    python benches/bench_append.py [--sizes 16000 100000 1000000 4000000] [--appends 200]
                                   [--tokenizers qwen3 llama3] [--append-chars 400]

The session text is real agent transcripts (../shared/corpus/transcripts, rendered with the
tokenizer's chat markers) followed by prose, code and multilingual text until it reaches the
size; each append is the next 400 characters of that stream. dtok's time is the whole
``tok.encode(text, session=key)`` call, memoryview included. The reference encodes the same
texts whole (``encode(text).ids``) on a sample of the appends (``--ref-samples``), after the timed
loop: a reference encode between two timed appends would evict the caches and slow the next
append (at 16K it tripled its time). Every sampled dtok result is compared with the reference.
Also reports the session's memory: ID bytes per 100K tokens (the text itself is the caller's string).
"""
from __future__ import annotations

import argparse
import json
from array import array
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SHARED, corpus, header, machine, summary, write_json  # noqa: E402

import dtok  # noqa: E402
from dtok.chat import detect_style, render_turns  # noqa: E402


def stream(tok: dtok.Tokenizer, n: int) -> str:
    style = detect_style(tok.admission.added_tokens)
    parts, total = [], 0
    for path in sorted((SHARED / "corpus" / "transcripts").glob("*.json")):
        if path.name == "MANIFEST.json":
            continue
        text = render_turns(json.loads(path.read_bytes()), style)[-1]
        parts.append(text)
        total += len(text)
        if total >= n:
            break
    for kind, name in [("prose", "gutenberg-2701_moby-dick.txt"),
                       ("code", "cpp__json__single_include_nlohmann_json.hpp.txt"),
                       ("multilingual", "udhr_all-languages_concatenated.txt")]:
        if total >= n:
            break
        parts.append(corpus(kind, name))
        total += len(parts[-1])
    return "".join(parts)[:n]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[16_000, 100_000, 1_000_000, 4_000_000])
    ap.add_argument("--appends", type=int, default=200)
    ap.add_argument("--append-chars", type=int, default=400)
    ap.add_argument("--tokenizers", nargs="*", default=["qwen3", "llama3"])
    ap.add_argument("--encoder", default="auto", choices=["reference", "auto", "fast"])
    ap.add_argument("--ref-samples", type=int, default=10,
                    help="appends checked against (and timed with) the reference, per size")
    args = ap.parse_args()
    info = machine()
    print(header(info))
    rows = []
    for name in args.tokenizers:
        base = dtok.Tokenizer.from_file(SHARED / "tokenizers" / name, encoder=args.encoder)
        longest = max(args.sizes) + args.appends * args.append_chars
        src = stream(base, longest)
        dtok_at = {}
        for size in args.sizes:
            tok = base.with_knobs()
            text = src[:size]
            tok.encode(text, session="bench")  # initialization (not timed here)
            step = max(1, args.appends // args.ref_samples)
            t_dtok, t_ref, exact, kept = [], [], True, {}
            for i in range(args.appends):
                text = src[: size + (i + 1) * args.append_chars]
                t0 = time.perf_counter()
                view = tok.encode(text, session="bench")
                t_dtok.append(time.perf_counter() - t0)
                if i % step == 0:
                    kept[i] = bytes(view)  # checked after the loop, so that no reference
                del view                   # encode runs between two timed appends
            for i, got in kept.items():
                text = src[: size + (i + 1) * args.append_chars]
                t0 = time.perf_counter()
                want = tok.reference.encode(text).ids
                t_ref.append(time.perf_counter() - t0)
                exact &= got == array("i", want).tobytes()
            checked = len(kept)
            st = tok.sessions.stats()
            n_tokens = len(tok.sessions._keyed["bench"].buf)
            row = {
                "tokenizer": name, "session_chars": size, "append_chars": args.append_chars,
                "appends": args.appends, "exact": exact, "checked_against_reference": checked,
                "dtok": summary(t_dtok), "reference_full_encode": summary(t_ref),
                "repairs": st["repairs"], "fallbacks": st["fallbacks"],
                "tokens": n_tokens, "id_bytes": st["id_bytes"],
                "id_mb_per_100k_tokens": st["id_bytes"] / n_tokens * 1e5 / 1e6,
            }
            row["ratio"] = row["reference_full_encode"]["median_ms"] / row["dtok"]["median_ms"]
            dtok_at[size] = row["dtok"]["median_ms"]
            rows.append(row)
            row["encoder"] = tok.encoder.name
            print(f"{name:7s} {tok.encoder.name:9s} {size:>9,} chars  dtok median {row['dtok']['median_ms']:.3f} ms "
                  f"p99 {row['dtok']['p99_ms']:.3f} ms | reference {row['reference_full_encode']['median_ms']:9.1f} ms "
                  f"(n={checked}) | x{row['ratio']:,.0f} | exact={exact} repairs={st['repairs']} "
                  f"fallbacks={st['fallbacks']} | {row['id_mb_per_100k_tokens']:.3f} MB IDs/100K tokens",
                  flush=True)
        if 16_000 in dtok_at and 1_000_000 in dtok_at:
            flat = dtok_at[1_000_000] / dtok_at[16_000]
            print(f"{name}: flatness 1M/16K = {flat:.2f}")
            rows.append({"tokenizer": name, "flatness_1M_over_16K": flat})
    path = write_json(f"append-{args.encoder}.json", {"machine": info, "args": vars(args), "rows": rows})
    print("wrote", path)


if __name__ == "__main__":
    main()
