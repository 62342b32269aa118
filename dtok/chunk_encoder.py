"""The chunk encoder: body IDs (no post-processing) of independent chunks of admitted text.

Each chunk goes to a fast encoder, except the stretches around guard characters or text NFC
would change, and stretches with no safe cut for more than LONGEST_FAST_STRETCH characters,
which go to the reference; stretches start and end at safe cuts, so their IDs concatenate
to the chunk's (:mod:`dtok.repair` and docs/exactness.md say why). The calls run on a thread
pool and in the calling thread at once (every encoder releases the GIL). The tokenizer's
stateless route, the session store and the pool's workers all encode through this object.
"""
from __future__ import annotations

import threading
from functools import partial
from typing import TYPE_CHECKING, Any

from dtok import testing
from dtok.chunking import Chunker, split_at
from dtok.encoders import ReferenceEncoder, available_cpus, fastokens_bpe_threads
from dtok.knobs import default_threads
from dtok.loading import FastParts, GuardedEncoder, LoadedFile
from dtok_ext.buffers import IdBuffer, ids_from_list
from dtok_ext.cuts import ROUTE_FAST, ROUTE_GUARD, CutRules

if TYPE_CHECKING:
    from dtok.encode_threads import EncodeThreads

__all__ = ["ChunkEncoder", "text_class", "affixed_view", "ONE_BYTE_TEXT", "OTHER_TEXT"]

# The figures behind each constant below: docs/benchmarks.md#figures-behind-the-scheduling-constants
# (the rules: docs/knobs.md#chunks, docs/knobs.md#threads).

# Reference stretches closer than this are sent as one (each encoder call costs microseconds).
COALESCE_GAP = 32
# Below this many characters of work per thread, a text's chunks are encoded in one call.
PARALLEL_MIN_CHARS = 32768
# A longer cut-free stretch goes to the reference: fastokens keeps scratch for its longest
# pre-token, for good (docs/encoders.md#guards).
LONGEST_FAST_STRETCH = 65536
# The longest chunk a fast encoder gets: a longer one costs scratch memory kept on each thread.
LONGEST_FAST_CHUNK = 1 << 20
# A pool thread takes its run of chunks in steps of at most this many characters (at least one
# chunk), so that the calling thread, done with its own run, can take the rest from the back.
RUN_STEP_CHARS = 160_000
# :func:`text_class` reads this many samples of this many characters of a long chunk (reading
# it all would cost a tenth of the encode it decides on).
CLASS_SAMPLES, CLASS_SAMPLE_CHARS = 16, 256
# With ``threads=None``, a split must save this much work (characters of Latin text on a fast
# encoder) where fastokens runs one BPE thread a call: chosen over a server's stream of requests.
AUTO_SPLIT_SAVING = 450_000
# The bound beside fastokens' own BPE threads (or another general encoder): the only one measured
# there (16 cores).
AUTO_SPLIT_SAVING_BESIDE_BPE_THREADS = 1_250_000
# The text classes (docs/glossary.md#latin-and-other-text), by the names guard tables and
# Tokenizer.stats() give them.
ONE_BYTE_TEXT, OTHER_TEXT = "latin", "other"
# Work per character of the reference in those units (it takes ~0.5 us a character).
REFERENCE_WEIGHT = 100


def text_class(chunk: str) -> str:
    """ONE_BYTE_TEXT (about one UTF-8 byte per character: prose, code) or OTHER_TEXT
    (multilingual text), judged on a sample of the chunk: the classes the specialist encoder's
    speed was measured on (``tools/data/build_guards.py --speed``)."""
    if chunk.isascii():
        return ONE_BYTE_TEXT
    # a few samples of contiguous characters spread over the chunk: reading every 61st character
    # of 1M instead (every cache line of a 2-byte string, cold) took ~0.6 ms, a tenth of the
    # encode it decides on
    step = len(chunk) // CLASS_SAMPLES
    sample = chunk if step <= CLASS_SAMPLE_CHARS else \
        "".join([chunk[i : i + CLASS_SAMPLE_CHARS] for i in range(0, len(chunk), step)])
    return ONE_BYTE_TEXT if len(sample.encode("utf-8", "surrogatepass")) * 10 <= len(sample) * 11 \
        else OTHER_TEXT


