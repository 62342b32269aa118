#!/usr/bin/env python3
"""Build the fast encoder's guard tables for tokenizer files into dtok/data/guards.

    python tools/data/build_guards.py PATH [PATH ...] [--encoder fastokens|gigatoken]
                                      [--out DIR] [--reuse-code-points] [--speed]
                                      [--candidate basetenkenizer]
                                      [--long-pieces]

For each file: compare every vocabulary entry's text and every code point in eight contexts
through the fast encoder (fastokens or gigatoken) and the reference, and for an NFC file run the NFC proof (see dtok/guards.py).
A few minutes per file on two cores. ``--reuse-code-points`` takes the vocabulary and
code-point results from an existing table (this schema or an earlier one) for the same file and
versions (they do not depend on the schema) and runs only the rest (the NFC proof).

``--speed`` (gigatoken tables): measure, in this process, gigatoken against fastokens on
64K-character documents of each text class dtok routes by (``dtok.chunk_encoder.text_class``:
"latin" = prose and code, "other" = multilingual and adversarial text) from the corpus, and
record the per-class median ratio in the file's table: dtok gives gigatoken the classes where
it took at most ``SPECIALIST_WINS`` of fastokens' time. Each document is new to both encoders (the
gigatoken instance first sees the other half of the corpus: a warm pre-token cache, as in
service); pairs alternate which encoder goes first. Every output is compared with the
reference's and the wrong ones counted. ``--speed --candidate basetenkenizer`` measures another
encoder a user might pick (basetenkenizer 0.2.8, MIT) the same way, in place of gigatoken, and
only prints: it has no guard tables, so dtok could serve nothing from it before they exist.

``--long-pieces`` (fastokens tables): measure, on one pinned CPU with one BPE thread (the
one-thread case it decides), fastokens on 1M-character documents of the text classes other
than Latin, whole against cut where the stateless route cuts them (the knob ``chunk_target``,
slicing included), and record the median ratio whole / cut per class in the file's table
(``speed.long_piece``), and the work per character of each class against Latin text (prose and
code whole), in the faster form (``speed.text_weight``). dtok reads neither since the ablation
of 2026-12-07 (other text in long pieces and weighed 3x did not pay:
docs/benchmarks.md#scheduling-mechanisms-each-switched-off); the records stay measurements.
Each document is a fresh copy; the forms alternate which goes first, 20 ms apart (requests
spaced out).
"""
import argparse
import gzip
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dtok import guards  # noqa: E402
from dtok.encoders import FastEncoder, FastEncoderError, GigaEncoder  # noqa: E402
from dtok.tokenizer import parts_of  # noqa: E402
from dtok.tokenizer import Tokenizer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=guards.BUNDLED_DIR)
    ap.add_argument("--reuse-code-points", action="store_true")
    ap.add_argument("--encoder", choices=("fastokens", "gigatoken"), default="fastokens")
    ap.add_argument("--speed", action="store_true",
                    help="only measure gigatoken against fastokens and record it in the table")
    ap.add_argument("--long-pieces", action="store_true",
                    help="only measure fastokens on long pieces of other text and record it")
    ap.add_argument("--corpus", type=Path, default=None)
    ap.add_argument("--candidate", choices=("basetenkenizer",), default=None,
                    help="with --speed: measure this encoder in place of gigatoken, print only")
    args = ap.parse_args()
    if args.long_pieces:
        if os.environ.get("FASTOKENS_BPE_THREADS") != "1":  # read when fastokens starts
            os.execve(sys.executable, [sys.executable, *sys.argv],
                      {**os.environ, "FASTOKENS_BPE_THREADS": "1"})
        for path in args.paths:
            record_long_pieces(path, args.out, args.corpus)
        return
    if args.speed:
        for path in args.paths:
            try:
                record_speed(path, args.out, args.corpus, args.candidate)
            except FastEncoderError as exc:  # no guard table to record it in
                print(f"{path}: {exc}: nothing measured", flush=True)
            except BaseException as exc:  # a candidate's Rust panic is a BaseException
                if not args.candidate or isinstance(exc, KeyboardInterrupt):
                    raise
                print(f"{path}: {args.candidate} raised {exc!r}"[:300], flush=True)
        return
    for path in args.paths:
        tok = Tokenizer.from_file(path, encoder="reference")
        a = tok.admission
        make = GigaEncoder if args.encoder == "gigatoken" else FastEncoder
        try:
            fast = make(tok.tokenizer_json(), tok.reference)
        except FastEncoderError as exc:  # dtok serves the file without this encoder
            print(f"{path}: {exc}: no guard table", flush=True)
            continue
        previous = None
        if args.reuse_code_points:
            for schema in range(guards.SCHEMA, 0, -1):
                name = guards.file_name(a.sha256, fast.version, fast.name).replace(
                    f"schema{guards.SCHEMA}", f"schema{schema}")
                if (args.out / name).exists():
                    previous = args.out / name
                    break
        table = guards.build(tok.reference, fast, a.sha256, args.out,
                             progress=lambda msg: print(f"  {path}: {msg}", flush=True),
                             nfc_family=a.family if a.nfc else None,
                             code_points_from=previous)
        if previous is not None and previous != Path(table.source):
            previous.unlink()
        nfc = f", NFC proven: {table.nfc_proven}" if a.nfc else ""
        print(f"{path}: {len(table.disagree)} guard code points{nfc} -> {table.source}",
              flush=True)


