"""The vLLM plugin and what the engine hooks share: session keys, the calls dtok reproduces
(truncation included) against real transformers tokenizers, the hooks on a stand-in renderer
with a real tokenizer, the pool-backed route; and the real vLLM render server through
tools/engines/vllm_check.py where vLLM can be imported."""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib.util
import os
import subprocess
import sys
import threading
import types
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import MAIN_FILES, default_run_on, read_text, shared_path

transformers = pytest.importorskip("transformers") if not os.environ.get("CI") else \
    __import__("transformers")
from dtok.integrations import engine, identity  # noqa: E402
from dtok.integrations import vllm as plugin  # noqa: E402
from dtok.tokenizer import parts_of  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_HF: dict[str, object] = {}


def hf(name):
    if name not in _HF:
        _HF[name] = transformers.AutoTokenizer.from_pretrained(
            str(shared_path("tokenizers", name)))
    return _HF[name]


# --- session keys -----------------------------------------------------------------------------


def test_session_key_order():
    K = engine.RequestKey
    raw = SimpleNamespace(headers={"X-Session-ID": "hdr", "X-Request-Id": "conv:9"})
    req = SimpleNamespace(session_id="body", vllm_xargs={"session_id": "xa"}, cache_salt="salt",
                          request_id="body-conv:1")
    assert plugin.session_key(req, raw, ":") == K(("sid", "body"), ("salt", None))
    req.session_id = None
    assert plugin.session_key(req, raw, ":") == K(("sid", "hdr"), ("salt", None))
    raw.headers.pop("X-Session-ID")
    assert plugin.session_key(req, raw, ":") == K(("sid", "xa"), ("salt", None))  # vLLM's third
    req.vllm_xargs = None
    assert plugin.session_key(req, raw, ":") == K(("rid", "conv"), ("salt", None))
    assert plugin.session_key(req, raw, None) == K(None, ("salt", None))  # lookup in the salt
    req.model = "lora-b"  # the served model (a LoRA adapter's name) scopes too
    assert plugin.session_key(req, raw, None) == K(None, ("salt", "lora-b"))
    req.cache_salt = req.model = None
    assert plugin.session_key(req, raw, ":") == K(("rid", "conv"), None)  # the header's id first
    assert plugin.session_key(req, None, ":") == K(("rid", "body-conv"), None)
    assert plugin.session_key(req, raw, None) is None  # no separator configured
    assert plugin.session_key(SimpleNamespace(), None, ":") is None
    # a salt holding what a joined string would use as a separator is still another tenant
    a = engine.session_key(session_id="x", cache_salt="t:sid:y")
    b = engine.session_key(session_id="y:sid:x", cache_salt="t")
    assert a != b and hash(a) != hash(b)


def test_engine_docstring_examples():
    import doctest

    result = doctest.testmod(engine)
    assert result.attempted >= 2 and result.failed == 0


def test_bound_key_is_scoped():
    with engine.bound_key("sid:a"):
        assert engine.SESSION_KEY.get() == "sid:a"
        with engine.bound_key(None):
            assert engine.SESSION_KEY.get() is None
        assert engine.SESSION_KEY.get() == "sid:a"
    assert engine.SESSION_KEY.get() is None


# --- which calls dtok reproduces --------------------------------------------------------------


def test_encode_options():
    tok = SimpleNamespace(truncation_side="left")
    assert engine.encode_options(tok, {}) == engine.EncodeOptions()
    assert engine.encode_options(tok, {"add_special_tokens": False, "truncation": False,
                                       "max_length": None}) == engine.EncodeOptions(False)
    assert engine.encode_options(tok, {"truncation": True, "max_length": 9}) == \
        engine.EncodeOptions(True, 9, "left")
    for passed_through in ({"return_offsets_mapping": True}, {"truncation": True},
                           {"truncation": "only_first", "max_length": 3},
                           {"truncation": True, "max_length": 0}, {"add_special_tokens": 1}):
        assert engine.encode_options(tok, passed_through) is None, passed_through


