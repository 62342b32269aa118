"""Session state: keep each transcript's text and IDs, re-encode only a short tail per append.

Repair is a splice at a safe cut (``CutRules.repair_cut``): for ``new = old + append`` and the
latest position ``b <= len(old)`` that is a safe cut of both ``old`` and ``new``,

    ids(new) = ids(old)[: len(ids(old)) - len(enc(old[b:]))] + enc(new[b:])

exact by the same argument as chunking, with two short encodes. The IDs live in an
:class:`~dtok_ext.buffers.IdBuffer` with the post-processor's prefix (e.g. BOS) in front and its
suffix behind, so ``add_special_tokens=True/False`` are two views of one buffer. A splice rewrites
the tail in place only while no view of the buffer is alive; otherwise it writes a new buffer, so
views returned earlier never change.

Requests without a key use *content lookup*: the stored text that is the longest prefix of the
request is found by keyed BLAKE2b digests of prefixes (at the text's end and at byte offsets
doubling from 4,096, computed in one pass) and confirmed by comparing the texts before any reuse.
"""
from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Hashable

from dtok_ext.buffers import IdBuffer

if TYPE_CHECKING:
    from dtok.tokenizer import Tokenizer

LOOKUP_MIN_BYTES = 4096  # shorter texts cost less to encode than to look up
_DIGEST_SIZE = 16


def plan_repair(tok: "Tokenizer", text: str, old_len: int, n_ids: int,
                ends_with: Callable[[int, list], bool]) -> tuple[int, list] | None:
    """The repair of an append, for in-process sessions and pool workers alike.

    ``text[:old_len]`` is the stored text (or its tail), whose IDs are ``n_ids`` long without
    the suffix; ``ends_with(keep, parts)`` says whether the stored IDs hold ``parts`` from
    ``keep`` on. Returns (how many stored IDs to keep, the buffers of the new tail), or None
    when there is no safe cut near the old end or the stored IDs do not end as expected."""
    b = tok.rules.repair_cut(text, old_len, tok.knobs["scan_budget"][-1])
    if b < 0:
        return None
    old_tail = tok._encode_body(text[b:old_len]) if b < old_len else []
    keep = n_ids - sum(len(p) for p in old_tail)
    # Defence in depth: the stored IDs must end with the re-encoded old tail.
    if keep < len(tok.admission.prefix) or not ends_with(keep, old_tail):
        return None
    return keep, tok._encode_body(text[b:])


def _headroom(n: int) -> int:
    """Spare capacity after a splice: appends rarely reallocate, and at most ~6% is unused."""
    return max(1024, n >> 4)


def _checkpoints(n_bytes: int) -> list[int]:
    """Byte offsets 4096, 8192, ... strictly below n_bytes."""
    out, o = [], LOOKUP_MIN_BYTES
    while o < n_bytes:
        out.append(o)
        o <<= 1
    return out


@dataclass(eq=False)
class Entry:
    """One stored transcript: its text, its IDs (prefix + body + suffix) and its lock."""

    key: Hashable | None
    text: str | None = None
    buf: IdBuffer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    nbytes: int = 0  # accounted bytes: text object + ID buffer capacity
    evicted: bool = False
    end_key: tuple[int, bytes] | None = None  # content entries: (byte length, digest)
    ckpt_keys: tuple[tuple[int, bytes], ...] = ()


