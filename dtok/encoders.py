"""Body encoders: text of an admitted tokenizer -> int32 IDs, without post-processing.

Every stretch of text dtok encodes (on every route: chunked encode, session repair, pool
workers) goes through a :class:`BodyEncoder`; :mod:`dtok.chunk_encoder` decides which. Three
exist:

* :class:`ReferenceEncoder`, the ``tokenizers`` library itself (``encode_batch_fast``: no offsets,
  the GIL released), its ID list copied once into an int32 buffer;
* :class:`FastEncoder`, ``fastokens`` (Apache-2.0), a native BPE encoder that reads the same
  ``tokenizer.json`` and returns IDs as one flat little-endian uint32 buffer, used zero-copy.
  It is trusted only behind guards (:mod:`dtok.guards`) and after its loaded vocabulary, added
  tokens and post-processing are compared with the reference's;
* :class:`GigaEncoder`, ``gigatoken`` (MIT), a second native BPE encoder, trusted the same way
  behind its own guard tables (it classifies with Unicode 17 tables, the reference with
  Unicode 16: its guards differ from fastokens'). Its pre-token cache has no bound in 0.10.0
  and no public way to clear it, so dtok replaces the native instance after ``RENEW_CHARS``
  characters (see :class:`GigaEncoder`).

Both fast encoders read a str as UTF-8 (``PyUnicode_AsUTF8AndSize``); they are handed each text
with its UTF-8 already written by :func:`dtok_ext.utf8.cache_utf8` (vector loops, no GIL), where
CPython's own encoder took a fifth of fastokens' time on 1M characters of prose.
"""
from __future__ import annotations

import os
import re
import sys
from contextlib import contextmanager
from typing import Protocol

from dtok_ext.buffers import ids_from_list
from dtok_ext.utf8 import cache_utf8, cache_utf8_each

# The versions the shipped guard tables and the load checks were built for. Another release of
# the same series (its API) is used too: its guard tables are probed on first use
# (dtok.probes); another series is refused with the reason.
FASTOKENS_VERSION = "0.3.5"
GIGATOKEN_VERSION = "0.10.0"
STRETCH_CHARS = 65536  # reference stretches up to this size in all avoid the rayon pool

# fastokens reads these at construction: a whole-input cache and a segment cache are cross-call
# state dtok does not need, so they are removed from the environment while it (or a pool's
# zygote) loads.
FASTOKENS_CACHE_VARS = ("FASTOKENS_INPUT_CACHE", "FASTOKENS_SEGMENT_CACHE")
# fastokens starts BPE threads of its own for one long call, one per CPU unless
# FASTOKENS_BPE_THREADS says otherwise (read once per process, at its first long call). On a
# machine with this many CPUs or fewer, dtok holds it to one where the operator left the
# variable unset: there its threads compete with dtok's own; on many cores they are left on,
# where they speed one long call up. The bound is the one CPU count measured
# (docs/encoders.md#threads-and-fastokens-own-threads, docs/benchmarks.md#fastokens-own-threads).
FASTOKENS_OWN_THREADS_MAX_CPUS = 2


class BodyEncoder(Protocol):
    """What :mod:`dtok.chunk_encoder` asks of an encoder: body IDs, one text or several."""

    name: str

    def encode(self, text: str):
        """int32 IDs of ``text`` (no post-processing), as a C-contiguous int32 buffer."""

    def encode_many(self, texts: list[str]) -> list:
        """:meth:`encode` for several texts at once."""


class ReferenceEncoder:
    """The ``tokenizers`` library itself."""

    name = "reference"

    def __init__(self, reference) -> None:
        self.reference = reference

    def encode(self, text: str):
        (enc,) = self.reference.encode_batch_fast([text], add_special_tokens=False)
        return ids_from_list(enc.ids)

    def encode_many(self, texts: list[str]) -> list:
        return [ids_from_list(e.ids) for e in
                self.reference.encode_batch_fast(texts, add_special_tokens=False)]

    def encode_stretches(self, texts: list[str]) -> list:
        """:meth:`encode_many` for the short stretches the fast encoder may not take. Up to
        STRETCH_CHARS characters in all, each is encoded by the reference's own ``encode``, in the
        calling thread:
        ``encode_batch_fast`` hands even one text to the reference's rayon pool, whose threads
        then spin for work while the fast encoder runs (on two cores that took the fast
        encoder's core). More than that: ``encode_batch_fast``, the pool does pay."""
        if sum(map(len, texts)) > STRETCH_CHARS:
            return self.encode_many(texts)
        return [ids_from_list(self.reference.encode(t, add_special_tokens=False).ids)
                for t in texts]


