#!/usr/bin/env python3
"""dtok on the fast encoder next to the encoders users would pick, exactness checked.

    python benches/bench_fast.py [--tokenizers ...] [--sizes 1000000] [--repeats 3] [--modes ...]
                                 [--pause-ms 20] [--hot] [--speed-only] [--pin CPU]
                                 [--peers gigatoken basetenkenizer toktier reference]
                                 [--off "two-ended take" ...]
    python benches/bench_fast.py --breakdown-only
    python benches/bench_fast.py --order-only
    python benches/bench_fast.py --memory-only
    python benches/bench_fast.py --pieces-only [--pin CPU] [--repeats 3]

Each (tokenizer, mode) runs in a fresh process with FASTOKENS_BPE_THREADS=1 (unless set):

* ``single``: dtok with ``threads=1`` next to fastokens alone (its own instance, one call on the
  whole text);
* ``single+others``: the same, with gigatoken 0.10.0, basetenkenizer 0.2.8, toktier 0.3.0
  (loaded offline: a manifest entry with ``local_dir`` and the SHA-256s toktier ships, its
  artifact store filled by ``LocalDirectorySource``) and the reference's ``encode_batch_fast``
  also loaded, each its own instance, and called in the rotation; every peer's output is
  compared with the reference's and its wrong outputs printed (``# WRONG``);
* ``2 threads``, ``2 threads+others``: dtok with its default threads (2 here; since
  2026-12-02 a text is shared out only where the split pays, docs/knobs.md#threads), against
  the same single-threaded peers and dtok's own ``threads=1`` (a tokenizer of its own load,
  in the same rotation: ``dtok/dtok threads=1``); with ``--off``, also dtok with each named
  scheduling mechanism switched off (``dtok.testing.MECHANISMS``, its own load, called inside
  ``dtok.testing.switched_off``: ``dtok no <mechanism>``), printed as its time over dtok's per
  document (``off/on``).

For every kind of text (prose, code, multilingual, adversarial: the adversarial corpus files
concatenated) distinct documents (whole periods of a balanced rotation, at least
``--repeats``) are encoded by every encoder, in a balanced rotation (a Williams design:
every encoder in every place and right after every other one equally often; the rotation
before this one put dtok first on every document in mode ``single``, and the first encoder
on a document meets its words first: 7-15% slower on a second fastokens instance, measured);
every call on a fresh copy of the text and after a pause
(``--pause-ms``, 20 by default: requests spaced out in time; what ran just before matters,
through encoder threads and glibc's heap: ``--order-only`` measures that itself; 0: back to
back); dtok's IDs are compared with the reference's. Printed: medians, P99, the per-document ratio dtok / fastokens (median and
min-max over the documents) and the CPU-time ratio. Then a guarded 1M-character document (one
unassigned code point). ``--breakdown-only``: where dtok's single-thread time goes (plan, slice,
route, encoder calls, concatenation) next to fastokens alone. Memory runs measure, in fresh
processes, VmRSS/PSS after loading (cold) and after encoding 1M characters (warm) and the peak
(VmHWM), for dtok on each encoder and for fastokens and tokenizers alone. ``--pieces-only``:
the stateless route's pieces for the fast encoder, paired in one rotation (reference IDs
computed first): dtok on one thread, the same with every text in 64K chunks (the rule before
Latin text got one piece per thread), dtok on two threads (unpinned), dtok with its default
threads (unpinned: two threads only where the split pays), fastokens alone; with
the pause and back to back, ratios to dtok on one thread with their spread over the repeats.
JSON goes to bench-results/.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dtok.chunking import split_at  # noqa: E402
from dtok.testing import MECHANISMS  # noqa: E402
from dtok.tokenizer import parts_of  # noqa: E402
from common import (SHARED, balanced_order, balanced_period, documents, header,  # noqa: E402
                    machine, smaps, summary, write_json)

PAUSE_MS = 20.0  # default pause before each timed call (--pause-ms)
MODES = ("single", "single+others", "2 threads", "2 threads+others")
KINDS = ("prose", "code", "multilingual", "adversarial")


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


def load_toktier(name: str, path: Path):
    """toktier's ``encode`` of a whole text: no session, its content lookup at its default
    (loaded by ``toktier_tokenizer``)."""
    tt = toktier_tokenizer(name, path)
    return lambda d: tt.encode(d, add_special_tokens=False)


def toktier_tokenizer(name: str, path: Path):
    """toktier 0.3.0, offline: a manifest entry with ``local_dir`` and the SHA-256s toktier
    ships for the file (only the files the shared copy has), its artifact store filled by
    ``LocalDirectorySource`` (no hub), then loaded with ``TOKTIER_OFFLINE=1``; CPU only."""
    import tempfile
    from importlib.resources import files

    os.environ.setdefault("TOKTIER_HOME", tempfile.mkdtemp(prefix="dtok-bench-toktier-"))
    os.environ["HF_HUB_OFFLINE"] = "1"
    import toktier
    from toktier.artifacts.manifest import ArtifactManifest
    from toktier.artifacts.sources import LocalDirectorySource
    from toktier.artifacts.store import ArtifactStore
    from toktier.config import Config

    family = TOKTIER_FAMILIES[name]
    shipped = json.loads((files("toktier.artifacts.tables") / "artifact_manifest.v1.json")
                         .read_text())
    entry = dict(shipped[family], local_dir=str(path))
    entry["files"] = {k: v for k, v in entry["files"].items() if (path / k).exists()}
    manifest = ArtifactManifest.from_mapping({family: entry}, source="dtok bench")
    ArtifactStore(manifest, config=Config.resolve(), source=LocalDirectorySource()).ensure(family)
    os.environ["TOKTIER_OFFLINE"] = "1"
    return toktier.load(family, manifest=manifest, device="cpu", config=Config.resolve())


TOKTIER_FAMILIES = {"qwen3": "qwen3_8b", "llama3": "llama_3_1_8b", "deepseek-v3": "deepseek_v3",
                    "gpt-oss": "gpt_oss_120b"}
# each peer's output as a list of IDs (outside the timed call)
AS_LIST = {
    "fastokens": lambda out: memoryview(out).cast("I").tolist(),
    "gigatoken": lambda out: out.tolist(),
    "basetenkenizer": lambda out: list(out.ids),
    "toktier": lambda out: list(out.ids),
    "hf batch_fast": lambda out: out[0].ids,
}


PEERS = ("gigatoken", "basetenkenizer", "toktier", "reference")  # the "+others" (--peers)


def peers(path: Path, with_others: bool, name: str = "", picked=PEERS) -> dict:
    """The encoders dtok is compared with, each loaded on its own (its own instance): fastokens
    alone always; with ``with_others`` also those of ``picked``: gigatoken, basetenkenizer,
    toktier (offline) and the reference's ``encode_batch_fast`` (the same process then holds
    every encoder, as a serving process trying several would). A peer that cannot be loaded is
    named and left out."""
    import fastokens

    raw = path.joinpath("tokenizer.json").read_text(encoding="utf-8")
    ft = fastokens.Tokenizer.from_json_str(raw)
    out = {"fastokens": lambda d: ft.encode_batch_flat([d], add_special_tokens=False)[0]}
    if not with_others:
        return out

    def gigatoken_():
        import gigatoken

        gt = gigatoken.Tokenizer.from_json(raw)
        return lambda d: gt.encode(d)

    def basetenkenizer_():
        import basetenkenizer

        bt = basetenkenizer.Tokenizer.from_file(str(path / "tokenizer.json"))
        return lambda d: bt.encode(d, add_special_tokens=False)

    for label, make in (("gigatoken", gigatoken_), ("basetenkenizer", basetenkenizer_),
                        ("toktier", lambda: load_toktier(name, path))):
        if label not in picked:
            continue
        try:
            out[label] = make()
        except Exception as exc:  # not installed, or refuses the file
            print(f"# {label} not measured: {exc!r}"[:300], flush=True)
    if "reference" in picked:
        from tokenizers import Tokenizer as HF

        hf = HF.from_str(raw)
        out["hf batch_fast"] = lambda d: hf.encode_batch_fast([d], add_special_tokens=False)
    return out


def outcome(fn, text: str):
    """``fn(text)``, or the exception it raised (a peer's Rust panic is a BaseException)."""
    try:
        return fn(text)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - reported as that peer's wrong output
        return exc


def run_speed(name: str, mode: str, sizes: list[int], repeats: int,
              pause_ms: float = PAUSE_MS, hot: bool = False, picked=PEERS,
              off: tuple = ()) -> list[dict]:
    import dtok
    from dtok import testing

    threads = 1 if mode.startswith("single") else None
    with_others = mode.endswith("+others")
    tok = dtok.Tokenizer.from_file(SHARED / "tokenizers" / name, content_lookup=False,
                                   **({"threads": threads} if threads else {}))
    assert tok.encoder.name == "fastokens", tok.stats()
    ref = tok.reference
    others = peers(SHARED / "tokenizers" / name, with_others, name, picked)
    encoders = {"dtok": lambda d: tok.encode(d, add_special_tokens=False), **others}
    tokenizers = [tok]  # dtok's, each warmed on every thread it has
    if threads is None:  # the default threads next to dtok's own one-thread path, same rotation
        # its own load, as every encoder here has its own instance: a second tokenizer made
        # by with_knobs shares the fast encoder, and whichever of the two met a document
        # second took 0.46-0.6x the time (measured)
        one = dtok.Tokenizer.from_file(SHARED / "tokenizers" / name, content_lookup=False,
                                       threads=1)
        encoders = {"dtok": encoders["dtok"], "fastokens": encoders["fastokens"],
                    "dtok threads=1": lambda d: one.encode(d, add_special_tokens=False),
                    **{k: v for k, v in others.items() if k != "fastokens"}}
        tokenizers.append(one)
        for m in off:  # each its own load, the mechanism off for its calls only
            t = dtok.Tokenizer.from_file(SHARED / "tokenizers" / name, content_lookup=False)

            def without(d, t=t, m=m):
                with testing.switched_off(m):
                    return t.encode(d, add_special_tokens=False)

            encoders[f"dtok no {m}"] = without
            tokenizers.append(t)
    # Warm every encoder's word cache on other text first (a serving process is warm).
    for kind in KINDS:
        warm = documents(kind, 300_000, 7)[-1]
        for label, fn in encoders.items():
            if isinstance(exc := outcome(fn, warm), BaseException):  # counted when timed
                print(f"# {label} raised on {kind} warm-up text: {exc!r}"[:200], flush=True)
    rows = []
    # whole periods of the balanced rotation: every encoder first on a document equally often
    period = balanced_period(len(encoders))
    n_docs = period * -(-repeats // period)
    for size in sizes:
        for kind in KINDS:
            docs = documents(kind, size, n_docs + 1)
            # a spare document of twice the timed size first: a fastokens thread's first call
            # larger than any before it grows its scratch (~10 ms at 500K-1M characters, once
            # per thread and size: a serving process has paid it), and a cell of four
            # documents counted that growth whenever one of them was larger in that measure
            # than the warm-up
            spare = documents(kind, 2 * size, 1)[0]
            for fn in encoders.values():
                outcome(fn, (spare + " ")[:-1])  # one that raises is reported when timed
            # and every thread of dtok's: a batch of the spare's 64K pieces is shared out
            # among the threads by the characters alone
            for t in tokenizers:
                t.encode_batch([spare[i:i + 65536] for i in range(0, len(spare), 65536)])
            for m in off:  # and the spare as the variant without it meets a text
                outcome(encoders[f"dtok no {m}"], (spare + " ")[:-1])
            wants = [ref.encode((doc + " ")[:-1], add_special_tokens=False).ids
                     for doc in docs[:-1]]
            wall = {k: [] for k in encoders}
            cpu = {k: [] for k in encoders}
            wrong: dict[str, list[int]] = {k: [] for k in encoders}
            labels = list(encoders)
            for i, (doc, want) in enumerate(zip(docs[:-1], wants)):
                # Every encoder in a balanced rotation: each in every place and right after
                # every other one equally often (what ran just before matters: see
                # --order-only; the first encoder on a document meets its words first)
                order = balanced_order(labels, i)
                for label in order:
                    fn = encoders[label]
                    # a fresh copy each time, as a request's text arrives: encoders that read
                    # a str as UTF-8 cache that form inside the str object, which would let
                    # whoever comes second skip the transcoding
                    fresh = (doc + " ")[:-1]
                    if hot:  # the same document just before: caches (word, pre-token) hot
                        outcome(fn, (doc + " ")[:-1])
                    time.sleep(pause_ms / 1e3)  # the previous encoder's threads settle (--order)
                    c0, t0 = time.process_time(), time.perf_counter()
                    got = outcome(fn, fresh)
                    wall[label].append(time.perf_counter() - t0)
                    cpu[label].append(time.process_time() - c0)
                    if isinstance(got, BaseException):
                        wrong[label].append((i, -1, f"raised {got!r}"[:120]))
                        continue
                    ids = list(got) if label.startswith("dtok") else AS_LIST[label](got)
                    if ids != want:
                        first = next((k for k, (a, b) in enumerate(zip(ids, want)) if a != b),
                                     min(len(ids), len(want)))
                        snippet = ascii(ref.decode(want[max(0, first - 3):first + 3]))[:120]
                        wrong[label].append((i, first, snippet))
            exact = not wrong["dtok"]
            row = {"tokenizer": name, "mode": mode, "kind": kind, "chars": size, "exact": exact,
                   "wrong": {k: [i for i, _, _ in v] for k, v in wrong.items() if v},
                   "docs": len(wants), "hot": hot,
                   "wall": {k: summary(v) for k, v in wall.items()},
                   "cpu": {k: summary(v) for k, v in cpu.items()},
                   "routes": tok.explain(docs[0]).get("chunk_routes")}
            # ratio per document (same document, same moment), then its median and spread
            per_doc = sorted(a / b for a, b in zip(wall["dtok"], wall["fastokens"]))
            row["dtok_over_fastokens"] = {"median": statistics.median(per_doc),
                                          "min": per_doc[0], "max": per_doc[-1]}
            for peer in labels[2:]:
                r = sorted(a / b for a, b in zip(wall["dtok"], wall[peer]))
                row[f"dtok_over_{peer}"] = {"median": statistics.median(r), "min": r[0],
                                            "max": r[-1]}
            for m in off:
                r = sorted(a / b for a, b in zip(wall[f"dtok no {m}"], wall["dtok"]))
                row[f"off_over_on:{m}"] = {"median": statistics.median(r), "min": r[0],
                                           "max": r[-1], "per_document": r}
            rows.append(row)
            cells = "  ".join(f"{k} {row['wall'][k]['median_ms']:7.2f}"
                              + (f" WRONG {len(wrong[k])}/{len(wants)}" if wrong[k] else "")
                              for k in encoders)
            peer_ratios = "".join(
                f"  dtok/{peer} {row[f'dtok_over_{peer}']['median']:.2f} "
                f"[{row[f'dtok_over_{peer}']['min']:.2f}-{row[f'dtok_over_{peer}']['max']:.2f}]"
                for peer in labels[2:] if not peer.startswith("dtok no "))
            r = row["dtok_over_fastokens"]
            print(f"{name:12s} {mode:16s} {kind:12s} {size:>9,}  {cells} ms  dtok/fastokens "
                  f"{r['median']:.2f} [{r['min']:.2f}-{r['max']:.2f}] (cpu "
                  f"{row['cpu']['dtok']['median_ms'] / row['cpu']['fastokens']['median_ms']:.2f})"
                  f"  p99 dtok {row['wall']['dtok']['p99_ms']:.2f}  exact={exact}{peer_ratios}",
                  flush=True)
            for m in off:
                r = row[f"off_over_on:{m}"]
                print(f"== {name} {mode} {kind} {size:,} {pause_ms:.0f} ms apart: no {m} / dtok "
                      f"{r['median']:.2f} [{r['min']:.2f}-{r['max']:.2f}] over {len(wants)} "
                      f"documents", flush=True)
            for label, bad in wrong.items():
                for i, first, snippet in bad:
                    print(f"#   WRONG {label} on {kind} document {i}: first differing ID at "
                          f"{first}; text there {snippet}", flush=True)
    if mode.endswith("+others"):
        return rows
    # A guarded document: whole-call fallback vs fallback confined to one stretch.
    doc = documents("prose", 1_000_000, 1)[0]
    doc = doc[:500_000] + "x\u0378y" + doc[500_000:]  # one unassigned code point
    t_whole, want = timed(lambda: ref.encode(doc).ids)
    t_dtok, got = timed(lambda: tok.encode(doc))
    routes = tok.explain(doc)["chunk_routes"]
    rows.append({"tokenizer": name, "mode": mode, "case": "guarded 1M document",
                 "reference_whole_ms": t_whole * 1e3, "dtok_ms": t_dtok * 1e3,
                 "reference_chunks": sum(r != "fast" for r in routes), "chunks": len(routes),
                 "exact": list(got) == want})
    print(f"{name:12s} {mode:16s} guarded 1M: reference whole {t_whole * 1e3:.1f} ms, dtok "
          f"{t_dtok * 1e3:.1f} ms with {rows[-1]['reference_chunks']}/{len(routes)} chunks "
          f"partly on the reference, exact={rows[-1]['exact']}", flush=True)
    return rows


def run_pieces(name: str, repeats: int, pause_ms: float, sizes: list[int]) -> list[dict]:
    """How the stateless route cuts for the fast encoder, paired: dtok on one thread (Latin
    text in one piece per thread, other text in chunks of chunk_target), the same with every
    text in chunks of chunk_target (the rule before), dtok on two threads, and fastokens
    alone; distinct documents of each of ``sizes`` per kind (two periods of the balanced
    rotation; kinds other than prose and code at the first size only), the
    reference's IDs computed before any timing, ``repeats`` passes, with the pause and back to
    back."""
    import dtok

    path = SHARED / "tokenizers" / name
    one = dtok.Tokenizer.from_file(path, content_lookup=False, threads=1)
    chunked = one.with_knobs()
    chunked_parts = parts_of(chunked)
    chunked_parts.chunk_encoder.chunk_target = lambda text: chunked_parts.chunker.target  # the rule before
    two = one.with_knobs(threads=2)
    auto = one.with_knobs(threads=None)  # dtok's default: split only where it pays
    encoders = {"dtok threads=1": lambda d: one.encode(d, add_special_tokens=False),
                "dtok 64K chunks": lambda d: chunked.encode(d, add_special_tokens=False)}
    if len(os.sched_getaffinity(0)) > 1:
        encoders["dtok threads=2"] = lambda d: two.encode(d, add_special_tokens=False)
        encoders["dtok default threads"] = lambda d: auto.encode(d, add_special_tokens=False)
    encoders["fastokens"] = peers(path, False)["fastokens"]
    labels = list(encoders)
    rows = []
    cases = [(kind, size) for size in sizes for kind in KINDS
             if size == sizes[0] or kind in ("prose", "code")]
    for pause in (pause_ms, 0.0):
        for kind, size in cases:
            docs = documents(kind, size, 2 * balanced_period(len(labels)))
            wants = [one.reference.encode(d, add_special_tokens=False).ids for d in docs]
            for fn in encoders.values():
                fn(docs[0][:100_000])
            passes = []
            for r in range(repeats):
                wall: dict[str, list[float]] = {k: [] for k in labels}
                for i, (doc, want) in enumerate(zip(docs, wants)):
                    order = balanced_order(labels, r * len(docs) + i)
                    for label in order:
                        fresh = (doc + " ")[:-1]
                        time.sleep(pause / 1e3)
                        t, got = timed(lambda: encoders[label](fresh))
                        wall[label].append(t)
                        ids = AS_LIST[label](got) if label in AS_LIST else list(got)
                        if ids != want:
                            raise SystemExit(f"{label} differs from the reference on {kind} "
                                             f"document {i}")
                passes.append(wall)
            row = {"tokenizer": name, "case": "pieces", "kind": kind, "size": size,
                   "pause_ms": pause,
                   "passes": repeats, "explain_why": one.explain(docs[0])["why"],
                   "default_threads_why": auto.explain(docs[0])["why"]}
            cells = []
            for label in labels:
                all_ms = [x for w in passes for x in w[label]]
                ratio = [statistics.median(a / b for a, b in zip(w[label], w["dtok threads=1"]))
                         for w in passes]
                row[label] = {**summary(all_ms),
                              "over_dtok_threads1": {"median": statistics.median(ratio),
                                                     "min": min(ratio), "max": max(ratio)}}
                cells.append(f"{label} {row[label]['median_ms']:6.2f} (P99 "
                             f"{row[label]['p99_ms']:.2f}; /threads=1 "
                             f"{statistics.median(ratio):.2f} [{min(ratio):.2f}-{max(ratio):.2f}])")
            rows.append(row)
            print(f"{name:12s} pieces pause {pause:4.0f} ms {kind:12s} {size:>9,} "
                  + "  ".join(cells),
                  flush=True)
    return rows


def run_order(name: str, repeats: int) -> list[dict]:
    """What the encoder that ran just before does to the next call: dtok (one thread) and
    fastokens alone timed right after the reference's ``encode_batch_fast`` of the same 1M
    characters, after it and a 20 ms pause, right after gigatoken, and right after their own
    previous call; thread CPU time and wall time. (The reference leaves glibc's main heap
    with much freed memory; the next large allocations in this thread pay for sorting it.)"""
    import dtok
    import gigatoken
    from tokenizers import Tokenizer as HF

    path = SHARED / "tokenizers" / name
    tok = dtok.Tokenizer.from_file(path, threads=1, content_lookup=False)
    fast = peers(path, False)["fastokens"]
    hf = HF.from_file(str(path / "tokenizer.json"))
    gt = gigatoken.Tokenizer(str(path / "tokenizer.json"))
    timed_ = {"dtok": lambda d: tok.encode(d, add_special_tokens=False), "fastokens": fast}
    before = {"right after reference": lambda d: hf.encode_batch_fast([d]),
              "after reference, 20 ms pause": lambda d: (hf.encode_batch_fast([d]),
                                                         time.sleep(0.02)),
              "right after gigatoken": lambda d: gt.encode(d),
              "right after itself": lambda d: None}
    docs = documents("prose", 1_000_000, repeats * 2 + 1)
    for fn in timed_.values():
        fn(docs[-1])
    res: dict = {}
    for doc in docs[:-1]:
        for who, fn in timed_.items():
            for cond, pre in before.items():
                pre((doc + " ")[:-1])
                fresh = (doc + " ")[:-1]
                t0, c0 = time.perf_counter(), time.thread_time()
                fn(fresh)
                res.setdefault((cond, who), []).append(
                    ((time.perf_counter() - t0) * 1e3, (time.thread_time() - c0) * 1e3))
    rows = []
    for cond in before:
        row = {"tokenizer": name, "case": "order", "before": cond}
        for who in timed_:
            v = res[(cond, who)]
            row[who] = {"wall_ms": statistics.median(a for a, _ in v),
                        "thread_cpu_ms": statistics.median(b for _, b in v)}
        rows.append(row)
        print(f"{name:12s} order: {cond:30s} dtok {row['dtok']['wall_ms']:6.2f} ms "
              f"(cpu {row['dtok']['thread_cpu_ms']:.2f})  fastokens {row['fastokens']['wall_ms']:6.2f}"
              f" ms (cpu {row['fastokens']['thread_cpu_ms']:.2f})", flush=True)
    return rows


def run_breakdown(name: str, repeats: int) -> list[dict]:
    """Where dtok's time goes on one thread (1M characters per kind): planning, slicing,
    routing (guard and NFC scans), the encoder calls, concatenation; vs fastokens alone."""
    import dtok
    from dtok_ext.buffers import IdBuffer

    tok = dtok.Tokenizer.from_file(SHARED / "tokenizers" / name, content_lookup=False, threads=1)
    fast = peers(SHARED / "tokenizers" / name, False)["fastokens"]
    chunk_encoder = parts_of(tok).chunk_encoder
    rows = []
    for kind in KINDS:
        docs = documents(kind, 1_000_000, repeats)
        for d in docs:
            tok.encode(d), fast(d)
        parts: dict[str, list] = {}
        for d0 in docs * 3:
            d, whole = (d0 + " ")[:-1], (d0 + " ")[:-1]  # fresh strings (no cached UTF-8)
            t = {}
            t["plan"], cuts = timed(lambda: chunk_encoder.stateless_cuts(d))
            t["slice"], pieces = timed(lambda: split_at(d, cuts))
            t["route"], segs = timed(lambda: [chunk_encoder.stretches(p) for p in pieces])
            fast_texts = [p[a:b] for p, ss in zip(pieces, segs) for a, b, w in ss if w is None]
            ref_texts = [p[a:b] for p, ss in zip(pieces, segs) for a, b, w in ss if w is not None]
            t["fast encoder"], ids = timed(lambda: tok.encoder.encode_many(fast_texts))
            t["reference"], rids = timed(lambda: chunk_encoder.reference.encode_many(ref_texts)
                                         if ref_texts else [])
            t["concat"], _ = timed(lambda: IdBuffer.concat(list(ids) + list(rids), (), ()))
            total = (d0 + " ")[:-1]
            t["dtok total"], _ = timed(lambda: tok.encode(total, add_special_tokens=False))
            t["fastokens alone"], _ = timed(lambda: fast(whole))
            for k, v in t.items():
                parts.setdefault(k, []).append(v * 1e3)
        row = {"tokenizer": name, "kind": kind, "ms": {k: statistics.median(v)
                                                       for k, v in parts.items()},
               "reference_stretches": len(ref_texts),
               "reference_chars": sum(map(len, ref_texts))}
        rows.append(row)
        print(f"{name:12s} {kind:12s} " + "  ".join(f"{k} {v:.2f}" for k, v in row["ms"].items())
              + f"  (ms; {row['reference_stretches']} stretches, {row['reference_chars']} chars "
              "on the reference)", flush=True)
    return rows


def run_memory(name: str, encoder: str) -> dict:
    """One row, in a fresh process: dtok on an encoder, or a peer alone (loaded as its users
    load it, with glibc's freed heap released like dtok does after loading)."""
    cold0 = memory()
    path = SHARED / "tokenizers" / name
    if encoder == "fastokens alone":
        import fastokens

        native = fastokens.Tokenizer.from_file(str(path / "tokenizer.json"))
        encode, label = (lambda d: native.encode_batch_flat([d])), encoder
    elif encoder == "gigatoken alone":
        import gigatoken

        gt = gigatoken.Tokenizer.from_json((path / "tokenizer.json").read_text())
        encode, label = (lambda d: gt.encode(d)), encoder
    elif encoder == "tokenizers alone":
        from tokenizers import Tokenizer as HF

        hf = HF.from_file(str(path / "tokenizer.json"))
        encode, label = (lambda d: hf.encode_batch_fast([d])), encoder
    else:
        import dtok

        tok = dtok.Tokenizer.from_file(path, encoder=encoder, content_lookup=False)
        encode, label = tok.encode, f"dtok {tok.encoder.name}"
    if encoder.endswith("alone"):
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    cold = memory()
    for kind in ("prose", "code", "multilingual"):  # three 1M encodes, as issue 19 measured
        encode(documents(kind, 1_000_000, 1)[0])
    warm = memory()
    return {"tokenizer": name, "encoder": label, "before_import": cold0,
            "cold": cold, "warm_after_1M": warm}


def child(args) -> None:
    if args.child == "speed":
        rows = run_speed(args.tokenizers[0], args.mode, args.sizes, args.repeats, args.pause_ms,
                         args.hot, args.peers, tuple(args.off))
    elif args.child == "breakdown":
        rows = run_breakdown(args.tokenizers[0], args.repeats)
    elif args.child == "order":
        rows = run_order(args.tokenizers[0], args.repeats)
    elif args.child == "pieces":
        rows = run_pieces(args.tokenizers[0], args.repeats, args.pause_ms, args.sizes)
    else:
        rows = [run_memory(args.tokenizers[0], args.mode)]
    print("JSON" + json.dumps(rows))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizers", nargs="*", default=["qwen3", "llama3", "deepseek-v3", "gpt-oss"])
    ap.add_argument("--sizes", type=int, nargs="*", default=[1_000_000])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--memory-only", action="store_true")
    ap.add_argument("--breakdown-only", action="store_true")
    ap.add_argument("--order-only", action="store_true")
    ap.add_argument("--speed-only", action="store_true")
    ap.add_argument("--pieces-only", action="store_true",
                    help="the stateless route's pieces for the fast encoder, paired: one piece "
                         "per thread against 64K chunks, threads=2 against 1, fastokens alone")
    ap.add_argument("--pause-ms", type=float, default=PAUSE_MS,
                    help="pause before each timed call: 20 = requests spaced out in time (the "
                         "other core idles in between), 0 = back to back")
    ap.add_argument("--hot", action="store_true",
                    help="each timed call right after an untimed call on the same document "
                         "(every cache hot); default: each document new to every encoder")
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES))
    ap.add_argument("--peers", nargs="*", default=list(PEERS), choices=list(PEERS),
                    help="the encoders the +others modes load beside fastokens (default: all; "
                         "toktier and the reference take most of a run's time)")
    ap.add_argument("--pin", type=int, default=None, metavar="CPU",
                    help="run every measuring process on this one CPU (one pinned core for "
                         "each encoder; dtok's default threads are then 1)")
    ap.add_argument("--off", nargs="*", default=[], choices=list(MECHANISMS),
                    help="modes with dtok's default threads: also dtok with each of these "
                         "scheduling mechanisms switched off (dtok.testing.MECHANISMS)")
    ap.add_argument("--child", choices=["speed", "memory", "breakdown", "order", "pieces"],
                    help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        if args.pin is not None:  # before any encoder starts a thread: they inherit it
            os.sched_setaffinity(0, {args.pin})
        return child(args)
    info = machine()
    print(header(info))
    rows = []
    picked = {k for k in ("speed", "breakdown", "order", "memory", "pieces")
              if getattr(args, f"{k}_only")}
    if not picked:  # by default every part except the pieces' comparison
        picked = {"speed", "breakdown", "order", "memory"}
    jobs = [("speed", n, m) for n in args.tokenizers for m in args.modes] \
        if "speed" in picked else []
    jobs += [(k, n, "single") for k in ("breakdown", "order", "pieces") if k in picked
             for n in args.tokenizers]
    if "memory" in picked:
        jobs += [("memory", n, e) for n in args.tokenizers
                 for e in ("reference", "auto", "fastokens alone", "gigatoken alone",
                           "tokenizers alone")]
    for kind, name, mode in jobs:
        env = dict(os.environ)
        # fastokens' own BPE threads off everywhere: dtok divides a text across its threads
        # itself, and "fastokens alone" is the single-thread baseline of the issue
        env.setdefault("FASTOKENS_BPE_THREADS", "1")
        cmd = [sys.executable, __file__, "--child", kind, "--mode", mode, "--tokenizers", name,
               "--repeats", str(args.repeats), "--pause-ms", str(args.pause_ms),
               *(["--hot"] if args.hot else []), "--peers", *args.peers,
               *(["--pin", str(args.pin)] if args.pin is not None else []),
               *(["--off", *args.off] if args.off else []),
               "--sizes", *map(str, args.sizes)]
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
            print(f"memory {name:12s} {r['encoder']:16s} cold RSS {r['cold']['VmRSS']} MiB "
                  f"PSS {r['cold'].get('Pss')} MiB; after three 1M encodes RSS {r['warm_after_1M']['VmRSS']}"
                  f" MiB PSS {r['warm_after_1M'].get('Pss')} MiB peak {r['warm_after_1M']['VmHWM']} MiB",
                  flush=True)
    path = write_json("fast-memory.json" if args.memory_only else
                      "fast-breakdown.json" if args.breakdown_only else
                      "fast-order.json" if args.order_only else
                      "fast-pieces.json" if args.pieces_only else "fast.json",
                      {"machine": info, "args": vars(args), "rows": rows})
    print("wrote", path)


if __name__ == "__main__":
    main()
