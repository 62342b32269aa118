"""The chunking rule of the stateless route: how many chunks a long text is cut into, where
(safe cuts only: :mod:`dtok_ext.cuts`), and the slicing of a text at its cuts.

>>> split_at("abcdef", [2, 4])
['ab', 'cd', 'ef']
>>> chunk_count(200_000, 65536, 16)
4
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from dtok_ext.cuts import CutRules

__all__ = ["Chunker", "chunk_count", "split_at"]


def chunk_count(n: int, chunk_target: int, max_chunks: int) -> int:
    """How many chunks a text of n characters is cut into (the pool caps it further by its
    live workers)."""
    return min(math.ceil(n / chunk_target), max_chunks)


def split_at(text: str, cuts: Sequence[int], start: int = 0, end: int | None = None) -> list[str]:
    """``text[start:end]`` cut at ``cuts`` (increasing, inside the range): the chunks in order."""
    bounds = [start, *cuts, len(text) if end is None else end]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


class Chunker:
    """Where the stateless route cuts a text, under one tokenizer's rules and knobs."""

    def __init__(self, rules: CutRules, knobs: dict[str, Any]) -> None:
        self.rules = rules
        self.threshold = knobs["chunk_threshold"]
        self.target = knobs["chunk_target"]
        self.max_chunks = knobs["max_chunks"]
        self.budgets = knobs["scan_budget"]

    def count(self, n: int, target: int | None = None) -> int:
        """Chunks for a text of n characters (at or above the threshold), aimed at ``target``
        characters each (default: the knob ``chunk_target``)."""
        return chunk_count(n, target or self.target, self.max_chunks)

    def cuts(self, text: str, k: int | None = None) -> list[int]:
        """Safe cuts for ``k`` chunks of text (default :meth:`count`), whatever its length; no
        chunk shorter than max(16, min(1024, N / 4k))."""
        n = len(text)
        k = self.count(n) if k is None else k
        if k < 2 or n < 256:
            return []
        return self.rules.plan(text, k, max(16, min(1024, n // (4 * k))), self.budgets)
