"""Bad input through the engine hooks (stand-in vLLM and SGLang module trees, as in
test_vllm.py and test_sglang.py: no real server is installed here): the hooked call answers as
the engine's own code does (the same IDs, or the same exception type), and dtok's memory stays
within its bounds (measured with tracemalloc) under huge session ids and bursts of distinct ids.

JSON delivers lone surrogates (``"\\ud800"``) and NUL (``"\\u0000"``) as they are; invalid UTF-8
bytes in a body never reach a tokenizer (the JSON decoder rejects them, with or without dtok),
and a server that decodes leniently hands over U+FFFD or surrogate escapes, tested here."""
from __future__ import annotations

import asyncio
import gc
import json
import time
import tracemalloc
from types import SimpleNamespace

import pytest

from conftest import read_text
from test_sglang import hooked_manager
from test_vllm import _fake_vllm, _request, hf, plugin

from dtok.integrations import engine
from dtok.integrations import sglang as sglang_hook

BAD = {
    "lone high surrogate": json.loads('"\\ud800"'),
    "lone low surrogate in text": json.loads('"abc \\udfff def"'),
    "surrogate in a long text": "word " * 2000 + json.loads('"\\ud83d"') + " tail" * 2000,
    "NUL": json.loads('"a\\u0000b"'),
    "NUL run": "\x00" * 5000,
    "invalid UTF-8, replaced": b"ok \xff\xfe bad \xc3 end".decode("utf-8", "replace"),
    "invalid UTF-8, surrogate-escaped": b"ok \xff\xfe bad \xc3 end".decode("utf-8", "surrogateescape"),
    "empty": "",
}
NOT_STR = {"None": None, "int": 123, "token ids": [1, 2, 3], "bytes": b"abc", "dict": {"a": 1},
           "float": 1.5}


def outcome(fn):
    try:
        return "ok", list(fn())
    except BaseException as exc:  # noqa: BLE001 - comparing exception types is the point
        return "raise", type(exc)


@pytest.fixture
def vllm_serving(monkeypatch):
    BaseRenderer, Serving = _fake_vllm(monkeypatch)
    plugin.install()
    tok = hf("qwen3")
    return tok, Serving(BaseRenderer(tok))


def _vllm_ask(serving, prompt, session=None, salt=None):
    req, raw = _request(prompt, session, add_special_tokens=True)
    req.cache_salt = salt
    return asyncio.run(serving.create_completion(req, raw))["prompt_token_ids"]


def test_invalid_utf8_in_a_json_body_never_reaches_the_tokenizer():
    with pytest.raises(UnicodeDecodeError):
        json.loads(b'{"prompt": "ok \xff bad"}')


@pytest.mark.parametrize("name", list(BAD) + list(NOT_STR))
@pytest.mark.parametrize("session", [None, "conv-bad"])
def test_bad_prompts_through_the_vllm_hook(vllm_serving, name, session):
    tok, serving = vllm_serving
    prompt = BAD.get(name, NOT_STR.get(name))
    got = outcome(lambda: _vllm_ask(serving, prompt, session))
    want = outcome(lambda: tok(prompt, add_special_tokens=True)["input_ids"])
    assert got == want


@pytest.mark.parametrize("name", list(BAD) + list(NOT_STR))
def test_bad_prompts_through_the_sglang_hook(name):
    tok = hf("qwen3")
    tm = hooked_manager(tok)
    assert sglang_hook.dtok_for(tok) is not None
    prompt = BAD.get(name, NOT_STR.get(name))
    req = SimpleNamespace(text=prompt, session_id="conv-bad", cache_salt="t", rid="r")
    got = outcome(lambda: asyncio.run(tm._tokenize_one_request(req)))
    want = outcome(lambda: tok([prompt])["input_ids"][0])
    assert got == want


