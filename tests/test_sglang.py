"""The SGLang hook: session keys, identity checks, and the hooks on a duck-typed tokenizer
manager with a real transformers tokenizer. (The real SGLang package is too large for CI; the
closing notes say what was run against it.)"""
from __future__ import annotations

import asyncio
import os
import sys
import types
from types import SimpleNamespace

import pytest

from conftest import read_text, shared_path

transformers = pytest.importorskip("transformers") if not os.environ.get("CI") else \
    __import__("transformers")
from dtok.integrations import engine  # noqa: E402
from dtok.integrations import sglang as hook  # noqa: E402


def hf(name):
    return transformers.AutoTokenizer.from_pretrained(str(shared_path("tokenizers", name)))


def test_session_key_order():
    K = engine.RequestKey
    r = SimpleNamespace(session_id="s1", routing_key="rk", cache_salt="c", rid="conv:7")
    raw = SimpleNamespace(headers={"x-smg-routing-key": "hdr"})
    assert hook.session_key(r, ":") == K(("sid", "s1"), ("c", None))
    r.session_id = None
    assert hook.session_key(r, ":") == K(("sid", "rk"), ("c", None))  # the gateway's routing key
    r.routing_key = None
    assert hook.session_key(r, ":", raw) == K(("sid", "hdr"), ("c", None))  # chat: the header
    assert hook.session_key(r, ":") == K(("rid", "conv"), ("c", None))
    assert hook.session_key(r, None) == K(None, ("c", None))  # the salt alone: lookup in it
    r.cache_salt = ""
    assert hook.session_key(r, ":") == K(("rid", "conv"), None)
    assert hook.session_key(r, None) is None  # no separator configured
    r.lora_path = "adapter-1"  # a LoRA adapter scopes too
    assert hook.session_key(r, ":") == K(("rid", "conv"), (None, "adapter-1"))
    assert hook.session_key(SimpleNamespace(rid="abc"), ":") is None


def test_section_comparison():
    a = hf("llama3").backend_tokenizer.to_str()
    assert hook.compare_sections(a, a) == []
    b = shared_path("tokenizers", "qwen3", "tokenizer.json").read_text()
    assert set(hook.compare_sections(a, b)) >= {"model", "pre_tokenizer"}


def test_identity_check_with_frozen_file(monkeypatch):
    # SGLang's hook reads its own variable; the check both ways (the same EngineHook.build as
    # vLLM's hook) is test_vllm.py's test of this name
    monkeypatch.setenv("DTOK_SGLANG_TOKENIZER", str(shared_path("tokenizers", "gpt-oss")))
    wrapper, why = hook._build(hf("qwen3"))  # another model's file: stay out
    assert wrapper is None and "differs from" in why


class FakeTokenizerManager:
    """What the hooks touch of SGLang's TokenizerManager."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.is_generation = True
        self.model_config = SimpleNamespace(is_embedding_gemma=False)

    async def _tokenize_texts(self, texts, is_cross_encoder=False):
        single = isinstance(texts, str)
        out = self.tokenizer([texts] if single else texts)["input_ids"]
        return (out[0] if single else out), None

    async def _tokenize_one_request(self, obj):
        ids, _ = await self._tokenize_texts(obj.text)
        return ids



def hooked_manager(tok) -> FakeTokenizerManager:
    """A TokenizerManager stand-in whose ``_tokenize_texts`` and ``_tokenize_one_request`` go
    through dtok's hooks, as the plugin patches them."""
    tm = FakeTokenizerManager(tok)
    orig_texts = FakeTokenizerManager._tokenize_texts
    orig_one = FakeTokenizerManager._tokenize_one_request

    async def texts(self, t, is_cross_encoder=False):
        return await hook._tokenize_texts(orig_texts, self, t, is_cross_encoder)

    async def one(self, obj):
        return await hook._tokenize_one_request(orig_one, self, obj)

    tm._tokenize_texts = types.MethodType(texts, tm)
    tm._tokenize_one_request = types.MethodType(one, tm)
    return tm