class FastEncoderError(RuntimeError):
    """fastokens is missing, another version, or does not load the file as the reference does."""


def installed_version(package: str) -> str | None:
    """The installed version of ``package``, as ``importlib.metadata.version`` finds it: the
    first ``.dist-info`` of that name along ``sys.path``, its METADATA's Version. Read here
    directly because importing ``importlib.metadata`` loads ~50 modules (email, zipfile, csv,
    ...) into every process that loads a tokenizer (docs/encoders.md#memory); it is
    asked only where the lookup is not plain (no dist-info, two in one folder, no Version, a
    zip on the path)."""
    def normalized(name: str) -> str:  # PEP 503, as dist-info folder names are compared
        return re.sub(r"[-_.]+", "_", name).lower()

    wanted = normalized(package)
    for entry in sys.path:
        try:
            names = [n for n in os.listdir(entry or ".")
                     if n.endswith((".dist-info", ".egg-info"))
                     and normalized(n.split("-", 1)[0]) == wanted]
        except OSError:
            if os.path.isfile(entry):  # a zip may hold distributions: importlib reads those
                break
            continue  # a path that does not exist
        if len(names) == 1 and names[0].endswith(".dist-info"):
            version = _metadata_version(os.path.join(entry or ".", names[0], "METADATA"))
            if version is not None:
                return version
        if names:
            break
    try:
        from importlib.metadata import version as dist_version

        return dist_version(package)
    except Exception:
        return None


def _metadata_version(path: str) -> str | None:
    """The ``Version:`` header of a METADATA file (the headers end at the first blank line)."""
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break
                if line.startswith("Version:"):
                    return line[len("Version:"):].strip()
    except OSError:
        pass
    return None


def available_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def hold_fastokens_threads() -> bool:
    """Set ``FASTOKENS_BPE_THREADS=1`` where it is unset and this process may use
    FASTOKENS_OWN_THREADS_MAX_CPUS CPUs or fewer; whether dtok holds fastokens to one thread
    (now or at an earlier load). Called before fastokens' first call in the process, which
    reads the variable once: the setting is the process's, every fastokens instance in it
    gets one BPE thread."""
    global _held_fastokens_threads
    if "FASTOKENS_BPE_THREADS" not in os.environ \
            and available_cpus() <= FASTOKENS_OWN_THREADS_MAX_CPUS:
        os.environ["FASTOKENS_BPE_THREADS"] = "1"
        _held_fastokens_threads = True
    return _held_fastokens_threads and os.environ.get("FASTOKENS_BPE_THREADS") == "1"


_held_fastokens_threads = False  # whether hold_fastokens_threads set the variable


def fastokens_bpe_threads() -> int:
    """The BPE threads fastokens shares one long call among in this process:
    ``FASTOKENS_BPE_THREADS`` where set (:func:`hold_fastokens_threads` sets it on few CPUs),
    else one per usable CPU."""
    value = os.environ.get("FASTOKENS_BPE_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else available_cpus()


def fastokens_version() -> str | None:
    return installed_version("fastokens")


def gigatoken_version() -> str | None:
    return installed_version("gigatoken")


@contextmanager
def _without_cache_env():
    saved = {k: os.environ.pop(k) for k in FASTOKENS_CACHE_VARS if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _pinned(name: str, installed: str | None, pinned: str) -> str:
    """The installed version of a fast encoder: ``pinned`` or a later release of its series
    (the same major.minor), whose guard tables are probed on first use."""
    if installed is None:
        raise FastEncoderError(f"{name} is not installed (pip install 'dtok[fast]')")
    if _series(installed) != _series(pinned) or _release(installed) < _release(pinned):
        raise FastEncoderError(f"{name} {installed} is installed; dtok uses {pinned} or a later "
                               f"{'.'.join(map(str, _series(pinned)))}.x release (its API)")
    return installed


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0])[:3])


