#!/usr/bin/env python3
"""Tokenizer files beyond the four: time to the fast path, speed and memory, per file.

    python benches/bench_new_files.py [--files NAME ...] [--repeats N] [--appends N]

Each file runs in a fresh process of its own, with an empty guard cache (``DTOK_CACHE_DIR``
a new folder), and reports:

* ``load_s`` and ``rss_loaded_mib``: ``dtok.Tokenizer(path)`` returning, and the process's RSS
  then (``smaps_rollup``, after a ``gc``);
* ``to_fast_s``: seconds from the load's return until the fast encoder serves. For a file whose
  guard table ships (or an equivalent file's does) this is 0. To time the background probes of a
  *new file of a known pipeline*, ``--as-new`` loads a copy with its last merge dropped: another
  tokenizer with the same pipeline and vocabulary size, for which no table exists anywhere;
* ``1M``: 1M characters of prose and of multilingual text (a fresh ``str`` each time, 20 ms
  apart), median of ``--repeats``: the reference (``encode_batch_fast``), fastokens alone on the
  same file, dtok with ``threads=1`` and with its default threads; every dtok result compared
  with the reference's;
* ``append_ms``: a 400-character append to a 1M-character session, median of ``--appends``
  (each checked against the reference).

Ratios are what to read (the machine is shared): dtok's time over the reference's and over
fastokens alone's, measured in the same process.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import SHARED, corpus, header, machine, smaps, summary, write_json  # noqa: E402

FILES = ["glm-5.2", "olmo-3", "minimax-m3", "qwen3.5", "qwen3-compact", "qwen3", "llama3"]


def _sources() -> dict[str, str]:
    prose = "".join(corpus("prose", p.name) for p in sorted((SHARED / "corpus" / "prose").iterdir()))
    multi = corpus("multilingual", "udhr_all-languages_concatenated.txt")
    return {"prose": prose, "multilingual": multi}


def _document(src: str, i: int, size: int = 1_000_000) -> str:
    """The ``i``-th distinct ``size``-character window of ``src`` (wrapping), a new str: no
    content lookup, no cached UTF-8 or hash."""
    step = max(1, (len(src) - size) // 7)
    start = (i * step) % max(1, len(src) - size)
    return (src[start:start + size] + " ")[:-1]


def _time(fn, src: str, repeats: int, first: int) -> float:
    """Median ms of ``fn`` over ``repeats`` distinct documents (numbered from ``first``),
    20 ms apart."""
    samples = []
    for i in range(first, first + repeats):
        t = _document(src, i)
        time.sleep(0.02)
        t0 = time.perf_counter()
        fn(t)
        samples.append(time.perf_counter() - t0)
    return summary(samples)["median_ms"]


def one_file(path: Path, repeats: int, appends: int) -> dict:
    """The measurements of one file, in this process (a fresh one, with an empty cache)."""
    import dtok
    import fastokens

    t0 = time.perf_counter()
    tok = dtok.Tokenizer(path)
    load_s = time.perf_counter() - t0
    gc.collect()
    rss = smaps()["Rss"]
    t1 = time.perf_counter()
    status = tok.probes(wait=600)
    to_fast = 0.0 if status["state"] == "none" else time.perf_counter() - t1
    out = {"admitted": tok.admission.admitted, "family": tok.admission.family,
           "load_s": round(load_s, 2), "rss_loaded_mib": rss, "probes": status,
           "to_fast_s": round(to_fast, 1), "encoder": tok.encoder.name}
    alone = fastokens.Tokenizer.from_json_str(tok.tokenizer_json().decode("utf-8"))
    alone.enable_segment_cache(0)
    alone.encode_batch_flat(["warm up the lazy state " * 20])  # as dtok's FastEncoder does
    one = tok.with_knobs(threads=1)
    sources = _sources()
    for kind, src in sources.items():
        for label, t in (("default", tok), ("threads=1", one)):  # exact, on a document of its own
            text = _document(src, 100)
            if list(t.encode(text)) != tok.reference.encode(text).ids:
                raise AssertionError(f"{path}: {label} differs from the reference on {kind}")
        # each side meets the same distinct documents (1-based; 0 is the session's below)
        row = {
            "reference": _time(lambda s: tok.reference.encode_batch_fast([s]), src, repeats, 1),
            "fastokens": _time(lambda s: alone.encode_batch_flat([s]), src, repeats, 1),
            "threads=1": _time(lambda s: one.encode(s), src, repeats, 1),
            "default": _time(lambda s: tok.encode(s), src, repeats, 1),
        }
        out[f"1M {kind}"] = {k: round(v, 1) for k, v in row.items()}
    base = _document(sources["prose"], 0)
    tail = sources["multilingual"]
    tok.encode(base, session="s")
    samples = []
    text = base
    for i in range(appends):
        text = text + tail[i * 400:(i + 1) * 400]
        time.sleep(0.02)
        t0 = time.perf_counter()
        ids = tok.encode(text, session="s")
        samples.append(time.perf_counter() - t0)
        if i == appends - 1 and list(ids) != tok.reference.encode(text).ids:
            raise AssertionError(f"{path}: the session's last turn differs from the reference")
    out["append_ms"] = round(summary(samples)["median_ms"], 3)
    return out


def _as_new(path: Path, folder: Path) -> Path:
    doc = json.loads(path.read_bytes())
    doc["model"]["merges"] = doc["model"]["merges"][:-1]
    new = folder / "tokenizer.json"
    new.write_text(json.dumps(doc))
    return new


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--files", nargs="+", default=FILES)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--appends", type=int, default=20)
    ap.add_argument("--as-new", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # the child process: one file's JSON out
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one_file(Path(args.one), args.repeats, args.appends)))
        return
    info = machine()
    print(header(info))
    results = {}
    for name in args.files:
        path = SHARED / "tokenizers" / name / "tokenizer.json"
        with tempfile.TemporaryDirectory() as tmp:
            if args.as_new:
                path = _as_new(path, Path(tmp))
            env = {**os.environ, "DTOK_CACHE_DIR": str(Path(tmp) / "cache")}
            run = subprocess.run([sys.executable, __file__, "--one", str(path), "--repeats",
                                  str(args.repeats), "--appends", str(args.appends)],
                                 env=env, capture_output=True, text=True)
        if run.returncode:
            print(f"{name}: failed\n{run.stderr[-2000:]}")
            continue
        r = json.loads(run.stdout.strip().splitlines()[-1])
        results[name] = r
        print(f"{name}: {r['family']}, encoder {r['encoder']}, load {r['load_s']} s, RSS "
              f"{r['rss_loaded_mib']} MiB, to the fast path {r['to_fast_s']} s, 400-char "
              f"append to 1M {r['append_ms']} ms")
        for kind in ("prose", "multilingual"):
            row = r[f"1M {kind}"]
            print(f"  1M {kind:12} reference {row['reference']:8.1f} ms  fastokens "
                  f"{row['fastokens']:7.1f}  threads=1 {row['threads=1']:7.1f} "
                  f"({row['reference'] / row['threads=1']:.1f}x ref, "
                  f"{row['threads=1'] / row['fastokens']:.2f} of fastokens)  default "
                  f"{row['default']:7.1f} ({row['reference'] / row['default']:.1f}x ref, "
                  f"{row['default'] / row['fastokens']:.2f} of fastokens)")
    write_json("new_files.json", {"machine": info, "as_new": args.as_new, "results": results})


if __name__ == "__main__":
    main()
