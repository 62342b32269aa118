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
only its tail changes; otherwise it writes another (the spare or a new one), so views returned
earlier never change.
Every view is taken before anyone else can reach the entry that owns it.

Requests without a key use *content lookup*, and keys live inside *scopes*; both, the copy-on-write
spare, the growth rule and the counters' names are the session core's, shared with the pool
(:mod:`dtok.session_core`).
"""
from __future__ import annotations

import itertools
import sys
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Hashable

from dtok import testing
from dtok.chunk_encoder import affixed_view
from dtok.repair import Anchors, Plan, Planner, execute
from dtok_ext.align import common_prefix
# scoped_key: the pool imports it from here too
from dtok.session_core import (IN_PLACE, LOOKUP_MIN_CHARS, ROUTE_COUNTERS, SPARE,  # noqa: F401
                               ContentIndex, SessionState, is_continuation, room_for,
                               scoped_key)
from dtok_ext.buffers import IdBuffer

if TYPE_CHECKING:
    from dtok.chunk_encoder import ChunkEncoder

# A request with a budget (``max_chars``) plans with at most this many characters of alignment
# work per character of its budget: comparing texts costs far less a character than encoding
# them, and a plan that stops early is as exact (it only reuses less)
ALIGNMENT_PER_BUDGET_CHAR = 16
# An event loop's default budget (``DTOK_LOOP_CHARS``): an answer that encodes this many
# characters (a session's next turn: its new text and the stretch back to a cut, a few
# thousand) costs ~0.1-0.3 ms on the fast encoder: less than an executor's hop there and back,
# which waits for the GIL (up to its 5 ms switch interval) and behind any long encode there.
LOOP_CHARS = 32768


def alignment_budget(chars: int) -> int:
    """The alignment work a plan may do for an answer whose budget is ``chars`` characters."""
    return chars * ALIGNMENT_PER_BUDGET_CHAR


def plan_fits(pieces: ChunkEncoder, plan: Plan, chars: int) -> bool:
    """Whether a plan's encoding costs at most an answer's budget of ``chars`` characters
    (:meth:`ChunkEncoder.encoding_cost`)."""
    return pieces.encoding_cost(plan.encode_chars) <= chars


class Entry(SessionState):
    """One stored transcript: the session core's state (IDs: prefix + body + suffix in an
    :class:`~dtok_ext.buffers.IdBuffer`), its key and lock."""

    __slots__ = ("key", "lock", "evicted", "unchanged", "route")

    def __init__(self, key: Hashable | None) -> None:
        super().__init__()
        self.key = key
        self.lock = threading.Lock()
        self.evicted = False
        self.unchanged = 0  # leading IDs (prefix included) the last request left as they were
        self.route: str | None = None  # the counter of what its last request did, not counted yet


class SessionStore:
    """Keyed sessions and the content-lookup index of one tokenizer.

    Bounded by ``max_sessions`` keyed entries, ``lookup_entries`` content entries (oldest
    dropped first) and ``session_bytes`` of text, IDs and anchors in all (least recently used
    dropped first). Eviction never disturbs a request in flight: it keeps its entry until it
    returns.
    """

    def __init__(self, pieces: "ChunkEncoder", planner: Planner, *, max_sessions: int,
                 session_bytes: int, lookup_entries: int, content_lookup: bool,
                 whole_below: int = 0) -> None:
        self._pieces = pieces
        self.whole_below = whole_below  # keyed texts shorter than this are encoded whole
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
        self._counts = dict.fromkeys([*ROUTE_COUNTERS.values(), "fallbacks", "evictions",
                                      "lookups", "lookup_hits"], 0)

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
                    "id_bytes": sum(e.buffers.current.nbytes for e in live
                                    if e.buffers.current is not None),
                    "anchor_bytes": sum(e.anchors.nbytes for e in live if e.anchors is not None),
                    "lists_made": sum(e.lists.made for e in live),
                    "bytes": self._bytes, **self._counts}

    def describe(self) -> dict[str, Any]:
        k = self.planner.knobs
        return {"max_sessions": self.max_sessions, "session_bytes": self.session_bytes,
                "lookup_entries": self.lookup_entries, "content_lookup": self.content_lookup,
                "session_whole_below": self.whole_below,
                "anchor_spacing": k.spacing, "edit_budget": k.edit_budget}

    # --- requests -------------------------------------------------------------------------

    def encode_keyed(self, text: str, key: Hashable, add_special_tokens: bool,
                     as_list: bool = False, max_chars: int | None = None
                     ) -> memoryview | list | None:
        """The IDs of ``text`` continued from the session ``key`` (a view, or with ``as_list`` a
        list kept up to date in O(changed IDs): :class:`~dtok_ext.buffers.IdList`).
        ``max_chars``: only if that costs at most this much encoding
        (:meth:`ChunkEncoder.encoding_cost`) and the session is not busy with another request;
        else None, and nothing changed."""
        # a stored session is found without the store's lock (one dict read); one evicted
        # meanwhile is served and not accounted, as when eviction comes after this read
        entry = self._keyed.get(key)
        if entry is None:
            with self._lock:
                entry = self._keyed.get(key)
                if entry is None:
                    if max_chars is not None and self._pieces.encoding_cost(len(text)) > max_chars:
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
            with self._lock:  # one hold of the store's lock: the route's counter, the bytes
                self._count_route(entry)
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
                        found.unchanged = len(found.buffers.current)
                        return self._result(found, add_special_tokens, as_list)
                    entry.text, entry.anchors = found.text, found.anchors
                    entry.buffers.current = found.buffers.current
                    reused = self._serve(entry, text, borrowed=True, max_chars=max_chars)
                    if reused is None:
                        return None
                    self._count("lookups", entry)
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
        self._count("lookups", entry)
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
        if key is not None and self._encodes_whole(old, text):
            return {"session": f"shorter than session_whole_below ({self.whole_below} "
                               "characters): encoded whole, kept for the next turn"}
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
        untouched, where the plan would encode more than that
        (:meth:`ChunkEncoder.encoding_cost`)."""
        old, prefix = entry.text, None
        if not borrowed and self._encodes_whole(old, text):
            # a short session: the stateless encode costs less than a continuation's work
            if max_chars is not None and self._pieces.encoding_cost(len(text)) > max_chars:
                return None
            return self._encode_instead(entry, text, "full_encodes")
        if old is not None and len(old) < len(text):
            prefix = common_prefix(old, text)
            # a pure append (a session's usual turn) takes the one-pass route; its encoding is
            # the appended text and at most two seam scans of old text
            if prefix == len(old) and (max_chars is None or self._pieces.encoding_cost(
                    len(text) - prefix + 2 * self.planner.knobs.scan_budget) <= max_chars):
                try:
                    reused = self._append(entry, text, borrowed)
                except Exception:  # noqa: BLE001 - the stateless route decides (and raises)
                    return self._encode_instead(entry, text, "fallbacks")
                if reused is not None:
                    entry.route = "repairs"
                    return reused
        if max_chars is None:
            plan = self.planner.plan(old, entry.anchors, text, prefix=prefix)
        elif old is None and self._pieces.encoding_cost(len(text)) > max_chars:
            return None  # nothing stored: the whole text to encode (not even planned)
        else:
            plan = self.planner.plan(old, entry.anchors, text,
                                     edit_budget=alignment_budget(max_chars), prefix=prefix)
            if not plan_fits(self._pieces, plan, max_chars):
                return None
        reused = len(text) if plan.kind == "hit" else plan.reused_chars
        entry.unchanged = len(entry.buffers.current) if plan.kind == "hit" else 0
        if plan.kind != "hit":
            in_place = not borrowed or is_continuation(reused, len(old))
            try:
                self._apply(entry, plan, text, in_place)
            except Exception:  # noqa: BLE001 - the stateless route decides (and raises)
                return self._encode_instead(
                    entry, text, "fallbacks" if plan.kind != "encode" else "full_encodes")
        entry.route = ROUTE_COUNTERS[plan.kind]
        return reused

    def _encodes_whole(self, old: str | None, text: str) -> bool:
        """A short session's turn (``session_whole_below``): the stateless encode costs less
        than a continuation's work."""
        return len(text) < self.whole_below and old != text

    def _encode_instead(self, entry: Entry, text: str, kind: str) -> int:
        """The text encoded whole by the stateless route (a short session's; a continuation
        that failed: an encoder error, a failed check): the reference's IDs, or the reference's
        exception; the session keeps it with two anchors, its ends. Returns 0: no characters
        reused."""
        # about 3 characters an ID: the room for the IDs not counted yet
        buf = self._pieces.encode_whole(text, room_for(len(text) // 3))
        entry.buffers.restart(buf)
        n_body = len(buf) - len(self._pieces.prefix) - len(self._pieces.suffix)
        entry.anchors = Anchors((0, len(text)), (0, n_body)) if text else Anchors()
        entry.text = text
        entry.unchanged = 0
        entry.route = kind
        return 0

    def _append(self, entry: Entry, text: str, borrowed: bool) -> int | None:
        """``text`` extends the stored text: :meth:`Planner.append` (None where it finds no
        seam: the general plan decides), its IDs spliced as :meth:`_apply` splices a plan's."""
        b = self._pieces
        p, s = len(b.prefix), len(b.suffix)
        buf = entry.buffers.current
        old_body = buf.view(p, len(buf) - s)
        done = self.planner.append(entry.text, entry.anchors, text, b.encode_texts, old_body)
        if done is None:
            old_body.release()
            return None
        in_place = not borrowed or is_continuation(done.reused, len(entry.text))
        total = p + done.keep + sum(map(len, done.tail)) + s
        self._splice(entry, old_body, p + done.keep, done.tail, in_place, room_for(total),
                     fresh=True)
        entry.text, entry.anchors = text, done.anchors
        entry.unchanged = p + done.keep
        return done.reused

    def _apply(self, entry: Entry, plan: Plan, text: str, in_place: bool = True) -> None:
        b = self._pieces
        p, s = len(b.prefix), len(b.suffix)
        old = entry.buffers.current
        old_body = old.view(p, len(old) - s) if old is not None else None
        outcome = execute(plan, b.encode_texts, old_body)
        anchors = self.planner.anchors_after(plan, outcome.resolved, outcome.counts,
                                             entry.anchors)
        total = p + outcome.n_body + s
        if old is None or plan.kind == "encode":
            entry.buffers.restart(IdBuffer.concat(outcome.tail, b.prefix, b.suffix,
                                                  room_for(total)))
        else:
            self._splice(entry, old_body, p + outcome.keep, outcome.tail, in_place,
                         room_for(total))
        outcome.tail.clear()
        entry.text, entry.anchors = text, anchors
        entry.unchanged = 0 if plan.kind == "encode" else p + outcome.keep

    def _splice(self, entry: Entry, old_body: memoryview, keep: int, tail: list,
                in_place: bool, headroom: int, fresh: bool = False) -> None:
        """Make the entry's IDs ``current[:keep] + tail + suffix`` where it costs least and no
        caller's view changes (:meth:`dtok.session_core.SessionBuffers.where`): in the buffer
        itself (the reused stretches in ``tail``, slices of it, copied out first), in the
        spare, or in a new buffer; the one before becomes the spare. ``in_place`` False (a borrowed buffer that stays its owner's): always a new buffer,
        nothing kept. ``fresh``: ``tail`` holds only newly encoded IDs (no slice of the
        buffer)."""
        held, suffix = entry.buffers, self._pieces.suffix
        buf = held.current
        if not in_place:
            held.restart(buf.splice(keep, tail, suffix, headroom))  # old_body is alive: a copy
            return
        # the IDs grow where they are written (needed 0); old_body is this writer's own view
        where = held.where(0, may_write_in_place=True, own_views=1)
        if where == IN_PLACE:
            if not fresh:
                tail[:] = [IdBuffer.concat((t,)) if isinstance(t, memoryview) and t.obj is buf
                           else t for t in tail]
            old_body.release()
            buf.splice(keep, tail, suffix, headroom)
            held.written_in_place(keep)
        elif where == SPARE:
            held.replace(buf.splice_into(held.spare, held.spare_valid, keep, tail, suffix,
                                        headroom), keep)
        else:
            held.replace(buf.splice(keep, tail, suffix, headroom), keep)  # a caller holds buf

    def _result(self, entry: Entry, add_special_tokens: bool, as_list: bool) -> memoryview | list:
        """The entry's IDs for the caller: a view, or its kept list (caller holds its lock)."""
        b = self._pieces
        view = affixed_view(entry.buffers.current, add_special_tokens, len(b.prefix), len(b.suffix))
        entry.lists.note(entry.unchanged)
        if not as_list:
            return view
        return entry.lists.get(add_special_tokens, view, len(b.prefix))

    def _count(self, name: str, entry: Entry | None = None) -> None:
        with self._lock:
            self._counts[name] += 1
            if entry is not None:
                self._count_route(entry)

    def _count_route(self, entry: Entry) -> None:
        """Count what the entry's last request did (caller holds the store lock)."""
        if entry.route is not None:
            self._counts[entry.route] += 1
            entry.route = None

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
        testing.run_hook(testing.AFTER_PUBLISH, entry)

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
        self._bytes += entry.recount()
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