def _series(version: str) -> tuple[int, ...]:
    return _release(version)[:2]


class JsonFile:
    """tokenizer.json's bytes for the native encoders: in a memory file they read by path, where
    the system has them (Linux), else the bytes themselves. Once the memory file holds them, the
    bytes object may go (a caller that handed it over lets it go before the encoders parse their
    copy: a load's peak is lower by the file's size). From a str the JSON would be held three
    times at once (the bytes, the str, its UTF-8 form), which raises a load's peak
    (docs/benchmarks.md#a-loaded-tokenizers-memory-step-by-step)."""

    def __init__(self, raw: bytes) -> None:
        self._raw: bytes | None = raw
        self._fd: int | None = None
        if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
            self._fd = os.memfd_create("dtok-tokenizer-json", os.MFD_CLOEXEC)
            view = memoryview(raw)
            while view:
                view = view[os.write(self._fd, view):]
            self._raw = None

    def load(self, load_file, load_str):
        """A native encoder made by ``load_file(path)``, or ``load_str(json)`` without a file."""
        if self._fd is not None:
            return load_file(f"/proc/self/fd/{self._fd}")
        return load_str(self._held().decode("utf-8"))

    def text(self) -> str:
        """The JSON as a str (for an encoder that reads nothing else)."""
        if self._fd is None:
            return self._held().decode("utf-8")
        return os.pread(self._fd, os.fstat(self._fd).st_size, 0).decode("utf-8")

    def _held(self) -> bytes:
        """The bytes, where no memory file took them."""
        if self._raw is None:
            raise ValueError("the JSON was handed to a memory file")
        return self._raw

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self._raw = None

    def __enter__(self) -> "JsonFile":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _json_file(raw_json: "bytes | JsonFile") -> tuple["JsonFile", bool]:
    """(a JsonFile for ``raw_json``, whether it was made here and is closed by the caller)."""
    return (raw_json, False) if isinstance(raw_json, JsonFile) else (JsonFile(raw_json), True)


class FastEncoder:
    """``fastokens`` on the same file (tokenizer.json's bytes), caches off, checked against the
    reference at load."""

    name = "fastokens"

    def __init__(self, raw_json: bytes | JsonFile, reference) -> None:
        version = _pinned("fastokens", fastokens_version(), FASTOKENS_VERSION)
        import fastokens

        self.held_threads = hold_fastokens_threads()
        json_file, made = _json_file(raw_json)
        try:
            with _without_cache_env():
                self.native = json_file.load(fastokens.Tokenizer.from_file,
                                             fastokens.Tokenizer.from_json_str)
        finally:
            if made:
                json_file.close()
        self.native.enable_segment_cache(0)
        self.version = version
        verify_light(self.native, reference)
        self.native.encode_batch_flat(["warm up the lazy state " * 20], add_special_tokens=False)

    def encode(self, text: str):
        cache_utf8(text)
        ids, _offsets = self.native.encode_batch_flat([text], add_special_tokens=False)
        return memoryview(ids).cast("i") if sys.byteorder == "little" else _swap(ids)

    def encode_many(self, texts: list[str]) -> list:
        cache_utf8_each(texts)
        ids, offsets = self.native.encode_batch_flat(texts, add_special_tokens=False)
        if sys.byteorder != "little":
            flat = _swap(ids)
        else:
            flat = memoryview(ids).cast("i")
        ends = memoryview(offsets).cast("Q")
        return [flat[ends[i]:ends[i + 1]] for i in range(len(texts))]


