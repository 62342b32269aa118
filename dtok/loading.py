"""Loading a tokenizer file: the reference, its admission, the cut rules, and the fast encoders
behind their guard tables (:mod:`dtok.guards`). What this makes is one :class:`Loaded` record,
shared by every :meth:`dtok.Tokenizer.with_knobs` copy of a tokenizer."""
from __future__ import annotations

from typing import Any, NamedTuple

from dtok import guards, tables
from dtok.admission import Admission, TokenizerFiles, admit
from dtok.encoders import (FastEncoder, FastEncoderError, GigaEncoder, JsonFile, available_cpus,
                           fastokens_version, gigatoken_version)
from dtok.logs import logger
from dtok_ext.cuts import CutRules
from dtok_ext.specials import SpecialMatcher

__all__ = ["Lane", "Loaded", "load", "SECOND_WINS", "LONG_PIECE_WINS"]

# The second fast encoder takes a text class when its guard table measured it at most this
# fraction of fastokens' time on that class (a margin over the measurement's noise).
SECOND_WINS = 0.9
# fastokens takes text of a class other than Latin in long pieces (one a thread, where one
# thread encodes it) when its guard table measured a whole 1M-character document at most this
# fraction of the time of the same document cut (tools/data/build_guards.py --long-pieces): cut
# text also costs the route's work per piece, which that does not measure. Measured (AMD EPYC,
# one pinned CPU): Llama-3.1 0.93-0.96 and DeepSeek-V3 0.92-0.93 in three runs each, gpt-oss
# 1.22, Qwen3 1.84 (its NFC: the 64K pieces stay there).
LONG_PIECE_WINS = 1.0


class Lane(NamedTuple):
    """A fast encoder with the file's cut rules carrying its own guard characters."""

    encoder: Any
    rules: CutRules
    nfc_by_fast: bool  # its guard table proves its NFC equals the reference's


class Loaded(NamedTuple):
    """The parts loading a file made. ``fast``: the main fast encoder (None: the reference
    encodes everything), guarded by ``rules``; ``second``: gigatoken's lane where it serves
    ``second_classes`` of text (:func:`dtok.pieces.text_class`)."""

    files: TokenizerFiles  # without the JSON bytes (see Tokenizer.tokenizer_json)
    reference: Any  # tokenizers.Tokenizer
    admission: Admission
    rules: CutRules | None  # None: not admitted
    fast: Any  # FastEncoder | GigaEncoder | None
    nfc_by_fast: bool  # the main encoder's guard table proves its NFC equals the reference's
    second: Lane | None
    second_classes: frozenset[str]
    notes: tuple[str, ...]  # what was loaded and why (Tokenizer.stats()["notes"])
    # text classes the main fast encoder takes in long pieces on one thread (LONG_PIECE_WINS;
    # Latin text on every file)
    long_piece_classes: frozenset[str]
    # encode_special_tokens: the reference takes special-token strings as plain text; they are
    # found by ``literal`` in pieces, whose stretches the fast encoders (which would match
    # them) never get
    encode_special_tokens: bool = False
    literal: SpecialMatcher | None = None


def load(files: TokenizerFiles, encoder: str = "auto",
         encode_special_tokens: bool = False) -> Loaded:
    """Load ``files``; ``encoder`` and ``encode_special_tokens`` are the knobs of those names
    ("reference": no fast encoder is loaded; "fast": FastEncoderError unless one is)."""
    from tokenizers import Tokenizer as Reference

    try:
        reference = Reference.from_buffer(files.raw)
    except Exception:
        files.outline()  # a file that is not JSON gets dtok's clear ValueError
        raise
    # parsed only after the reference has loaded and freed its own parse: a lower peak
    admission = admit(files, files.outline(), reference)
    notes: list[str] = []
    rules, fast, nfc_by_fast, second, second_classes = None, None, False, None, frozenset()
    long_piece_classes = frozenset({"latin"})
    if admission.admitted:
        t = tables.load(admission.family)
        table = t.table
        # with encode_special_tokens the reference matches only the added tokens not marked
        # special: those are the boundaries the cut rules know
        literal_set = set(admission.special_tokens) if encode_special_tokens else set()
        specials = SpecialMatcher([s for s in admission.added_tokens if s not in literal_set])
        normalize = reference.normalizer.normalize_str if admission.nfc else None
        if encoder != "reference":
            with JsonFile(files.raw or reference.to_str().encode("utf-8")) as json_file:
                # the memory file holds the bytes now: a caller that handed them over (a path
                # given to Tokenizer) lets them go here, before the fast encoders parse
                files = files.released()
                fast, guard = _load_fast(files, json_file, reference, admission,
                                         encoder == "fast", notes)
                giga, giga_guard = _load_giga(json_file, reference, admission, fast is not None,
                                              notes)
            if fast is None and giga is not None:  # gigatoken is the only one
                fast, guard, giga = giga, giga_guard, None
            if guard is not None:
                nfc_by_fast = admission.nfc and guard.nfc_proven
                table = guards.guarded_table(table, guard, nfc_by_fast)
                if guard.encoder == "fastokens":
                    long_piece_classes |= {c for c, r in guard.speed.get("long_piece", {}).items()
                                           if r <= LONG_PIECE_WINS}
            if giga is not None:
                nfc = admission.nfc and giga_guard.nfc_proven
                second = Lane(giga, CutRules(guards.guarded_table(t.table, giga_guard, nfc),
                                             t.accept, specials, normalize), nfc)
                second_classes = frozenset(
                    c for c, r in giga_guard.speed.get("ratio", {}).items() if r <= SECOND_WINS)
        rules = CutRules(table, t.accept, specials, normalize)
    elif encoder == "fast":
        raise FastEncoderError("encoder='fast' needs an admitted file: "
                               + "; ".join(admission.reasons))
    literal = None
    if encode_special_tokens:
        # set only now: admission and the fast encoders' load checks compare with the
        # reference's default behaviour
        reference.encode_special_tokens = True
        if admission.admitted and admission.special_tokens:
            literal = SpecialMatcher(admission.special_tokens)
            notes.append(f"encode_special_tokens: {len(admission.special_tokens)} special-token "
                         "strings are plain text; stretches holding one go to the reference")
    loaded = Loaded(files.released(), reference, admission, rules, fast, nfc_by_fast, second,
                    second_classes, tuple(notes), long_piece_classes, encode_special_tokens,
                    literal)
    _release_free_heap()
    return loaded


