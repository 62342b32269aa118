"""dtok_ext.utf8.cache_utf8 leaves on a str exactly the UTF-8 CPython would make, or nothing.

The bytes are read back through ``PyUnicode_AsUTF8AndSize``, the call the encoders make, and
compared with ``str.encode`` of a copy made before (``str.encode`` too returns a str's
UTF-8 once it has one); the fast encoders' IDs on such strs are the reference's."""
from __future__ import annotations

import ctypes
import gzip
import random
import tracemalloc

import pytest
from tokenizers import Tokenizer

from conftest import HAVE_SHARED, ROOT, SHARED, shared_path
from dtok_ext.utf8 import MIN_CHARS, available, cache_utf8, cache_utf8_each

CORPUS = SHARED / "corpus" if HAVE_SHARED else ROOT / "tests" / "data" / "corpus"
_as_utf8 = ctypes.pythonapi.PyUnicode_AsUTF8AndSize
_as_utf8.restype = ctypes.c_void_p
_as_utf8.argtypes = [ctypes.py_object, ctypes.POINTER(ctypes.c_ssize_t)]

# the edges of each UTF-8 length, and of the surrogate range
EDGES = [0x41, 0x7F, 0x80, 0xFF, 0x100, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFD, 0xFFFF, 0x10000,
         0x1F600, 0x10FFFF]


def fresh(s: str) -> str:
    return (s + " ")[:-1]  # a new str object: no UTF-8 of its own yet


def cached_bytes(s: str) -> bytes:
    n = ctypes.c_ssize_t()
    return ctypes.string_at(_as_utf8(s, ctypes.byref(n)), n.value)


def texts() -> list[str]:
    rng = random.Random(7)
    out = []
    for top in (0xFF, 0xFFFF, 0x10FFFF):  # each PEP 393 width
        edges = [c for c in EDGES if c <= top]
        for n in (MIN_CHARS, MIN_CHARS + 1, 5003, 40_000):
            out.append("".join(chr(rng.choice(edges)) if rng.random() < 0.3 else
                               chr(rng.randrange(0x20, 0x7F)) for _ in range(n)))
        out.append("a" * 16 * 400 + chr(edges[-1]))  # non-ASCII only in the last character
        # ASCII runs of every length up to two vector steps before each edge: every count of
        # leading ASCII characters in a step, at every alignment, and runs of others
        runs = "".join("a" * r + chr(e) * (1 + r % 3) for e in edges for r in range(34))
        out.append(runs * -(-MIN_CHARS // len(runs)))
        out.append(chr(edges[-1]) + "b" * 9999)
    # the shared corpus is stored plain; without it, the repository's copies, most of them
    # gzip-compressed (tests/data/corpus): read decompressed, they are the same real text
    corpus = sorted(p for p in CORPUS.rglob("*") if p.is_file())
    for p in corpus:
        data = p.read_bytes()
        text = (gzip.decompress(data) if p.suffix == ".gz" else data).decode(
            "utf-8", "surrogateescape")
        if len(text) >= MIN_CHARS and not text.isascii():
            out.append(text)
    return out


@pytest.mark.skipif(not available(), reason="this interpreter's build or allocators decline")
def test_written_bytes_are_cpythons_own():
    written = 0
    for text in texts():
        s = fresh(text)
        try:
            want = s.encode("utf-8")
        except UnicodeEncodeError:  # surrogateescape'd corpus bytes: declined, left to CPython
            assert not cache_utf8(s)
            with pytest.raises(UnicodeEncodeError):
                cached_bytes(s)
            continue
        assert cache_utf8(s), repr(s[:40])
        assert cached_bytes(s) == want, repr(s[:40])
        written += 1
    assert written >= 30


@pytest.mark.skipif(not available(), reason="this interpreter's build or allocators decline")
def test_the_read_back_sees_what_was_written():
    # the control of the test above: a byte changed in the written UTF-8 is seen there
    s = fresh("é" * MIN_CHARS)
    assert cache_utf8(s)
    n = ctypes.c_ssize_t()
    ctypes.memset(_as_utf8(s, ctypes.byref(n)), ord("x"), 1)
    assert cached_bytes(s) != fresh(s).encode("utf-8")
    assert s.encode("utf-8")[:1] == b"x"  # str.encode, too, returns a str's UTF-8 once it has one


def test_declined_where_cpython_would_differ_or_need_nothing():
    class Sub(str):
        pass

    assert not cache_utf8(fresh("x" * 10 * MIN_CHARS))  # ASCII: its buffer is its UTF-8
    assert not cache_utf8(fresh("é" * (MIN_CHARS - 1)))  # short: CPython's own
    assert not cache_utf8(Sub("é" * MIN_CHARS))
    lone = fresh("é" * MIN_CHARS + "\ud800")
    assert not cache_utf8(lone)
    with pytest.raises(UnicodeEncodeError):
        cached_bytes(lone)  # CPython's own error, as before
    s = fresh("é" * MIN_CHARS)
    s.encode("utf-8")
    cached_bytes(s)  # CPython made it
    assert not cache_utf8(s)
    t = fresh("é" * MIN_CHARS)
    assert cache_utf8(t) == available()
    assert not cache_utf8(t)  # once only
    tracemalloc.start()
    try:  # its hooks make the two allocator domains differ
        assert not available()
        assert not cache_utf8(fresh("é" * MIN_CHARS))
    finally:
        tracemalloc.stop()
    many = [fresh("é" * MIN_CHARS), "short", fresh("ü" * MIN_CHARS), b"bytes", None]
    assert cache_utf8_each(many) == (2 if available() else 0)


# the property does not depend on the file: one in the default run, the other behind slow
@pytest.mark.parametrize("name", ["qwen3", pytest.param("llama3", marks=pytest.mark.slow)])
def test_fast_encoders_read_the_written_utf8(name):
    import fastokens

    path = shared_path("tokenizers", name, "tokenizer.json")
    ref = Tokenizer.from_file(str(path))
    fast = fastokens.Tokenizer.from_file(str(path))
    fast.enable_segment_cache(0)
    # a third of the texts, up to 320K characters (a write's length past a few vector steps
    # changes nothing the encoder reads; the 1-5M-character corpus files cost ~15 s here)
    for text in [t for t in texts()[::3] if len(t) <= 320_000]:
        s = fresh(text)
        try:
            want = ref.encode(fresh(text), add_special_tokens=False).ids
        except Exception:
            continue
        cache_utf8(s)
        ids, _ = fast.encode_batch_flat([s], add_special_tokens=False)
        assert memoryview(ids).cast("I").tolist() == want
