#!/usr/bin/env python3
"""Derive families' accepted class transitions by enumeration and write dtok/families/_transitions.py.

    python tools/data/derive_transitions.py [FAMILY ...] [--out FILE]

For every ordered pair of classes (one representative each), left and right contexts made of
class representatives are tried through the installed reference pre-tokenizer; a pair is accepted
when no context splits differently with a cut between the two characters
(:func:`dtok.families.derive.derive`: context lengths (1, 1), (2, 1), (1, 2), and (2, 2) for
families with at most 20 classes). The families named (default: all) are derived again; the
others keep what the package's ``_transitions.py`` holds. ``--out`` writes elsewhere (the recipe's
test compares that file with the package's). About a minute for qwen2, llama3 or deepseek_v3 and
ten for o200k (fifteen for kimi) on two cores.
"""
import argparse
import ast
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dtok.families import FAMILIES, TRANSITIONS_FILE  # noqa: E402
from dtok.families.derive import derive, transitions_source  # noqa: E402
from dtok.tables import tokenizers_version  # noqa: E402


def stored_sets(path: Path) -> tuple[dict, dict]:
    """CLASSES and ACCEPTED as a transitions file holds them (empty when there is none yet)."""
    if not path.exists():
        return {}, {}
    values = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and node.targets[0].id in ("CLASSES", "ACCEPTED"):
            values[node.targets[0].id] = ast.literal_eval(node.value)
    return values["CLASSES"], values["ACCEPTED"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("families", nargs="*", default=list(FAMILIES), metavar="FAMILY")
    ap.add_argument("--out", type=Path, default=TRANSITIONS_FILE)
    args = ap.parse_args()
    unknown = [name for name in args.families if name not in FAMILIES]
    if unknown:
        sys.exit(f"unknown families {unknown}: add them to dtok/families/rules.py first")
    classes, accepted = stored_sets(TRANSITIONS_FILE)
    for name in args.families:
        t0 = time.time()
        classes[name], accepted[name] = derive(
            FAMILIES[name], progress=lambda msg: print(f"{msg}, {time.time() - t0:.0f} s",
                                                       flush=True))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(transitions_source(classes, accepted, tokenizers_version()))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
