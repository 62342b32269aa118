"""Session state: keep each transcript's text, IDs and anchors; bring them to the next text by
re-encoding only what changed (:mod:`dtok.repair` says why that is exact).

A keyed session serves every text sent with its key: the stored text equal → its IDs; the new
text extends it → a *repair* (the IDs up to a cut near the old end are kept, the tail
re-encoded); the new text edits it (a chat template dropped an earlier think block, an agent
truncated an old tool output) → an *edit* (the common prefix and every long stretch of the old
text that reappears are reused, the changed regions re-encoded); nothing reusable → a full
encode. The IDs live in an :class:`~dtok_ext.buffers.IdBuffer` with the post-processor's prefix
(e.g. BOS) in front and its suffix behind, so ``add_special_tokens=True/False`` are two views of
one buffer. A continuation rewrites the buffer in place only while no view of it is alive and
only its tail changes; otherwise it writes a new buffer, so views returned earlier never change.
Every view is taken before anyone else can reach the entry that owns it.

Requests without a key use *content lookup*: keyed fingerprints of the 64 characters before
each checkpoint (character offsets 4,096, 8,192, ... 65,536, then every 65,536, and each stored
text's end) choose the stored text that shares the longest prefix with the request: the one
whose end fingerprint matches (a whole prefix, the longest), else the most recently used of
those matching the deepest checkpoint. Computing them reads ~64 characters per checkpoint, not
the text, so a request that matches nothing stored costs microseconds. The choice is only a
guess: the continuation then compares the texts themselves (the common prefix, the reused
stretches) before anything is reused, so a fingerprint collision can waste work, never change
IDs.

*Scopes* keep tenants apart (``scope=``: e.g. a serving engine's ``cache_salt`` and model): a
keyed session is stored under ``(scope, key)`` (:func:`scoped_key`), so the same key in two
scopes names two sessions, and content lookup fingerprints a text with a key derived from its
scope, so a text is only ever continued from one stored under the same scope. Without the
latter, the time a request takes would tell its sender how much of another tenant's stored
text it shares.
"""
from __future__ import annotations

import itertools
import os
import sys
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Hashable

from dtok.digests import blake2b
from dtok.pieces import affixed_view
from dtok.repair import Anchors, Plan, Planner, execute
from dtok_ext.align import fingerprints
from dtok_ext.buffers import IdBuffer, IdList

if TYPE_CHECKING:
    from dtok.pieces import PieceEncoder

LOOKUP_MIN_CHARS = 4096  # shorter texts cost less to encode than to look up
# A request with a budget (``max_chars``) plans with at most this many characters of alignment
# work per character of its budget: comparing texts costs far less a character than encoding
# them, and a plan that stops early is as exact (it only reuses less)
ALIGNMENT_PER_BUDGET_CHAR = 16
# An event loop's default budget (``DTOK_LOOP_CHARS``): an answer that encodes this many
# characters (a session's next turn: its new text and the stretch back to a cut, a few
# thousand) costs ~0.1-0.3 ms on the fast encoder: less than an executor's hop there and back,
# which waits for the GIL (up to its 5 ms switch interval) and behind any long encode there.
LOOP_CHARS = 32768
LOOKUP_DENSE_UNTIL = 1 << 16  # checkpoints double up to here, then repeat at this spacing


def alignment_budget(chars: int) -> int:
    """The alignment work a plan may do for an answer whose budget is ``chars`` characters."""
    return chars * ALIGNMENT_PER_BUDGET_CHAR


def plan_fits(pieces: PieceEncoder, plan: Plan, chars: int) -> bool:
    """Whether a plan's encoding costs at most an answer's budget of ``chars`` characters
    (:meth:`PieceEncoder.work`)."""
    return pieces.work(plan.encode_chars) <= chars


def is_continuation(reused: int, stored: int) -> bool:
    """Content lookup's rule: a text that reuses at least half of a stored text's characters
    continues it (and replaces it); one that shares less is a fork (another conversation with
    the same start) and is kept beside it."""
    return 2 * reused >= stored