def _even_runs(items: list, n: int, total: int | None = None) -> list[list]:
    """(slot, text) items in at most ``n`` contiguous runs of about equal length (each item
    goes to the run its middle falls in; each run's text in order)."""
    if total is None:
        total = sum(len(t) for _, t in items)
    runs: list[list] = [[] for _ in range(n)]
    share, size = total / n, 0
    for item in items:
        runs[min(n - 1, int((size + len(item[1]) / 2) // share))].append(item)
        size += len(item[1])
    return [run for run in runs if run]


class _TwoEnds:
    """The indices of a run's chunks not yet taken, handed out from either end: a pool thread
    takes from the front, the calling thread from the back.

    >>> ends = _TwoEnds([60, 60, 60, 200])
    >>> ends.take(128, back=False), ends.take(128, back=True), ends.take(128, back=False)
    ((0, 2), (3, 4), (2, 3))
    """

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths
        self.lo, self.hi = 0, len(lengths)
        self._lock = threading.Lock()

    def take(self, chars: int, back: bool) -> tuple[int, int] | None:
        """The next chunks, as many as fit in ``chars`` characters (at least one), as a range
        [a, b) of indices, or None: all taken."""
        with self._lock:
            if self.lo >= self.hi:
                return None
            if back:
                a, b = self.hi - 1, self.hi
                size = self.lengths[a]
                while a > self.lo and size + self.lengths[a - 1] <= chars:
                    a -= 1
                    size += self.lengths[a]
                self.hi = a
            else:
                a, b = self.lo, self.lo + 1
                size = self.lengths[a]
                while b < self.hi and size + self.lengths[b] <= chars:
                    size += self.lengths[b]
                    b += 1
                self.lo = b
            return a, b


def affixed_view(ids, add_special_tokens: bool, n_prefix: int, n_suffix: int) -> memoryview:
    """A read-only view of an ID buffer (prefix + body + suffix) with the post-processor's
    affixes (``add_special_tokens``) or without them: the two results one buffer serves."""
    return ids.view() if add_special_tokens else ids.view(n_prefix, len(ids) - n_suffix)


class ChunkEncoder:
    """Encodes chunks of admitted text on a tokenizer's encoders (see the module docstring).

    ``general`` (the fast encoder of every text class with the rules that guard it, or the
    reference), ``specialist`` (gigatoken, for ``specialist_classes`` of text) and ``reference``
    are read at each call: the controls of the exactness battery replace them (test seams)."""

    def __init__(self, loaded: LoadedFile, knobs: dict[str, Any], chunker: Chunker) -> None:
        a = loaded.admission
        self.rules = loaded.rules
        self.prefix: tuple[int, ...] = a.prefix  # IDs the post-processor puts before the text
        self.suffix: tuple[int, ...] = a.suffix  # ... and after it
        self.chunker = chunker
        self.scan_budget = knobs["scan_budget"][-1]
        self.threads = knobs["threads"] or default_threads(available_cpus())
        self.thread_renew_chars = knobs["thread_renew_chars"]
        self.auto_threads = knobs["threads"] is None  # split only where it pays (useful_threads)
        self._reference_tokenizer = loaded.reference
        self.reference = ReferenceEncoder(loaded.reference)
        use_fast = loaded.fast is not None and knobs["encoder"] != "reference"
        self.general = GuardedEncoder(loaded.fast if use_fast else self.reference, loaded.rules,
                                      loaded.nfc_by_fast)
        self.specialist: GuardedEncoder | None = loaded.specialist if use_fast else None
        self.specialist_classes = loaded.specialist_classes if use_fast else frozenset()
        self.split_saving = self._split_saving()  # the split rule's bound (split_pays)
        # encode_special_tokens: special-token strings are plain text to the reference, while
        # the fast encoders would match them; stretches holding one go to the reference
        self.plain_specials = loaded.plain_specials
        self._plain_special_starts = tuple({t[:2] for t in loaded.admission.special_tokens}) \
            if loaded.plain_specials is not None else ()
        self._stretch_counts = {"fast": 0, "reference": 0, "specialist": 0}
        self._executor: EncodeThreads | None = None
        self._renewals_closed = 0  # renewals of the threads close() stopped
        self._lock = threading.Lock()
        if loaded.upgrade is not None and knobs["encoder"] != "reference":
            loaded.upgrade.subscribe(self)  # the fast encoder comes when its probes are done

    def _split_saving(self) -> int:
        one_bpe_thread = self.general.encoder.name == "fastokens" and fastokens_bpe_threads() == 1
        return AUTO_SPLIT_SAVING if one_bpe_thread else AUTO_SPLIT_SAVING_BESIDE_BPE_THREADS

    def take_fast(self, parts: FastParts) -> None:
        """Serve with the fast encoders from now on (their guard probes finished after the
        load). A call already running finishes on the encoders it read: each is exact."""
        self.specialist, self.specialist_classes = parts.specialist, parts.specialist_classes
        self.rules = parts.rules
        self.general = GuardedEncoder(parts.encoder, parts.rules, parts.nfc_by_fast)
        self.split_saving = self._split_saving()

    # --- encoding -------------------------------------------------------------------------

    def encode_texts(self, chunks: list[str], batch: bool = False) -> list[list]:
        """Body IDs of each chunk, encoded independently: for each chunk, the list of its int32
        buffers. Several long chunks are shared out among the ``threads`` in contiguous runs,
        each thread routing and encoding its own run (the scans that decide the routes then run
        in parallel too, not all before the encodes in the calling thread). Otherwise the
        stretches that must go to the reference are sent in at most ``threads`` calls (one with
        ``batch``: short texts of a batch), and the rest in at most ``threads`` calls to each
        fast encoder."""
        if not chunks:
            return []
        if self.general.encoder is self.reference:
            self._count(reference=len(chunks))
            if batch:
                return [[ids] for ids in self.reference.encode_many(chunks)]
            return [[ids] for ids in self._map(self.reference.encode, chunks)]
        general = self.general
        if self.specialist is None and sum(map(len, chunks)) < 2 * PARALLEL_MIN_CHARS \
                and all(self.fast_may_take(general, p) for p in chunks):
            # what the routing below decides for a few short chunks the fast encoder may take
            # whole (a session's turn): one call, without its lists and groups
            self._count(fast=len(chunks))
            return [[ids] for ids in general.encoder.encode_many(chunks)]
        runs = [] if batch or len(chunks) == 1 or testing.is_off(testing.OFF_RUNS) \
            else self._groups(list(enumerate(chunks)), True)
        if len(runs) > 1:
            return self._encode_runs(runs)
        return self._encode_routed(chunks, True, batch)

    def _encode_runs(self, runs: list[list]) -> list[list]:
        """:meth:`encode_texts` of runs of (slot, chunk) items, each run routed and encoded on a
        thread of its own, the first on this one. A pool thread takes its run's chunks from
        the front, up to RUN_STEP_CHARS characters a step; this thread, done with its own
        run, takes what is left of the others from the back (so it never waits for a pool
        thread that got its CPU late, or shares it, to the end of its run) and then waits only
        for the steps the pool threads are encoding."""
        texts = [[p for _, p in run] for run in runs]
        out: list[list] = [[None] * len(run) for run in texts]
        ends = [_TwoEnds([len(p) for p in run]) for run in texts]
        step = 1 << 62 if testing.is_off(testing.OFF_STEPS) else RUN_STEP_CHARS
        two_ends = not testing.is_off(testing.OFF_TWO_ENDS)

        def drain(k: int, back: bool) -> None:
            while (taken := ends[k].take(step, back)) is not None:
                a, b = taken
                out[k][a:b] = self._encode_routed(texts[k][a:b], False)

        pending = self._pool().beside([partial(drain, k, False) for k in range(1, len(runs))],
                                      sum(map(len, (p for run in texts[1:] for p in run))))
        out[0] = self._encode_routed(texts[0], False)
        for k in range(1, len(runs)):
            if two_ends:
                drain(k, True)
        for k, fut in enumerate(pending, 1):
            if fut.cancel():  # one that never started has nothing left to do, or all its run
                drain(k, False)
            else:
                fut.result()
        return [ids for run in out for ids in run]

    def _encode_routed(self, chunks: list[str], parallel: bool, batch: bool = False
                       ) -> list[list]:
        """:meth:`encode_texts` of chunks routed here; ``parallel``: the calls to each encoder
        are shared out among the threads, else all made in this thread."""
        testing.run_hook(testing.CHUNKS_ROUTED, chunks)

        def groups(items: list, fast: bool, one: bool = False) -> list[list]:
            return self._groups(items, fast, one) if parallel else [items] if items else []

        guarded = [self.general] if self.specialist is None else [self.general, self.specialist]
        by_guarded: list[list] = [[] for _ in guarded]  # (slot, stretch) for each fast encoder
        slow: list[tuple[int, str]] = []
        owner: list[int] = []  # slot -> chunk index
        for i, chunk in enumerate(chunks):
            k = 1 if len(guarded) > 1 and text_class(chunk) in self.specialist_classes else 0
            for a, b, why in self.stretches(chunk, guarded[k]):
                text = chunk[a:b]  # one slice: the one whose UTF-8 a route may have written
                if why is not None and len(guarded) > 1 \
                        and self.fast_may_take(guarded[1 - k], text):
                    by_guarded[1 - k].append((len(owner), text))  # the other fast encoder
                    owner.append(i)
                    continue
                (by_guarded[k] if why is None else slow).append((len(owner), text))
                owner.append(i)
        self._count(fast=len(by_guarded[0]), reference=len(slow),
                    specialist=len(by_guarded[1]) if len(guarded) > 1 else 0)
        calls = [(each.encoder.encode_many, g)
                 for each, items in zip(guarded, by_guarded) for g in groups(items, True)]
        calls += [(self.reference.encode_stretches, g) for g in groups(slow, False, batch)]
        jobs = [partial(fn, [t for _, t in g]) for fn, g in calls]
        results: list = [None] * len(owner)
        if parallel:  # counted only where jobs may be handed to the threads
            answers = self._at_once(jobs, sum(len(t) for _, g in calls[1:] for _, t in g))
        else:
            answers = [job() for job in jobs]
        for (_, g), answer in zip(calls, answers):
            for (j, _), ids in zip(g, answer):
                results[j] = ids
        out: list[list] = [[] for _ in chunks]
        for j, i in enumerate(owner):
            out[i].append(results[j])
        return out

    def encode_body(self, text: str) -> list:
        """Body IDs of one text as a list of buffers, cut into chunks where the stateless route
        cuts it (:meth:`stateless_cuts`)."""
        cuts = self.stateless_cuts(text)
        if cuts:
            return [p for parts in self.encode_texts(split_at(text, cuts)) for p in parts]
        if self.specialist is None and self.general.encoder is not self.reference \
                and self.fast_may_take(self.general, text):
            # one chunk, one fast encoder, all of it: the call encode_texts would make, without
            # its routing lists and thread groups (run cold, as a server's next request finds
            # the caches, those took ~0.1 ms of a 4 ms encode of 1M characters)
            self._count(fast=1)
            return [self.general.encoder.encode(text)]
        return self.encode_texts([text])[0]

    def encode_whole(self, text: str, headroom: int = 0) -> IdBuffer:
        """prefix + IDs + suffix of one text by the stateless route, in one buffer with
        ``headroom`` spare capacity; for input the reference rejects (e.g. a lone surrogate),
        whatever the reference does with the whole text."""
        return self._whole(text, self._body_or_none(text), headroom)

    def encode_view(self, text: str, add_special_tokens: bool) -> memoryview:
        """:meth:`encode_whole` as a read-only int32 view, with the post-processor's affixes or
        without. A text encoded in one chunk with nothing to add around it is the encoder's
        own buffer, not a copy (1M characters of prose: ~1 MB of IDs, whose copy took 0.05 ms
        with hot caches, 1-2% of the encode)."""
        parts = self._body_or_none(text)
        if parts is not None and len(parts) == 1 \
                and not (add_special_tokens and (self.prefix or self.suffix)):
            view = memoryview(parts[0])
            if view.format == "i" and view.ndim == 1 and view.c_contiguous:
                return view.toreadonly()
        return affixed_view(self._whole(text, parts), add_special_tokens, len(self.prefix),
                            len(self.suffix))

    def _body_or_none(self, text: str) -> list | None:
        """:meth:`encode_body`, or None for input the reference must judge whole."""
        try:
            return self.encode_body(text)
        except Exception:
            return None

    def _whole(self, text: str, parts: list | None, headroom: int = 0) -> IdBuffer:
        """prefix + ``parts`` + suffix in one buffer; ``parts`` None: the reference's encode of
        the whole text."""
        if parts is None:
            return self.encode_by_reference(text, True)
        return IdBuffer.concat(parts, self.prefix, self.suffix, headroom)

    def encode_by_reference(self, text, add_special_tokens) -> IdBuffer:
        """One reference encode of the whole text, post-processing by the reference (the route
        for files that are not admitted, and for input the reference must judge: its own
        exception for input it rejects)."""
        ref = self._reference_tokenizer
        if type(text) is str and type(add_special_tokens) is bool:
            try:
                (enc,) = ref.encode_batch_fast([text], add_special_tokens=add_special_tokens)
                return ids_from_list(enc.ids)
            except Exception:
                pass  # fall through: the reference's own encode raises its own exception
        return ids_from_list(ref.encode(text, add_special_tokens=add_special_tokens).ids)

    # --- routing --------------------------------------------------------------------------

    def encoding_cost(self, chars: int) -> int:
        """Encoding ``chars`` characters, in characters of a fast encoder's work (the
        reference's count REFERENCE_WEIGHT each): what an answer's budget is counted in."""
        return chars * REFERENCE_WEIGHT if self.general.encoder is self.reference else chars

    def chunk_target(self, text: str) -> int:
        """The chunk length the stateless route aims at for ``text``, up to
        LONGEST_FAST_CHUNK: on a fast encoder, one chunk per encoding thread for Latin text
        (:func:`text_class`); else the knob ``chunk_target`` (the reference's cost per chunk
        grows faster than linearly with the chunk's length; a fast encoder's other text in
        long chunks did not pay: docs/knobs.md#chunks)."""
        target = self.chunker.target
        if self.general.encoder is self.reference or self.specialist is not None:
            return target
        if text_class(text) != ONE_BYTE_TEXT:
            return target
        threads = self.useful_threads(len(text), 1)
        return max(target, min(LONGEST_FAST_CHUNK, -(-len(text) // threads)))

    def chunk_count(self, text: str) -> int:
        """How many chunks the stateless route cuts ``text`` into (of about
        :meth:`chunk_target` characters; 1 below the knob ``chunk_threshold``)."""
        n = len(text)
        if n < self.chunker.threshold:  # the common case: no class sampling at all
            return 1
        return self.chunker.count(n, self.chunk_target(text))

    def stateless_cuts(self, text: str) -> list[int]:
        """Where the stateless route cuts ``text`` into :meth:`chunk_count` chunks: a first
        encode of a session is cut there too."""
        k = self.chunk_count(text)
        return self.chunker.cuts(text, k) if k > 1 else []

    def stretches(self, chunk: str, guarded: GuardedEncoder | None = None
                 ) -> list[tuple[int, int, str | None]]:
        """[(start, end, why)]: the chunk's stretches, each for one encoder: why is None for those
        the fast encoder (of ``guarded``: the general one by default) may take, else why the
        stretch goes elsewhere. Stretches start and end at safe cuts, so their IDs concatenate
        to the chunk's; stretches closer than COALESCE_GAP characters are merged (one stretch
        instead of three)."""
        _, rules, nfc_by_fast = self.general if guarded is None else guarded
        check_nfc = rules.nfc and not nfc_by_fast
        route, at = rules.route(chunk, nfc=check_nfc, utf8=True)  # its UTF-8 if all fast
        plain_specials = self.plain_specials_in(chunk)
        uncut = self.cut_free_stretches(chunk, rules)
        if route == ROUTE_FAST and not plain_specials and not uncut:
            return [(0, len(chunk), None)]
        marked = [(a, b, f"special-token text {chunk[a:b]!r} at {a} (encode_special_tokens)")
                  for a, b in plain_specials]
        marked += [(a, b, f"no safe cut for {b - a} characters at {a}") for a, b in uncut]
        if route == ROUTE_GUARD:  # the first guard character is at `at`: scan on from there
            marked += [(a, b, f"guard character U+{ord(chunk[a]):04X} at {a}")
                       for a, b in rules.guard_spans(chunk, at)]
        if check_nfc and route != ROUTE_FAST:
            marked += [(a, c, f"not NFC at {a}") for a, c in self.unstable(chunk)]
        if not marked:
            return [(0, len(chunk), None)]
        marked.sort()
        stretches = rules.isolate(chunk, [(a, b) for a, b, _ in marked], self.scan_budget)
        merged: list[list[int]] = []
        for a, b in stretches:
            if merged and a - merged[-1][1] < COALESCE_GAP:
                merged[-1][1] = b
            else:
                merged.append([a, b])
        out: list[tuple[int, int, str | None]] = []
        pos, k = 0, 0
        for a, b in merged:
            if a > pos:
                out.append((pos, a, None))
            while k + 1 < len(marked) and marked[k][1] <= a:
                k += 1
            out.append((a, b, marked[k][2]))
            pos = b
        if pos < len(chunk):
            out.append((pos, len(chunk), None))
        return out

    def fast_may_take(self, guarded: GuardedEncoder, text: str) -> bool:
        """Whether ``guarded``'s fast encoder may encode all of ``text``: no guard character, no
        text NFC would change (unless its NFC is proven), no special-token text taken
        literally, no over-long cut-free stretch."""
        return (guarded.rules.route(text, nfc=not guarded.nfc_by_fast, utf8=True)[0] == ROUTE_FAST
                and not self.plain_specials_in(text)
                and not self.cut_free_stretches(text, guarded.rules))

    def cut_free_stretches(self, chunk: str, rules: CutRules) -> list[tuple[int, int]]:
        """The stretches of the chunk between safe cuts (of ``rules``, a guarded encoder's)
        longer than LONGEST_FAST_STRETCH: the reference's (see that constant)."""
        if len(chunk) <= LONGEST_FAST_STRETCH or testing.is_off(testing.CHECK_LONG_STRETCHES):
            return []
        return rules.cut_free_stretches(chunk, LONGEST_FAST_STRETCH)

    def plain_specials_in(self, chunk: str) -> list[tuple[int, int]]:
        """Where special-token strings stand in the chunk, when they are plain text
        (``encode_special_tokens``): the stretches no fast encoder may take."""
        if self.plain_specials is None or testing.is_off(testing.CHECK_PLAIN_SPECIALS) \
                or not any(p in chunk for p in self._plain_special_starts):
            return []
        return self.plain_specials.find_all(chunk)

    def unstable(self, chunk: str) -> list[tuple[int, int]]:
        """The NFC windows of the chunk that the reference normalizer would change (one
        normalizer call over all windows; by bisection if the chunk holds the separator)."""
        rules = self.rules
        if rules is None:  # only an admitted file's text is cut and checked
            raise ValueError("NFC windows need an admitted file's cut rules")
        found = rules.unstable_windows(chunk)
        if found is not None:
            return found
        normalize = self._reference_tokenizer.normalizer.normalize_str
        windows = rules.nfc_windows(chunk)
        texts = [chunk[a:c] for a, c in windows]

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

    def routes(self, chunks: list[str]) -> list[str]:
        """For each chunk, "fast", or which of its stretches go to the reference and why."""
        if self.general.encoder is self.reference:
            return ["reference"] * len(chunks)
        out = []
        for chunk in chunks:
            away = [(a, b, why) for a, b, why in self.stretches(chunk) if why is not None]
            if not away:
                out.append("fast")
            else:
                n = sum(b - a for a, b, _ in away)
                out.append(f"reference for {n} of {len(chunk)} chars ({len(away)} stretch(es), "
                           f"first: {away[0][2]})")
        return out

    def counts(self) -> dict[str, int]:
        """Chunks each encoder took so far, and how often the encoding threads were renewed."""
        executor = self._executor
        with self._lock:
            return {"fast_pieces": self._stretch_counts["fast"],
                    "reference_pieces": self._stretch_counts["reference"],
                    "second_pieces": self._stretch_counts["specialist"],
                    "thread_renewals": self._renewals_closed
                    + (executor.renewals if executor is not None else 0)}

    def close(self) -> None:
        """Stop the encoder threads (they are also stopped when this object is collected)."""
        if self._executor is not None:
            self._renewals_closed += self._executor.renewals
            self._executor.shutdown(wait=True)
            self._executor = None

    # --- threads --------------------------------------------------------------------------

    def useful_threads(self, chars: int, weight: float) -> int:
        """The threads worth sharing ``chars`` characters of work among, each worth ``weight``
        characters of Latin text on a fast encoder: ``threads``, or with the threads left to
        dtok, 1 where an even split would not pay (:meth:`split_pays`: on two threads 800K
        characters of a fast encoder's text stay on one thread, 1M go on two)."""
        n = self.threads
        if n > 1 and not self.split_pays(chars, chars / n, weight):
            return 1
        return n

    def split_pays(self, chars: float, largest: float, weight: float) -> bool:
        """Whether sharing ``chars`` characters of work (each worth ``weight`` characters of
        Latin text on a fast encoder) among threads, the largest share ``largest`` characters,
        is worth it: always with an explicit ``threads``; with the threads left to dtok, where
        it saves at least :attr:`split_saving` (the other shares' work, which the other threads
        take off the largest's thread; AUTO_SPLIT_SAVING where fastokens runs one BPE thread a
        call, AUTO_SPLIT_SAVING_BESIDE_BPE_THREADS otherwise)."""
        bound = AUTO_SPLIT_SAVING_BESIDE_BPE_THREADS if testing.is_off(testing.OFF_TWO_BOUNDS) \
            else self.split_saving
        return not self.auto_threads or (chars - largest) * weight >= bound

    def split_threads(self, chunks: list[str]) -> int:
        """The threads :meth:`encode_texts` shares a text's chunks among: the
        decision it makes, for ``explain``."""
        if self.general.encoder is self.reference:
            return min(self.threads, len(chunks))
        return max(1, len(self._groups(list(enumerate(chunks)), True)))

    def _groups(self, items: list, fast: bool, one: bool = False) -> list[list]:
        """Split (slot, text) items into groups of about equal length, one encoder call each:
        at most :meth:`useful_threads` of them for the items' work (``fast``: text for a fast
        encoder; else stretches for the reference, REFERENCE_WEIGHT a character); short work
        stays in one group (a thread hand-off costs more)."""
        if not items:
            return []
        total = sum(len(t) for _, t in items)
        n = 1 if one else min(self.threads, len(items), max(1, total // PARALLEL_MIN_CHARS))
        if n > 1:
            weight = 1 if fast else REFERENCE_WEIGHT
            n = min(n, self.useful_threads(total, weight))
        if n == 1:
            return [items]
        groups = _even_runs(items, n, total)
        # uneven items (a chunk's two stretches around a guard character, one of them short)
        # make uneven groups: the split must pay as they are, not as an even one would
        largest = max(sum(len(t) for _, t in grp) for grp in groups)
        return groups if self.split_pays(total, largest, weight) else [items]

    def _count(self, fast: int = 0, reference: int = 0, specialist: int = 0) -> None:
        with self._lock:
            self._stretch_counts["fast"] += fast
            self._stretch_counts["reference"] += reference
            self._stretch_counts["specialist"] += specialist

    def _at_once(self, jobs: list, chars: int) -> list:
        """The results of ``jobs`` (callables), in order: the first run in this thread while the
        others, handed out before it starts, run on the thread pool (off this thread's CPU,
        :mod:`dtok.encode_threads`); a job no pool thread has started by the time this thread
        is done is run here, so a pool thread that gets no CPU in time is not waited for. On
        one thread, in turn (a hand-off to a pool thread on the same core only adds a
        switch). ``chars``: the characters of text ``jobs[1:]`` encode."""
        if len(jobs) <= 1 or self.threads == 1:
            return [job() for job in jobs]
        pending = self._pool().beside(jobs[1:], chars)
        first = jobs[0]()
        return [first, *(job() if fut.cancel() else fut.result()
                         for job, fut in zip(jobs[1:], pending))]

    def _map(self, fn, items: list) -> list:
        if self.threads == 1 or len(items) == 1:
            return [fn(x) for x in items]
        return list(self._pool().map(fn, items, sum(map(len, items))))

    def _pool(self) -> EncodeThreads:
        if self._executor is None:
            # imported when first needed: 1 MiB of RSS in a process that encodes on one thread
            from dtok.encode_threads import EncodeThreads

            with self._lock:
                if self._executor is None:
                    self._executor = EncodeThreads(self.threads, self.thread_renew_chars)
        return self._executor