@pytest.mark.parametrize("n", [2_000_000, pytest.param(10_000_000, marks=pytest.mark.slow)])
def test_multi_million_character_prompt_through_the_hook(vllm_serving, n):
    tok, serving = vllm_serving
    prose = read_text("prose", "gutenberg-2701_moby-dick.txt")
    prompt = (prose * (n // len(prose) + 1))[:n]
    t0 = time.perf_counter()
    got = _vllm_ask(serving, prompt)
    took = time.perf_counter() - t0
    t0 = time.perf_counter()
    want = tok(prompt)["input_ids"]
    print(f"{n:,} characters: hooked {took:.1f} s, the engine's own "
          f"{time.perf_counter() - t0:.1f} s")
    assert got == want


def _traced(fn):
    """(result, bytes still allocated by fn once it returned and garbage was collected, peak)."""
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = fn()
        gc.collect()
        now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return out, now - base, peak - base


def test_a_megabyte_session_id_is_not_kept():
    key = engine.session_key(session_id="x" * (1 << 20), cache_salt="s" * (1 << 20))
    assert len(repr(key)) < 300
    assert key != engine.session_key(session_id="x" * (1 << 20) + "y", cache_salt="s" * (1 << 20))
    assert engine.session_key(session_id="short") == engine.RequestKey(("sid", "short"), None)


@pytest.mark.parametrize("control", [False, True])
def test_megabyte_session_ids_through_the_hook(vllm_serving, monkeypatch, control):
    """30 requests, each with its own 1 MB session id: exact, and dtok keeps ~nothing of the ids
    (the control keeps ids whole: 30 MB)."""
    tok, serving = vllm_serving
    if control:
        monkeypatch.setattr(engine, "KEY_CHARS", 1 << 30)
    text = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[:2000]

    def burst():
        for i in range(30):
            req, raw = _request(text, None, add_special_tokens=True)
            req.session_id = f"{i}-" + "k" * (1 << 20)
            ids = asyncio.run(serving.create_completion(req, raw))["prompt_token_ids"]
            assert ids == tok(text)["input_ids"]
            del req, raw

    _, kept, peak = _traced(burst)
    print(f"\n30 x 1 MB session ids (control {control}): {kept / 1e6:.1f} MB kept, "
          f"peak {peak / 1e6:.1f} MB")
    assert (kept > 30e6) if control else (kept < 8e6), kept


@pytest.mark.parametrize("n", [10_000, pytest.param(100_000, marks=pytest.mark.slow)])
def test_a_burst_of_distinct_session_ids_stays_within_the_bounds(n):
    """n distinct session ids at once through the hook's encode (in process): exact, the store
    holds at most max_sessions of them and its bytes stay within session_bytes."""
    max_sessions, session_bytes = 2048, 8 << 20
    hook = engine.EngineHook("bad-input", frozen_env="DTOK_TEST_UNSET")
    engine.configure(knobs={"max_sessions": max_sessions, "session_bytes": session_bytes})
    try:
        tok = hf("qwen3")
        wrapper = hook.dtok_for(tok)
        texts = [f"user {i}: " + "hello there, how are you? " * 8 for i in range(200)]
        want = [tok(t)["input_ids"] for t in texts]

        def burst():
            for i in range(n):
                key = engine.session_key(session_id=f"burst-{i}", cache_salt=f"tenant-{i % 7}")
                assert hook.encode(wrapper, texts[i % 200], engine.EncodeOptions(), key) == \
                    want[i % 200]

        t0 = time.perf_counter()
        _, kept, peak = _traced(burst)
        took = time.perf_counter() - t0
        s = wrapper.current().sessions.stats()
        print(f"\n{n} session ids in {took:.1f} s: {kept / 1e6:.1f} MB kept, peak "
              f"{peak / 1e6:.1f} MB, {s['keyed']} sessions, "
              f"{s['text_bytes'] + s['id_bytes'] + s['anchor_bytes']} bytes accounted")
        assert s["keyed"] <= max_sessions and s["evictions"] >= n - max_sessions
        assert s["text_bytes"] + s["id_bytes"] + s["anchor_bytes"] <= session_bytes
        assert kept < session_bytes + 4 * max_sessions * 1024, kept  # + ~4 KB per entry
    finally:
        engine.configure()
        hook.close()