class GigaEncoder:
    """``gigatoken`` on the same file, checked against the reference at load.

    gigatoken 0.10.0 keeps a pre-token cache per native instance that only grows (its issue
    #36; the bound came after 0.10.0) and offers no way to bound or clear it. Each call's
    characters are counted; once ``renew_chars`` have gone through one instance, the next call
    builds a fresh one (from the reference's JSON; the old one is freed when its last call
    returns), so the cache holds at most what ``renew_chars`` characters put there. A renewal
    is a pause inside the call that triggers it (docs/encoders.md#a-second-fast-encoder-gigatoken)."""

    name = "gigatoken"
    RENEW_CHARS = 64 << 20

    def __init__(self, raw_json: bytes | JsonFile, reference,
                 renew_chars: int | None = None) -> None:
        version = _pinned("gigatoken", gigatoken_version(), GIGATOKEN_VERSION)
        import gigatoken

        self._gigatoken = gigatoken
        self.reference = reference
        self.version = version
        self.renew_chars = renew_chars or self.RENEW_CHARS
        self.renewals = 0
        self._chars = 0
        # it reads JSON from a str only
        self.native = self._load(raw_json.text() if isinstance(raw_json, JsonFile)
                                 else raw_json.decode("utf-8"))
        verify_giga(self.native, reference)

    def _load(self, raw_json: str):
        try:
            return self._gigatoken.Tokenizer.from_json(raw_json)._backend
        except Exception as exc:  # a file it does not support
            raise FastEncoderError(f"gigatoken does not load this file: {exc}") from None

    def _native(self, n: int):
        self._chars += n  # racy across threads: a renewal a few calls late is harmless
        if self._chars > self.renew_chars:
            self._chars = n
            self.native = self._load(self.reference.to_str())
            self.renewals += 1
        return self.native

    def encode(self, text: str):
        cache_utf8(text)
        return memoryview(self._native(len(text)).encode(text).view("i4"))

    def encode_many(self, texts: list[str]) -> list:
        cache_utf8_each(texts)
        native = self._native(sum(map(len, texts)))
        return [memoryview(native.encode(t).view("i4")) for t in texts]


def verify_giga(native, reference) -> None:
    """gigatoken's vocabulary size, and the sample text with every added token, match."""
    n = reference.get_vocab_size(with_added_tokens=True)
    if native.vocab_size != n:
        raise FastEncoderError(f"vocabulary size {native.vocab_size} != reference {n}")
    added = [t.content for t in reference.get_added_tokens_decoder().values()]
    text = _SAMPLE + "".join(added) + " ".join(added)
    if native.encode(text).tolist() != reference.encode(text, add_special_tokens=False).ids:
        raise FastEncoderError("sample text encodes differently from the reference")


def _swap(ids: bytes):  # pragma: no cover - big-endian hosts only
    from array import array

    a = array("i")
    a.frombytes(ids)
    a.byteswap()
    return memoryview(a)


# A short text that touches every stage: NFC, digits, contractions, CJK, whitespace, emoji.
_SAMPLE = ("The quick brown fox's 12345 jumps — cafe\u0301 ﬁ \u0958/ 中文テキスト 한국어 \r\n\t "
           "  x\u00a0y \U0001f469\u200d\U0001f469\u200d\U0001f467 HTTPServer don't I'LL ") * 3


def verify_light(native, reference) -> None:
    """The loaded vocabulary, added tokens and post-processing match the reference's."""
    n = reference.get_vocab_size(with_added_tokens=True)
    if native.vocab_size != n:
        raise FastEncoderError(f"vocabulary size {native.vocab_size} != reference {n}")
    step = max(1, n // 4096)
    for i in range(0, n, step):
        if native.id_to_token(i) != reference.id_to_token(i):
            raise FastEncoderError(f"token {i} differs: {native.id_to_token(i)!r}")
    ref_added = {i: (t.content, t.special, t.normalized, t.lstrip, t.rstrip, t.single_word)
                 for i, t in reference.get_added_tokens_decoder().items()}
    fast_added = {}
    for t in native.added_tokens():
        fast_added[t["id"]] = (t["content"], t["special"], t["normalized"], t["lstrip"],
                               t["rstrip"], t["single_word"])
    if fast_added != ref_added:
        raise FastEncoderError("added tokens differ from the reference's")
    text = _SAMPLE + "".join(v[0] for v in ref_added.values())
    for special in (False, True):
        ids, _ = native.encode_batch_flat([text], add_special_tokens=special)
        if memoryview(ids).cast("I").tolist() != reference.encode(text, add_special_tokens=special).ids:
            raise FastEncoderError("sample text encodes differently from the reference")
