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

    python benches/bench_append.py --patterns [--sizes 100000 1000000] [--repeats 3]

measures the appends as a server lives them instead (:mod:`patterns`): results dropped, held
and held as lists, with hot caches and cold ones (a memory sweep, the reference's 1M encode on
another thread and on the calling thread, 64 sessions interleaved), dtok in process next to
fastokens alone encoding the whole text (what a user would run instead), with the allocator tax
that the calling thread pays after the reference's encode, and the bytes a turn reads and writes.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SHARED, corpus, header, machine, summary, write_json  # noqa: E402
import patterns  # noqa: E402
from bench_fast import AS_LIST, load_toktier, peers as fast_peers  # noqa: E402

import dtok  # noqa: E402
from dtok.chat import detect_style, render_turns  # noqa: E402
from dtok_ext.shm import str_nbytes  # noqa: E402


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


def load_peers(name: str) -> dict:
    """What a user would pick instead of dtok's sessions, each encoding the whole text every
    turn, as bench_fast.py loads them: fastokens alone and toktier alone (offline, where
    installed). Keys: the labels printed; ``AS_LIST[label.split()[0]]`` reads an output."""
    path = SHARED / "tokenizers" / name
    out = {"fastokens alone": fast_peers(path, False)["fastokens"]}
    try:
        out["toktier alone"] = load_toktier(name, path)
    except ImportError:
        print(f"# {name}: toktier is not installed (pip install toktier==0.3.0): not measured")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[16_000, 100_000, 1_000_000, 4_000_000])
    ap.add_argument("--appends", type=int, default=200)
    ap.add_argument("--append-chars", type=int, default=400)
    ap.add_argument("--tokenizers", nargs="*", default=["qwen3", "llama3"])
    ap.add_argument("--encoder", default="auto", choices=["reference", "auto", "fast"])
    ap.add_argument("--ref-samples", type=int, default=10,
                    help="appends checked against (and timed with) the reference, per size")
    ap.add_argument("--patterns", action="store_true",
                    help="results held/dropped/lists, hot and cold caches (see patterns.py)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-peers", action="store_true",
                    help="do not time fastokens alone and toktier alone beside dtok")
    args = ap.parse_args()
    info = machine()
    print(header(info))
    if args.patterns:
        return patterns_main(args, info, "append")
    rows = []
    for name in args.tokenizers:
        base = dtok.Tokenizer.from_file(SHARED / "tokenizers" / name, encoder=args.encoder)
        peers = {} if args.no_peers else load_peers(name)
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
                n_tokens = len(view)  # the session's IDs after the last append
                if i % step == 0:
                    kept[i] = bytes(view)  # checked after the loop, so that no reference
                del view                   # encode runs between two timed appends
            t_peers: dict[str, list] = {p: [] for p in peers}
            peer_wrong = {p: 0 for p in peers}  # outputs that differ from the reference's
            for i, got in kept.items():
                text = src[: size + (i + 1) * args.append_chars]
                t0 = time.perf_counter()
                want = tok.reference.encode(text).ids
                t_ref.append(time.perf_counter() - t0)
                exact &= got == array("i", want).tobytes()
                a = tok.admission
                body = want[len(a.prefix):len(want) - len(a.suffix)]  # no post-processing
                for peer, encode in peers.items():  # what a user runs instead: all of it
                    fresh = (text + " ")[:-1]  # no cached UTF-8
                    t0 = time.perf_counter()
                    out = encode(fresh)
                    t_peers[peer].append(time.perf_counter() - t0)
                    peer_wrong[peer] += AS_LIST[peer.split()[0]](out) != body
            checked = len(kept)
            st = tok.sessions.stats()
            row = {
                "tokenizer": name, "session_chars": size, "append_chars": args.append_chars,
                "appends": args.appends, "exact": exact, "checked_against_reference": checked,
                "dtok": summary(t_dtok), "reference_full_encode": summary(t_ref),
                **{f"{p}_full_encode": summary(t) for p, t in t_peers.items()},
                "peer_wrong": dict(peer_wrong),
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
                  f"fallbacks={st['fallbacks']} | {row['id_mb_per_100k_tokens']:.3f} MB IDs/100K tokens"
                  + "".join(f" | {p} {row[p + '_full_encode']['median_ms']:.1f} ms "
                            f"(wrong {peer_wrong[p]})" for p in peers), flush=True)
        if 16_000 in dtok_at and 1_000_000 in dtok_at:
            flat = dtok_at[1_000_000] / dtok_at[16_000]
            print(f"{name}: flatness 1M/16K = {flat:.2f}")
            rows.append({"tokenizer": name, "flatness_1M_over_16K": flat})
    path = write_json(f"append-{args.encoder}.json", {"machine": info, "args": vars(args), "rows": rows})
    print("wrote", path)