def test_hooks_route_prompts_through_dtok_exactly():
    tok = hf("qwen3")
    tm = hooked_manager(tok)
    base = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[:30000]
    assert hook.dtok_for(tok) is not None  # built here (on the loop it is built in background)
    before = dict(hook.stats)

    async def run():
        text = "<|im_start|>user\n" + base
        for i in range(6):
            text += f"<|im_end|>\n<|im_start|>user\nturn {i}\n"
            req = SimpleNamespace(text=text, session_id="conv-1", cache_salt=None, rid="r")
            got = await tm._tokenize_one_request(req)
            assert list(got) == tok([text])["input_ids"][0]
        assert await tm._tokenize_texts(["a", "b"]) == (tok(["a", "b"])["input_ids"], None)

    asyncio.run(run())
    assert hook.stats["keyed_calls"] - before["keyed_calls"] == 6
    assert hook.stats["passed_through"] - before["passed_through"] == 1  # the batch
    assert hook.dtok_for(tok).dtok.sessions.stats()["repairs"] == 5


def test_pool_backed_tokenize_texts(monkeypatch):
    """With a pool, keyed prompts are awaited from it in _tokenize_texts (the event loop does
    not encode them); IDs stay SGLang's own."""
    from dtok.integrations import engine

    monkeypatch.setenv("DTOK_SGLANG_TOKENIZER", str(shared_path("tokenizers", "qwen3")))
    tok = hf("qwen3")
    wrapper, why = hook.HOOK.build(tok)  # from the file: the pool can load it
    assert wrapper is not None, why
    monkeypatch.setitem(hook.HOOK._by_tok, tok, wrapper)
    engine.configure(pool_workers=1)
    try:
        pool = hook.HOOK.pool_for(wrapper.current(), wait=300)
        assert pool is not None, hook.HOOK.pool_state()
        tm = FakeTokenizerManager(tok)
        orig_texts = FakeTokenizerManager._tokenize_texts
        base = "<|im_start|>user\n" + read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[
            :20000]
        before = dict(hook.stats)

        async def run():
            text = base
            for i in range(4):
                text += f"<|im_end|>\n<|im_start|>user\nturn {i}\n"
                with engine.bound_key("sid:pooled"):
                    ids, _ = await hook._tokenize_texts(orig_texts, tm, text)
                assert ids == tok([text])["input_ids"][0]

        asyncio.run(run())
        assert hook.stats["pool_calls"] - before["pool_calls"] == 4
        assert pool.stats()["session_repairs"] == 3
    finally:
        engine.configure()
        if pool is not None:
            pool.close()


def test_first_request_on_the_loop_does_not_wait_for_the_build():
    """On the event loop dtok is built in the background; SGLang's own code serves the request
    that started it, and dtok the ones after the build."""
    import time

    tok = hf("gpt-oss")
    tm = FakeTokenizerManager(tok)
    orig = FakeTokenizerManager._tokenize_texts
    before = dict(hook.stats)
    ids, _ = asyncio.run(hook._tokenize_texts(orig, tm, "hello there"))
    assert ids == tok(["hello there"])["input_ids"][0]
    assert hook.stats["passed_through"] - before["passed_through"] == 1
    deadline = time.monotonic() + 120
    while hook.HOOK.dtok_for(tok, wait=False) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    ids, _ = asyncio.run(hook._tokenize_texts(orig, tm, "hello there"))
    assert ids == tok(["hello there"])["input_ids"][0]
    assert hook.stats["dtok_calls"] - before["dtok_calls"] == 1


def test_stays_out_of_overridden_tokenizers():
    tok = hf("llama3")
    tok.encode = lambda *a, **k: [0]  # an instance override: dtok cannot know what it does
    assert hook.dtok_for(tok) is None
    assert hook._build(SimpleNamespace(is_fast=False))[0] is None


