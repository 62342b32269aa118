"""The public :class:`Tokenizer`: the reference's IDs, faster on long texts."""
from __future__ import annotations

import logging
import math
import os
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Hashable, NamedTuple, Sequence

from dtok import guards, tables
from dtok.admission import Admission, TokenizerFiles, admit, bundled_files, read_files
from dtok.encoders import (FastEncoder, FastEncoderError, GigaEncoder, ReferenceEncoder,
                           fastokens_version, gigatoken_version)
from dtok.sessions import LOOKUP_MIN_CHARS, SessionStore, affixed_view, scoped_key
from dtok_ext.buffers import IdBuffer, ids_from_list
from dtok_ext.cuts import CutRules
from dtok_ext.specials import SpecialMatcher

__all__ = ["Tokenizer", "Bodies", "KNOBS", "chunk_count", "chunk_cuts", "positive_int"]

log = logging.getLogger("dtok")

#: Operator knobs and their defaults (the paper's parameters, supplement S6.2).
KNOBS: dict[str, Any] = {
    "threads": None,  # encoder threads for chunked encodes; None = the CPUs this process may use
    "chunk_threshold": 131072,  # texts this long (code points) or longer are cut into chunks
    "chunk_target": 65536,  # aimed-at chunk length
    "max_chunks": 16,
    "scan_budget": (48, 4096),  # backward scan for a safe cut: first stage, then up to the second
    "content_lookup": True,  # unkeyed texts of 4096+ characters reuse a stored text's IDs
    "max_sessions": 4096,  # keyed sessions kept
    "session_bytes": 128 << 20,  # text + IDs kept for sessions and content lookup (LRU)
    "lookup_entries": 1024,  # content-lookup entries kept (oldest dropped first)
    "anchor_spacing": 2048,  # sessions record a cut with its token index about this often (chars)
    "edit_budget": 1 << 22,  # characters of alignment work an edited session may spend
    "encoder": "auto",  # "auto" (fast where admitted and guarded), "fast", "reference"
}
ENCODERS = ("auto", "fast", "reference")
# Reference stretches closer than this are sent as one (a piece costs a few microseconds in each
# encoder; the reference takes ~0.5 us per character).
COALESCE_GAP = 32
# Below this many characters of work per thread, the chunks of a text are encoded in one call.
PARALLEL_MIN_CHARS = 32768
# The second fast encoder takes a text class when its guard table measured it at most this
# fraction of fastokens' time on that class (a margin over the measurement's noise).
SECOND_WINS = 0.9


class Lane(NamedTuple):
    """A fast encoder with the file's cut rules carrying its own guard characters."""

    encoder: Any
    rules: CutRules
    nfc_by_fast: bool  # its guard table proves its NFC equals the reference's


def text_class(piece: str) -> str:
    """'latin' (about one UTF-8 byte per character: prose, code) or 'other' (multilingual
    text), judged on a sample of the piece: the class the second encoder's speed was measured
    on (``tools/build_guards.py --speed``)."""
    if piece.isascii():
        return "latin"
    sample = piece[::61] if len(piece) > 4096 else piece
    return "latin" if len(sample.encode("utf-8", "surrogatepass")) * 10 <= len(sample) * 11 \
        else "other"


def chunk_count(n: int, chunk_target: int, max_chunks: int) -> int:
    """How many chunks a text of n characters is cut into (the pool caps it further by its
    live workers)."""
    return min(math.ceil(n / chunk_target), max_chunks)


