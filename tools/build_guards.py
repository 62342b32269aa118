#!/usr/bin/env python3
"""Build the fast encoder's guard tables for tokenizer files into dtok/data/guards.

    python tools/build_guards.py PATH [PATH ...] [--out DIR]

For each file: compare every vocabulary entry's text and every code point in eight contexts
through fastokens and the reference (see dtok/guards.py). A few minutes per file on two cores.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dtok import guards  # noqa: E402
from dtok.admission import read_files  # noqa: E402
from dtok.encoders import FastEncoder  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=guards.BUNDLED_DIR)
    args = ap.parse_args()
    from tokenizers import Tokenizer

    for path in args.paths:
        files = read_files(path)
        raw = files.raw.decode("utf-8")
        reference = Tokenizer.from_str(raw)
        fast = FastEncoder(raw, reference)
        import hashlib

        sha = hashlib.sha256(files.raw).hexdigest()
        table = guards.build(reference, fast, sha, args.out,
                             progress=lambda msg: print(f"  {path}: {msg}", flush=True))
        print(f"{path}: {len(table.disagree)} guard code points -> {table.source}", flush=True)


if __name__ == "__main__":
    main()
