"""Continuations: the IDs of a new text from a stored text's IDs, when the new text extends or
edits the stored one. One plan serves in-process sessions (:mod:`dtok.sessions`) and the pool
(front end plans, worker executes).

Why it is exact
---------------
A *cut* of a text S is a position b that is a safe cut of S (``CutRules``: the same predicate
that chunked encoding uses, evaluated on the whole of S) or either end of S. For cuts
``0 = c0 < c1 < ... < ck = len(S)`` the reference encodes S as the concatenation of the
encodings of the pieces ``S[ci:ci+1]`` (the chunking argument: the added-token scan, the
normalizer and the pre-tokenizer all split at every safe cut, and BPE works within pre-tokens).
Hence for any two cuts ``x < y`` of S, ``ids(S)[t(x):t(y)] == encode(S[x:y])``, where t(c) is
the number of IDs of ``S[:c]``.

A session keeps *anchors*: cuts of its stored text ``old`` with their token indices, recorded
where the session already cut (the grid of an encode, the seams of earlier continuations), never
derived from lengths. For a new text, the plan writes ``new`` as consecutive pieces whose
boundaries are cuts of ``new`` (checked on ``new``; a cut of ``old`` proves nothing about
``new`` near a change):

* a *reused* piece ``new[y0:y1] == old[x0:x1]`` (compared character by character) whose ends
  x0, x1 are cuts of ``old``; its IDs are ``ids(old)[t(x0):t(x1)]`` by the fact above. When an
  end is not an anchor, its token index is the nearest anchor's, moved by the IDs of the old
  text between them (itself a piece between two cuts of ``old``); those IDs must equal the
  stored ones there (defence in depth: otherwise the plan fails and the text is encoded whole);
* a *fresh* piece, encoded now (itself split at cuts of ``new``: the anchor grid).

So ``ids(new)`` is the concatenation of the pieces' IDs: exact by the same argument as chunking.
Nothing is guessed: when no such seams are found the text is encoded whole.

Where the pieces come from: the common prefix of ``old`` and ``new`` (memory-speed compare),
then stretches of ``old`` after the first difference that reappear in ``new``
(:func:`dtok_ext.align.match_runs`, a probe every ``spacing / 2`` characters, a bounded
search); everything in
between (the changed regions, short windows around the seams, the appended text) is fresh. A
pure append is the special case with one reused piece, the prefix up to a cut at or before the
end of ``old``.

New anchors: the seams, the grid cuts of the fresh pieces, and the anchors of ``old`` inside a
reused stretch that lie at least ``CutRules.context`` characters from both ends of the stretch
(the verdict at such a position reads only characters equal in both texts, so it is the same in
``new``), thinned to about one per ``spacing / 2`` characters.
"""
from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from typing import Callable, NamedTuple, Protocol, Sequence

from dtok.chunking import split_at
from dtok_ext.align import common_prefix, match_runs
from dtok_ext.buffers import equal_ids
from dtok_ext.cuts import AnchorWriter, nearest_anchor

PROBE_WIDTH = 32  # characters of old text that identify an anchored stretch in the new text


class Anchors:
    """Cuts of a stored text with their token indices (IDs without post-processing), ascending;
    the first is (0, 0) and the last (len(text), number of IDs)."""

    __slots__ = ("offsets", "tokens")

    def __init__(self, offsets: Sequence[int] = (0,), tokens: Sequence[int] = (0,)) -> None:
        self.offsets = array("q", offsets)
        self.tokens = array("q", tokens)

    def __len__(self) -> int:
        return len(self.offsets)

    @property
    def nbytes(self) -> int:
        return 8 * (len(self.offsets) + len(self.tokens))

    def nearest(self, pos: int) -> int:
        """Index of the anchor nearest to pos."""
        return nearest_anchor(self.offsets, pos)

    @classmethod
    def written(cls, out: AnchorWriter) -> "Anchors":
        """The anchors an :class:`~dtok_ext.cuts.AnchorWriter` finished: its arrays as they
        are, not copies."""
        anchors = cls.__new__(cls)
        anchors.offsets, anchors.tokens = out.offsets, out.tokens
        return anchors

    def between(self, lo: int, hi: int) -> tuple[int, int]:
        """Index range of the anchors with lo <= offset <= hi."""
        return bisect_left(self.offsets, lo), bisect_right(self.offsets, hi)

    def __repr__(self) -> str:
        return f"<Anchors {len(self)}: {list(zip(self.offsets[:6], self.tokens[:6]))}...>"