def chunk_cuts(rules: CutRules, text: str, k: int, budgets) -> list[int]:
    """Safe cuts for k chunks of text: no chunk shorter than max(16, min(1024, N / 4k))."""
    n = len(text)
    if k < 2 or n < 256:
        return []
    return rules.plan(text, k, max(16, min(1024, n // (4 * k))), budgets)


def _release_free_heap() -> None:
    """Give the heap that loading freed back to the system (glibc only). Parsing a tokenizer
    file (the reference's and dtok's own parse) leaves ~100 MB of freed heap in the process,
    which glibc keeps unless asked; on Qwen3 this halves a loaded tokenizer's RSS."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def positive_int(name: str, value) -> None:
    """The check every count-like knob gets (the tokenizer's and the pool's)."""
    if type(value) is not int or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def _validated(knobs: dict[str, Any]) -> dict[str, Any]:
    unknown = set(knobs) - set(KNOBS)
    if unknown:
        raise TypeError(f"unknown knob(s): {', '.join(sorted(unknown))}")
    k = {**KNOBS, **knobs}
    for name in ("chunk_threshold", "chunk_target", "max_chunks", "max_sessions",
                 "session_bytes", "lookup_entries", "anchor_spacing", "edit_budget"):
        positive_int(name, k[name])
    if k["threads"] is not None and (type(k["threads"]) is not int or k["threads"] < 1):
        raise ValueError(f"threads must be a positive int or None, got {k['threads']!r}")
    try:
        budget = tuple(k["scan_budget"])
    except TypeError:
        budget = ()
    if not budget or any(type(b) is not int or b < 0 for b in budget):
        raise ValueError(f"scan_budget must be non-negative ints, got {k['scan_budget']!r}")
    k["scan_budget"] = budget
    if k["encoder"] not in ENCODERS:
        raise ValueError(f"encoder must be one of {ENCODERS}, got {k['encoder']!r}")
    if type(k["content_lookup"]) is not bool:
        raise ValueError(f"content_lookup must be a bool, got {k['content_lookup']!r}")
    return k


class Tokenizer:
    """Exact tokenizer: ``list(tok.encode(x)) == reference.encode(x).ids`` for every text.

    Long texts of admitted files are cut at provably safe positions and the chunks encoded on
    several threads; everything else goes to the reference whole. Results are read-only int32
    memoryviews.

    >>> tok = Tokenizer.default()
    >>> ids = tok.encode("Hello, world!")
    >>> ids.format, list(ids) == tok.reference.encode("Hello, world!").ids
    ('i', True)
    >>> tok.admission.admitted, tok.admission.family
    (True, 'qwen2')
    """

    # --- construction ---------------------------------------------------------------------

    def __init__(self, files: TokenizerFiles, **knobs: Any) -> None:
        self.knobs = _validated(knobs)
        from tokenizers import Tokenizer as _Reference

        try:
            self.reference = _Reference.from_buffer(files.raw)
        except Exception:
            files.spec()  # a file that is not JSON gets dtok's clear ValueError
            raise
        # parsed only after the reference has loaded and freed its own parse: a lower peak
        self.admission: Admission = admit(files, files.spec(), self.reference)
        self.rules: CutRules | None = None
        self._fast: FastEncoder | None = None
        # The guard table proves the fast encoder's NFC equals the reference's (dtok.guards):
        # text NFC would change then goes to the fast encoder like any other. A private hook:
        # the control battery forces it on for an encoder the proof does not cover.
        self._nfc_by_fast = False
        # gigatoken, behind its own guards: the encoder of the text classes where its guard
        # table measured it faster (``_second_classes``), and of the stretches fastokens'
        # guards send away that its guards let through (and the other way round).
        self._second: Lane | None = None
        self._second_classes: frozenset[str] = frozenset()
        self.encoder_notes: list[str] = []
        if self.admission.admitted:
            t = tables.load(self.admission.family)
            table = t.table
            specials = SpecialMatcher(self.admission.added_tokens)
            normalize = self.reference.normalizer.normalize_str if self.admission.nfc else None
            if self.knobs["encoder"] != "reference":
                self._fast, guard = self._load_fast(files)
                giga, giga_guard = self._load_giga(files, fast_loaded=self._fast is not None)
                if self._fast is None and giga is not None:  # gigatoken is the only one
                    self._fast, guard, giga = giga, giga_guard, None
                if guard is not None:
                    self._nfc_by_fast = self.admission.nfc and guard.nfc_proven
                    table = guards.guarded_table(table, guard, self._nfc_by_fast)
                if giga is not None:
                    nfc = self.admission.nfc and giga_guard.nfc_proven
                    self._second = Lane(giga, CutRules(
                        guards.guarded_table(t.table, giga_guard, nfc), t.accept, specials,
                        normalize), nfc)
                    self._second_classes = frozenset(
                        c for c, r in giga_guard.speed.get("ratio", {}).items() if r <= SECOND_WINS)
            self.rules = CutRules(table, t.accept, specials, normalize)
        elif self.knobs["encoder"] == "fast":
            raise FastEncoderError("encoder='fast' needs an admitted file: "
                                   + "; ".join(self.admission.reasons))
        self.files = files.released()  # the JSON bytes are not kept (see tokenizer_json)
        _release_free_heap()
        self._setup()

    def _load_giga(self, files: TokenizerFiles, fast_loaded: bool
                   ) -> tuple[GigaEncoder | None, "guards.GuardTable | None"]:
        """gigatoken and its guard table, where a table was built and (next to fastokens) it
        measured faster on some text class; else (None, None), with a note."""
        version = gigatoken_version()
        guard = guards.load(self.admission.sha256, version, "gigatoken") if version else None
        if guard is None:
            if version is not None:
                self.encoder_notes.append("gigatoken: no guard table for this file and versions")
            return None, None
        if self.admission.nfc and not guard.nfc_proven:
            # its NFC differs from the reference's even on text the reference leaves as it is
            # (it reorders marks the reference does not), so the NFC check cannot protect it
            self.encoder_notes.append("gigatoken: not used (its NFC is not proven for this file)")
            return None, None
        wins = sorted(c for c, r in guard.speed.get("ratio", {}).items() if r <= SECOND_WINS)
        if fast_loaded and not wins:
            self.encoder_notes.append("gigatoken: not loaded (its guard table measured it no "
                                      f"faster than fastokens on any text class: {guard.speed})")
            return None, None
        try:
            giga = GigaEncoder((files.raw or self.tokenizer_json()).decode("utf-8"),
                               self.reference)
        except FastEncoderError as exc:
            self.encoder_notes.append(f"gigatoken refused: {exc}")
            return None, None
        self.encoder_notes.append(
            f"gigatoken {giga.version}, guard table {guard.source} ({len(guard.disagree)} "
            f"disagreeing code points + unassigned); text classes: {wins or 'all'}")
        return giga, guard

    def _load_fast(self, files: TokenizerFiles
                   ) -> tuple[FastEncoder | None, "guards.GuardTable | None"]:
        """The fast encoder and its guard table, or (None, None) and a note saying why not."""
        strict = self.knobs["encoder"] == "fast"
        version = fastokens_version()
        guard = guards.load(self.admission.sha256, version) if version else None
        if guard is None and not strict:
            self.encoder_notes.append(
                "fastokens is not installed (pip install 'dtok[fast]')" if version is None else
                "no guard table for this file and versions (build one: dtok guards PATH)")
            return None, None
        try:
            fast = FastEncoder((files.raw or self.tokenizer_json()).decode("utf-8"),
                               self.reference)
        except FastEncoderError as exc:
            if strict:
                raise
            self.encoder_notes.append(f"fast encoder refused: {exc}")
            return None, None
        if guard is None:
            log.warning("dtok: building the fast encoder's guard table for %s (minutes)",
                        files.path)
            a = self.admission
            guard = guards.build(self.reference, fast, a.sha256,
                                 progress=lambda msg: log.info("dtok guards: %s", msg),
                                 nfc_family=a.family if a.nfc else None)
        self.encoder_notes.append(f"fastokens {fast.version}, guard table {guard.source} "
                                  f"({len(guard.disagree)} disagreeing code points + unassigned)")
        if self.admission.nfc:
            self.encoder_notes.append(
                "NFC: proven to normalize as the reference (text NFC changes stays on fastokens)"
                if guard.nfc_proven else
                "NFC: not proven for this encoder; text NFC would change goes to the reference")
        return fast, guard

    def _setup(self) -> None:
        """Per-instance state that knobs decide: threads, encoder, sessions."""
        self.threads = self.knobs["threads"] or _available_cpus()
        self.ref_encoder = ReferenceEncoder(self.reference)
        use_fast = self._fast is not None and self.knobs["encoder"] != "reference"
        self.encoder = self._fast if use_fast else self.ref_encoder
        self._pieces = {"fast": 0, "reference": 0, "second": 0}
        self._executor: ThreadPoolExecutor | None = None
        self._executor_lock = threading.Lock()
        self.bodies = Bodies(self)
        self.sessions = SessionStore(
            self.bodies, max_sessions=self.knobs["max_sessions"],
            session_bytes=self.knobs["session_bytes"], lookup_entries=self.knobs["lookup_entries"],
            content_lookup=self.knobs["content_lookup"],
            scan_budget=self.knobs["scan_budget"][-1], anchor_spacing=self.knobs["anchor_spacing"],
            edit_budget=self.knobs["edit_budget"])

    @classmethod
    def from_file(cls, path: str | os.PathLike, **knobs: Any) -> "Tokenizer":
        """Load a ``tokenizer.json`` (or a directory holding one and maybe tokenizer_config.json)."""
        _validated(knobs)  # fail fast, before reading a large file
        return cls(read_files(path), **knobs)

    @classmethod
    def default(cls, **knobs: Any) -> "Tokenizer":
        """The bundled Qwen3 tokenizer (Apache-2.0)."""
        _validated(knobs)
        return cls(bundled_files(), **knobs)

    def with_knobs(self, **knobs: Any) -> "Tokenizer":
        """A tokenizer for the same file with other knobs and its own (empty) session state;
        the loaded reference and tables are shared, so this is cheap."""
        merged = _validated({**self.knobs, **knobs})
        if merged["encoder"] != "reference" and self._fast is None and self.admission.admitted \
                and self.knobs["encoder"] == "reference":
            # the fast encoder was never loaded: load the file again from the reference's JSON
            # (same SHA-256 of the original bytes, so the same guard table)
            files = replace(self.files, raw=self.tokenizer_json())
            return Tokenizer(files, **merged)
        clone = object.__new__(Tokenizer)
        clone.files, clone.reference, clone.admission = self.files, self.reference, self.admission
        clone.rules, clone._fast = self.rules, self._fast
        clone._nfc_by_fast = self._nfc_by_fast
        clone._second, clone._second_classes = self._second, self._second_classes
        clone.encoder_notes = list(self.encoder_notes)
        clone.knobs = merged
        clone._setup()
        return clone

    def tokenizer_json(self) -> bytes:
        """The loaded reference serialized as tokenizer.json (UTF-8 bytes). dtok does not keep
        the file's own bytes; ``admission.sha256`` is still the SHA-256 of those."""
        return self.reference.to_str().encode("utf-8")

    def close(self) -> None:
        """Stop the encoder threads (they are also stopped when the tokenizer is collected)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def __enter__(self) -> "Tokenizer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- encoding -------------------------------------------------------------------------

    def encode(self, text: str, *, session: Hashable | None = None,
               add_special_tokens: bool = True, scope: Hashable | None = None) -> memoryview:
        """IDs of ``text``, exactly as ``reference.encode(text, add_special_tokens=...).ids``.

        With ``session=key``, the text and IDs are kept: when the next text for the key extends
        the stored one, only a short tail is re-encoded. Without a key, texts of ``LOOKUP_MIN_CHARS``
        (4096) characters or more are looked up by content (knob ``content_lookup``).
        ``scope`` (a tenant: e.g. a serving engine's ``cache_salt`` and model) keeps sessions and
        content lookup apart: the same key in another scope is another session, and a text is
        only continued from one stored under its scope.

        >>> tok = Tokenizer.default()
        >>> list(tok.encode("<|im_start|>user\\nhi<|im_end|>"))
        [151644, 872, 198, 6023, 151645]
        >>> turn1 = "<|im_start|>user\\nHello there<|im_end|>\\n"
        >>> a = tok.encode(turn1, session="chat-1")
        >>> b = tok.encode(turn1 + "<|im_start|>assistant\\nHi!", session="chat-1")
        >>> list(b)[: len(a)] == list(a), tok.sessions.stats()["repairs"]
        (True, 1)
        """
        return self._encode(text, session, add_special_tokens, False, scope)

    def encode_list(self, text: str, *, session: Hashable | None = None,
                    add_special_tokens: bool = True, scope: Hashable | None = None) -> list[int]:
        """:meth:`encode` as a ``list[int]`` (what serving engines take). For a session (or a
        content-lookup entry) the list is kept and updated for the changed IDs only, in place
        when nobody else holds it; a list held elsewhere never changes.

        >>> tok = Tokenizer.default()
        >>> tok.encode_list("Hello, world!")
        [9707, 11, 1879, 0]
        """
        return self._encode(text, session, add_special_tokens, True, scope)

    def _encode(self, text, session, add_special_tokens, as_list, scope=None):
        if type(text) is not str or type(add_special_tokens) is not bool or self.rules is None:
            view = memoryview(self._whole(text, add_special_tokens))
            return view.tolist() if as_list else view
        if session is not None:
            return self.sessions.encode_keyed(text, scoped_key(session, scope),
                                              add_special_tokens, as_list)
        if self.sessions.content_lookup and len(text) >= LOOKUP_MIN_CHARS:
            return self.sessions.encode_lookup(text, add_special_tokens, as_list, scope)
        a = self.admission
        view = affixed_view(self._encode_buffer(text), add_special_tokens, len(a.prefix),
                            len(a.suffix))
        return view.tolist() if as_list else view

    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool = True
                     ) -> list[memoryview]:
        """:meth:`encode` for each text; the short ones are encoded together in one call.

        >>> tok = Tokenizer.default()
        >>> [list(v) for v in tok.encode_batch(["a b", "c"])]
        [[64, 293], [66]]
        """
        if (self.rules is None or not isinstance(texts, (list, tuple))
                or type(add_special_tokens) is not bool or any(type(t) is not str for t in texts)):
            # Not admitted, or pairs, odd sequences and bad items: the reference decides (and
            # raises its errors).
            encs = self.reference.encode_batch_fast(texts, add_special_tokens=add_special_tokens)
            return [memoryview(ids_from_list(e.ids)) for e in encs]
        a = self.admission
        prefix, suffix = (a.prefix, a.suffix) if add_special_tokens else ((), ())
        out: list[memoryview | None] = [None] * len(texts)
        short = [i for i, t in enumerate(texts) if len(t) < self.knobs["chunk_threshold"]]
        parts = self._encode_pieces([texts[i] for i in short], batch=True)
        for i, piece_parts in zip(short, parts):
            out[i] = memoryview(IdBuffer.concat(piece_parts, prefix, suffix))
        for i, text in enumerate(texts):
            if out[i] is None:
                out[i] = self.encode(text, add_special_tokens=add_special_tokens)
        return out  # type: ignore[return-value]

    # --- routes ---------------------------------------------------------------------------

    def _whole(self, text, add_special_tokens) -> IdBuffer:
        """One reference encode of the whole text, post-processing by the reference (the route
        for files that are not admitted, and for input the reference must judge)."""
        if type(text) is str and type(add_special_tokens) is bool:
            try:
                (enc,) = self.reference.encode_batch_fast([text],
                                                          add_special_tokens=add_special_tokens)
                return ids_from_list(enc.ids)
            except Exception:
                pass  # fall through: the reference's own encode raises its own exception
        return ids_from_list(self.reference.encode(text, add_special_tokens=add_special_tokens).ids)

    def _encode_body(self, text: str) -> list:
        """int32 IDs of admitted text without post-processing, as a list of buffers: cut into
        chunks when long enough; each chunk to the fast encoder, except the stretches around
        guard characters or text NFC would change, which go to the reference."""
        if len(text) >= self.knobs["chunk_threshold"]:
            cuts = self._plan(text)
            if cuts:
                bounds = [0, *cuts, len(text)]
                pieces = [text[a:b] for a, b in zip(bounds, bounds[1:])]
                return [p for parts in self._encode_pieces(pieces) for p in parts]
        return self._encode_pieces([text])[0]

    def _encode_pieces(self, pieces: list[str], batch: bool = False) -> list[list]:
        """Encode independent pieces (chunks of one text, or a batch of short texts): for each
        piece, the list of its buffers. With the fast encoder, the stretches that must go to
        the reference are sent in at most ``threads`` calls, and the rest in at most ``threads``
        fast-encoder calls; the calls run on the thread pool and in this thread at once (both
        encoders release the GIL)."""
        if not pieces:
            return []
        if self.encoder is self.ref_encoder:
            self._count(reference=len(pieces))
            if batch:
                return [[ids] for ids in self.ref_encoder.encode_many(pieces)]
            return [[ids] for ids in self._map(self.ref_encoder.encode, pieces)]
        main = self._lane()
        lanes = [main] if self._second is None else [main, self._second]
        by_lane: list[list] = [[] for _ in lanes]  # (slot, sub-text) for each fast encoder
        slow = []
        owner = []  # slot -> piece index
        for i, piece in enumerate(pieces):
            k = 1 if len(lanes) > 1 and text_class(piece) in self._second_classes else 0
            for a, b, why in self._segments(piece, lanes[k]):
                if why is not None and len(lanes) > 1:  # the other fast encoder may take it
                    other = lanes[1 - k]
                    if other.rules.route(piece, a, b, nfc=not other.nfc_by_fast)[0] == 0:
                        by_lane[1 - k].append((len(owner), piece[a:b]))
                        owner.append(i)
                        continue
                (by_lane[k] if why is None else slow).append((len(owner), piece[a:b]))
                owner.append(i)
        self._count(fast=len(by_lane[0]), reference=len(slow),
                    second=len(by_lane[1]) if len(lanes) > 1 else 0)
        calls = [(lane.encoder.encode_many, g)
                 for lane, items in zip(lanes, by_lane) for g in self._groups(items)]
        calls += [(self.ref_encoder.encode_stretches, g) for g in self._groups(slow, batch)]
        results: list = [None] * len(owner)
        pending = []
        if len(calls) > 1:
            pool = self._pool()
            pending = [(g, pool.submit(fn, [t for _, t in g])) for fn, g in calls[1:]]
            calls = calls[:1]
        for fn, g in calls:
            for (j, _), ids in zip(g, fn([t for _, t in g])):
                results[j] = ids
        for g, fut in pending:
            for (j, _), ids in zip(g, fut.result()):
                results[j] = ids
        out: list[list] = [[] for _ in pieces]
        for j, i in enumerate(owner):
            out[i].append(results[j])
        return out

    def _groups(self, items: list, one: bool = False) -> list[list]:
        """Split (slot, text) items into at most ``threads`` groups of about equal length, one
        encoder call each; short work stays in one group (a thread hand-off costs more)."""
        if not items:
            return []
        total = sum(len(t) for _, t in items)
        n = 1 if one else min(self.threads, len(items), max(1, total // PARALLEL_MIN_CHARS))
        if n == 1:
            return [items]
        groups: list[list] = [[] for _ in range(n)]
        share, size, g = total / n, 0, 0
        for item in items:  # contiguous runs keep each group's text in order
            if size >= share * (g + 1) and g < n - 1:
                g += 1
            groups[g].append(item)
            size += len(item[1])
        return [grp for grp in groups if grp]

    def _count(self, fast: int = 0, reference: int = 0, second: int = 0) -> None:
        with self._executor_lock:
            self._pieces["fast"] += fast
            self._pieces["reference"] += reference
            self._pieces["second"] += second

    def _lane(self) -> Lane:
        """The main fast encoder with its rules (read at each call: the controls replace them)."""
        return Lane(self.encoder, self.rules, self._nfc_by_fast)

    def _segments(self, piece: str, lane: Lane | None = None
                  ) -> list[tuple[int, int, str | None]]:
        """[(start, end, why)] covering the piece: why is None for stretches the fast encoder
        (of ``lane``: the main one by default) may take, else why the stretch goes elsewhere.
        Stretches start and end at safe cuts, so their IDs concatenate to the piece's; stretches
        closer than COALESCE_GAP characters are merged (one piece instead of three)."""
        rules, nfc_by_fast = (self.rules, self._nfc_by_fast) if lane is None else lane[1:]
        check_nfc = rules.nfc and not nfc_by_fast
        kind, _ = rules.route(piece, nfc=check_nfc)
        if kind == 0:
            return [(0, len(piece), None)]
        spans = [(a, b, f"guard character U+{ord(piece[a]):04X} at {a}")
                 for a, b in rules.guard_spans(piece)]
        if check_nfc:
            spans += [(a, c, f"not NFC at {a}") for a, c in self._unstable(piece)]
        if not spans:
            return [(0, len(piece), None)]
        spans.sort()
        stretches = rules.isolate(piece, [(a, b) for a, b, _ in spans],
                                  self.knobs["scan_budget"][-1])
        merged: list[list[int]] = []
        for a, b in stretches:
            if merged and a - merged[-1][1] < COALESCE_GAP:
                merged[-1][1] = b
            else:
                merged.append([a, b])
        out, pos, k = [], 0, 0
        for a, b in merged:
            if a > pos:
                out.append((pos, a, None))
            while k + 1 < len(spans) and spans[k][1] <= a:
                k += 1
            out.append((a, b, spans[k][2]))
            pos = b
        if pos < len(piece):
            out.append((pos, len(piece), None))
        return out

    def _unstable(self, piece: str) -> list[tuple[int, int]]:
        """The NFC windows of the piece that the reference normalizer would change (one
        normalizer call over all windows; by bisection if the piece holds the separator)."""
        found = self.rules.unstable_windows(piece)
        if found is not None:
            return found
        normalize = self.reference.normalizer.normalize_str
        windows = self.rules.nfc_windows(piece)
        texts = [piece[a:c] for a, c in windows]

        def bad(lo: int, hi: int) -> list[tuple[int, int]]:
            joined = "\n".join(texts[lo:hi])
            try:
                if normalize(joined) == joined:
                    return []
            except UnicodeError:  # a lone surrogate: the reference will judge that stretch
                pass
            if hi - lo == 1:
                return [windows[lo]]
            mid = (lo + hi) // 2
            return bad(lo, mid) + bad(mid, hi)

        return bad(0, len(windows)) if windows else []

    def _encode_buffer(self, text: str, headroom: int = 0) -> IdBuffer:
        """prefix + IDs + suffix of admitted text in one buffer (with spare capacity)."""
        try:
            parts = self._encode_body(text)
        except Exception:
            # e.g. a lone surrogate: whatever the reference does with the whole text
            return self._whole(text, True)
        a = self.admission
        return IdBuffer.concat(parts, a.prefix, a.suffix, headroom)

    def _chunk_count(self, n: int) -> int:
        return chunk_count(n, self.knobs["chunk_target"], self.knobs["max_chunks"])

    def _plan(self, text: str) -> list[int]:
        return chunk_cuts(self.rules, text, self._chunk_count(len(text)), self.knobs["scan_budget"])

    def _map(self, fn, items: list) -> list:
        if self.threads == 1 or len(items) == 1:
            return [fn(x) for x in items]
        return list(self._pool().map(fn, items))

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            with self._executor_lock:
                if self._executor is None:
                    ex = ThreadPoolExecutor(self.threads, thread_name_prefix="dtok-encode")
                    weakref.finalize(self, ex.shutdown, wait=False)
                    self._executor = ex
        return self._executor

    # --- introspection --------------------------------------------------------------------

    def explain(self, text: str, *, session: Hashable | None = None,
                scope: Hashable | None = None) -> dict[str, Any]:
        """Which route ``encode(text)`` takes, where it cuts, and why (changes no state).

        >>> Tokenizer.default().explain("short text")["route"]
        'whole'
        """
        info: dict[str, Any] = {
            "chars": len(text) if isinstance(text, str) else None,
            "admitted": self.admission.admitted,
            "family": self.admission.family,
            "encoder": self.encoder.name,
            "cuts": [],
        }
        if self._second is not None:  # chunk_routes' "fast" is then either fast encoder
            info["second_encoder"] = self._second.encoder.name
            info["second_classes"] = sorted(self._second_classes)
        if type(text) is not str:
            return {**info, "route": "reference", "why": "not a str: the reference decides"}
        if self.rules is None:
            return {**info, "route": "reference",
                    "why": "not admitted: " + "; ".join(self.admission.reasons)}
        if session is not None or self.sessions.content_lookup:
            found = self.sessions.explain(  # a continuation, or only a note
                text, None if session is None else scoped_key(session, scope), scope)
            if "route" in found:
                return {**info, **found}
            info.update(found)
        n = len(text)
        if n < self.knobs["chunk_threshold"]:
            return {**info, "route": "whole", "chunk_routes": self._routes_of([text]),
                    "why": f"{n} chars < chunk_threshold {self.knobs['chunk_threshold']}"}
        k = self._chunk_count(n)
        t0 = time.perf_counter()
        cuts = self._plan(text)
        plan_ms = (time.perf_counter() - t0) * 1e3
        bounds = [0, *cuts, n]
        info.update(
            requested_chunks=k, cuts=cuts, plan_ms=round(plan_ms, 3),
            chunk_chars=[b - a for a, b in zip(bounds, bounds[1:])],
            cut_kinds=[("special-token boundary" if self.rules.is_safe(text, c) == 1
                        else "class transition") for c in cuts],
        )
        info["chunk_routes"] = self._routes_of([text[a:b] for a, b in zip(bounds, bounds[1:])])
        if not cuts:
            return {**info, "route": "whole", "why": "no safe cut within the scan budget"}
        routes = info["chunk_routes"]
        n_ref = sum(r != "fast" for r in routes)
        if self.encoder is self.ref_encoder:
            why = f"{len(routes)} chunks on {min(self.threads, len(routes))} thread(s)"
        else:
            why = (f"{len(routes)} chunks to {self.encoder.name} in one call; {n_ref} of them "
                   "with stretches on the reference")
        return {**info, "route": "chunked", "why": why}

    def _routes_of(self, pieces: list[str]) -> list[str]:
        if self.encoder is self.ref_encoder:
            return ["reference"] * len(pieces)
        out = []
        for piece in pieces:
            segs = [(a, b, why) for a, b, why in self._segments(piece) if why is not None]
            if not segs:
                out.append("fast")
            else:
                n = sum(b - a for a, b, _ in segs)
                out.append(f"reference for {n} of {len(piece)} chars ({len(segs)} stretch(es), "
                           f"first: {segs[0][2]})")
        return out

    def stats(self) -> dict[str, Any]:
        """The encoder in use, why, and how many pieces each encoder took so far."""
        return {"encoder": self.encoder.name, "notes": list(self.encoder_notes),
                "second_encoder": self._second.encoder.name if self._second else None,
                "second_classes": sorted(self._second_classes),
                "fast_pieces": self._pieces["fast"], "reference_pieces": self._pieces["reference"],
                "second_pieces": self._pieces["second"]}

    def __repr__(self) -> str:
        a = self.admission
        state = f"family={a.family}" if a.admitted else "not admitted"
        return f"<dtok.Tokenizer {self.files.path} {state} encoder={self.encoder.name}>"


class Bodies:
    """The encoder of bodies that sessions and pool workers use (:class:`dtok.sessions.
    BodyEncoder`): the tokenizer's cut rules, its post-processing affixes, independent encodes
    of texts, and the whole-text route."""

    def __init__(self, tok: Tokenizer) -> None:
        self._tok = tok
        self.rules = tok.rules
        self.prefix = tok.admission.prefix
        self.suffix = tok.admission.suffix

    def encode_texts(self, texts: list[str]) -> list[list]:
        """Body IDs (no post-processing) of each text, encoded independently."""
        return self._tok._encode_pieces(texts)

    def encode_whole(self, text: str, headroom: int = 0) -> IdBuffer:
        """prefix + IDs + suffix by the stateless route (the reference's exception for input it
        rejects)."""
        return self._tok._encode_buffer(text, headroom)

    def chunk_cuts(self, text: str) -> list[int]:
        """Where the stateless route cuts ``text`` (none below ``chunk_threshold``)."""
        tok = self._tok
        return tok._plan(text) if len(text) >= tok.knobs["chunk_threshold"] else []
