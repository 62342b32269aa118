"""Class tables: NFC anchors from the reference normalizer, version keying of the cache."""
from __future__ import annotations

import random

import numpy as np
import pytest

from dtok import tables

NASTY = ["e", "\u0301", "\u0335", "\u0345", "\u0323", "\u1100", "\u1161", "\u11a8", "\uac00",
         "\u0958", "\u093c", "\u212b", "\uf900", "a", " ", "\u0f73", "\u0f71", "\u0cd5", "\u0cbf",
         "\u09be", "\u09c7", "\u3099", "\u304b", "\U0001d15e", "\U000110ba", "\U00011099"]


def anchors():
    t = tables.load("qwen2").table
    return np.flatnonzero(np.frombuffer(t, dtype=np.uint8) & tables.NFC_ANCHOR)


def test_anchor_property_holds_on_the_reference_normalizer():
    """For an anchor c and any X, Y: N(X + c + Y) == N(X) + N(c + Y)."""
    from tokenizers import normalizers

    n = normalizers.NFC().normalize_str
    rng = random.Random(0)
    anchor_cps = anchors()
    picks = [chr(int(c)) for c in rng.sample(list(anchor_cps), 3000)] + \
            [c for c in NASTY if ord(c) in set(anchor_cps.tolist())]
    for c in picks:
        for _ in range(5):
            x = "".join(rng.choices(NASTY, k=rng.randint(0, 4)))
            y = "".join(rng.choices(NASTY, k=rng.randint(0, 4)))
            assert n(x + c + y) == n(x) + n(c + y), (hex(ord(c)), x, y)


def test_known_anchor_verdicts():
    a = set(anchors().tolist())
    assert all(cp in a for cp in range(0x80)), "ASCII characters are anchors"
    for ch in "\u0301\u0335\u1161\u11a8\u0958\u212b\uf900\u093c":
        assert ord(ch) not in a, hex(ord(ch))
    for ch in "\uac00中é\u1100":
        assert ord(ch) in a, hex(ord(ch))
    assert not any(cp in a for cp in range(0xD800, 0xE000))


def test_table_of_another_version_is_not_used(monkeypatch, tmp_path):
    monkeypatch.setattr(tables, "tokenizers_version", lambda: "0.0.0-not-installed")
    monkeypatch.setenv("DTOK_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DTOK_TABLES", "strict")
    with pytest.raises(RuntimeError, match="no class table"):
        tables.load("qwen2")


@pytest.mark.parametrize("damage", ["truncated", "not gzip", "wrong length"])
def test_a_damaged_cached_table_is_ignored(monkeypatch, tmp_path, caplog, damage):
    """A cached table that does not read back whole is set aside (here, with building
    forbidden, nothing else is found): never used, never an unexplained error."""
    import gzip

    version = "0.0.0-damaged"
    monkeypatch.setattr(tables, "tokenizers_version", lambda: version)
    monkeypatch.setenv("DTOK_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("DTOK_TABLES", "strict")
    path = tables.cache_dir() / tables.file_name(tables.FAMILIES["qwen2"], version)
    whole = gzip.compress(bytes(tables.N_CODEPOINTS), 9, mtime=0)
    tables.write_table(path, bytes(tables.N_CODEPOINTS))
    assert path.read_bytes() == whole  # written as it is read back
    path.write_bytes({"truncated": whole[:len(whole) // 2], "not gzip": b"\x00" * 64,
                      "wrong length": gzip.compress(b"\x01" * 100)}[damage])
    with pytest.raises(RuntimeError, match="no class table"):
        tables.load("qwen2")
    assert "ignoring damaged table" in caplog.text


def test_bundled_tables_match_installed_version():
    t = tables.load("llama3")
    assert tables.tokenizers_version() in t.source
    assert len(t.table) == tables.N_CODEPOINTS


@pytest.mark.slow
def test_rebuild_for_another_version(monkeypatch, tmp_path):
    """A version mismatch rebuilds from the reference, into the user cache, identically."""
    bundled = tables.load("llama3").table
    monkeypatch.setattr(tables, "tokenizers_version", lambda: "0.0.0-rebuild")
    monkeypatch.setenv("DTOK_CACHE_DIR", str(tmp_path))
    rebuilt = tables.load("llama3")
    assert str(tmp_path) in rebuilt.source and rebuilt.table == bundled
