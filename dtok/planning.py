"""What a pool asks of a tokenizer, and nothing more: a session turn's plan and the anchors after
it, a long text cut into chunks, whether a plan's encoding fits a budget, and the chunks' IDs.

:class:`Planning` is the one door the pool (:mod:`dtok.pool`) and its workers go through; the
tokenizer's planner, chunk encoder and chunker stay behind it.

>>> import dtok
>>> from dtok.repair import Anchors
>>> planning = dtok.Tokenizer.default().planning
>>> planning.plan(None, None, "Hello").kind, planning.plan("Hello", Anchors(), "Hello, world").kind
('encode', 'append')
>>> planning.cut("one. two. three.", 1)
['one. two. three.']
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from dtok.chunking import split_at
from dtok.sessions import plan_fits

if TYPE_CHECKING:
    from dtok.chunking import Chunker
    from dtok.loading import Upgrade
    from dtok.chunk_encoder import ChunkEncoder
    from dtok.repair import Anchors, Plan, Planner

__all__ = ["Planning"]


class Planning:
    """A tokenizer's planning interface (``Tokenizer.planning``). It holds the tokenizer's own
    parts, not copies, so a method replaced on one of them in a test is the one used."""

    __slots__ = ("_planner", "_chunk_encoder", "_chunker", "_upgrade")

    def __init__(self, planner: "Planner", chunk_encoder: "ChunkEncoder", chunker: "Chunker",
                 upgrade: "Upgrade | None" = None) -> None:
        self._planner, self._chunk_encoder, self._chunker = planner, chunk_encoder, chunker
        self._upgrade = upgrade

    def when_guard_table(self, callback: Callable[[], None]) -> bool:
        """Call ``callback()`` (on another thread) once a guard table for this file is in the
        cache, probing for one in the background if none is running; False where none will
        come (the file is not admitted, ``guard_probes="off"``, no fastokens, or a table
        covered the file at load)."""
        if self._upgrade is None:
            return False
        self._upgrade.notify(callback)
        return True

    @property
    def prefix(self) -> tuple[int, ...]:
        """IDs the post-processor puts before a text."""
        return self._chunk_encoder.prefix

    @property
    def suffix(self) -> tuple[int, ...]:
        """IDs the post-processor puts after a text."""
        return self._chunk_encoder.suffix

    def plan(self, old: str | None, anchors: "Anchors | None", text: str,
             edit_budget: int | None = None) -> "Plan":
        """The plan that brings the stored ``old`` to ``text`` (None: encode it whole);
        :meth:`dtok.repair.Planner.plan`."""
        return self._planner.plan(old, anchors, text, edit_budget)

    def anchors_after(self, plan: "Plan", resolved, counts, old: "Anchors | None") -> "Anchors":
        """The anchors of the text ``plan`` produced; :meth:`dtok.repair.Planner.anchors_after`."""
        return self._planner.anchors_after(plan, resolved, counts, old)

    def cut(self, text: str, k: int) -> list[str]:
        """``text`` cut at safe cuts into (about) ``k`` chunks."""
        return split_at(text, self._chunker.cuts(text, k))

    def fits(self, plan: "Plan", chars: int) -> bool:
        """Whether ``plan``'s encoding costs at most ``chars`` characters of encoding."""
        return plan_fits(self._chunk_encoder, plan, chars)

    def encode_texts(self, texts: list[str]) -> list[list]:
        """Body IDs of each text, encoded independently (a plan's texts, a chunk)."""
        return self._chunk_encoder.encode_texts(texts)
