"""Command line: ``dtok demo | encode | verify | replay | explain | bench | guards``.

Also ``python -m dtok``. Every command has ``--help``; errors are one line on stderr and a
non-zero exit.
"""
from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Iterator

import dtok


class CliError(Exception):
    """An error shown as one line, with a non-zero exit (2)."""


# --- helpers -----------------------------------------------------------------------------------


def _load(path: str | None, need_admitted: bool = False, **knobs) -> dtok.Tokenizer:
    try:
        tok = (dtok.Tokenizer.default(**knobs) if path is None
               else dtok.Tokenizer.from_file(path, **knobs))
    except (FileNotFoundError, ValueError, OSError) as exc:
        raise CliError(str(exc)) from None
    if need_admitted and not tok.admission.admitted:
        raise CliError(f"tokenizer {path} is not admitted ({'; '.join(tok.admission.reasons)}); "
                       "dtok would only pass it to the reference")
    return tok


def demo_text(name: str = "devils-dictionary.txt") -> str:
    """Real text shipped with the package (see dtok/data/demo/NOTICE): public-domain prose
    (Bierce, The Devil's Dictionary) and source code (ripgrep, Unlicense)."""
    data = Path(__file__).resolve().parent / "data" / "demo" / f"{name}.gz"
    return gzip.decompress(data.read_bytes()).decode("utf-8")


def _best_of(fn, n: int = 3):
    best, out = float("inf"), None
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _read_text(path: str | None) -> str:
    if path in (None, "-"):
        return sys.stdin.buffer.read().decode("utf-8", errors="surrogateescape")
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except FileNotFoundError:
        raise CliError(f"no such file: {path}") from None
    except IsADirectoryError:
        raise CliError(f"{path} is a directory") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{path} is not UTF-8: {exc}") from None


def _read_json(path: Path):
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise CliError(f"no such file: {path}") from None
    except ValueError as exc:
        raise CliError(f"{path} is not valid JSON: {exc}") from None


