"""What every session keeps, wherever its IDs live: the in-process store (:mod:`dtok.sessions`,
IDs in an :class:`~dtok_ext.buffers.IdBuffer`) and the pool's sessions
(:mod:`dtok.pool.shared_sessions`, IDs in a shared-memory segment) are both built on it.

* **The IDs and their copy-on-write spare** (:class:`SessionBuffers`): a session's next IDs are
  written into the buffer that holds them now only while no view of it is alive; otherwise into
  its *spare*, the buffer that was current before, when no view of that is alive (only the IDs
  that changed since it was current are copied); else into a fresh buffer. A buffer is any
  object with ``exports`` (views alive), ``capacity`` (ints) and a length, so the same rule
  serves memory the store allocates and segments the pool maps.
* **The growth rule** (:func:`capacity_for`): one for both, so ``session_bytes`` bounds the same
  thing in process and in the pool (docs/sessions.md, "Bounded memory").
* **Lookup**: keys inside a scope (:func:`scoped_key`) and content lookup by fingerprints
  (:class:`ContentIndex`).
* **Counters**: the names of what a request did (:data:`ROUTE_COUNTERS`).
* **Lists** kept up to date for ``encode_list`` (:class:`KeptLists`).

Content lookup: keyed fingerprints of the 64 characters before each checkpoint (character offsets
4,096, 8,192, ... 65,536, then every 65,536, and each stored text's end) choose the stored text
that shares the longest prefix with the request: the one whose end fingerprint matches (a whole
prefix, the longest), else the most recently used of those matching the deepest checkpoint.
Computing them reads ~64 characters per checkpoint, not the text, so a request that matches
nothing stored costs microseconds. The choice is only a guess: the continuation then compares the
texts themselves (the common prefix, the reused stretches) before anything is reused, so a
fingerprint collision can waste work, never change IDs.

*Scopes* keep tenants apart (``scope=``: e.g. a serving engine's ``cache_salt`` and model): a
keyed session is stored under ``(scope, key)`` (:func:`scoped_key`), so the same key in two
scopes names two sessions, and content lookup fingerprints a text with a key derived from its
scope, so a text is only ever continued from one stored under the same scope. Without the
latter, the time a request takes would tell its sender how much of another tenant's stored
text it shares.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Hashable

from dtok.digests import blake2b
from dtok.repair import Anchors
from dtok_ext.align import fingerprints
from dtok_ext.buffers import IdList

LOOKUP_MIN_CHARS = 4096  # shorter texts cost less to encode than to look up
LOOKUP_DENSE_UNTIL = 1 << 16  # checkpoints double up to here, then repeat at this spacing

#: The counter each plan kind adds to (``stats()``); the pool counts the same names with a
#: ``session_`` prefix beside its own counters.
ROUTE_COUNTERS = {"hit": "hits", "append": "repairs", "edit": "edits", "encode": "full_encodes"}


# --- the IDs: growth rule and copy-on-write spare ------------------------------------------

def room_for(n: int) -> int:
    """Spare capacity (ints) beside n IDs: appends rarely need a new buffer, and at most 1/16
    of a session's IDs is unused (the bound docs/sessions.md states)."""
    return max(1024, n >> 4)


def capacity_for(n: int) -> int:
    """The capacity (ints) a buffer for n IDs is made with."""
    return n + room_for(n)


IN_PLACE, SPARE, FRESH = "in place", "spare", "fresh"


class SessionBuffers:
    """A session's IDs: the buffer that holds them (``current``) and its copy-on-write
    ``spare``, whose first ``spare_valid`` IDs still equal the current ones.

    Buffers are any objects with ``exports`` (views alive), ``capacity`` (ints) and a length
    (the IDs they hold): the store's
    :class:`~dtok_ext.buffers.IdBuffer`, the pool's segments.

    >>> class Buf:
    ...     def __init__(self, capacity): self.capacity, self.exports = capacity, 0
    >>> held, a, b = SessionBuffers(), Buf(100), Buf(100)
    >>> held.replace(a, 0)                  # the first IDs: nothing to keep, no spare yet
    >>> a.exports = 1                      # a caller holds a view of them
    >>> held.where(50, may_write_in_place=True)
    'fresh'
    >>> held.replace(b, 40)                 # the next ones: a becomes the spare
    >>> a.exports = 0                      # the caller let go of it
    >>> b.exports = 1                      # and holds the newer one
    >>> held.where(50, may_write_in_place=True), held.spare is a, held.spare_valid
    ('spare', True, 40)
    """

    __slots__ = ("current", "spare", "spare_valid")

    def __init__(self) -> None:
        self.current: Any = None
        self.spare: Any = None
        self.spare_valid = 0

    def where(self, needed: int, may_write_in_place: bool, own_views: int = 0) -> str:
        """Where the next IDs (``needed`` ints; 0: the buffer grows where it is written) go:
        IN_PLACE when the plan allows it, no view of the current buffer is alive but the
        writer's own ``own_views`` and they fit; else SPARE when no view of it is alive and they
        fit; else FRESH."""
        cur, spare = self.current, self.spare
        if (may_write_in_place and cur is not None and cur.exports == own_views
                and needed <= cur.capacity):
            return IN_PLACE
        if spare is not None and spare.exports == 0 and needed <= spare.capacity:
            return SPARE
        return FRESH

    def take_spare(self) -> Any:
        """The spare, no longer kept (a writer that may not complete owns it meanwhile)."""
        spare, self.spare = self.spare, None
        return spare

    def written_in_place(self, keep: int) -> None:
        """The current buffer was rewritten after its first ``keep`` IDs: the spare shares at
        most those."""
        if self.spare is not None:
            self.spare_valid = min(self.spare_valid, keep)

    def replace(self, new: Any, keep: int) -> Any:
        """``new`` holds the IDs now, its first ``keep`` equal to the current buffer's, which
        becomes the spare. Returns the spare this one replaces (for the caller to release), or
        None."""
        old_spare = self.spare if self.spare is not new else None
        self.spare, self.spare_valid = self.current, keep
        self.current = new
        return old_spare

    def restart(self, new: Any) -> Any:
        """``new`` holds IDs that share nothing with the ones before: no spare. Returns the
        buffers let go of (current first), for the caller to release."""
        old = self.current, self.spare
        self.current, self.spare, self.spare_valid = new, None, 0
        return old


