"""Command line: ``dtok demo | encode | explain`` (also ``python -m dtok``)."""
from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from importlib import resources

import dtok


class CliError(Exception):
    """An error shown as one line, with a non-zero exit."""


def _load(path: str | None, **knobs) -> dtok.Tokenizer:
    if path is None:
        return dtok.Tokenizer.default(**knobs)
    try:
        return dtok.Tokenizer.from_file(path, **knobs)
    except (FileNotFoundError, ValueError) as exc:
        raise CliError(str(exc)) from None


def demo_text(name: str = "devils-dictionary.txt") -> str:
    """Real text shipped with the package (see dtok/data/demo/NOTICE): public-domain prose
    (Bierce, The Devil's Dictionary) and source code (ripgrep, Unlicense)."""
    data = resources.files("dtok") / "data" / "demo" / f"{name}.gz"
    return gzip.decompress(data.read_bytes()).decode("utf-8")


def _best_of(fn, n: int = 3):
    best, out = float("inf"), None
    for _ in range(n):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def demo_turns(tok: dtok.Tokenizer, turns: int) -> list[str]:
    """A session that grows turn by turn: user turns quote prose and code, assistant turns
    answer; rendered with the tokenizer's own chat markers."""
    from dtok.chat import STYLES, detect_style, render_turns

    try:
        style = detect_style(tok.admission.added_tokens)
    except ValueError:
        style = None
    prose = demo_text()
    code = demo_text("ripgrep-walk.rs") + demo_text("ripgrep-glob.rs")
    messages = [{"role": "system", "content": "You are a careful reviewer of prose and code."}]
    for i in range(turns):
        src = code if i % 2 else prose
        piece = src[(i // 2) * 9000 : (i // 2) * 9000 + 9000]
        messages.append({"role": "user", "content": f"Review this excerpt ({i}):\n{piece}"})
        messages.append({"role": "assistant", "content": prose[-(i + 1) * 700 : -i * 700 or None]})
    if style is None or style not in STYLES:
        out, text = [], ""
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
    print(f"encoder: {stats['encoder']} ({'; '.join(stats['notes'])})")
    ok = True
    print(f"\n1. an agent session growing turn by turn (shipped prose and code), session key 'demo'")
    print(f"{'turn':>4} {'chars':>9} {'route':>15} {'dtok ms':>9} {'reference ms':>13} "
          f"{'ratio':>7}  identical")
    for i, text in enumerate(demo_turns(tok, args.turns)):
        route = tok.explain(text, session="demo")["route"]
        t0 = time.perf_counter()
        ids = tok.encode(text, session="demo")
        t_dtok = time.perf_counter() - t0
        t_ref, want = _best_of(lambda: ref.encode(text).ids, 1)
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


def _read_input(path: str | None) -> str:
    if path in (None, "-"):
        return sys.stdin.buffer.read().decode("utf-8", errors="surrogateescape")
    try:
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except FileNotFoundError:
        raise CliError(f"no such file: {path}") from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{path} is not UTF-8: {exc}") from None


def cmd_encode(args) -> int:
    tok = _load(args.tokenizer)
    ids = tok.encode(_read_input(args.file), add_special_tokens=not args.no_special)
    if args.npy:
        import numpy as np

        np.save(args.npy, np.frombuffer(ids, dtype=np.int32))
    else:
        sys.stdout.write(" ".join(map(str, ids)) + "\n")
    return 0


def cmd_explain(args) -> int:
    tok = _load(args.tokenizer)
    print(json.dumps(tok.explain(_read_input(args.file)), indent=2, ensure_ascii=False))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="dtok", description="Exact, fast tokenization of long prompts.")
    ap.add_argument("--version", action="version", version=f"dtok {dtok.__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="encode shipped real text with dtok and the reference, side by side")
    p.add_argument("--tokenizer", help="tokenizer.json or its directory (default: bundled Qwen3)")
    p.add_argument("--chars", type=int, default=1_000_000, help="length of the long document")
    p.add_argument("--turns", type=int, default=12, help="turns of the demo session")
    p.set_defaults(fn=cmd_demo)

    p = sub.add_parser("encode", help="print the IDs of a file (or stdin)")
    p.add_argument("file", nargs="?", help="UTF-8 text file; '-' or nothing for stdin")
    p.add_argument("--tokenizer", help="tokenizer.json or its directory (default: bundled Qwen3)")
    p.add_argument("--no-special", action="store_true", help="add_special_tokens=False")
    p.add_argument("--npy", help="write the IDs as a .npy int32 array to this path")
    p.set_defaults(fn=cmd_encode)

    p = sub.add_parser("explain", help="show the route and cuts dtok takes for a file")
    p.add_argument("file", nargs="?")
    p.add_argument("--tokenizer")
    p.set_defaults(fn=cmd_explain)
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


if __name__ == "__main__":
    sys.exit(main())
