"""Loading a tokenizer file: the reference, its admission, the cut rules, and the fast encoders
behind their guard tables (:mod:`dtok.guards`). What this makes is one :class:`LoadedFile`
record, shared by every :meth:`dtok.Tokenizer.with_knobs` copy of a tokenizer."""
from __future__ import annotations

import os
import threading
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

from dtok import guards, tables
from dtok.allocator import release_free_heap
from dtok.admission import Admission, TokenizerFiles, admit
from dtok.encoders import (FastEncoder, FastEncoderError, GigaEncoder, JsonFile, available_cpus,
                           fastokens_version, gigatoken_version)
from dtok.logs import logger
from dtok.reference import load as load_reference
from dtok_ext.cuts import CutRules
from dtok_ext.specials import SpecialMatcher

if TYPE_CHECKING:  # the probes' module is imported when probes start
    from dtok.probes import ProbeJob

__all__ = ["GuardedEncoder", "LoadedFile", "FastParts", "Upgrade", "load", "fast_parts_from_cache",
           "SPECIALIST_WINS"]

# The specialist encoder takes a text class when its guard table measured it at most this
# fraction of fastokens' time on that class (a margin over the measurement's noise).
SPECIALIST_WINS = 0.9


class GuardedEncoder(NamedTuple):
    """A fast encoder with the file's cut rules carrying its own guard characters: a chunk's
    stretches those rules let through are the encoder's, the rest go elsewhere."""

    encoder: Any
    rules: CutRules
    nfc_by_fast: bool  # its guard table proves its NFC equals the reference's


class LoadedFile(NamedTuple):
    """The parts loading a file made. ``fast``: the general fast encoder, of every text class
    (None: the reference encodes everything), guarded by ``rules``; ``specialist``: gigatoken,
    guarded, where it serves ``specialist_classes`` of text
    (:func:`dtok.chunk_encoder.text_class`)."""

    files: TokenizerFiles  # without the JSON bytes (see Tokenizer.tokenizer_json)
    reference: Any  # tokenizers.Tokenizer
    admission: Admission
    rules: CutRules | None  # None: not admitted
    fast: Any  # FastEncoder | GigaEncoder | None
    nfc_by_fast: bool  # the general encoder's guard table proves its NFC equals the reference's
    specialist: GuardedEncoder | None
    specialist_classes: frozenset[str]
    notes: tuple[str, ...]  # what was loaded and why (Tokenizer.stats()["notes"])
    # encode_special_tokens: the reference takes special-token strings as plain text; they are
    # found by ``plain_specials`` in chunks, whose stretches the fast encoders (which would
    # match them) never get
    encode_special_tokens: bool = False
    plain_specials: SpecialMatcher | None = None
    # where no guard table covered the file: the background probes and what they bring
    upgrade: "Upgrade | None" = None
    # the SHA-256 its guard tables are keyed by (its own, or an equivalent known file's)
    table_sha: str = ""