class KeptLists:
    """The lists ``encode_list`` handed out for one session, one per ``add_special_tokens``
    value, each brought up to date in O(changed IDs) (:class:`~dtok_ext.buffers.IdList`).

    Every result of the session, a view too, is noted with how many leading IDs (post-processor
    prefix included) it left unchanged: a list last brought up to date several requests ago is
    stale from the lowest of their change points, not only from the last one's. Sessions and
    the pool's sessions keep their lists this way."""

    __slots__ = ("_lists", "_keep")

    def __init__(self) -> None:
        self._lists: dict[bool, IdList] = {}
        self._keep: dict[bool, int] = {}  # leading IDs unchanged since each list's last update

    def note(self, keep: int) -> None:
        """A request left ``keep`` leading IDs of the session as they were."""
        for add_special in self._lists:
            self._keep[add_special] = min(self._keep.get(add_special, keep), keep)

    def get(self, add_special: bool, view: memoryview, n_prefix: int) -> list:
        """The list for ``add_special``, brought to ``view`` (after :meth:`note`). Releases the
        view."""
        lst = self._lists.get(add_special)
        if lst is None:
            lst = self._lists[add_special] = IdList()
        keep = self._keep.pop(add_special, 0)
        try:
            return lst.update(view, keep if add_special else max(0, keep - n_prefix))
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


def _headroom(n: int) -> int:
    """Spare capacity after a splice: appends rarely reallocate, and at most ~6% is unused."""
    return max(1024, n >> 4)


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
    stored text most likely shares the longest prefix with a new one. Items are any objects with
    ``end_key``, ``ckpt_keys`` (set by :meth:`add`) and ``used`` (a recency clock) attributes;
    the caller serializes access. In-process sessions and the pool's sessions both use it."""

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
        if item.end_key is not None and self._by_end.get(item.end_key) is item:
            del self._by_end[item.end_key]
        for k in item.ckpt_keys:
            s = self._by_ckpt.get(k)
            if s is not None:
                s.discard(item)
                if not s:
                    del self._by_ckpt[k]
        item.end_key, item.ckpt_keys = None, ()


class Entry:
    """One stored transcript: its text, IDs (prefix + body + suffix), anchors and lock."""

    __slots__ = ("key", "text", "buf", "anchors", "lock", "nbytes", "evicted", "used",
                 "unchanged", "lists", "spare", "spare_valid", "end_key", "ckpt_keys")

    def __init__(self, key: Hashable | None) -> None:
        self.key = key
        self.text: str | None = None
        self.buf: IdBuffer | None = None
        self.anchors: Anchors | None = None
        self.lock = threading.Lock()
        self.nbytes = 0  # accounted bytes: text object + ID buffer capacity + anchors
        self.evicted = False
        self.used = 0  # store clock at last use (content lookup prefers the most recent)
        self.unchanged = 0  # leading IDs (prefix included) the last request left as they were
        self.lists = KeptLists()  # what encode_list handed out
        # The buffer that was current before the last copy on write (a caller held a view of
        # it), kept for the next one: its first ``spare_valid`` IDs still equal ``buf``'s.
        self.spare: IdBuffer | None = None
        self.spare_valid = 0
        self.end_key: tuple[int, int] | None = None  # content entries: (length, fingerprint)
        self.ckpt_keys: tuple[tuple[int, int], ...] = ()


