#!/usr/bin/env python3
"""Build the fast encoder's guard tables for tokenizer files into dtok/data/guards.

    python tools/build_guards.py PATH [PATH ...] [--out DIR] [--reuse-code-points]

For each file: compare every vocabulary entry's text and every code point in eight contexts
through fastokens and the reference, and for an NFC file run the NFC proof (see dtok/guards.py).
A few minutes per file on two cores. ``--reuse-code-points`` takes the vocabulary and
code-point results from an existing table (this schema or an earlier one) for the same file and
versions (they do not depend on the schema) and runs only the rest (the NFC proof).
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dtok import guards  # noqa: E402
from dtok.encoders import FastEncoder  # noqa: E402
from dtok.tokenizer import Tokenizer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=guards.BUNDLED_DIR)
    ap.add_argument("--reuse-code-points", action="store_true")
    args = ap.parse_args()
    for path in args.paths:
        tok = Tokenizer.from_file(path, encoder="reference")
        a = tok.admission
        fast = FastEncoder(tok.tokenizer_json().decode("utf-8"), tok.reference)
        previous = None
        if args.reuse_code_points:
            for schema in range(guards.SCHEMA, 0, -1):
                name = guards._file_name(a.sha256, fast.version).replace(
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


if __name__ == "__main__":
    main()