class Seam:
    """The token index of a cut x of the old text: an anchor's token index, moved by the IDs of
    the old text between the anchor and x (texts[snippet]; -1: x is the anchor)."""

    __slots__ = ("anchor_token", "snippet", "forward")

    def __init__(self, anchor_token: int, snippet: int = -1, forward: bool = True) -> None:
        self.anchor_token = anchor_token
        self.snippet = snippet
        self.forward = forward


class Reuse:
    """A stretch of the new text whose IDs are the old text's between two seams."""

    __slots__ = ("new_start", "new_end", "old_start", "old_end", "start", "end", "equal")

    def __init__(self, new_start: int, new_end: int, old_start: int, old_end: int, start: Seam,
                 end: Seam, equal: tuple[int, int, int]) -> None:
        self.new_start = new_start
        self.new_end = new_end
        self.old_start = old_start
        self.old_end = old_end
        self.start = start
        self.end = end
        self.equal = equal  # the whole equal stretch (old_start, old_end, new_start)


class Fresh:
    """A stretch of the new text to encode, cut on the anchor grid."""

    __slots__ = ("new_start", "new_end", "cuts", "first_text")

    def __init__(self, new_start: int, new_end: int, cuts: list[int], first_text: int) -> None:
        self.new_start = new_start
        self.new_end = new_end
        self.cuts = cuts  # grid cuts inside (offsets in the new text)
        self.first_text = first_text  # texts[first_text : first_text + len(cuts) + 1]: its pieces


class Plan:
    """How to build the IDs of ``new``: ops in text order and the texts to encode."""

    __slots__ = ("kind", "old_len", "new_len", "ops", "texts", "prefix_len", "work")

    def __init__(self, kind: str, old_len: int, new_len: int, ops: list | None = None,
                 texts: list[str] | None = None, prefix_len: int = 0, work: int = 0) -> None:
        self.kind = kind  # "hit", "append", "edit", "encode"
        self.old_len = old_len
        self.new_len = new_len
        self.ops = [] if ops is None else ops
        self.texts = [] if texts is None else texts
        self.prefix_len = prefix_len  # common prefix of old and new
        self.work = work  # alignment work (characters)

    @property
    def reused(self) -> list[Reuse]:
        return [op for op in self.ops if isinstance(op, Reuse)]

    @property
    def in_place(self) -> bool:
        """Only the IDs after a kept prefix change (the stored buffer can be spliced)."""
        return all(isinstance(op, Fresh) for op in self.ops[1:]) and bool(self.ops) \
            and isinstance(self.ops[0], Reuse) and self.ops[0].old_start == 0

    @property
    def reused_chars(self) -> int:
        """Characters of the new text whose IDs are reused (:meth:`describe`'s count)."""
        return sum(op.new_end - op.new_start for op in self.ops if isinstance(op, Reuse))

    @property
    def encode_chars(self) -> int:
        """Characters the plan encodes (fresh text and the old text re-encoded at seams)."""
        return sum(map(len, self.texts))

    def describe(self) -> dict:
        """Seams, reused stretches and fresh characters, for ``explain``."""
        reused = [(op.new_start, op.new_end, op.old_start, op.old_end) for op in self.reused]
        fresh = [(op.new_start, op.new_end) for op in self.ops if isinstance(op, Fresh)]
        seams = sorted({op.new_start for op in self.ops if op.new_start} |
                       {op.new_end for op in self.ops if op.new_end < self.new_len})
        return {"seams": seams, "reused": reused, "fresh": fresh,
                "fresh_chars": sum(b - a for a, b in fresh),
                "reused_chars": self.reused_chars,
                "old_text_reencoded": sum(len(t) for t in self.texts)
                - sum(b - a for a, b in fresh), "common_prefix": self.prefix_len,
                "alignment_work": self.work}


class CutRulesLike(Protocol):
    context: int

    def seam(self, old: str, old_pos: int, new: str, new_pos: int, count: int,
             direction: int) -> int: ...

    def grid(self, text: str, start: int, end: int, spacing: int, budget: int) -> list[int]: ...

    def append_pieces(self, old: str, offsets: array, new: str, scan_budget: int, spacing: int
                      ) -> tuple[int, int, list[int], list[str]] | None: ...


class PlanKnobs(NamedTuple):
    scan_budget: int  # how far a seam may move from where the texts stop agreeing
    spacing: int  # anchor grid spacing (characters)
    edit_budget: int  # characters of alignment work before the search stops