def _load_fast(files: TokenizerFiles, json_file: JsonFile, reference, admission: Admission,
               strict: bool, notes: list[str]):
    """The fast encoder and its guard table, or (None, None) and a note saying why not."""
    version = fastokens_version()
    guard = guards.load(admission.sha256, version) if version else None
    if guard is None and not strict:
        notes.append("fastokens is not installed (pip install 'dtok[fast]')" if version is None
                     else "no guard table for this file and versions (build one: dtok guards PATH)")
        return None, None
    try:
        fast = FastEncoder(json_file, reference)
    except FastEncoderError as exc:
        if strict:
            raise
        notes.append(f"fast encoder refused: {exc}")
        return None, None
    if fast.held_threads:
        notes.append("fastokens holds to one BPE thread (FASTOKENS_BPE_THREADS=1, set by dtok "
                     f"on {available_cpus()} CPUs: set the variable to choose)")
    if guard is None:
        logger().warning("dtok: building the fast encoder's guard table for %s (minutes)",
                         files.path)
        guard = guards.build(reference, fast, admission.sha256,
                             progress=lambda msg: logger().info("dtok guards: %s", msg),
                             nfc_family=admission.family if admission.nfc else None)
    notes.append(f"fastokens {fast.version}, guard table {guard.source} "
                 f"({len(guard.disagree)} disagreeing code points + unassigned)")
    if admission.nfc:
        notes.append(
            "NFC: proven to normalize as the reference (text NFC changes stays on fastokens)"
            if guard.nfc_proven else
            "NFC: not proven for this encoder; text NFC would change goes to the reference")
    return fast, guard


def _load_giga(json_file: JsonFile, reference, admission: Admission, fast_loaded: bool,
               notes: list[str]):
    """gigatoken and its guard table, where a table was built and (next to fastokens) it
    measured faster on some text class; else (None, None), with a note."""
    version = gigatoken_version()
    guard = guards.load(admission.sha256, version, "gigatoken") if version else None
    if guard is None:
        if version is not None:
            notes.append("gigatoken: no guard table for this file and versions")
        return None, None
    if admission.nfc and not guard.nfc_proven:
        # its NFC differs from the reference's even on text the reference leaves as it is
        # (it reorders marks the reference does not), so the NFC check cannot protect it
        notes.append("gigatoken: not used (its NFC is not proven for this file)")
        return None, None
    wins = sorted(c for c, r in guard.speed.get("ratio", {}).items() if r <= SECOND_WINS)
    if fast_loaded and not wins:
        notes.append("gigatoken: not loaded (its guard table measured it no faster than "
                     f"fastokens on any text class: {guard.speed})")
        return None, None
    try:
        giga = GigaEncoder(json_file, reference)
    except FastEncoderError as exc:
        notes.append(f"gigatoken refused: {exc}")
        return None, None
    notes.append(f"gigatoken {giga.version}, guard table {guard.source} ({len(guard.disagree)} "
                 f"disagreeing code points + unassigned); text classes: {wins or 'all'}")
    return giga, guard


def _release_free_heap() -> None:
    """Give the heap that loading freed back to the system (glibc only). Parsing a tokenizer
    file (the reference's and dtok's own parse) leaves ~100 MB of freed heap in the process,
    which glibc keeps unless asked; on Qwen3 this halves a loaded tokenizer's RSS."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