def load(files: TokenizerFiles, encoder: str = "auto",
         encode_special_tokens: bool = False, guard_probes: str = "background") -> LoadedFile:
    """Load ``files``; ``encoder``, ``encode_special_tokens`` and ``guard_probes`` are the knobs
    of those names ("reference": no fast encoder is loaded; "fast": FastEncoderError unless
    one is; ``guard_probes="background"``: where no guard table covers the file, probe for one
    in the background (:mod:`dtok.probes`) and take the fast encoder when it is done)."""
    try:
        reference = load_reference(files.raw)
    except Exception:
        files.outline()  # a file that is not JSON gets dtok's clear ValueError
        raise
    # parsed only after the reference has loaded and freed its own parse: a lower peak
    admission = admit(files, files.outline(), reference)
    notes: list[str] = []
    rules, fast = None, _NO_FAST
    upgrade = None
    table_sha = admission.sha256
    if admission.admitted:
        maker = _RuleMaker(admission, reference, encode_special_tokens)
        path = files.path
        if encoder != "reference":
            table_sha = _table_sha(files, admission, notes)
            with JsonFile(files.raw or reference.to_str().encode("utf-8")) as json_file:
                # the memory file holds the bytes now: a caller that handed them over (a path
                # given to Tokenizer) lets them go here, before the fast encoders parse
                files = files.released()
                fast = _fast_parts(json_file, reference, admission, table_sha,
                                   encoder == "fast", notes, maker)
        if fast.encoder is None and guard_probes == "background" \
                and fastokens_version() is not None and not encode_special_tokens:
            # (with encode_special_tokens the fast encoder's load check, which compares
            # with the reference's default behaviour, could not run on the live reference);
            # a reference-only load probes only when someone asks (Upgrade.notify: a pool)
            upgrade = Upgrade(path, table_sha, takes_fast=encoder != "reference")
        rules = fast.rules or maker.rules()
    elif encoder == "fast":
        raise FastEncoderError("encoder='fast' needs an admitted file: "
                               + "; ".join(admission.reasons))
    plain_specials = None
    if encode_special_tokens:
        # set only now: admission and the fast encoders' load checks compare with the
        # reference's default behaviour
        reference.encode_special_tokens = True
        if admission.admitted and admission.special_tokens:
            plain_specials = SpecialMatcher(admission.special_tokens)
            notes.append(f"encode_special_tokens: {len(admission.special_tokens)} special-token "
                         "strings are plain text; stretches holding one go to the reference")
    loaded = LoadedFile(files.released(), reference, admission, rules, fast.encoder,
                        fast.nfc_by_fast, fast.specialist, fast.specialist_classes,
                        tuple(notes), encode_special_tokens, plain_specials, upgrade, table_sha)
    if upgrade is not None:
        upgrade.attach(loaded)
    _release_free_heap()
    return loaded


class FastParts(NamedTuple):
    """The fast encoders of a file and the cut rules that guard the general one."""

    encoder: Any  # FastEncoder | GigaEncoder | None
    rules: CutRules | None  # None: no fast encoder (the family's own rules serve)
    nfc_by_fast: bool
    specialist: GuardedEncoder | None
    specialist_classes: frozenset[str]


_NO_FAST = FastParts(None, None, False, None, frozenset())


class _RuleMaker:
    """The cut rules of an admitted file over a class table: the family's table, the
    added-token matchers and the normalizer, read and built once for every guarded encoder of a
    load."""

    def __init__(self, admission: Admission, reference, encode_special_tokens: bool) -> None:
        if admission.family is None:  # only an admitted file (which has a family) has rules
            raise ValueError("cut rules need an admitted file: " + "; ".join(admission.reasons))
        self.family = tables.load(admission.family)
        # with encode_special_tokens the reference matches only the added tokens not marked
        # special: those are the boundaries the cut rules know
        plain = set(admission.special_tokens) if encode_special_tokens else set()
        self.specials = SpecialMatcher([s for s in admission.added_tokens if s not in plain])
        self.declared = SpecialMatcher(list(admission.declared_tokens))
        self.normalize = reference.normalizer.normalize_str if admission.nfc else None

    def rules(self, guard: guards.GuardTable | None = None, use_nfc_proof: bool = False
              ) -> CutRules:
        """The rules over the family's table, with ``guard``'s characters added when given."""
        table = self.family.table if guard is None else guards.guarded_table(
            self.family.table, guard, use_nfc_proof)
        return CutRules(table, self.family.accept, self.specials, self.normalize, self.declared)


def _fast_parts(json_file: JsonFile, reference, admission: Admission, table_sha: str,
                strict: bool, notes: list[str], maker: _RuleMaker) -> FastParts:
    """The fast encoders whose guard tables (keyed ``table_sha``) exist, with their rules."""
    fast, guard = _load_fast(json_file, reference, admission, table_sha, strict, notes)
    giga, giga_guard = _load_giga(json_file, reference, admission, table_sha,
                                  fast is not None, notes)
    if fast is None and giga is not None:  # gigatoken is the only one
        fast, guard, giga = giga, giga_guard, None
    if fast is None:
        return _NO_FAST
    nfc_by_fast = admission.nfc and guard.nfc_proven
    rules = maker.rules(guard, nfc_by_fast)
    specialist: GuardedEncoder | None = None
    specialist_classes: frozenset[str] = frozenset()
    if giga is not None:
        nfc = admission.nfc and giga_guard.nfc_proven
        specialist = GuardedEncoder(giga, maker.rules(giga_guard, nfc), nfc)
        specialist_classes = frozenset(
            c for c, r in giga_guard.speed.get("ratio", {}).items() if r <= SPECIALIST_WINS)
    return FastParts(fast, rules, nfc_by_fast, specialist, specialist_classes)