# --- what a session holds ------------------------------------------------------------------

class SessionState:
    """A session's text, IDs, anchors and lists, what it is indexed under for content lookup,
    and the bytes it is accounted for."""

    __slots__ = ("text", "buffers", "anchors", "lists", "nbytes", "used", "end_key", "ckpt_keys")
    # what an ID buffer is accounted for: its capacity where this process's heap holds it,
    # its IDs where shm_bytes bounds the segment's memory (the pool's sessions)
    ACCOUNT_CAPACITY = True

    def __init__(self) -> None:
        self.text: str | None = None
        self.buffers = SessionBuffers()
        self.anchors: Anchors | None = None
        self.lists = KeptLists()  # what encode_list handed out
        self.nbytes = 0  # accounted at its last request (held_bytes)
        self.used = 0  # its table's clock at last use (content lookup prefers the most recent)
        self.end_key: tuple[int, int] | None = None  # content lookup: (length, fingerprint)
        self.ckpt_keys: tuple[tuple[int, int], ...] = ()

    def recount(self) -> int:
        """Bring ``nbytes`` to what the session holds now; returns by how much it changed."""
        size = self.held_bytes()
        change, self.nbytes = size - self.nbytes, size
        return change

    def held_bytes(self) -> int:
        """Text, IDs (the current buffer's and the spare's), anchors and lists: what
        ``session_bytes`` bounds (an ID buffer as :attr:`ACCOUNT_CAPACITY` says)."""
        held, anchors = self.buffers, self.anchors
        size = (sys.getsizeof(self.text) if self.text is not None else 0) \
            + (anchors.nbytes if anchors is not None else 0) + self.lists.nbytes
        for buffer in (held.current, held.spare):
            if buffer is not None:
                size += 4 * (buffer.capacity if self.ACCOUNT_CAPACITY else len(buffer))
        return size


class KeptLists:
    """The lists ``encode_list`` handed out for one session, one per ``add_special_tokens``
    value, each brought up to date in O(changed IDs) (:class:`~dtok_ext.buffers.IdList`).

    Every result of the session, a view too, is noted with how many leading IDs (post-processor
    prefix included) it left unchanged: a list last brought up to date several requests ago is
    stale from the lowest of their change points, not only from the last one's."""

    __slots__ = ("_lists", "_keep")

    def __init__(self) -> None:
        self._lists: dict[bool, IdList] = {}
        self._keep: dict[bool, int] = {}  # leading IDs unchanged since each list's last update

    def note(self, keep: int) -> None:
        """A request left ``keep`` leading IDs of the session as they were."""
        for add_special_tokens in self._lists:
            self._keep[add_special_tokens] = min(self._keep.get(add_special_tokens, keep), keep)

    def get(self, add_special_tokens: bool, view: memoryview, n_prefix: int) -> list:
        """The list for ``add_special_tokens``, brought to ``view`` (after :meth:`note`).
        Releases the view."""
        lst = self._lists.get(add_special_tokens)
        if lst is None:
            lst = self._lists[add_special_tokens] = IdList()
        keep = self._keep.pop(add_special_tokens, 0)
        try:
            return lst.update(view, keep if add_special_tokens else max(0, keep - n_prefix))
        finally:
            view.release()

    def clear(self) -> None:
        self._lists.clear()
        self._keep.clear()

    @property
    def nbytes(self) -> int:
        return sum(lst.nbytes for lst in self._lists.values())

    @property
    def made(self) -> int:
        """Lists made whole (neither updated in place nor from a spare)."""
        return sum(lst.made for lst in self._lists.values())