def test_install_patches_by_hand(monkeypatch):
    """install() wraps the targets wherever they live (a stand-in module tree)."""
    calls = []

    class TokenizerManager:
        async def _tokenize_one_request(self, obj):
            calls.append(engine.SESSION_KEY.get())
            return "ok"

    tm_mod = types.ModuleType("sglang.srt.managers.tokenizer_manager")
    tm_mod.TokenizerManager = TokenizerManager
    for name in ("sglang", "sglang.srt", "sglang.srt.managers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["sglang.srt.managers"].tokenizer_manager = tm_mod
    monkeypatch.setitem(sys.modules, "sglang.srt.managers.tokenizer_manager", tm_mod)
    done = hook.install()
    assert f"{hook._TM}._tokenize_one_request" in done
    assert hook.install() == []  # idempotent
    out = asyncio.run(TokenizerManager()._tokenize_one_request(SimpleNamespace(session_id="k")))
    assert out == "ok" and calls == [engine.RequestKey(("sid", "k"), None)]


def test_register_is_opt_in(monkeypatch):
    monkeypatch.delenv("DTOK_SGLANG", raising=False)
    hook.register()  # no sglang needed: nothing happens without DTOK_SGLANG=1


def _sglang_runner() -> list[str] | None:
    """How to run tools/engines/sglang_check.py here: in this interpreter when SGLang imports,
    else through its cached venv when that exists and DTOK_ENGINE_CHECKS=1 (a minute more);
    None: no SGLang here (tests never build the venv)."""
    import importlib.util
    from pathlib import Path

    tools = Path(__file__).resolve().parents[1] / "tools" / "engines"
    if importlib.util.find_spec("sglang") is not None:
        return [sys.executable, str(tools / "sglang_check.py"), "--inner"]
    sys.path.insert(0, str(tools))
    try:
        import engine_setup
        import sglang_check
    finally:
        sys.path.pop(0)
    if engine_setup.built(sglang_check.VENV_NAME) and \
            os.environ.get("DTOK_ENGINE_CHECKS") == "1":
        return [sys.executable, str(tools / "sglang_check.py")]
    return None


def test_real_sglang():
    """The hooks inside a real SGLang TokenizerManager and chat server
    (tools/engines/sglang_check.py). `sglang` is not in the test extra (its install pulls a CUDA
    torch): skipped where it cannot be imported and the check's venv is not built."""
    import subprocess

    runner = _sglang_runner()
    if runner is None:
        pytest.skip("sglang is not importable here (run python tools/engines/sglang_check.py, "
                    "or set DTOK_ENGINE_CHECKS=1 to run it through its cached venv)")
    shared_path("tokenizers", "qwen3")  # fails under CI when ../shared is missing
    run = subprocess.run(runner + ["qwen3"], capture_output=True, text=True,
                         env={**os.environ, "DTOK_SGLANG": "1"}, timeout=1800)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    assert "dtok ON" in run.stdout and "mismatches=0" in run.stdout
    assert "mismatches=1" not in run.stdout


def test_tenants_never_share_sessions_through_the_hook():
    """Through the hooked _tokenize_one_request: the same session id under two cache salts is
    two sessions (nothing reused), under one salt it continues; a salted request without a
    session id continues its own tenant's conversation by content lookup, never another's."""
    tok = hf("qwen3")
    tm = hooked_manager(tok)
    assert hook.dtok_for(tok) is not None
    sessions = hook.dtok_for(tok).dtok.sessions
    base = read_text("prose", "gutenberg-2701_moby-dick.txt")[:30000]
    turns = [base + "".join(f"\nturn {j}" for j in range(i + 1)) for i in range(3)]

    def ask(text, salt, sid=None):
        req = SimpleNamespace(text=text, session_id=sid, cache_salt=salt, rid="r")
        got = asyncio.run(tm._tokenize_one_request(req))
        assert list(got) == tok([text])["input_ids"][0]

    s0 = sessions.stats()
    delta = lambda k: sessions.stats()[k] - s0[k]  # noqa: E731
    ask(turns[0], "tenant-A", "same-id")
    ask(turns[1], "tenant-B", "same-id")  # B's first turn: A's text is not reused
    assert (delta("full_encodes"), delta("repairs"), delta("edits")) == (2, 0, 0)
    ask(turns[2], "tenant-A", "same-id")
    assert delta("repairs") == 1
    other = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[:20000]
    ask(other, "tenant-C")
    ask(other + "\nmore", "tenant-D")  # D finds nothing of C's
    assert (delta("lookups"), delta("lookup_hits"), delta("repairs")) == (2, 0, 1)
    ask(other + "\nmore", "tenant-C")  # C continues its own conversation
    assert (delta("lookup_hits"), delta("repairs")) == (1, 2)
