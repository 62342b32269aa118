#!/usr/bin/env python3
"""Is a front end's memory flat once its session stores are full? A Pool and an in-process
Tokenizer in one process get keyed appends (views and lists) on a few hundred sessions, the
client's own texts bounded, and the process's RSS (anonymous and shared memory) is printed with
what the stores account, every ``--every`` seconds.

    python tools/reliability/frontend_rss.py [--seconds 150] [--session-mb 64] [--sessions 400]

Last line: ``front end RSS after the stores filled: +N MiB over S s (A -> B MiB)``.
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benches"))

import dtok  # noqa: E402
from common import SHARED, corpus  # noqa: E402


def memory_mib() -> dict[str, int]:
    status = open("/proc/self/status").read()
    return {k: int(status.split(f"{k}:")[1].split()[0]) // 1024
            for k in ("VmRSS", "RssAnon", "RssShmem")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=150)
    ap.add_argument("--every", type=float, default=15)
    ap.add_argument("--session-mb", type=int, default=64, help="session_bytes of each store")
    ap.add_argument("--sessions", type=int, default=400)
    ap.add_argument("--tokenizer", default="qwen3")
    args = ap.parse_args()
    limit = args.session_mb << 20
    tok = dtok.Tokenizer.from_file(SHARED / "tokenizers" / args.tokenizer, session_bytes=limit)
    src = "".join(corpus("prose", p.name) for p in sorted((SHARED / "corpus" / "prose").iterdir()))
    rng = random.Random(1)
    texts: dict[int, str] = {}
    filled = None
    with dtok.Pool(tok, workers=2, session_bytes=limit) as pool:
        t0 = last = time.monotonic()
        while time.monotonic() - t0 < args.seconds:
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
                pool_b, tok_b = pool.stats()["session_bytes"], tok.sessions.stats()
                tok_b = tok_b["text_bytes"] + tok_b["id_bytes"] + tok_b["anchor_bytes"]
                full = pool_b > 0.9 * limit
                if full and filled is None:
                    filled = (now, mem["VmRSS"])
                print(f"{now - t0:5.0f} s  RSS {mem['VmRSS']} MiB (anon {mem['RssAnon']}, shmem "
                      f"{mem['RssShmem']})  pool accounts {pool_b >> 20} MiB in "
                      f"{pool.stats()['sessions']} sessions, tokenizer {tok_b >> 20} MiB in "
                      f"{len(tok.sessions)}", flush=True)
        end = memory_mib()["VmRSS"]
    if filled is None:
        print("front end RSS after the stores filled: the stores never filled (run longer)")
        return
    print(f"front end RSS after the stores filled: {end - filled[1]:+d} MiB over "
          f"{time.monotonic() - filled[0]:.0f} s ({filled[1]} -> {end} MiB)")


if __name__ == "__main__":
    main()
