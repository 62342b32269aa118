#!/usr/bin/env python3
"""Build the class tables that ship in dtok/families/tables for the installed tokenizers version.

    python tools/data/build_tables.py [FAMILY ...] [--out DIR]

Each table is one byte per code point (class id + NFC anchor flag), probed from the installed
reference (regex engine and NFC normalizer), gzip-compressed, named with the family, the family's
pattern hash, the tokenizers version and the table schema (``dtok.tables.file_name``). At run
time a table is used only when all of these match; otherwise dtok rebuilds it into the user
cache. The families named (default: all) are built; their older tables in ``--out`` (another
pattern hash, version or schema) are removed. The class ids come from
``dtok/families/_transitions.py``: run ``tools/data/derive_transitions.py`` first.
"""
import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dtok import tables  # noqa: E402
from dtok.families import CLASSES, FAMILIES  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("families", nargs="*", default=list(FAMILIES), metavar="FAMILY")
    ap.add_argument("--out", type=Path, default=tables.BUNDLED_DIR)
    args = ap.parse_args()
    missing = [name for name in args.families if name not in CLASSES]
    if missing:
        sys.exit(f"{missing}: not in dtok/families/_transitions.py (unknown families need "
                 "dtok/families/rules.py, then tools/data/derive_transitions.py)")
    version = tables.tokenizers_version()
    t0 = time.time()
    anchor = tables.nfc_anchor_mask()
    print(f"NFC anchors: {int(anchor.sum())} code points ({time.time() - t0:.1f} s)")
    masks = {}
    for name in args.families:
        family = FAMILIES[name]
        t0 = time.time()
        table, unknown = tables.build_table(family, list(CLASSES[name]), anchor, masks)
        if unknown:
            sys.exit(f"{name}: classes {unknown} are not in dtok/families/_transitions.py; "
                     "run tools/data/derive_transitions.py first")
        path = args.out / tables.file_name(family, version)
        for old in args.out.glob(f"{name}-*.bin.gz"):
            if old != path:
                old.unlink()
        tables.write_table(path, table)
        print(f"{name}: {path.name} {path.stat().st_size} bytes ({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