@pytest.mark.parametrize("name", default_run_on(MAIN_FILES))
def test_truncation_matches_transformers(name):
    """vLLM's ``truncation=True, max_length=...`` call, both sides, with and without special
    tokens, every length from 1 to past the text: dtok's IDs (or a pass-through where it
    cannot know) equal transformers' own."""
    tok = hf(name)
    hook = engine.EngineHook("test", frozen_env="DTOK_TEST_NO_SUCH_VAR")
    wrapper = hook.dtok_for(tok)
    assert wrapper is not None, hook.refusal(tok)
    text = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[:400]
    n = len(tok(text)["input_ids"])
    saved = tok.truncation_side
    try:
        for side in ("left", "right"):
            tok.truncation_side = side
            for special in (True, False):
                for length in [*range(1, 6), n - 1, n, n + 1, 10 * n]:
                    kwargs = {"truncation": True, "max_length": length,
                              "add_special_tokens": special}
                    options = engine.encode_options(tok, kwargs)
                    got = hook.encode(wrapper, text, options)
                    want = tok(text, **kwargs)["input_ids"]
                    assert got is None and length <= 1 or got == want, (side, special, length)
    finally:
        tok.truncation_side = saved


def test_truncation_control_wrong_side_is_seen():
    """The comparison above can fail: truncating from the wrong side differs."""
    tok = hf("llama3")
    wrapper = plugin.HOOK.dtok_for(tok)
    text = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[:400]
    wrong = engine.EncodeOptions(True, 20, "right" if tok.truncation_side == "left" else "left")
    want = tok(text, truncation=True, max_length=20)["input_ids"]
    assert plugin.HOOK.encode(wrapper, text, wrong) != want


def test_identity_check_with_frozen_file(monkeypatch):
    monkeypatch.setenv("DTOK_VLLM_TOKENIZER", str(shared_path("tokenizers", "llama3")))
    wrapper, why = plugin.HOOK.build(hf("llama3"))
    assert wrapper is not None, why
    # built from the file itself: the fast encoder's guard tables and the pool can use it
    assert wrapper.dtok.files.path == shared_path("tokenizers", "llama3", "tokenizer.json")
    wrapper, why = plugin.HOOK.build(hf("gpt-oss"))  # another model's file: stay out
    assert wrapper is None and "differs from" in why


def test_section_comparison_ignores_serialization_and_offsets():
    live = hf("qwen3").backend_tokenizer.to_str()  # merges as pairs, trim_offsets=True
    assert identity.compare_sections(live, shared_path(
        "tokenizers", "qwen3", "tokenizer.json").read_text(encoding="utf-8")) == []
    other = shared_path("tokenizers", "llama3", "tokenizer.json").read_text(encoding="utf-8")
    assert set(identity.compare_sections(live, other)) >= {"model", "pre_tokenizer"}


@pytest.mark.parametrize("name", ["qwen3", "llama3"])  # merges as pairs / as strings
def test_section_comparison_finds_one_changed_id(name):
    """The file compared as written (Qwen3's merges are pairs) and rewritten (Llama-3.1's are
    strings): two vocabulary IDs swapped, or a token named ``trim_offsets`` added (a key
    ignored outside the model only), make the model differ."""
    import json

    live = hf(name).backend_tokenizer.to_str()
    doc = json.loads(shared_path("tokenizers", name, "tokenizer.json").read_text(encoding="utf-8"))
    vocab = doc["model"]["vocab"]
    a, b = list(vocab)[1000:1002]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    assert identity.compare_sections(live, json.dumps(doc, ensure_ascii=False)) == ["model"]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    vocab["trim_offsets"] = len(vocab) + 1000
    assert "model" in identity.compare_sections(live, json.dumps(doc, ensure_ascii=False))