class SessionStore:
    """Keyed sessions and the content-lookup index of one tokenizer.

    Bounded by ``max_sessions`` keyed entries, ``lookup_entries`` content entries (oldest
    dropped first) and ``session_bytes`` of text, IDs and anchors in all (least recently used
    dropped first). Eviction never disturbs a request in flight: it keeps its entry until it
    returns.
    """

    def __init__(self, pieces: "PieceEncoder", planner: Planner, *, max_sessions: int,
                 session_bytes: int, lookup_entries: int, content_lookup: bool) -> None:
        self._pieces = pieces
        self.planner = planner
        self.max_sessions = max_sessions
        self.session_bytes = session_bytes
        self.lookup_entries = lookup_entries
        self.content_lookup = content_lookup
        self._lock = threading.Lock()
        self._keyed: dict[Hashable, Entry] = {}
        self._lru: OrderedDict[Entry, None] = OrderedDict()  # all entries, oldest use first
        self._content: OrderedDict[Entry, None] = OrderedDict()  # content entries, oldest first
        self._index = ContentIndex()
        self._clock = itertools.count(1)
        self._bytes = 0
        self._counts = dict(hits=0, repairs=0, edits=0, full_encodes=0, fallbacks=0,
                            evictions=0, lookups=0, lookup_hits=0)
        self._after_publish = None  # private test hook: called with each newly visible entry

    # --- public surface -------------------------------------------------------------------

    def __len__(self) -> int:
        with self._lock:
            return len(self._lru)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._keyed

    def drop(self, key: Hashable) -> bool:
        """Forget a keyed session; True if it was stored."""
        with self._lock:
            entry = self._keyed.get(key)
            if entry is None:
                return False
            self._remove(entry)
            return True

    def clear(self) -> None:
        """Forget every session and content entry."""
        with self._lock:
            for entry in list(self._lru):
                self._remove(entry)

    def stats(self) -> dict[str, int]:
        """Entries, bytes held, and what the requests did: ``repairs`` (the text extended the
        stored one), ``edits`` (IDs reused across a change that is not an append),
        ``full_encodes``, ``fallbacks`` (a continuation that could not be proven: encoded
        whole); ``lists_made``: lists for ``encode_list`` built whole (the others were updated
        in O(changed IDs)) by the sessions held now; ``bytes``: what ``session_bytes`` bounds
        (text, IDs, spares, anchors and lists)."""
        with self._lock:
            live = [e for e in self._lru if e.text is not None]
            return {"entries": len(self._lru), "keyed": len(self._keyed),
                    "content": len(self._content),
                    "text_bytes": sum(sys.getsizeof(e.text) for e in live),
                    "id_bytes": sum(e.buf.nbytes for e in live if e.buf is not None),
                    "anchor_bytes": sum(e.anchors.nbytes for e in live if e.anchors is not None),
                    "lists_made": sum(e.lists.made for e in live),
                    "bytes": self._bytes, **self._counts}

    def describe(self) -> dict[str, Any]:
        k = self.planner.knobs
        return {"max_sessions": self.max_sessions, "session_bytes": self.session_bytes,
                "lookup_entries": self.lookup_entries, "content_lookup": self.content_lookup,
                "anchor_spacing": k.spacing, "edit_budget": k.edit_budget}

    # --- requests -------------------------------------------------------------------------

    def encode_keyed(self, text: str, key: Hashable, add_special_tokens: bool,
                     as_list: bool = False, max_chars: int | None = None
                     ) -> memoryview | list | None:
        """The IDs of ``text`` continued from the session ``key`` (a view, or with ``as_list`` a
        list kept up to date in O(changed IDs): :class:`~dtok_ext.buffers.IdList`).
        ``max_chars``: only if that costs at most this much encoding (:meth:`PieceEncoder.work`)
        and the session is not busy with another request; else None, and nothing changed."""
        with self._lock:
            entry = self._keyed.get(key)
            if entry is None:
                if max_chars is not None and self._pieces.work(len(text)) > max_chars:
                    return None  # a first turn: the whole text to encode
                entry = Entry(key)
                self._keyed[key] = entry
                self._lru[entry] = None
        if not entry.lock.acquire(blocking=max_chars is None):
            return None
        try:
            if self._serve(entry, text, max_chars=max_chars) is None:
                return None
            return self._result(entry, add_special_tokens, as_list)
        finally:
            entry.lock.release()
            with self._lock:
                self._account(entry)

    def encode_lookup(self, text: str, add_special_tokens: bool, as_list: bool = False,
                      scope: Hashable | None = None, max_chars: int | None = None
                      ) -> memoryview | list | None:
        """Content lookup for a text of at least LOOKUP_MIN_CHARS characters: continue from the
        stored text of the same ``scope`` sharing the longest prefix, which the result replaces
        when it reused most of it. ``max_chars``: as for :meth:`encode_keyed`."""
        with self._lock:
            found, keys = self._index.find(text, scope)
        entry = Entry(None)
        if found is not None:
            if not found.lock.acquire(blocking=max_chars is None):
                return None
            try:
                if found.text is not None and not found.evicted:
                    if found.text == text:
                        with self._lock:
                            self._counts["lookups"] += 1
                            self._counts["lookup_hits"] += 1
                            self._counts["hits"] += 1
                            if not found.evicted:
                                self._touch(found)
                        found.unchanged = len(found.buf)
                        return self._result(found, add_special_tokens, as_list)
                    entry.text, entry.buf, entry.anchors = found.text, found.buf, found.anchors
                    reused = self._serve(entry, text, borrowed=True, max_chars=max_chars)
                    if reused is None:
                        return None
                    self._count("lookups")
                    replace = is_continuation(reused, len(found.text))
                    if replace:
                        entry.lists = found.lists
                    result = self._result(entry, add_special_tokens, as_list)
                    self._publish(entry, keys, found, reused, replace)
                    return result
            finally:
                found.lock.release()
        if self._serve(entry, text, max_chars=max_chars) is None:
            return None
        self._count("lookups")
        result = self._result(entry, add_special_tokens, as_list)
        self._publish(entry, keys)
        return result

    def explain(self, text: str, key: Hashable | None,
                scope: Hashable | None = None) -> dict[str, Any]:
        """What a request for ``text`` would do (with ``key``, or by content lookup), and why:
        a continuation's route, seams and reused stretches; only a ``session`` note when the text
        is encoded whole (by the stateless route, whose plan the caller explains). Changes no
        state."""
        if key is not None:
            with self._lock:
                entry = self._keyed.get(key)
            source = "session"
        else:
            if not self.content_lookup or len(text) < LOOKUP_MIN_CHARS:
                return {}
            with self._lock:
                entry = self._index.find(text, scope)[0]
            source = "content lookup"
        old = entry.text if entry is not None else None
        if old is None:
            return {} if key is None else {"session": f"no stored text for this {source}"}
        plan = self.planner.plan(old, entry.anchors, text)
        if plan.kind == "encode":
            return {"session": f"{source}: nothing of the stored text can be reused"}
        route = {"hit": "session hit", "append": "session repair", "edit": "session edit"}[plan.kind]
        why = {"hit": "same text as stored",
               "append": "the new text extends the stored one",
               "edit": f"the texts first differ at {plan.prefix_len} of {len(old)} stored "
                       "characters; reusing the stretches found again"}[plan.kind]
        desc = plan.describe()
        return {"route": route, "why": f"{source}: {why}", "cuts": desc["seams"], **desc}

    # --- the work -------------------------------------------------------------------------

    def _serve(self, entry: Entry, text: str, borrowed: bool = False,
               max_chars: int | None = None) -> int | None:
        """Bring the entry to `text` (caller holds its lock); returns how many characters of the
        stored text were reused. ``borrowed``: the entry's buffer belongs to a content-lookup
        entry that this one replaces only if it reuses most of it; otherwise the buffer is never
        spliced in place (the stored entry keeps its IDs). ``max_chars``: None, and the entry
        untouched, where the plan would encode more than that (:meth:`PieceEncoder.work`)."""
        if max_chars is None:
            plan = self.planner.plan(entry.text, entry.anchors, text)
        elif entry.text is None and self._pieces.work(len(text)) > max_chars:
            return None  # nothing stored: the whole text to encode (not even planned)
        else:
            plan = self.planner.plan(entry.text, entry.anchors, text,
                                     edit_budget=alignment_budget(max_chars))
            if not plan_fits(self._pieces, plan, max_chars):
                return None
        kind = {"hit": "hits", "append": "repairs", "edit": "edits",
                "encode": "full_encodes"}[plan.kind]
        reused = len(text) if plan.kind == "hit" else plan.describe()["reused_chars"]
        entry.unchanged = len(entry.buf) if plan.kind == "hit" else 0
        if plan.kind != "hit":
            in_place = not borrowed or is_continuation(reused, len(entry.text))
            try:
                self._apply(entry, plan, text, in_place)
            except Exception:  # noqa: BLE001 - the stateless route decides (and raises)
                # A continuation that failed (an encoder error, a failed check) is encoded whole
                # by the stateless route: the reference's IDs, or the reference's exception.
                if plan.kind != "encode":
                    kind = "fallbacks"
                reused = 0
                entry.buf = self._pieces.encode_whole(text, _headroom(len(text) // 3))
                entry.spare = None
                n_body = len(entry.buf) - len(self._pieces.prefix) - len(self._pieces.suffix)
                entry.anchors = Anchors((0, len(text)), (0, n_body)) if text else Anchors()
                entry.text = text
        self._count(kind)
        return reused

    def _apply(self, entry: Entry, plan: Plan, text: str, in_place: bool = True) -> None:
        b = self._pieces
        p, s = len(b.prefix), len(b.suffix)
        old_body = entry.buf.view(p, len(entry.buf) - s) if entry.buf is not None else None
        outcome = execute(plan, b.encode_texts, old_body)
        anchors = self.planner.anchors_after(plan, outcome.resolved, outcome.counts,
                                             entry.anchors)
        total = p + outcome.n_body + s
        if entry.buf is None or plan.kind == "encode":
            buf = IdBuffer.concat(outcome.tail, b.prefix, b.suffix, _headroom(total // 3))
            entry.spare = None
        else:
            buf = self._splice(entry, old_body, p + outcome.keep, outcome.tail, in_place,
                               _headroom(total))
        outcome.tail.clear()
        entry.buf, entry.text, entry.anchors = buf, text, anchors
        entry.unchanged = 0 if plan.kind == "encode" else p + outcome.keep

    def _splice(self, entry: Entry, old_body: memoryview, keep: int, tail: list,
                in_place: bool, headroom: int) -> IdBuffer:
        """``entry.buf[:keep] + tail + suffix`` where it costs least and no caller's view
        changes: in the buffer itself when no view of it is alive (the reused stretches in
        ``tail``, slices of it, copied out first); else in the spare when no view of that is
        alive (only what changed since it was current is copied); else in a new buffer, and
        the old one becomes the spare. ``in_place`` False (a borrowed buffer that stays its
        owner's): always a new buffer, nothing kept."""
        buf, suffix = entry.buf, self._pieces.suffix
        if not in_place:
            return buf.splice(keep, tail, suffix, headroom)  # old_body is alive: a copy
        if buf.exports == 1:  # only old_body: nobody else holds a view
            tail[:] = [IdBuffer.concat((t,)) if isinstance(t, memoryview) and t.obj is buf else t
                       for t in tail]
            old_body.release()
            if entry.spare is not None:
                entry.spare_valid = min(entry.spare_valid, keep)
            return buf.splice(keep, tail, suffix, headroom)
        spare = entry.spare
        if spare is not None and spare.exports == 0:
            out = buf.splice_into(spare, entry.spare_valid, keep, tail, suffix, headroom)
        else:
            out = buf.splice(keep, tail, suffix, headroom)  # a caller holds buf: a copy
        entry.spare, entry.spare_valid = buf, keep
        return out

    def _result(self, entry: Entry, add_special: bool, as_list: bool) -> memoryview | list:
        """The entry's IDs for the caller: a view, or its kept list (caller holds its lock)."""
        b = self._pieces
        view = affixed_view(entry.buf, add_special, len(b.prefix), len(b.suffix))
        entry.lists.note(entry.unchanged)
        if not as_list:
            return view
        return entry.lists.get(add_special, view, len(b.prefix))

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    # --- content index --------------------------------------------------------------------

    def _publish(self, entry: Entry, keys: tuple, found: Entry | None = None,
                 reused: int = 0, replace: bool = False) -> None:
        """Make a served content entry visible (its caller's view is already taken, so a
        request that continues from it while the caller returns copies on write)."""
        with self._lock:
            if reused:
                self._counts["lookup_hits"] += 1
            if replace and not found.evicted:
                self._remove(found)
            old = self._index.at_end(keys)
            if old is not None:
                self._remove(old)
            self._index.add(entry, keys)
            self._content[entry] = None
            self._lru[entry] = None
            self._account(entry)
        if self._after_publish is not None:
            self._after_publish(entry)

    # --- accounting and eviction (caller holds the store lock) ----------------------------

    def _touch(self, entry: Entry) -> None:
        entry.used = next(self._clock)
        self._lru.move_to_end(entry)

    def _account(self, entry: Entry) -> None:
        if entry.evicted or entry not in self._lru:
            return
        if entry.text is None:  # a keyed placeholder whose first request failed
            self._remove(entry)
            return
        size = (sys.getsizeof(entry.text) + (entry.buf.nbytes if entry.buf is not None else 0)
                + (entry.spare.nbytes if entry.spare is not None else 0)
                + (entry.anchors.nbytes if entry.anchors is not None else 0)
                + entry.lists.nbytes)
        self._bytes += size - entry.nbytes
        entry.nbytes = size
        self._touch(entry)
        self._evict()

    def _evict(self) -> None:
        while self._lru and (self._bytes > self.session_bytes
                             or len(self._keyed) > self.max_sessions
                             or len(self._content) > self.lookup_entries):
            if len(self._content) > self.lookup_entries:
                victim = next(iter(self._content))
            elif len(self._keyed) > self.max_sessions:
                victim = next(e for e in self._lru if e.key is not None)
            else:
                victim = next(iter(self._lru))
            self._remove(victim)
            self._counts["evictions"] += 1

    def _remove(self, entry: Entry) -> None:
        entry.evicted = True
        self._lru.pop(entry, None)
        self._bytes -= entry.nbytes
        entry.nbytes = 0
        if entry.key is not None and self._keyed.get(entry.key) is entry:
            del self._keyed[entry.key]
        if entry in self._content:
            del self._content[entry]
            self._index.remove(entry)
