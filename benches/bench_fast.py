#!/usr/bin/env python3
"""The fast encoder behind its guards vs the reference, side by side, exactness checked.

    python benches/bench_fast.py [--tokenizers ...] [--sizes 1000000 4000000] [--repeats 3]
    python benches/bench_fast.py --memory-only

Each (tokenizer, mode) runs in a fresh process, so that fastokens' own thread setting
(FASTOKENS_BPE_THREADS, read once per process) can differ:

* ``single``: dtok with ``threads=1`` and FASTOKENS_BPE_THREADS=1, one encode per text;
* ``2 threads``: dtok's defaults on this machine (chunked; fastokens' own threads).

In each process, for every kind of text (prose, code, multilingual) and size, distinct documents
are encoded by the reference's plain ``encode(x).ids`` and by dtok, alternating; medians, P99
and ratios are printed and written to bench-results/fast.json. The same processes measure:
a guarded 1M-character document (one decomposed accent, Qwen3; one unassigned code point
otherwise) whole through the reference vs dtok's chunks; a session initialization of a
1M-character transcript. Memory runs measure, in fresh processes, VmRSS/PSS after loading
(cold) and after encoding 1M characters (warm), and the peak (VmHWM), per file and encoder.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SHARED, documents, header, machine, smaps, summary, write_json  # noqa: E402

KINDS = ("prose", "code", "multilingual")


def memory() -> dict:
    out = {}
    for line in open("/proc/self/status"):
        if line.startswith(("VmRSS", "VmHWM")):
            k, v = line.split(":")
            out[k] = int(v.split()[0]) / 1024
    out = {k: round(v, 1) for k, v in out.items()}
    try:
        out["Pss"] = smaps()["Pss"]
    except OSError:
        pass
    return out


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def run_speed(name: str, mode: str, sizes: list[int], repeats: int) -> list[dict]:
    import dtok

    knobs = {"threads": 1} if mode == "single" else {}
    tok = dtok.Tokenizer.from_file(SHARED / "tokenizers" / name, content_lookup=False, **knobs)
    assert tok.encoder.name == "fastokens", tok.stats()
    ref = tok.reference
    # Warm both encoders' word caches on other text first (a serving process is warm).
    for kind in KINDS:
        warm = documents(kind, 300_000, 7)[-1]
        ref.encode(warm)
        tok.encode(warm)
    rows = []
    for size in sizes:
        for kind in KINDS:
            docs = documents(kind, size, repeats + 1)
            tok.encode(docs[-1][:100_000])
            t_ref, t_dtok, exact = [], [], True
            for i, doc in enumerate(docs[:-1]):
                order = [("ref", lambda: ref.encode(doc).ids), ("dtok", lambda: tok.encode(doc))]
                res = {}
                for label, fn in (order if i % 2 == 0 else order[::-1]):
                    res[label] = timed(fn)
                t_ref.append(res["ref"][0])
                t_dtok.append(res["dtok"][0])
                exact &= list(res["dtok"][1]) == res["ref"][1]
            row = {"tokenizer": name, "mode": mode, "kind": kind, "chars": size, "exact": exact,
                   "reference": summary(t_ref), "dtok": summary(t_dtok),
                   "routes": tok.explain(docs[0]).get("chunk_routes")}
            row["ratio"] = row["reference"]["median_ms"] / row["dtok"]["median_ms"]
            rows.append(row)
            print(f"{name:12s} {mode:9s} {kind:12s} {size:>9,}  ref {row['reference']['median_ms']:8.1f} ms"
                  f"  dtok {row['dtok']['median_ms']:7.2f} ms (p99 {row['dtok']['p99_ms']:7.2f})"
                  f"  x{row['ratio']:6.1f}  exact={exact}", flush=True)
    # A guarded document: whole-call fallback vs fallback confined to one chunk.
    doc = documents("prose", 1_000_000, 1)[0]
    mark = "Cafe\u0301" if tok.admission.nfc else "x\u0378y"
    doc = doc[:500_000] + mark + doc[500_000:]
    t_whole, want = timed(lambda: ref.encode(doc).ids)
    t_dtok, got = timed(lambda: tok.encode(doc))
    routes = tok.explain(doc)["chunk_routes"]
    rows.append({"tokenizer": name, "mode": mode, "case": "guarded 1M document",
                 "reference_whole_ms": t_whole * 1e3, "dtok_ms": t_dtok * 1e3,
                 "reference_chunks": sum(r != "fast" for r in routes), "chunks": len(routes),
                 "exact": list(got) == want})
    print(f"{name:12s} {mode:9s} guarded 1M: reference whole {t_whole * 1e3:.1f} ms, dtok "
          f"{t_dtok * 1e3:.1f} ms with {rows[-1]['reference_chunks']}/{len(routes)} chunks on the "
          f"reference, exact={rows[-1]['exact']}", flush=True)
    # Session initialization of a 1M-character transcript.
    from bench_append import stream

    text = stream(tok, 1_000_000)
    t_ref, want = timed(lambda: ref.encode(text).ids)
    t_init, got = timed(lambda: tok.encode(text, session="init"))
    rows.append({"tokenizer": name, "mode": mode, "case": "session init 1M transcript",
                 "reference_ms": t_ref * 1e3, "dtok_ms": t_init * 1e3,
                 "ratio": t_ref / t_init, "exact": list(got) == want})
    print(f"{name:12s} {mode:9s} session init 1M: reference {t_ref * 1e3:.1f} ms, dtok "
          f"{t_init * 1e3:.1f} ms, x{t_ref / t_init:.1f}, exact={rows[-1]['exact']}", flush=True)
    return rows


def run_memory(name: str, encoder: str) -> dict:
    cold0 = memory()
    import dtok

    tok = dtok.Tokenizer.from_file(SHARED / "tokenizers" / name, encoder=encoder)
    cold = memory()
    doc = documents("prose", 1_000_000, 1)[0]
    tok.encode(doc)
    warm = memory()
    return {"tokenizer": name, "encoder": tok.encoder.name, "before_import": cold0,
            "cold": cold, "warm_after_1M": warm}


def child(args) -> None:
    if args.child == "speed":
        rows = run_speed(args.tokenizers[0], args.mode, args.sizes, args.repeats)
    else:
        rows = [run_memory(args.tokenizers[0], args.mode)]
    print("JSON" + json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizers", nargs="*", default=["qwen3", "llama3", "deepseek-v3", "gpt-oss"])
    ap.add_argument("--sizes", type=int, nargs="*", default=[1_000_000, 4_000_000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--memory-only", action="store_true")
    ap.add_argument("--child", choices=["speed", "memory"], help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    info = machine()
    print(header(info))
    rows = []
    jobs = [] if args.memory_only else [("speed", n, m) for n in args.tokenizers
                                         for m in ("single", "2 threads")]
    jobs += [("memory", n, e) for n in args.tokenizers for e in ("reference", "auto")]
    for kind, name, mode in jobs:
        env = dict(os.environ)
        if mode == "single":
            env["FASTOKENS_BPE_THREADS"] = "1"
        cmd = [sys.executable, __file__, "--child", kind, "--mode", mode, "--tokenizers", name,
               "--repeats", str(args.repeats), "--sizes", *map(str, args.sizes)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        for line in proc.stdout.splitlines():
            if line.startswith("JSON"):
                rows += json.loads(line[4:])
            else:
                print(line, flush=True)
        if proc.returncode:
            print(proc.stderr[-3000:], flush=True)
        if kind == "memory":
            r = rows[-1]
            print(f"memory {name:12s} {r['encoder']:9s} cold RSS {r['cold']['VmRSS']} MiB "
                  f"PSS {r['cold'].get('Pss')} MiB; after 1M chars RSS {r['warm_after_1M']['VmRSS']}"
                  f" MiB PSS {r['warm_after_1M'].get('Pss')} MiB peak {r['warm_after_1M']['VmHWM']} MiB",
                  flush=True)
    path = write_json("fast.json" if not args.memory_only else "fast-memory.json",
                      {"machine": info, "args": vars(args), "rows": rows})
    print("wrote", path)


if __name__ == "__main__":
    main()
