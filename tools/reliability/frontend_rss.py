#!/usr/bin/env python3
"""Is a front end's memory flat once it is warm? A Pool and an in-process Tokenizer in one
process get keyed appends (views and lists) on a few hundred sessions, the client's own texts
bounded, and, with ``--documents-every``, a stateless 1M-character document of the prose corpus
now and then (the long texts dtok's encoding threads share; ``--new-words``: its letters
permuted, every word new, the worst case for the encoders' memos). The
process's RSS (anonymous and shared memory) is printed with what the stores account every
``--every`` seconds.

    python tools/reliability/frontend_rss.py [--seconds 150] [--session-mb 64] [--sessions 400]
        [--documents-every 2 [--new-words]] [--thread-renew-chars N] [--tune-allocator] [--json PATH]

Warm: the stores have filled (90% of ``session_bytes``) and ``--warm-up`` seconds have passed.
Last line: ``front end RSS after warm-up: +N MiB over S s (A -> B MiB), slope X MiB/h, beyond
what the stores hold Y MiB/h; its highest over its first: +P MiB`` (least-squares slopes over
the samples after warm-up; the highest RSS beyond what the stores hold after warm-up over the
first such sample); ``--json`` writes the samples and these figures. Minutes show a leak; the
hourly rate needs the soak (tools/reliability/soak.py).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benches"))

import dtok  # noqa: E402
from common import SHARED, corpus, permuted_letters  # noqa: E402


def memory_mib() -> dict[str, int]:
    status = open("/proc/self/status").read()
    return {k: int(status.split(f"{k}:")[1].split()[0]) // 1024
            for k in ("VmRSS", "RssAnon", "RssShmem")}


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MiB) points, in MiB per hour."""
    seconds, mib = zip(*points)
    return 3600 * statistics.linear_regression(seconds, mib).slope


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=150)
    ap.add_argument("--every", type=float, default=15)
    ap.add_argument("--warm-up", type=float, default=0, help="seconds, at least, before warm")
    ap.add_argument("--session-mb", type=int, default=64, help="session_bytes of each store")
    ap.add_argument("--sessions", type=int, default=400)
    ap.add_argument("--tokenizer", default="qwen3")
    ap.add_argument("--documents-every", type=float, default=0,
                    help="seconds between stateless 1M-character documents (0: none)")
    ap.add_argument("--new-words", action="store_true",
                    help="the documents' words all new (their letters permuted): memos grow")
    ap.add_argument("--thread-renew-chars", type=int, default=None,
                    help="the tokenizer's knob (default: dtok's; 0: threads never renewed)")
    ap.add_argument("--tune-allocator", action="store_true",
                    help="dtok.allocator.tune(), as the engine plugins do")
    ap.add_argument("--json", default=None, help="write the samples and the result here")
    args = ap.parse_args()
    if args.tune_allocator:
        dtok.allocator.tune()
    limit = args.session_mb << 20
    knobs = {} if args.thread_renew_chars is None else {"thread_renew_chars": args.thread_renew_chars}
    tok = dtok.Tokenizer.from_file(SHARED / "tokenizers" / args.tokenizer, session_bytes=limit,
                                   **knobs)
    src = "".join(corpus("prose", p.name) for p in sorted((SHARED / "corpus" / "prose").iterdir()))
    rng = random.Random(1)
    texts: dict[int, str] = {}
    samples: list[dict] = []
    warm = None
    with dtok.Pool(tok, workers=2, session_bytes=limit) as pool:
        t0 = last = last_doc = time.monotonic()
        while time.monotonic() - t0 < args.seconds:
            if args.documents_every and time.monotonic() - last_doc >= args.documents_every:
                last_doc = time.monotonic()
                start = rng.randrange(len(src) - 1_000_000)
                doc = src[start:start + 1_000_000]
                ids = tok.encode(permuted_letters(doc, rng) if args.new_words else doc + " ")
                del ids, doc
            k = rng.randrange(args.sessions)
            text = texts.get(k, "")
            if not text or len(text) > 160_000:  # the client's texts stay bounded too
                text = src[k * 1000 : k * 1000 + rng.randint(20_000, 150_000)]
            text = texts[k] = text + src[rng.randrange(len(src) - 400):][:400]
            owner, key = (pool, ("p", k)) if rng.random() < 0.5 else (tok, ("t", k))
            ids = (owner.encode_list if rng.random() < 0.5 else owner.encode)(text, session=key)
            del ids
            now = time.monotonic()
            if now - last >= args.every:
                last = now
                mem = memory_mib()
                pool_b, tok_s = pool.stats()["session_bytes"], tok.sessions.stats()
                tok_b = tok_s["text_bytes"] + tok_s["id_bytes"] + tok_s["anchor_bytes"]
                held = (pool_b + tok_b) >> 20
                if warm is None and pool_b > 0.9 * limit and now - t0 >= args.warm_up:
                    warm = now - t0
                samples.append({"s": round(now - t0, 1), **mem, "held_mib": held,
                                "renewals": tok.stats()["thread_renewals"]})
                print(f"{now - t0:5.0f} s  RSS {mem['VmRSS']} MiB (anon {mem['RssAnon']}, shmem "
                      f"{mem['RssShmem']})  pool accounts {pool_b >> 20} MiB in "
                      f"{pool.stats()['sessions']} sessions, tokenizer {tok_b >> 20} MiB in "
                      f"{len(tok.sessions)}, thread renewals {samples[-1]['renewals']}", flush=True)
    after = [s for s in samples if warm is not None and s["s"] >= warm]
    result = {"samples": samples, "warm_s": warm, "args": vars(args)}
    if len(after) < 3:
        print("front end RSS after warm-up: never warm (run longer)")
    else:
        rss = slope_per_hour([(s["s"], s["VmRSS"]) for s in after])
        beyond = slope_per_hour([(s["s"], s["VmRSS"] - s["held_mib"]) for s in after])
        beyond_held = [s["VmRSS"] - s["held_mib"] for s in after]
        result.update(growth_mib=after[-1]["VmRSS"] - after[0]["VmRSS"],
                      slope_mib_h=round(rss, 1), slope_beyond_held_mib_h=round(beyond, 1),
                      rise_beyond_held_mib=max(beyond_held) - beyond_held[0])
        print(f"front end RSS after warm-up: {result['growth_mib']:+d} MiB over "
              f"{after[-1]['s'] - after[0]['s']:.0f} s ({after[0]['VmRSS']} -> "
              f"{after[-1]['VmRSS']} MiB), slope {rss:+.0f} MiB/h, beyond what the stores hold "
              f"{beyond:+.0f} MiB/h; its highest over its first: "
              f"{result['rise_beyond_held_mib']:+d} MiB")
    if args.json:
        Path(args.json).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