def turn_bytes(tok: dtok.Tokenizer, kind: str, src: str, size: int, turns: int = 5) -> dict:
    """What a turn reads and writes, from the plan of each (untimed): text bytes compared,
    characters encoded (new text, and old text re-encoded to place seams), IDs written (after
    the first that differs from the previous request's)."""
    key, text, at = "bytes", src[:size], size
    last = tok.encode(text, session=key).tolist()
    rows = []
    for _ in range(turns):
        before, text, at = patterns.next_turn(kind, text, src, at)
        for t in before:
            last = tok.encode(t, session=key).tolist()
        e = tok.explain(text, session=key)
        ids = tok.encode(text, session=key).tolist()
        same = next((i for i, (a, b) in enumerate(zip(last, ids)) if a != b),
                    min(len(last), len(ids)))
        width = str_nbytes(text) // max(1, len(text))  # PEP 393: 1, 2 or 4 bytes a character
        rows.append({"text_bytes_compared": 2 * width * e.get("common_prefix", 0),
                     "fresh_chars": e.get("fresh_chars", 0),
                     "old_chars_reencoded": e.get("old_text_reencoded", 0),
                     "ids_written": len(ids) - same, "ids": len(ids)})
        last = ids
    out = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(f"  per {kind} turn at {size:,}: compares {out['text_bytes_compared'] / 1e6:.1f} MB of "
          f"text, encodes {out['fresh_chars']:.0f} new + {out['old_chars_reencoded']:.0f} old "
          f"characters, writes {out['ids_written']:,.0f} IDs; session {out['ids']:,.0f} IDs "
          f"({4 * out['ids'] / 1e6:.1f} MB)", flush=True)
    return out


def patterns_main(args, info: dict, kind: str) -> None:
    """The ``--patterns`` tables (also used by bench_edits.py)."""
    import tokenizers

    os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
    results = {"machine": info, "args": vars(args), "rows": [], "allocator_tax_ms": {},
               "turn_bytes": []}
    bad = []
    for name in args.tokenizers:
        path = SHARED / "tokenizers" / name
        tok = dtok.Tokenizer.from_file(path, threads=1, content_lookup=False,
                                       session_bytes=1 << 31)
        ref = tok.reference
        cold = patterns.Cold(tokenizers.Tokenizer.from_file(str(path / "tokenizer.json")))
        fast = tok.encoder if tok.encoder.name != "reference" else None

        def check(view, text):
            if list(view) != ref.encode(text).ids:
                bad.append((name, len(text)))

        encoders = {"dtok": lambda t, k, as_list: (tok.encode_list(t, session=k) if as_list
                                                   else tok.encode(t, session=k))}
        if fast is not None:  # what a user runs instead: the whole text, every turn
            encoders[f"{fast.name} whole"] = lambda t, k, as_list: (
                fast.encode(t).tolist() if as_list else fast.encode(t))
        src = stream(tok, max(args.sizes) + 1_000_000)  # patterns.take wraps around
        taxes = [cold.allocator_tax() for _ in range(5)]
        results["allocator_tax_ms"][name] = taxes
        print(f"# {name}: allocator tax after the reference's 1M encode on this thread: median "
              f"{statistics.median(taxes):.2f} ms [{min(taxes):.2f}-{max(taxes):.2f}] (240 mallocs)")
        for size in args.sizes:
            results["turn_bytes"].append({"tokenizer": name, "size": size,
                                          **turn_bytes(tok.with_knobs(), kind, src, size)})
            results["rows"] += patterns.table(name, encoders, kind, src, size,
                                              min(args.appends, 40), args.repeats, cold, check)
    print(f"exact: {'yes' if not bad else 'NO ' + str(bad[:5])}")
    results["exact"] = not bad
    print("wrote", write_json(f"{kind}-patterns.json", results))


if __name__ == "__main__":
    main()