class SessionStore:
    """Keyed sessions and the content-lookup index of one :class:`~dtok.Tokenizer`.

    Bounded by ``max_sessions`` keyed entries, ``lookup_entries`` content entries (oldest
    dropped first) and ``session_bytes`` of text and IDs in all (least recently used dropped
    first). Eviction never disturbs a request in flight: it keeps its entry until it returns.
    """

    def __init__(self, tok: "Tokenizer", *, max_sessions: int, session_bytes: int,
                 lookup_entries: int, content_lookup: bool) -> None:
        self._tok = tok
        self.max_sessions = max_sessions
        self.session_bytes = session_bytes
        self.lookup_entries = lookup_entries
        self.content_lookup = content_lookup
        self._lock = threading.Lock()
        self._keyed: dict[Hashable, Entry] = {}
        self._lru: OrderedDict[Entry, None] = OrderedDict()  # all entries, oldest use first
        self._content: OrderedDict[Entry, None] = OrderedDict()  # content entries, oldest first
        self._by_end: dict[tuple[int, bytes], Entry] = {}
        self._by_ckpt: dict[tuple[int, bytes], set[Entry]] = {}
        self._digest_key = os.urandom(16)  # keyed: clients cannot aim for collisions
        self._bytes = 0
        self._counts = dict(hits=0, repairs=0, full_encodes=0, fallbacks=0, evictions=0,
                            lookups=0, lookup_hits=0)

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
        """Entries, bytes held, and what the requests did."""
        with self._lock:
            text_bytes = sum(sys.getsizeof(e.text) for e in self._lru if e.text is not None)
            id_bytes = sum(e.buf.nbytes for e in self._lru if e.buf is not None)
            return {"entries": len(self._lru), "keyed": len(self._keyed),
                    "content": len(self._content), "text_bytes": text_bytes,
                    "id_bytes": id_bytes, **self._counts}

    # --- requests -------------------------------------------------------------------------

    def encode_keyed(self, text: str, key: Hashable, add_special_tokens: bool) -> memoryview:
        with self._lock:
            entry = self._keyed.get(key)
            if entry is None:
                entry = Entry(key)
                self._keyed[key] = entry
                self._lru[entry] = None
        with entry.lock:
            try:
                self._serve(entry, text)
            finally:
                with self._lock:
                    self._account(entry)
            return self._view(entry.buf, add_special_tokens)

    def encode_lookup(self, text: str, raw: bytes, add_special_tokens: bool) -> memoryview:
        """Content lookup for a text of at least LOOKUP_MIN_BYTES UTF-8 bytes (``raw``)."""
        found, end_key, ckpt_keys = self._find(raw)
        with self._lock:
            self._counts["lookups"] += 1
        if found is not None:
            with found.lock:
                old = found.text
                if old is not None and not found.evicted and text.startswith(old):
                    with self._lock:
                        self._counts["lookup_hits"] += 1
                    if len(text) == len(old):
                        with self._lock:
                            self._counts["hits"] += 1
                            if not found.evicted:
                                self._lru.move_to_end(found)
                        return self._view(found.buf, add_special_tokens)
                    # Proper prefix: the extended text replaces the entry it extends.
                    entry = Entry(None, old, found.buf)
                    self._serve(entry, text)
                    with self._lock:
                        if not found.evicted:
                            self._remove(found)
                        self._insert_content(entry, end_key, ckpt_keys)
                    return self._view(entry.buf, add_special_tokens)
        entry = Entry(None)
        self._serve(entry, text)
        with self._lock:
            self._insert_content(entry, end_key, ckpt_keys)
        return self._view(entry.buf, add_special_tokens)

    # --- the work -------------------------------------------------------------------------

    def _serve(self, entry: Entry, text: str) -> None:
        """Bring the entry to `text`: reuse, repair, or encode whole. Caller holds its lock."""
        old = entry.text
        if old is not None and text.startswith(old):
            if len(text) == len(old):
                self._count("hits")
                return
            buf = self._repair(entry.buf, old, text)
            if buf is not None:
                entry.text, entry.buf = text, buf
                self._count("repairs")
                return
            self._count("fallbacks")  # no safe cut near the end of the old text
        else:
            self._count("full_encodes")
        entry.buf = self._tok._encode_buffer(text, headroom=_headroom(len(text) // 3))
        entry.text = text

    def _repair(self, buf: IdBuffer, old: str, new: str) -> IdBuffer | None:
        suffix = self._tok.admission.suffix
        plan = plan_repair(self._tok, new, len(old), buf.length - len(suffix), buf.equals_at)
        if plan is None:
            return None
        keep, new_tail = plan
        total = keep + sum(len(p) for p in new_tail) + len(suffix)
        return buf.splice(keep, new_tail, suffix, headroom=_headroom(total))

    def _view(self, buf: IdBuffer, add_special_tokens: bool) -> memoryview:
        if add_special_tokens:
            return buf.view()
        a = self._tok.admission
        return buf.view(len(a.prefix), buf.length - len(a.suffix))

    def _count(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    # --- content index --------------------------------------------------------------------

    def _find(self, raw: bytes) -> tuple[Entry | None, tuple[int, bytes],
                                         tuple[tuple[int, bytes], ...]]:
        """One pass of keyed BLAKE2b over `raw`: the longest stored text whose end digest
        matches a prefix of `raw`, and `raw`'s own end and checkpoint keys (to store it).

        A stored text of L bytes is a candidate only if it matched at every checkpoint below L,
        so only texts ending between the last matched checkpoint and the next one are hashed to
        their own end (from a copy of the running hash)."""
        h = hashlib.blake2b(digest_size=_DIGEST_SIZE, key=self._digest_key)
        view = memoryview(raw)
        n = len(raw)
        ckpt_keys: list[tuple[int, bytes]] = []
        best: Entry | None = None
        alive: list[Entry] = []
        pos = 0
        digest = b""
        for stop in _checkpoints(n) + [n]:
            for e in sorted((e for e in alive if pos < e.end_key[0] < stop),
                            key=lambda e: e.end_key[0]):
                g = h.copy()
                g.update(view[pos : e.end_key[0]])
                if g.digest() == e.end_key[1]:
                    best = e
            h.update(view[pos:stop])
            pos = stop
            digest = h.digest()
            with self._lock:
                best = self._by_end.get((stop, digest), best)
                if stop < n:
                    alive = list(self._by_ckpt.get((stop, digest), ()))
            if stop < n:
                ckpt_keys.append((stop, digest))
        return best, (n, digest), tuple(ckpt_keys)

    def _insert_content(self, entry: Entry, end_key, ckpt_keys) -> None:
        """Caller holds the store lock."""
        old = self._by_end.get(end_key)
        if old is not None:
            self._remove(old)
        entry.end_key, entry.ckpt_keys = end_key, ckpt_keys
        self._by_end[end_key] = entry
        for k in ckpt_keys:
            self._by_ckpt.setdefault(k, set()).add(entry)
        self._content[entry] = None
        self._lru[entry] = None
        self._account(entry)

    # --- accounting and eviction (caller holds the store lock) ----------------------------

    def _account(self, entry: Entry) -> None:
        if entry.evicted or entry not in self._lru:
            return
        if entry.text is None:  # a keyed placeholder whose first request failed
            self._remove(entry)
            return
        size = sys.getsizeof(entry.text) + (entry.buf.nbytes if entry.buf is not None else 0)
        self._bytes += size - entry.nbytes
        entry.nbytes = size
        self._lru.move_to_end(entry)
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
            if self._by_end.get(entry.end_key) is entry:
                del self._by_end[entry.end_key]
            for k in entry.ckpt_keys:
                s = self._by_ckpt.get(k)
                if s is not None:
                    s.discard(entry)
                    if not s:
                        del self._by_ckpt[k]

    def describe(self) -> dict[str, Any]:
        return {"max_sessions": self.max_sessions, "session_bytes": self.session_bytes,
                "lookup_entries": self.lookup_entries, "content_lookup": self.content_lookup}