def test_trusted_overrides():
    """vLLM's thread-pool proxy overrides __call__ to delegate to copies: trusted by name;
    any other override keeps dtok out."""
    tok = hf("gpt-oss")

    class TokenizerPool(type(tok)):
        def __call__(self, *a, **k):
            return super().__call__(*a, **k)

    TokenizerPool.__module__ = "vllm.tokenizers.hf"
    TokenizerPool.__call__.__module__ = "vllm.tokenizers.hf"
    TokenizerPool.__call__.__qualname__ = \
        "maybe_make_thread_pool.<locals>.TokenizerPool.__call__"
    proxy = object.__new__(TokenizerPool)
    proxy.__dict__.update(tok.__dict__)
    assert plugin.HOOK.build(proxy)[0] is not None
    TokenizerPool.__call__.__qualname__ = "Something.__call__"
    assert "overridden" in plugin.HOOK.build(proxy)[1]


# --- the hooks on a stand-in vLLM module tree -------------------------------------------------


class FakeParams:
    """What the hooks use of vLLM's TokenizeParams."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def get_encode_kwargs(self):
        return dict(self.kwargs)


def _fake_vllm(monkeypatch):
    """Stand-ins for BaseRenderer and OpenAIServingCompletion with vLLM's call shapes."""
    executor = concurrent.futures.ThreadPoolExecutor(1)

    class BaseRenderer:
        def __init__(self, tokenizer):
            self.tokenizer = tokenizer
            self._executor = executor

            def make_async(fn):  # vLLM's make_async: run_in_executor, no context copy
                return lambda *a: asyncio.get_running_loop().run_in_executor(
                    executor, functools.partial(fn, *a))

            self._tokenize_prompt_async = make_async(self._tokenize_prompt)

        def _wants_offsets(self, prompt, params):
            return params.kwargs.get("return_offsets_mapping", False)

        def _tokenize_prompt(self, prompt, params):
            encoding = self.tokenizer(prompt["prompt"], **params.get_encode_kwargs())
            return {"prompt_token_ids": list(encoding["input_ids"]), **prompt}

    class OpenAIServingCompletion:
        def __init__(self, renderer):
            self.renderer = renderer

        async def create_completion(self, request, raw_request=None):
            return await self.renderer._tokenize_prompt_async(
                {"prompt": request.prompt}, FakeParams(**request.kwargs))

    modules = {
        "vllm.renderers.base": {"BaseRenderer": BaseRenderer},
        "vllm.entrypoints.openai.completion.serving":
            {"OpenAIServingCompletion": OpenAIServingCompletion},
    }
    for name in ("vllm", "vllm.renderers", "vllm.entrypoints", "vllm.entrypoints.openai",
                 "vllm.entrypoints.openai.completion"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    for name, attrs in modules.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
        parent, _, child = name.rpartition(".")
        setattr(sys.modules[parent], child, module)
    return BaseRenderer, OpenAIServingCompletion


def _request(prompt, session=None, **kwargs):
    return (SimpleNamespace(prompt=prompt, session_id=None, cache_salt=None, request_id="r",
                            vllm_xargs=None, kwargs=kwargs),
            SimpleNamespace(headers={"X-Session-ID": session} if session else {}))


def test_hooks_route_prompts_through_dtok_exactly(monkeypatch):
    BaseRenderer, Serving = _fake_vllm(monkeypatch)
    done = plugin.install()
    assert f"{plugin._BASE}._tokenize_prompt" in done and plugin.install() == []
    tok = hf("qwen3")
    serving = Serving(BaseRenderer(tok))
    base = "<|im_start|>user\n" + read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[
        :30000]
    before = dict(plugin.stats)

    async def run():
        text = base
        for i in range(6):
            text += f"<|im_end|>\n<|im_start|>user\nturn {i}\n"
            got = await serving.create_completion(*_request(text, "conv-1",
                                                            add_special_tokens=True))
            assert got["prompt_token_ids"] == tok(text)["input_ids"] and got["prompt"] == text
        short = await serving.create_completion(*_request(text, None, truncation=True,
                                                          max_length=17))
        assert short["prompt_token_ids"] == tok(text, truncation=True, max_length=17)[
            "input_ids"]
        offsets = await serving.create_completion(*_request(text, None,
                                                            return_offsets_mapping=True))
        assert offsets["prompt_token_ids"] == tok(text)["input_ids"]

    asyncio.run(run())
    assert plugin.stats["keyed_calls"] - before["keyed_calls"] == 6  # the key reached the thread
    assert plugin.stats["truncated"] - before["truncated"] == 1
    assert plugin.stats["passed_through"] - before["passed_through"] == 1  # the offsets call
    assert plugin.dtok_for(tok).current().sessions.stats()["repairs"] >= 5


def test_short_work_is_answered_on_the_event_loop(monkeypatch):
    """In process, the async path answers on the event loop what encodes at most
    DTOK_LOOP_CHARS characters (a session's next turn; no executor hop), and sends the rest
    (a long first turn) to the executor; with the budget 0, everything goes to the executor.
    Exact either way."""
    BaseRenderer, Serving = _fake_vllm(monkeypatch)
    plugin.install()
    tok = hf("llama3")
    serving = Serving(BaseRenderer(tok))
    base = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[:100_000]
    wrapper = plugin.dtok_for(tok)
    seen: list[str] = []  # the thread of each dtok answer
    for name in ("encode_list", "try_encode_list"):
        method = getattr(wrapper.current(), name)

        def recording(*args, _method=method, **kwargs):
            out = _method(*args, **kwargs)
            if out is not None:
                seen.append(threading.current_thread().name)
            return out

        monkeypatch.setattr(wrapper.current(), name, recording)

    async def turns(session: str) -> list[str]:
        seen.clear()
        loop_thread = threading.current_thread().name
        text = base
        for i in range(4):
            text += f" Turn {i}."
            got = await serving.create_completion(*_request(text, session))
            assert got["prompt_token_ids"] == tok(text)["input_ids"]
        return ["loop" if name == loop_thread else "executor" for name in seen]

    assert asyncio.run(turns("loop-1")) == ["executor", "loop", "loop", "loop"]
    engine.configure(loop_chars=0)
    try:
        assert asyncio.run(turns("loop-2")) == ["executor"] * 4
    finally:
        engine.configure()


def test_the_loop_thread_is_warmed_once_dtok_is_built(monkeypatch):
    """A thread's first fast-encoder call sets up its state (measured 2-38 ms): when an event
    loop that answers short work itself started dtok's build, its thread encodes a short text
    as soon as dtok is built, between requests, so no request answered there waits for it."""
    import dtok

    hook = engine.EngineHook("test", frozen_env="DTOK_TEST_NO_SUCH_FILE")
    tok = transformers.AutoTokenizer.from_pretrained(str(shared_path("tokenizers", "llama3")))
    threads: list[str] = []
    encode = dtok.Tokenizer.encode
    monkeypatch.setattr(dtok.Tokenizer, "encode", lambda self, *a, **k: (
        threads.append(threading.current_thread().name), encode(self, *a, **k))[1])

    async def first_request() -> str:
        got = await hook.serve_async(lambda: (tok, "hello", engine.EncodeOptions()),
                                     lambda: asyncio.sleep(0, "the engine's own"),
                                     executor_backed=True)
        for _ in range(600):  # the build: seconds
            if threading.current_thread().name in threads:
                break
            await asyncio.sleep(0.05)
        return got

    assert asyncio.run(first_request()) == "the engine's own"  # while dtok is built
    assert threading.current_thread().name in threads, threads


def test_disabled_hook_passes_everything_through(monkeypatch):
    BaseRenderer, Serving = _fake_vllm(monkeypatch)
    plugin.install()
    renderer = BaseRenderer(hf("llama3"))
    before = plugin.stats["dtok_calls"]
    plugin.HOOK.enabled = False
    try:
        got = renderer._tokenize_prompt({"prompt": "hello"}, FakeParams())
    finally:
        plugin.HOOK.enabled = True
    assert got["prompt_token_ids"] == hf("llama3")("hello")["input_ids"]
    assert plugin.stats["dtok_calls"] == before


def test_register_is_opt_in(monkeypatch):
    monkeypatch.delenv("DTOK_VLLM", raising=False)
    plugin.register()  # no vllm needed: nothing happens without DTOK_VLLM=1


def test_entry_point_declared():
    text = (ROOT / "pyproject.toml").read_text()
    assert '[project.entry-points."vllm.general_plugins"]' in text
    assert 'dtok = "dtok.integrations.vllm:register"' in text


# --- the pool-backed route ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def pooled():
    """Hooks with a 2-worker pool; dtok built from the file (DTOK_VLLM_TOKENIZER), which the
    pool loads."""
    os.environ["DTOK_VLLM_TOKENIZER"] = str(shared_path("tokenizers", "llama3"))
    engine.configure(pool_workers=2, pool_min_chars=4096)
    hook = engine.EngineHook("vLLM", frozen_env="DTOK_VLLM_TOKENIZER")
    tok = transformers.AutoTokenizer.from_pretrained(str(shared_path("tokenizers", "llama3")))
    wrapper = hook.dtok_for(tok)
    pool = hook.pool_for(wrapper.current(), wait=300)
    try:
        yield hook, tok, wrapper, pool
    finally:
        engine.configure()
        os.environ.pop("DTOK_VLLM_TOKENIZER", None)
        if pool is not None:
            pool.close()


def test_pool_backed_route(pooled):
    hook, tok, wrapper, pool = pooled
    assert pool is not None, hook.pool_state()
    base = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[:50000]

    async def run():
        text = base
        for i in range(5):  # keyed: to the pool, repaired there
            text += f" turn {i}."
            ids = await hook.encode_async(wrapper, text, engine.EncodeOptions(), "sid:p")
            assert ids == tok(text)["input_ids"]
        short = await hook.encode_async(wrapper, "short text", engine.EncodeOptions(False))
        assert short == tok("short text", add_special_tokens=False)["input_ids"]
        cut = {"truncation": True, "max_length": 100}
        long = await hook.encode_async(wrapper, base, engine.encode_options(tok, cut))
        assert long == tok(base, **cut)["input_ids"]

    asyncio.run(run())
    assert hook.stats["pool_calls"] == 6 and hook.stats["dtok_calls"] == 7
    assert pool.stats()["session_repairs"] >= 4
    assert hook.encode(wrapper, base + "!", engine.EncodeOptions(), "sid:p") == \
        tok(base + "!")["input_ids"]  # blocking route (an executor thread)


def test_loop_chars_bounds_the_pools_planning_on_the_loop(pooled):
    """DTOK_LOOP_CHARS reaches the pool: a keyed session's next turn is planned on the event
    loop by default, and never with 0 (the pool's submit thread plans it)."""
    hook, tok, wrapper, pool = pooled
    base = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[60_000:110_000]
    planner = parts_of(pool.tokenizer).planner
    plan, threads = planner.plan, []

    def spy(*args, **kwargs):
        threads.append(threading.get_ident())
        return plan(*args, **kwargs)

    async def turns(key):
        text = base
        for i in range(4):
            text += f" turn {i}."
            assert await hook.encode_async(wrapper, text, engine.EncodeOptions(), key) == \
                tok(text)["input_ids"]
            await asyncio.sleep(0.02)
        return threading.get_ident()

    on_loop = {}
    planner.plan = spy
    try:
        for loop_chars in (None, 0):
            engine.configure(pool_workers=2, pool_min_chars=4096, loop_chars=loop_chars)
            threads.clear()
            loop_thread = asyncio.run(turns(f"sid:loop{loop_chars}"))
            on_loop[loop_chars] = [t == loop_thread for t in threads]
    finally:
        planner.plan = plan
        engine.configure(pool_workers=2, pool_min_chars=4096)
    assert on_loop[None][1:] == [True] * 3 and on_loop[0] == [False] * 4, on_loop


# --- the real vLLM ------------------------------------------------------------------------------


def _vllm_runner() -> list[str] | None:
    """How to run tools/engines/vllm_check.py here: in this interpreter when vLLM imports, else
    through its cached venv when that exists and DTOK_ENGINE_CHECKS=1 (a minute more each);
    None: no vLLM here (tests never build the venv)."""
    tool = str(ROOT / "tools" / "engines" / "vllm_check.py")
    if importlib.util.find_spec("vllm") is not None:
        return [sys.executable, tool, "--inner"]
    sys.path.insert(0, str(ROOT / "tools" / "engines"))
    try:
        import engine_setup
        import vllm_check
    finally:
        sys.path.pop(0)
    if engine_setup.built(vllm_check.VENV_NAME) and os.environ.get("DTOK_ENGINE_CHECKS") == "1":
        return [sys.executable, tool]
    return None


@pytest.mark.parametrize("mode", ["check", "control"])
def test_real_vllm(mode):
    """The plugin inside vLLM's real render server (tools/engines/vllm_check.py, qwen3): every
    answer equal to vLLM's own; and its control finds differences with a guard switched off."""
    runner = _vllm_runner()
    if runner is None:
        pytest.skip("vLLM is not importable here (run python tools/engines/vllm_check.py, or "
                    "set DTOK_ENGINE_CHECKS=1 to run it through its cached venv)")
    shared_path("tokenizers", "qwen3")  # fails under CI when ../shared is missing
    cmd = runner + ["qwen3"] + (["--control"] if mode == "control" else [])
    env = {**os.environ, "DTOK_VLLM": "1", "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    last = run.stdout.strip().splitlines()[-1]
    if mode == "check":
        assert "dtok ON" in run.stdout and last.endswith(" 0 mismatches"), last
    else:
        assert last.endswith("differences found") and "NO DIFF" not in last, last


def test_pool_backed_tenants_never_share_state(pooled):
    """Through the pool route: the same session id under two cache salts reuses nothing, under
    one it does; salted requests without a session id continue only their own tenant's text."""
    hook, tok, wrapper, pool = pooled
    assert pool is not None, hook.pool_state()
    base = read_text("prose", "gutenberg-2701_moby-dick.txt")[:30000]
    turns = [base + "".join(f" turn {j}." for j in range(i + 1)) for i in range(3)]
    s0 = pool.stats()
    delta = lambda k: pool.stats()[k] - s0[k]  # noqa: E731

    def ask(text, salt, sid=None, model=None):
        key = engine.session_key(session_id=sid, cache_salt=salt, model=model)
        ids = asyncio.run(hook.encode_async(wrapper, text, engine.EncodeOptions(), key))
        assert ids == tok(text)["input_ids"]

    ask(turns[0], "A", "same-id")
    ask(turns[1], "B", "same-id")
    ask(turns[1], "A", "same-id", model="lora-x")  # another adapter: another tenant
    assert (delta("session_full_encodes"), delta("session_repairs")) == (3, 0)
    ask(turns[2], "A", "same-id")
    assert delta("session_repairs") == 1
    other = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[:20000]
    ask(other, "C")
    ask(other + " more", "D")
    assert delta("lookup_hits") == 0
    ask(other + " more", "C")
    assert delta("lookup_hits") == 1


def test_report_while_calls_are_answered():
    """A stats endpoint reads :meth:`EngineHook.report` (and the recent timings) while executor
    threads answer calls: what it reads is copied, never iterated while a thread appends
    (seen in ``vllm serve``: ``deque mutated during iteration`` from ``/ttft_switch`` during a
    burst of requests)."""
    import threading

    tok = hf("qwen3")
    hook = engine.EngineHook("test", frozen_env="DTOK_TEST_NO_SUCH_VAR")
    assert hook.dtok_for(tok) is not None, hook.refusal(tok)
    stop, failures = threading.Event(), []

    def serve():
        while not stop.is_set():
            hook.serve(lambda: (tok, "a few words", engine.EncodeOptions()), lambda: None)

    saved = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the race shows at once
    threads = [threading.Thread(target=serve) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        while len(hook.recent_timings()) < 4096:
            pass
        for _ in range(300):
            try:
                hook.report()
                hook.recent_timings()
            except RuntimeError as exc:
                failures.append(str(exc))
    finally:
        stop.set()
        for t in threads:
            t.join()
        sys.setswitchinterval(saved)
    assert failures == []