# --- lookup --------------------------------------------------------------------------------

def is_continuation(reused: int, stored: int) -> bool:
    """Content lookup's rule: a text that reuses at least half of a stored text's characters
    continues it (and replaces it); one that shares less is a fork (another conversation with
    the same start) and is kept beside it."""
    return 2 * reused >= stored


def checkpoints(n: int) -> list[int]:
    """Content-lookup checkpoints strictly below n characters: 4096, 8192, ... 65536, then every
    65536 (dense enough that a text edited 30K characters before its end is still told apart
    from others sharing a shorter prefix)."""
    out, o = [], LOOKUP_MIN_CHARS
    while o < n:
        out.append(o)
        o = o << 1 if o < LOOKUP_DENSE_UNTIL else o + LOOKUP_DENSE_UNTIL
    return out


class ScopedKey:
    """A session key inside a scope: equal only to the same key in the same scope (never to a
    plain key or tuple a caller might pass)."""

    __slots__ = ("scope", "key")

    def __init__(self, scope: Hashable, key: Hashable) -> None:
        self.scope = scope
        self.key = key

    def __eq__(self, other: object) -> bool:
        return type(other) is ScopedKey and other.scope == self.scope and other.key == self.key

    def __hash__(self) -> int:
        return hash((ScopedKey, self.scope, self.key))

    def __repr__(self) -> str:
        return f"ScopedKey(scope={self.scope!r}, key={self.key!r})"


def scoped_key(key: Hashable, scope: Hashable | None) -> Hashable:
    """The key a session is stored under: ``key`` itself without a scope."""
    return key if scope is None else ScopedKey(scope, key)


class ContentIndex:
    """Stored texts by keyed fingerprints of their prefixes (see the module docstring): which
    stored text most likely shares the longest prefix with a new one. Items are
    :class:`SessionState` objects (``end_key`` and ``ckpt_keys`` set by :meth:`add`, ``used`` a
    recency clock); the caller serializes access."""

    def __init__(self) -> None:
        self._by_end: dict[tuple[int, int], Any] = {}
        self._by_ckpt: dict[tuple[int, int], set] = {}
        self._secret = os.urandom(16)
        self._key = int.from_bytes(self._secret[:8], "little")  # clients cannot aim for collisions

    def _scope_key(self, scope: Hashable | None) -> int:
        """The fingerprint key of a scope: texts of different scopes never share a key, so
        never match (repr: the scope's values, unambiguous for str, int, None and tuples)."""
        if scope is None:
            return self._key
        h = blake2b(repr(scope).encode("utf-8", "surrogatepass"), digest_size=8,
                            key=self._secret)
        return int.from_bytes(h.digest(), "little")

    def find(self, text: str, scope: Hashable | None = None) -> tuple[Any, tuple]:
        """(the best stored item or None, the keys of `text` for :meth:`add`): the item whose
        end fingerprint matches (a whole prefix, the longest), else the most recently used of
        those matching the deepest checkpoint; only items added with this ``scope``'s keys."""
        n = len(text)
        stops = checkpoints(n)
        fkey = self._scope_key(scope)
        fps = fingerprints(text, [*stops, n], fkey)
        ckpt_keys = tuple(zip(stops, fps))
        best = self._by_end.get((n, fps[-1]))  # the same text, or one equal at its end
        deepest: list = []
        for key in ckpt_keys:
            found = self._by_ckpt.get(key)
            if not found:
                break
            deepest = list(found)
        if best is None and deepest:
            ends = sorted({e.end_key[0] for e in deepest if e.end_key[0] < n}, reverse=True)
            for end, fp in zip(ends, fingerprints(text, ends, fkey)):
                best = next((e for e in deepest if e.end_key == (end, fp)), None)
                if best is not None:
                    break
            if best is None:
                best = max(deepest, key=lambda e: e.used)
        return best, ((n, fps[-1]), ckpt_keys)

    def at_end(self, keys: tuple):
        """The item indexed under the same end key (the same text, most likely), or None."""
        return self._by_end.get(keys[0])

    def add(self, item, keys: tuple) -> None:
        """Index `item` under the keys :meth:`find` gave for its text (the caller removes an item
        :meth:`at_end` found first)."""
        end_key, ckpt_keys = keys
        item.end_key, item.ckpt_keys = end_key, ckpt_keys
        self._by_end[end_key] = item
        for k in ckpt_keys:
            self._by_ckpt.setdefault(k, set()).add(item)

    def remove(self, item) -> None:
        end_key = item.end_key
        if end_key is not None and self._by_end.get(end_key) is item:
            del self._by_end[end_key]
        for k in item.ckpt_keys:
            s = self._by_ckpt.get(k)
            if s is not None:
                s.discard(item)
                if not s:
                    del self._by_ckpt[k]
        item.end_key, item.ckpt_keys = None, ()