ROOT = Path(__file__).resolve().parents[2]
CLASSES = {"latin": ("prose", "code"), "other": ("multilingual", "adversarial")}
DOC = 65536  # dtok's chunk_target: what one encoder call usually gets


def _corpus_root(corpus: Path | None) -> Path:
    shared = Path(os.environ.get("DTOK_SHARED", ROOT.parent / "shared")) / "corpus"
    return corpus or (shared if shared.is_dir() else ROOT / "tests" / "data" / "corpus")


def _read(f: Path) -> str:
    raw = f.read_bytes()
    return (gzip.decompress(raw) if f.suffix == ".gz" else raw).decode("utf-8")


def _corpus_docs(corpus: Path | None) -> dict[str, list[str]]:
    root = _corpus_root(corpus)
    out = {}
    for cls, kinds in CLASSES.items():
        docs = []
        for kind in kinds:
            for f in sorted((root / kind).iterdir()):
                text = _read(f)
                docs += [text[i:i + DOC] for i in range(0, len(text) - DOC // 4, DOC)]
        out[cls] = docs
    return out


class Basetenkenizer:
    """basetenkenizer 0.2.8 (MIT) with the two calls the speed measurement makes."""

    name = "basetenkenizer"

    def __init__(self, raw_json: bytes) -> None:
        import basetenkenizer

        self.native = basetenkenizer.Tokenizer.from_json_str(raw_json.decode("utf-8"))

    def encode(self, text: str) -> list[int]:
        return self.native.encode(text, add_special_tokens=False).ids

    def encode_many(self, texts: list[str]) -> list:
        return [self.encode(t) for t in texts]


def record_speed(path: Path, out: Path, corpus: Path | None, candidate: str | None = None) -> None:
    from dtok.chunk_encoder import text_class

    tok = Tokenizer.from_file(path, encoder="reference")
    raw = tok.tokenizer_json()
    fast = FastEncoder(raw, tok.reference)
    second = Basetenkenizer(raw) if candidate else GigaEncoder(raw, tok.reference)
    docs = _corpus_docs(corpus)
    ratio, ms, counts, wrong = {}, {}, {}, {}
    for cls, items in docs.items():
        items = [d for d in items if text_class(d) == cls] or items
        warm, measured = items[1::2], items[0::2]
        wants = [tok.reference.encode(doc, add_special_tokens=False).ids for doc in measured]
        second.encode_many(warm)  # a pre-token cache as in service: warm, but not on these
        per_doc, t_fast, t_second = [], [], []
        wrong[cls] = {fast.name: 0, second.name: 0}
        for i, (doc, want) in enumerate(zip(measured, wants)):
            t = {}
            for enc in ((fast, second) if i % 2 else (second, fast)):
                t0 = time.perf_counter()
                got = enc.encode(doc)
                t[enc.name] = time.perf_counter() - t0
                wrong[cls][enc.name] += list(got) != want
            per_doc.append(t[second.name] / t[fast.name])
            t_fast.append(t[fast.name])
            t_second.append(t[second.name])
        ratio[cls] = round(statistics.median(per_doc), 3)
        ms[cls] = {fast.name: round(1e3 * sum(t_fast), 2),
                   second.name: round(1e3 * sum(t_second), 2)}
        counts[cls] = len(measured)
        print(f"{path}: {cls}: {second.name} / fastokens median {ratio[cls]:.3f} over "
              f"{len(measured)} docs (quartiles {statistics.quantiles(per_doc, n=4)}); wrong "
              f"outputs {wrong[cls]}", flush=True)
    if candidate:
        return
    table_path = out / guards.file_name(tok.admission.sha256, second.version, second.name)
    table = json.loads(table_path.read_text())
    table["speed"] = {"ratio": ratio, "total_ms": ms, "docs": counts, "doc_chars": DOC,
                      "loadavg": [round(x, 2) for x in os.getloadavg()],
                      "cpus": len(os.sched_getaffinity(0)), "when": time.strftime("%Y-%m-%d")}
    guards.write_table(table_path, table)


LONG_DOC = 1_000_000
LONG_DOCS = 6  # documents of each kind (each measured in three pairs)


def _fresh(text: str) -> str:
    return (text + " ")[:-1]  # a new str: no UTF-8 written on it yet, as a request's text


def _long_docs(root: Path, kind: str) -> list[str]:
    """LONG_DOCS distinct documents of LONG_DOC characters spread over the corpus's files of
    ``kind`` concatenated (windows a few thousand characters apart would hold one stretch of
    the corpus, a few of its languages, with every word seen by the first)."""
    text = "".join(_read(f) for f in sorted((root / kind).iterdir()))
    while len(text) < LONG_DOC * LONG_DOCS:
        text += text
    step = (len(text) - LONG_DOC) // (LONG_DOCS - 1)
    return [text[d * step : d * step + LONG_DOC] for d in range(LONG_DOCS)]


def _paired(forms: dict, d: int) -> dict[str, float]:
    """The median time of each form, a (callable, text) pair: three rounds, the order
    alternating with ``d`` and the round, each call on a fresh copy of its text 20 ms after the
    last (spaced out)."""
    t: dict[str, list[float]] = {name: [] for name in forms}
    for r in range(3):
        for name in (list(forms) if (d + r) % 2 else list(forms)[::-1]):
            fn, doc = forms[name]
            s = _fresh(doc)
            time.sleep(0.02)
            t0 = time.perf_counter()
            fn(s)
            t[name].append(time.perf_counter() - t0)
    return {name: statistics.median(v) for name, v in t.items()}


def record_long_pieces(path: Path, out: Path, corpus: Path | None) -> None:
    from dtok.chunking import split_at
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})
    tok = Tokenizer.from_file(path, encoder="reference")  # the knob chunk_target's cuts
    fast = FastEncoder(tok.tokenizer_json(), tok.reference)
    table_path = out / guards.file_name(tok.admission.sha256, fast.version)
    table = json.loads(table_path.read_text())
    root = _corpus_root(corpus)
    latin = [doc for kind in CLASSES["latin"] for doc in _long_docs(root, kind)]
    ratio, by_kind, weight = {}, {}, {}
    for cls, kinds in CLASSES.items():
        if cls == "latin":
            continue
        docs = [(kind, doc) for kind in kinds for doc in _long_docs(root, kind)]
        # each document cut as the stateless route cuts it (the cuts found once)
        chunk_encoder = parts_of(tok).chunk_encoder
        cut = [lambda s, cuts=chunk_encoder.stateless_cuts(doc): fast.encode_many(split_at(s, cuts))
               for _, doc in docs]
        per_doc = []
        for d, (kind, doc) in enumerate(docs):
            t = _paired({"whole": (fast.encode, doc), "cut": (cut[d], doc)}, d)
            per_doc.append(t["whole"] / t["cut"])
            by_kind.setdefault(kind, []).append(per_doc[-1])
        ratio[cls] = round(statistics.median(per_doc), 3)
        # the work per character in the form dtok gives it, each document timed beside a
        # document of Latin text (alternating): the machine's drift cancels in the pair.
        # Means, not medians: the class mixes kinds of unlike cost (multilingual text cost up
        # to 1.5x adversarial text), whose work adds up
        whole = ratio[cls] <= 1.0  # whole faster
        times = {"other": [], "latin": []}
        for d, (kind, doc) in enumerate(docs):
            form = fast.encode if whole else cut[d]
            t = _paired({"other": (form, doc), "latin": (fast.encode, latin[d % len(latin)])}, d)
            for name in times:
                times[name].append(t[name])
        weight[cls] = round(statistics.fmean(times["other"]) / statistics.fmean(times["latin"]), 2)
        print(f"{path}: {cls}: whole / cut median {ratio[cls]:.3f} over {len(per_doc)} "
              f"documents; work per character {weight[cls]} x Latin text's", flush=True)
    by_kind = {kind: round(statistics.median(r), 3) for kind, r in by_kind.items()}
    table["speed"] = {"long_piece": ratio, "long_piece_kinds": by_kind, "text_weight": weight,
                      "doc_chars": LONG_DOC, "loadavg": [round(x, 2) for x in os.getloadavg()],
                      "when": time.strftime("%Y-%m-%d")}
    guards.write_table(table_path, table)


if __name__ == "__main__":
    main()
