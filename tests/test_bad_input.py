"""Odd input gets what the reference gives: the same IDs or the same exception type."""
from __future__ import annotations

import pytest

from conftest import ref_ids


def outcome(fn):
    try:
        return "ok", list(fn())
    except BaseException as exc:  # noqa: BLE001 - comparing exception types is the point
        return "raise", type(exc)


@pytest.mark.parametrize("value", [123, b"abc", None, ["a"], ("a", "b"), bytearray(b"x"), 1.5])
def test_non_str(main_tok, value):
    got = outcome(lambda: main_tok.encode(value))
    want = outcome(lambda: main_tok.reference.encode(value).ids)
    assert got == want and got[1] is TypeError


@pytest.mark.parametrize("text", [
    "\ud800", "abc\udfffdef", "a\x00b", "", "\x00" * 5000, " " * 5000, "\n" * 5000,
    "x" * 3000 + "\ud83d" + "y" * 3000,  # a lone surrogate inside a chunked text
    "e\u0301 " * 1500 + "\ud800" + "e\u0301 " * 1500,  # ... next to NFC checks
    "a" * 100_000,
])
@pytest.mark.parametrize("special", [True, False])
def test_same_ids_or_same_exception(main_tok, text, special):
    got = outcome(lambda: main_tok.encode(text, add_special_tokens=special))
    want = outcome(lambda: main_tok.reference.encode(text, add_special_tokens=special).ids)
    assert got == want


@pytest.mark.parametrize("flag", [0, 1, None, "yes"])
def test_add_special_tokens_must_be_bool(main_tok, flag):
    got = outcome(lambda: main_tok.encode("hi", add_special_tokens=flag))
    want = outcome(lambda: main_tok.reference.encode("hi", add_special_tokens=flag).ids)
    assert got == want


def test_str_subclass(main_tok):
    class S(str):
        pass

    text = S("hello world " * 300)
    assert list(main_tok.encode(text)) == ref_ids(main_tok, text)


def test_single_letter_run_has_no_cut(main_tok):
    """10M characters of one letter: no safe cut exists, so the text is encoded whole."""
    text = "a" * 10_000_000
    ex = main_tok.explain(text)
    assert ex["route"] == "whole" and ex["cuts"] == []


def test_single_letter_run_exact(main_tok):
    text = "a" * 1_000_000
    assert list(main_tok.encode(text)) == ref_ids(main_tok, text)


@pytest.mark.slow
def test_ten_million_letter_run_exact(main_tok):
    text = "a" * 10_000_000
    assert list(main_tok.encode(text)) == ref_ids(main_tok, text)


def test_batch_errors_match(main_tok):
    for bad in ("not a list", [1, 2], None):
        got = outcome(lambda: main_tok.encode_batch(bad))
        want = outcome(lambda: main_tok.reference.encode_batch(bad))
        assert got[0] == want[0] == "raise" and got[1] is want[1]
