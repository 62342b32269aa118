"""Derive and check a family's accepted class transitions against the reference pre-tokenizer.

Used by ``tools/derive_transitions.py`` (which writes :mod:`dtok._transitions`) and by the test
suite (which re-checks the stored set). The argument for why short contexts suffice is in the
docstring of :mod:`dtok.families`.
"""
from __future__ import annotations

import itertools
import random

import numpy as np

from dtok.families import Family
from dtok.tables import class_names, probe_atom


def class_members(family: Family) -> dict[str, np.ndarray]:
    """Class name -> the code points in it, as probed from the installed reference."""
    masks = {regex: probe_atom(regex) for _label, regex in family.atoms}
    sig, names = class_names(family, masks)
    return {name: np.flatnonzero(sig == s) for s, name in names.items()}


def representatives(members: dict[str, np.ndarray], seed: int | None = None) -> dict[str, str]:
    """One character per class: the smallest code point, or a random one when seeded."""
    rng = random.Random(seed)
    out = {}
    for name, cps in sorted(members.items()):
        cp = int(cps[0]) if seed is None else int(cps[rng.randrange(len(cps))])
        out[name] = chr(cp)
    return out


def _contexts(chars: list[str], max_len: int) -> list[str]:
    out = [""]
    for n in range(1, max_len + 1):
        out.extend("".join(p) for p in itertools.product(chars, repeat=n))
    return out


class PairChecker:
    """pre(L + x + y + R) == pre(L + x) + pre(y + R) for all short contexts L, R."""

    def __init__(self, family: Family, reps: dict[str, str], left: int = 2, right: int = 2):
        pre = family.pre_tokenizer()
        self._split = lambda s: [piece for piece, _ in pre.pre_tokenize_str(s)]
        self.reps = reps
        chars = list(reps.values())
        self.lefts = _contexts(chars, left)
        self.rights = _contexts(chars, right)
        self.calls = 0

    def counterexample(self, x: str, y: str) -> tuple[str, str] | None:
        """(left text, right text) where cutting between x and y changes the pieces, or None."""
        split = self._split
        right_pieces = {r: split(y + r) for r in self.rights}
        for left in self.lefts:
            lp = split(left + x)
            for r in self.rights:
                self.calls += 1
                if split(left + x + y + r) != lp + right_pieces[r]:
                    return left + x, y + r
        return None

    def derive(self) -> list[tuple[str, str]]:
        names = sorted(self.reps)
        return [
            (a, b)
            for a in names
            for b in names
            if self.counterexample(self.reps[a], self.reps[b]) is None
        ]
