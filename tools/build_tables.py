#!/usr/bin/env python3
"""Build the class tables that ship in dtok/data/tables for the installed tokenizers version.

    python tools/build_tables.py [--out DIR]

Each table is one byte per code point (class id + NFC anchor flag), probed from the installed
reference (regex engine and NFC normalizer), gzip-compressed, named with the family, the family's
pattern hash, the tokenizers version and the table schema. At run time a table is used only when
all of these match; otherwise dtok rebuilds it into the user cache.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dtok import tables  # noqa: E402
from dtok._transitions import CLASSES  # noqa: E402
from dtok.families import FAMILIES  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=tables.BUNDLED_DIR)
    args = ap.parse_args()
    version = tables.tokenizers_version()
    t0 = time.time()
    anchor = tables.nfc_anchor_mask()
    print(f"NFC anchors: {int(anchor.sum())} code points ({time.time() - t0:.1f} s)")
    masks = {}
    for old in args.out.glob("*.bin.gz"):
        old.unlink()
    for family in FAMILIES.values():
        t0 = time.time()
        table, unknown = tables.build_table(family, list(CLASSES[family.name]), anchor, masks)
        if unknown:
            sys.exit(f"{family.name}: classes {unknown} are not in dtok/_transitions.py; "
                     "run tools/derive_transitions.py first")
        path = args.out / tables._file_name(family, version)
        tables.write_table(path, table)
        print(f"{family.name}: {path.name} {path.stat().st_size} bytes ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
