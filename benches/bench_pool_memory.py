#!/usr/bin/env python3
"""Memory of a dtok.Pool: PSS and private memory of the zygote and of each worker, idle and
after 1M-character sessions (two per worker on average) and a chunked 1M document (seed 004's
method: PSS from smaps_rollup, so a page shared by n processes counts 1/n in each; private dirty
pages are what a worker adds).

    python benches/bench_pool_memory.py [--tokenizers qwen3 llama3] [--workers 2 4]

Each (tokenizer, workers) runs in a fresh process. Writes bench-results/pool-memory.json.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SHARED, corpus, header, machine, smaps, write_json  # noqa: E402


def child(name: str, workers: int) -> dict:
    import dtok

    text = corpus("prose", "gutenberg-1342_pride-and-prejudice.txt")
    while len(text) < 1_000_000:
        text += text
    text = text[:1_000_000]
    with dtok.Pool(str(SHARED / "tokenizers" / name), workers=workers, name="mem") as pool:
        def snapshot():
            s = pool.stats()
            return {"zygote": smaps(pool.zygote_pid),
                    "workers": [smaps(w["pid"]) for w in s["workers"]]}

        idle = snapshot()
        # sessions of 1M characters (2 per worker on average: keys land by CRC-32), each
        # initialized at 900K and extended, then a stateless 1M document cut into chunks
        exact = True
        for k in range(2 * workers):
            key = f"agent-{k * 7919:06d}"
            pool.encode(text[:900_000], session=key)
            ids = pool.encode(text, session=key)
            exact &= list(ids) == pool.tokenizer.reference.encode(text).ids
        ids = pool.encode(text)
        exact &= list(ids) == pool.tokenizer.reference.encode(text).ids
        warm = snapshot()
        done = [w["tasks_done"] for w in pool.stats()["workers"]]
        return {"tokenizer": name, "workers": workers, "encoder": pool.encoder_name,
                "idle": idle, "after_sessions": warm, "tasks_done": done, "exact": exact}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizers", nargs="*", default=["qwen3", "llama3"])
    ap.add_argument("--workers", type=int, nargs="*", default=[2, 4])
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    m = machine()
    print(header(m))
    rows = []
    for name in args.tokenizers:
        for n in args.workers:
            out = subprocess.run([sys.executable, __file__, "--child", name, str(n)],
                                 check=True, capture_output=True, text=True).stdout
            r = json.loads(out.splitlines()[-1])
            rows.append(r)
            for label in ("idle", "after_sessions"):
                z, ws = r[label]["zygote"], r[label]["workers"]
                print(f"{name:8s} {n} workers ({r['encoder']}) {label:13s} zygote PSS "
                      f"{z['Pss']:6.1f} MiB | workers PSS "
                      + " ".join(f"{w['Pss']:6.1f}" for w in ws)
                      + " MiB, private dirty " + " ".join(f"{w['Private_Dirty']:5.1f}" for w in ws)
                      + f" MiB | total PSS {z['Pss'] + sum(w['Pss'] for w in ws):6.1f} MiB"
                      + f" | tasks {r['tasks_done']} exact={r['exact']}")
    path = write_json("pool-memory.json", {"machine": m, "rows": rows})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