def plan_text(rules: CutRulesLike, old: str | None, anchors: Anchors | None, new: str,
              knobs: PlanKnobs, chunk_cuts: Callable[[str], list[int]],
              prefix: int | None = None) -> Plan:
    """The plan that brings the stored ``old`` (None: nothing stored) to ``new``: a
    continuation when something can be reused, else a full encode cut where the stateless route
    cuts (``chunk_cuts``: its chunk planner), whose cuts become the first anchors. ``prefix``:
    as for :func:`plan_continuation`."""
    if old is not None:
        plan = plan_continuation(rules, old, anchors, new, knobs, prefix)
        if plan.kind != "encode":
            return plan
    # The grid inside each chunk: anchors every ``spacing`` characters from the first turn on,
    # so that a later edit re-encodes at most about that much old text to place each seam.
    chunks = [0, *chunk_cuts(new), len(new)]
    cuts: list[int] = []
    for a, b in zip(chunks, chunks[1:]):
        if a:
            cuts.append(a)
        cuts += rules.grid(new, a, b, knobs.spacing, knobs.scan_budget)
    plan = Plan("encode", 0, len(new))
    plan.ops.append(Fresh(0, len(new), cuts, 0))
    plan.texts.extend(split_at(new, cuts))
    return plan


def plan_continuation(rules: CutRulesLike, old: str, anchors: Anchors | None, new: str,
                      knobs: PlanKnobs, prefix: int | None = None) -> Plan:
    """The plan that brings ``old`` (with ``anchors``) to ``new``; kind "encode" (and no ops)
    when nothing can be reused. ``prefix``: their common prefix, where the caller compared them
    already."""
    m, n = len(old), len(new)
    p = common_prefix(old, new) if prefix is None else prefix
    if p == m == n:
        return Plan("hit", m, n, prefix_len=p)
    runs = [(0, p, 0)] if p else []
    work = p
    if p < m and p < n:
        probes = range(p, m - PROBE_WIDTH + 1, max(PROBE_WIDTH, knobs.spacing // 2))
        found, w = match_runs(old, new, p, p, probes, PROBE_WIDTH, knobs.edit_budget)
        runs += [r for r in found if r[1] - r[0] >= knobs.spacing // 2]
        work += w
    plan = Plan("append" if p == m else "edit", m, n, prefix_len=p, work=work)
    pos = 0  # new text placed so far
    for x0, x1, y0 in runs:
        length = x1 - x0
        d0 = rules.seam(old, x0, new, y0, min(length, knobs.scan_budget), 1)
        if d0 < 0:
            continue
        d1 = rules.seam(old, x1, new, y0 + length, min(length - d0, knobs.scan_budget), -1)
        if d1 < 0 or length - d0 - d1 <= 0 or y0 + d0 < pos:
            continue
        if y0 + d0 > pos:
            _add_fresh(plan, rules, new, pos, y0 + d0, knobs)
        plan.ops.append(Reuse(y0 + d0, y0 + length - d1, x0 + d0, x1 - d1,
                              _seam(plan, old, anchors, x0 + d0),
                              _seam(plan, old, anchors, x1 - d1), (x0, x1, y0)))
        pos = y0 + length - d1
    if not plan.reused:
        return Plan("encode", m, n, prefix_len=p, work=work)
    if pos < n:
        _add_fresh(plan, rules, new, pos, n, knobs)
    return plan


def _seam(plan: Plan, old: str, anchors: Anchors | None, x: int) -> Seam:
    if anchors is None:  # stored text comes with its anchors: a caller's error
        raise ValueError("a continuation of stored text needs its anchors")
    i = anchors.nearest(x)
    a, t = int(anchors.offsets[i]), int(anchors.tokens[i])
    if a == x:
        return Seam(t)
    plan.texts.append(old[a:x] if a < x else old[x:a])
    return Seam(t, len(plan.texts) - 1, a < x)


def _add_fresh(plan: Plan, rules: CutRulesLike, text: str, start: int, end: int,
               knobs: PlanKnobs) -> None:
    cuts = rules.grid(text, start, end, knobs.spacing, knobs.scan_budget)
    plan.ops.append(Fresh(start, end, cuts, len(plan.texts)))
    plan.texts.extend(split_at(text, cuts, start, end))


# --- execution (in process, or in a pool worker) ------------------------------------------------


class Outcome:
    """What executing a plan gave: the first ``keep`` old IDs stay where they are; ``tail`` (int32
    buffers, maybe slices of the old IDs) follows them; ``counts`` are the IDs of each text."""

    __slots__ = ("keep", "tail", "resolved", "counts")

    def __init__(self, keep: int, tail: list, resolved: list[tuple[int, int]],
                 counts: list[int]) -> None:
        self.keep = keep
        self.tail = tail
        self.resolved = resolved  # per Reuse op: its old token range
        self.counts = counts

    @property
    def n_body(self) -> int:
        return self.keep + sum(len(p) for p in self.tail)


class PlanFailed(RuntimeError):
    """The stored IDs do not hold what the anchors say (never expected; the text is encoded
    whole instead)."""


def seam_token(old_body, anchor_token: int, forward: bool, snippet: list, count: int) -> int:
    """The token index of a seam placed from an anchor: the old text between them re-encoded
    (``snippet``, ``count`` IDs) must be the stored IDs after the anchor (``forward``) or
    before it; PlanFailed where they are not."""
    lo = anchor_token if forward else anchor_token - count
    if lo < 0 or not equal_ids(old_body, lo, snippet):
        raise PlanFailed("the stored IDs do not end with the re-encoded old text")
    return lo + count if forward else lo


def execute(plan: Plan, encode_texts: Callable[[list[str]], list[list]], old_body) -> Outcome:
    """Encode the plan's texts in one call and assemble the new IDs. ``old_body`` is an int32
    buffer of the stored IDs without post-processing (unused when nothing is reused)."""
    encoded = encode_texts(plan.texts) if plan.texts else []
    counts = [sum(len(p) for p in parts) for parts in encoded]

    def token(seam: Seam) -> int:
        if seam.snippet < 0:
            return seam.anchor_token
        return seam_token(old_body, seam.anchor_token, seam.forward, encoded[seam.snippet],
                          counts[seam.snippet])

    keep, tail, resolved = 0, [], []
    for i, op in enumerate(plan.ops):
        if isinstance(op, Reuse):
            t0, t1 = token(op.start), token(op.end)
            if t1 < t0:
                raise PlanFailed("a reused stretch has negative length")
            resolved.append((t0, t1))
            if i == 0 and t0 == 0:
                keep = t1
            else:
                tail.append(memoryview(old_body)[t0:t1])
        else:
            for parts in encoded[op.first_text : op.first_text + len(op.cuts) + 1]:
                tail.extend(parts)
    return Outcome(keep, tail, resolved, counts)


def next_anchors(plan: Plan, resolved: Sequence[tuple[int, int]], counts: Sequence[int],
                 old: Anchors, margin: int, spacing: int) -> Anchors:
    """The anchors of the new text (see the module docstring), about one per ``spacing / 2``
    characters: an anchor closer than that to the one kept before it is dropped. ``resolved``
    and ``counts`` are what executing the plan gave (:class:`Outcome`; a pool worker reports
    them)."""
    out = AnchorWriter(spacing)
    gap, offsets, add = out.gap, out.offsets, out.add
    t = 0  # token index in the new IDs
    reuse = iter(resolved)
    for op in plan.ops:
        add(op.new_start, t)
        if isinstance(op, Reuse):
            t0, t1 = next(reuse)
            x0, x1, y0 = op.equal
            lo = x0 + (0 if x0 == 0 and y0 == 0 else margin)
            hi = x1 - (0 if x1 == plan.old_len and y0 + x1 - x0 == plan.new_len else margin)
            shift_o, shift_t = op.new_start - op.old_start, t - t0
            i, j = old.between(max(lo, op.old_start, offsets[-1] + gap - shift_o),
                               min(hi, op.old_end))
            if shift_o == 0 and shift_t == 0:  # a kept prefix: its anchors as they are
                out.keep(old.offsets, old.tokens, i, j)
            else:
                for k in range(i, j):
                    add(old.offsets[k] + shift_o, old.tokens[k] + shift_t)
            t += t1 - t0
        else:
            ids = counts[op.first_text : op.first_text + len(op.cuts) + 1]
            for cut, c in zip(op.cuts, ids):
                t += c
                add(cut, t)
            t += ids[-1]
        add(op.new_end, t)
    out.finish(plan.new_len, t)
    return Anchors.written(out)


# --- a pure append in one pass -----------------------------------------------------------------


class Appended(NamedTuple):
    """What :func:`continue_append` gave: the first ``keep`` stored IDs stay, ``tail`` follows
    them; ``reused`` characters of the old text kept their IDs."""

    keep: int
    tail: list
    anchors: Anchors
    reused: int


def continue_append(rules: CutRulesLike, old: str, anchors: Anchors, new: str,
                    knobs: PlanKnobs, encode_texts: Callable[[list[str]], list[list]],
                    old_body) -> Appended | None:
    """A session's usual next turn, ``new`` = ``old`` + more text (the caller checked that
    ``new`` starts with ``old``), planned, executed and anchored in one pass: the IDs and
    anchors :func:`plan_continuation`, :func:`execute` and :func:`next_anchors` give for it,
    without their objects (a cold turn paid for each of them). None where no seam is found (the
    general path then decides)."""
    found = rules.append_pieces(old, anchors.offsets, new, knobs.scan_budget, knobs.spacing)
    if found is None:
        return None
    x, i, cuts, texts = found  # the seam: a cut of both texts, IDs before it kept
    a, t = anchors.offsets[i], anchors.tokens[i]
    encoded = encode_texts(texts)
    if a != x:  # texts[0]: the old text between the anchor and the seam, to place its token
        snippet = encoded.pop(0)
        t = seam_token(old_body, t, a < x, snippet, sum(len(p) for p in snippet))
    keep = t
    # next_anchors for this plan: the kept prefix's anchors as they are, then the fresh grid's
    out = AnchorWriter(knobs.spacing)
    out.keep_prefix(anchors.offsets, anchors.tokens, min(len(old) - rules.context, x))
    tail, t = out.fresh(x, t, cuts, encoded, len(new))
    out.finish(len(new), t)
    return Appended(keep, tail, Anchors.written(out), x)


# --- the planner the session store and the pool share ------------------------------------------

class Planner:
    """Plans continuations and the anchors they leave, under one tokenizer's cut rules and
    knobs: built by the tokenizer, used by its session store and by a pool alike (the front end
    plans; the store or a pool worker executes).

    >>> import dtok
    >>> tok = dtok.Tokenizer.default()
    >>> old = "Hello there. " * 400
    >>> first = tok.planning.plan(None, None, old)  # nothing stored: encode it all
    >>> done = execute(first, tok.planning.encode_texts, None)
    >>> anchors = tok.planning.anchors_after(first, done.resolved, done.counts, None)
    >>> tok.planning.plan(old, anchors, old + "More text").kind
    'append'
    """

    def __init__(self, rules: CutRulesLike | None, knobs: PlanKnobs,
                 chunk_cuts: Callable[[str], list[int]]) -> None:
        self._rules = rules  # None: a file not admitted, which the reference encodes whole
        self.knobs = knobs
        self._chunk_cuts = chunk_cuts  # the stateless route's cuts: a first encode's chunks

    def plan(self, old: str | None, anchors: Anchors | None, text: str,
             edit_budget: int | None = None, prefix: int | None = None) -> Plan:
        """The plan that brings ``old`` (with its ``anchors``; None: nothing stored) to
        ``text``; ``edit_budget`` caps the alignment work below the knob's (a plan that finds
        less to reuse is as exact, only longer to execute); ``prefix``: their common prefix,
        where the caller compared them already."""
        knobs = self.knobs if edit_budget is None or edit_budget >= self.knobs.edit_budget \
            else self.knobs._replace(edit_budget=edit_budget)
        return plan_text(self.rules, old, anchors, text, knobs, self._chunk_cuts, prefix)

    def append(self, old: str, anchors: Anchors, text: str, encode_texts: Callable,
               old_body) -> Appended | None:
        """:func:`continue_append` under this planner's rules and knobs."""
        return continue_append(self.rules, old, anchors, text, self.knobs, encode_texts,
                               old_body)

    @property
    def rules(self) -> CutRulesLike:
        """The cut rules plans are made under."""
        if self._rules is None:
            raise ValueError("a file that is not admitted has no cut rules to plan under")
        return self._rules

    def anchors_after(self, plan: Plan, resolved: Sequence[tuple[int, int]],
                      counts: Sequence[int], old: Anchors | None) -> Anchors:
        """The anchors of the text ``plan`` produced (``old``: the stored text's anchors), from
        what executing it gave: each reused stretch's old token range and each text's ID
        count."""
        return next_anchors(plan, resolved, counts, old or Anchors(), self.rules.context,
                            self.knobs.spacing)