class Progress:
    """A one-line progress bar on stderr while stderr is a terminal; nothing when it is piped
    or redirected (a log gets the result lines only).

    ``update(n)`` counts work done (characters, steps: ``unit`` says which); ``note(text)``
    shows what is being done when there is no count."""

    def __init__(self, total: int, label: str, unit: str = "M chars", scale: float = 1e6,
                 stream=None) -> None:
        self.total, self.label, self.done = max(1, total), label, 0
        self.unit, self.scale = unit, scale
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.last = 0.0
        self.start = time.monotonic()
        self.shown = False

    def update(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if not self.tty or (now - self.last < 0.1 and self.done < self.total):
            return
        self.last = now
        frac = min(1.0, self.done / self.total)
        bar = "#" * int(30 * frac)
        self._show(f"{self.label} [{bar:<30}] {100 * frac:5.1f}% {self.done / self.scale:.1f}/"
                   f"{self.total / self.scale:.1f} {self.unit} {now - self.start:.0f} s")

    def note(self, text: str) -> None:
        if self.tty:
            self._show(f"{self.label}: {text} ({time.monotonic() - self.start:.0f} s)")

    def _show(self, line: str) -> None:
        self.stream.write("\r\x1b[K" + line)
        self.stream.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
            self.shown = False


def _first_difference(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


# --- demo --------------------------------------------------------------------------------------


def demo_turns(tok: dtok.Tokenizer, turns: int) -> list[str]:
    """A session that grows turn by turn: user turns quote prose and code, assistant turns
    answer; rendered with the tokenizer's own chat markers."""
    from dtok.chat import detect_style, render_turns

    prose = demo_text()
    code = demo_text("ripgrep-walk.rs") + demo_text("ripgrep-glob.rs")
    messages = [{"role": "system", "content": "You are a careful reviewer of prose and code."}]
    for i in range(turns):
        src = code if i % 2 else prose
        piece = src[(i // 2) * 9000 : (i // 2) * 9000 + 9000]
        messages.append({"role": "user", "content": f"Review this excerpt ({i}):\n{piece}"})
        messages.append({"role": "assistant", "content": prose[-(i + 1) * 700 : -i * 700 or None]})
    try:
        style = detect_style(tok.admission.added_tokens)
    except ValueError:
        text, out = "", []
        for m in messages:
            text += m["content"] + "\n"
            out.append(text)
        return out[2::2]
    return render_turns(messages, style)[2::2]


def cmd_demo(args) -> int:
    tok = _load(args.tokenizer)
    ref = tok.reference
    print(f"dtok {dtok.__version__} - {tok!r}")
    print(f"admission: {'admitted' if tok.admission.admitted else 'NOT admitted'} "
          f"({'; '.join(tok.admission.reasons)})")
    stats = tok.stats()
    why = '; '.join(stats['notes']) or ('as asked' if tok.admission.admitted else 'not admitted')
    print(f"encoder: {stats['encoder']} ({why})")
    ok = True
    print("\n1. an agent session growing turn by turn (shipped prose and code), session key 'demo'")
    print(f"{'turn':>4} {'chars':>9} {'route':>15} {'dtok ms':>9} {'reference ms':>13} "
          f"{'ratio':>7}  identical")
    for i, text in enumerate(demo_turns(tok, args.turns)):
        route = tok.explain(text, session="demo")["route"]
        t_dtok, ids = _timed(lambda: tok.encode(text, session="demo"))
        t_ref, want = _timed(lambda: ref.encode(text).ids)
        same = list(ids) == want
        ok &= same
        print(f"{i:>4} {len(text):>9,} {route:>15} {t_dtok * 1e3:>9.2f} {t_ref * 1e3:>13.1f} "
              f"{t_ref / t_dtok:>6.0f}x  {'yes' if same else 'NO'}")
    prose = demo_text()
    doc = (prose * (1 + args.chars // len(prose)))[: args.chars]
    print(f"\n2. one long stateless document: {len(doc):,} characters of shipped prose "
          "(content lookup off, best of 3 each)")
    stateless = tok.with_knobs(content_lookup=False)
    t_ref, want = _best_of(lambda: ref.encode(doc).ids)
    t_dtok, ids = _best_of(lambda: stateless.encode(doc))
    ex = stateless.explain(doc)
    same = list(ids) == want
    ok &= same
    print(f"   route {ex['route']} ({ex['why']})")
    print(f"   reference {t_ref * 1e3:8.1f} ms   dtok {t_dtok * 1e3:8.1f} ms   "
          f"ratio x{t_ref / t_dtok:.1f}   tokens {len(want):,}   identical: {'yes' if same else 'NO'}")
    return 0 if ok else 1


# --- encode / explain --------------------------------------------------------------------------


def cmd_encode(args) -> int:
    tok = _load(args.tokenizer)
    ids = tok.encode(_read_text(args.file), add_special_tokens=not args.no_special)
    if args.npy:
        import numpy as np

        np.save(args.npy, np.frombuffer(ids, dtype=np.int32))
    else:
        sys.stdout.write(" ".join(map(str, ids)) + "\n")
    return 0


def cmd_explain(args) -> int:
    tok = _load(args.tokenizer)
    info = tok.explain(_read_text(args.file))
    info["encoder_notes"] = tok.stats()["notes"]
    print(json.dumps(info, indent=2, ensure_ascii=False))
    return 0


# --- verify ------------------------------------------------------------------------------------


def _texts_of(path: Path, tok: dtok.Tokenizer) -> Iterator[tuple[str, str]]:
    """(label, text) for a file, a directory (recursively), JSONL or JSON."""
    if path.is_dir():
        for p in sorted(q for q in path.rglob("*") if q.is_file()):
            yield from _texts_of(p, tok)
        return
    if not path.exists():
        raise CliError(f"no such file or directory: {path}")
    if path.suffix == ".jsonl":
        for n, line in enumerate(path.read_bytes().decode("utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except ValueError as exc:
                raise CliError(f"{path}:{n}: not valid JSON: {exc}") from None
            yield f"{path}:{n}", _text_of(item, tok, f"{path}:{n}")
        return
    if path.suffix == ".json":
        yield str(path), _text_of(_read_json(path), tok, str(path))
        return
    yield str(path), _read_text(str(path))


def _text_of(item, tok: dtok.Tokenizer, where: str) -> str:
    if isinstance(item, str):
        return item
    if isinstance(item, dict) and isinstance(item.get("text"), str):
        return item["text"]
    messages = item.get("messages") if isinstance(item, dict) else item
    if isinstance(messages, list) and all(isinstance(m, dict) and "role" in m for m in messages):
        from dtok.chat import detect_style, render_turns

        try:
            style = detect_style(tok.admission.added_tokens)
        except ValueError:
            raise CliError(f"{where}: this tokenizer has no known chat markers") from None
        return render_turns(messages, style)[-1] if messages else ""
    raise CliError(f"{where}: expected a string, {{'text': ...}}, or a list of messages")


def cmd_verify(args) -> int:
    tok = _load(args.tokenizer)
    special = not args.no_special
    items = [(label, text) for p in args.paths for label, text in _texts_of(Path(p), tok)]
    progress = Progress(sum(len(t) for _, t in items), "verify")
    t_dtok = t_ref = 0.0
    for label, text in items:
        dt, got = _timed(lambda: list(tok.encode(text, add_special_tokens=special)))
        t_dtok += dt
        dt, want = _timed(lambda: tok.reference.encode(text, add_special_tokens=special).ids)
        t_ref += dt
        progress.update(len(text))
        if got != want:
            progress.close()
            i = _first_difference(got, want)
            print(f"DIFFERENT: {label}: first difference at token {i}: dtok {got[i:i + 5]} "
                  f"reference {want[i:i + 5]} ({len(got)} vs {len(want)} tokens)")
            return 1
    progress.close()
    chars = sum(len(t) for _, t in items)
    print(f"identical: yes - {len(items)} texts, {chars:,} characters; dtok {t_dtok:.2f} s, "
          f"reference {t_ref:.2f} s ({tok.stats()['encoder']}, "
          f"{'admitted' if tok.admission.admitted else 'not admitted'})")
    return 0


# --- replay ------------------------------------------------------------------------------------


def cmd_replay(args) -> int:
    from dtok.chat import detect_style, render_turns

    tok = _load(args.tokenizer, need_admitted=True)
    try:
        style = detect_style(tok.admission.added_tokens)
    except ValueError:
        raise CliError("this tokenizer has no known chat markers to render transcripts") from None
    transcripts = []
    for p in args.transcripts:
        messages = _read_json(Path(p))
        if not isinstance(messages, list) or not all(
                isinstance(m, dict) and "role" in m for m in messages):
            raise CliError(f"{p}: expected a JSON list of {{role, content}} messages")
        transcripts.append((p, render_turns(messages, style)))
    print(f"# {tok!r}, mode {args.mode}")
    print(f"{'transcript':40s} {'turns':>5} {'chars':>9} {'dtok p50':>9} {'dtok p99':>9} "
          f"{'ref p50':>9} {'ratio':>7} identical")
    ok = True
    for p, turns in transcripts:
        session = f"replay:{p}" if args.mode == "keyed" else None
        t_dtok, t_ref, same = [], [], True
        for text in turns:
            dt, got = _timed(lambda: list(tok.encode(text, session=session)))
            t_dtok.append(dt * 1e3)
            dt, want = _timed(lambda: tok.reference.encode(text).ids)
            t_ref.append(dt * 1e3)
            same &= got == want
        ok &= same
        d50 = statistics.median(t_dtok)
        d99 = sorted(t_dtok)[min(len(t_dtok) - 1, int(0.99 * len(t_dtok)))]
        r50 = statistics.median(t_ref)
        name = Path(p).name
        print(f"{name[-40:]:40s} {len(turns):>5} {len(turns[-1]) if turns else 0:>9,} "
              f"{d50:>9.2f} {d99:>9.2f} {r50:>9.1f} {r50 / d50:>6.0f}x {'yes' if same else 'NO'}")
    s = tok.sessions.stats()
    print(f"# sessions: {s['repairs']} repairs, {s['full_encodes']} full encodes, "
          f"{s['fallbacks']} fallbacks, {s['lookup_hits']} content-lookup hits")
    return 0 if ok else 1


# --- bench -------------------------------------------------------------------------------------


def cmd_bench(args) -> int:
    """A quick side-by-side: one long stateless document and a session of appends."""
    tok = _load(args.tokenizer, need_admitted=True, content_lookup=False)
    text = "".join(_read_text(f) for f in args.files) if args.files else (
        demo_text() + demo_text("ripgrep-walk.rs"))
    doc = (text * (1 + args.chars // max(1, len(text))))[: args.chars]
    ref = tok.reference
    print(f"# {tok!r}; {args.chars:,} chars; {args.repeats} repeats; medians (P99)")
    progress = Progress(2 * args.repeats + args.appends + 2, "bench", "steps", 1)
    t_ref, t_dtok = [], []
    for _ in range(args.repeats):
        t_ref.append(_timed(lambda: ref.encode(doc).ids)[0] * 1e3)
        progress.update(1)
        t_dtok.append(_timed(lambda: tok.encode(doc))[0] * 1e3)
        progress.update(1)
    progress.close()
    print(f"stateless: reference {statistics.median(t_ref):.1f} ms, dtok "
          f"{statistics.median(t_dtok):.1f} ms ({max(t_dtok):.1f}), "
          f"x{statistics.median(t_ref) / statistics.median(t_dtok):.1f}")
    base = doc[: args.chars // 2]
    session = tok.with_knobs()
    session.encode(base, session="b")
    t_app = []
    for i in range(args.appends):
        t = doc[: len(base) + (i + 1) * 400]
        t_app.append(_timed(lambda: session.encode(t, session="b"))[0] * 1e3)
        progress.update(1)
    t_full = _timed(lambda: ref.encode(doc[: len(base) + args.appends * 400]).ids)[0] * 1e3
    progress.close()
    p99 = sorted(t_app)[min(len(t_app) - 1, int(0.99 * len(t_app)))]
    print(f"session: {args.appends} appends of 400 chars to {len(base):,} chars: dtok "
          f"{statistics.median(t_app):.3f} ms ({p99:.3f}); a full reference encode {t_full:.1f} ms")
    return 0


# --- guards ------------------------------------------------------------------------------------


def cmd_guards(args) -> int:
    from dtok import guards, probes
    from dtok.encoders import FastEncoderError, fastokens_version

    tok = _load(args.path, need_admitted=True, encoder="reference")
    a = tok.admission
    found = guards.load(a.sha256, fastokens_version() or "")
    if found is not None:
        print(f"guard table already there: {found.source}")
        return 0
    progress = Progress(1, "guards")
    try:
        table = probes.probe(str(tok.files.path), a.sha256, progress.note)
    except (FastEncoderError, ValueError) as exc:
        raise CliError(str(exc)) from None
    finally:
        progress.close()
    print(f"{len(table.disagree)} disagreeing code points; guard table written to {table.source}")
    return 0


# --- parser ------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dtok", description="Exact, fast tokenization of long "
                                 "prompts: the IDs of Hugging Face tokenizers, faster.")
    ap.add_argument("--version", action="version", version=f"dtok {dtok.__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    tk = "tokenizer.json or its directory (default: the bundled Qwen3)"

    p = sub.add_parser("demo", help="encode shipped real text with dtok and the reference")
    p.add_argument("--tokenizer", help=tk)
    p.add_argument("--chars", type=int, default=1_000_000, help="length of the long document")
    p.add_argument("--turns", type=int, default=12, help="turns of the demo session")
    p.set_defaults(fn=cmd_demo)

    p = sub.add_parser("encode", help="print the IDs of a file (or stdin)")
    p.add_argument("file", nargs="?", help="UTF-8 text file; '-' or nothing for stdin")
    p.add_argument("--tokenizer", help=tk)
    p.add_argument("--no-special", action="store_true", help="add_special_tokens=False")
    p.add_argument("--npy", help="write the IDs as a .npy int32 array to this path")
    p.set_defaults(fn=cmd_encode)

    p = sub.add_parser("verify", help="compare dtok with the reference on your data")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="text files, directories, .jsonl (strings, {'text'}, or messages) or "
                        ".json transcripts")
    p.add_argument("--tokenizer", help=tk)
    p.add_argument("--no-special", action="store_true", help="add_special_tokens=False")
    p.set_defaults(fn=cmd_verify)

    p = sub.add_parser("replay", help="replay chat transcripts turn by turn")
    p.add_argument("transcripts", nargs="+", metavar="TRANSCRIPT.json",
                   help="JSON lists of {role, content} messages")
    p.add_argument("--tokenizer", help=tk)
    p.add_argument("--mode", choices=["keyed", "lookup"], default="keyed",
                   help="keyed sessions, or content lookup (no key)")
    p.set_defaults(fn=cmd_replay)

    p = sub.add_parser("explain", help="show the route and cuts dtok takes for a file")
    p.add_argument("file", nargs="?", help="UTF-8 text file; '-' or nothing for stdin")
    p.add_argument("--tokenizer", help=tk)
    p.set_defaults(fn=cmd_explain)

    p = sub.add_parser("bench", help="a quick side-by-side benchmark (see benches/ for more)")
    p.add_argument("files", nargs="*", help="text to use (default: shipped demo text)")
    p.add_argument("--tokenizer", help=tk)
    p.add_argument("--chars", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--appends", type=int, default=100)
    p.set_defaults(fn=cmd_bench)

    p = sub.add_parser("guards", help="probe now what a first load of the file probes in the "
                       "background (its guard table, into the cache)")
    p.add_argument("path", help="tokenizer.json or its directory")
    p.set_defaults(fn=cmd_guards)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except CliError as exc:
        print(f"dtok: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