def _table_sha(files: TokenizerFiles, admission: Admission, notes: list[str]) -> str:
    """The SHA-256 the file's guard tables are keyed by: its own where a table for it exists,
    else that of a known file with the same content (:func:`dtok.probes.equivalent_sha`)."""
    versions = [(v, name) for v, name in ((fastokens_version(), "fastokens"),
                                          (gigatoken_version(), "gigatoken")) if v]
    if not versions or any(guards.exists(admission.sha256, v, name) for v, name in versions):
        return admission.sha256
    from dtok.probes import equivalent_sha

    same = equivalent_sha(files.raw) if files.raw else None
    if same is None:
        return admission.sha256
    notes.append(f"same content as the known file {same[:16]} (serialised otherwise): its "
                 "guard tables serve")
    return same


class Upgrade:
    """A fast encoder that comes later: the background probes (:class:`dtok.probes.ProbeJob`)
    for a file with no guard table, the chunk encoders that take the fast encoder once they
    are done (each :meth:`dtok.chunk_encoder.ChunkEncoder.take_fast`), and whoever else asked to
    know (:meth:`notify`: a pool, whose workers then take the table from the cache). A load that
    takes the fast encoder (``takes_fast``) starts the probes at once; a reference-only load
    starts them when someone asks."""

    def __init__(self, path, table_sha: str, takes_fast: bool = True) -> None:
        self.path = path
        self.table_sha = table_sha
        self.takes_fast = takes_fast
        self.job: ProbeJob | None = None
        self.error = ""  # the probes could not start
        self.done = False
        self.parts: FastParts | None = None  # once done, where the load takes the fast encoder
        self.notes: list[str] = []
        self._loaded: LoadedFile | None = None
        self._waiting: "weakref.WeakSet" = weakref.WeakSet()
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def attach(self, loaded: LoadedFile) -> None:
        """The load is complete: probe now where it takes the fast encoder."""
        self._loaded = loaded
        if self.takes_fast:
            self.start()

    def start(self) -> None:
        """Start the probes (once); where the cache already holds the table, take it."""
        from dtok.probes import ProbeJob

        loaded = self._loaded
        if loaded is None:
            raise RuntimeError("guard probes asked for before the load was complete")
        with self._lock:
            if self.job is not None or self.done or self.error:
                return
            version = fastokens_version()
            cached = version is not None and guards.exists(self.table_sha, version)
            if not cached:
                path = Path(self.path) if self.path else None
                same_file = path is not None and path.is_file() \
                    and loaded.admission.sha256 == self.table_sha
                try:
                    if path is None or not same_file:  # the loaded reference's JSON: the same
                        path = tables.cache_dir() / "probes" / \
                            f"{self.table_sha[:16]}-{os.getpid()}.json"
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_text(loaded.reference.to_str())
                    self.job = ProbeJob(path, self.table_sha, self._done, same_file)
                except OSError as exc:  # no cache to write, no process to start: the reference
                    self.error = f"{type(exc).__name__}: {exc}"
                return
        self._done(None)

    def subscribe(self, chunk_encoder) -> None:
        """``chunk_encoder`` takes the fast encoder when it comes (at once if it has come)."""
        with self._lock:
            parts = self.parts
            if parts is None:
                self._waiting.add(chunk_encoder)
        if parts is not None:
            chunk_encoder.take_fast(parts)

    def notify(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the file's guard table is in the cache (at once if it is),
        starting the probes if they have not started."""
        with self._lock:
            done = self.done
            if not done:
                self._callbacks.append(callback)
        if done:
            callback()
        else:
            self.start()

    def _done(self, table) -> None:
        """The table is in the cache (``table``: what the job wrote, or None where the cache
        held it already): take it, and tell whoever asked."""
        loaded = self._loaded
        if loaded is None:  # the job's callback: attach() sets it before the job begins
            raise RuntimeError("guard probes ended before they were started")
        parts: FastParts | None = None
        notes: list[str] = []
        if self.takes_fast:
            parts, notes = fast_parts_from_cache(loaded, self.table_sha)
            if parts is None:
                raise RuntimeError("; ".join(notes) or "the guard table left no fast encoder")
        with self._lock:
            self.parts, self.notes, self.done = parts, notes, True
            waiting, callbacks = list(self._waiting), self._callbacks
            self._waiting.clear()
            self._callbacks = []
        for chunk_encoder in waiting:
            chunk_encoder.take_fast(parts)
        for callback in callbacks:
            callback()
        _release_free_heap()

    def status(self, wait: float | None = None) -> dict[str, Any]:
        """The probes' state (``stats()['probes']``), after waiting up to ``wait`` seconds for
        them to end."""
        if self.error:
            return {"state": "failed", "error": self.error}
        if self.job is None:
            return {"state": "done" if self.done else "none"}
        if wait is not None:
            self.job.wait(wait)
        return self.job.status()


def fast_parts_from_cache(loaded: LoadedFile, table_sha: str | None = None
                          ) -> tuple[FastParts | None, list[str]]:
    """The fast encoders of ``loaded`` behind the guard tables the cache holds now (written
    since the load by probes, by another process or by ``dtok guards``), with notes; (None,
    notes) where none covers the file."""
    notes: list[str] = []
    version = fastokens_version()
    sha = table_sha or loaded.table_sha or loaded.admission.sha256
    if not loaded.admission.admitted or loaded.encode_special_tokens or version is None \
            or not guards.exists(sha, version):
        return None, notes
    with JsonFile(loaded.reference.to_str().encode("utf-8")) as json_file:
        parts = _fast_parts(json_file, loaded.reference, loaded.admission, sha, True, notes,
                            _RuleMaker(loaded.admission, loaded.reference, False))
    _release_free_heap()
    return (parts if parts.encoder is not None else None), notes


def _load_fast(json_file: JsonFile, reference, admission: Admission, table_sha: str,
               strict: bool, notes: list[str]):
    """The fast encoder and its guard table, or (None, None) and a note saying why not."""
    version = fastokens_version()
    guard = guards.load(table_sha, version) if version else None
    if guard is None and not strict:
        notes.append("fastokens is not installed (pip install 'dtok[fast]')" if version is None
                     else "no guard table for this file and versions: the reference serves "
                     "until the guard probes are done (stats()['probes'])")
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
        logger().warning("dtok: building the fast encoder's guard table (minutes)")
        guard = guards.build(reference, fast, table_sha,
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


def _load_giga(json_file: JsonFile, reference, admission: Admission, table_sha: str,
               fast_loaded: bool, notes: list[str]):
    """gigatoken and its guard table, where a table was built and (next to fastokens) it
    measured faster on some text class; else (None, None), with a note."""
    version = gigatoken_version()
    guard = guards.load(table_sha, version, "gigatoken") if version else None
    if guard is None:
        if version is not None:
            notes.append("gigatoken: no guard table for this file and versions")
        return None, None
    if admission.nfc and not guard.nfc_proven:
        # its NFC differs from the reference's even on text the reference leaves as it is
        # (it reorders marks the reference does not), so the NFC check cannot protect it
        notes.append("gigatoken: not used (its NFC is not proven for this file)")
        return None, None
    wins = sorted(c for c, r in guard.speed.get("ratio", {}).items() if r <= SPECIALIST_WINS)
    if fast_loaded and not guard.speed:
        notes.append("gigatoken: not loaded (no speed measurement in its guard table)")
        return None, None
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
    """Give the heap that loading freed back to the system: parsing a tokenizer file (the
    reference's and dtok's own parse) leaves freed heap in the process, which glibc keeps
    unless asked (docs/benchmarks.md#a-loaded-tokenizers-memory-step-by-step)."""
    release_free_heap()
