"""Bench-only per-request tokenizer switch inside one ``vllm serve`` (benches/bench_ttft.py).

The request header ``X-TTFT-Mode`` picks who turns the prompt text into IDs in vLLM's renderer:

* ``dtok``: dtok's hooks (the plugin as deployed);
* ``vllm``: vLLM's own ``_tokenize_prompt`` (the function dtok's hook wraps), in vLLM's executor;
* ``oracle``: a zero-cost tokenizer: the reference's IDs of every prompt, computed by the bench
  before the run (``DTOK_TTFT_ORACLE``: a pickle of {sha1(text) + special flag: list of IDs}),
  looked up by the text's hash, in the same executor call as ``vllm``, handed over as a fresh
  list like vLLM's own. A text not in the table
  is tokenized by vLLM and counted as a miss.

Everything else about a request is identical, so modes can be compared paired inside one
server. ``GET /ttft_switch`` answers the counters.
"""
from __future__ import annotations

import asyncio
import contextvars
import gc
import hashlib
import os
import pickle
import threading
import time

MODE: contextvars.ContextVar[str] = contextvars.ContextVar("ttft_mode", default="dtok")
HEADER = "X-TTFT-Mode"
COUNTS = {"dtok": 0, "vllm": 0, "oracle": 0, "oracle_misses": 0}
_TABLE: dict | None = None
_LOCK = threading.Lock()


def oracle_key(text: str, special: bool) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest() + "+-"[special]


def _table() -> dict:
    global _TABLE
    if _TABLE is None:
        with _LOCK:
            if _TABLE is None:
                with open(os.environ["DTOK_TTFT_ORACLE"], "rb") as f:
                    table = pickle.load(f)
                # millions of ints in long-lived lists: out of the collector's way, so that
                # no full collection walks them during a measured request
                gc.freeze()
                _TABLE = table
    return _TABLE


def _oracle(self, prompt, params, original):
    kwargs = params.get_encode_kwargs()
    ids = _table().get(oracle_key(prompt["prompt"], kwargs.get("add_special_tokens", True)))
    if ids is None:
        COUNTS["oracle_misses"] += 1
        return original(self, prompt, params)
    max_length = kwargs.get("max_length")
    if kwargs.get("truncation") and max_length is not None and len(ids) > max_length:
        ids = ids[:max_length]  # right side; only over-long prompts, which vLLM then rejects
    # a fresh list, as vLLM's own _build_tokens_prompt hands over (and the table stays intact)
    return {"prompt_token_ids": list(ids), **prompt}


def _bind_mode(orig):
    async def create(self, request, raw_request=None, *args, **kwargs):
        headers = getattr(raw_request, "headers", None)
        token = MODE.set((headers.get(HEADER) if headers is not None else None) or "dtok")
        try:
            return await orig(self, request, raw_request, *args, **kwargs)
        finally:
            MODE.reset(token)
    return create


_GC_START = [0.0]


def _gc_timer(phase: str, info: dict) -> None:
    """Time the collector's passes in this process (per generation): a full collection walks
    every tracked list, the prompts' ID lists included."""
    if phase == "start":
        _GC_START[0] = time.perf_counter()
    else:
        key = f"gc{info.get('generation')}"
        COUNTS[key] = COUNTS.get(key, 0) + 1
        COUNTS[key + "_ms"] = round(COUNTS.get(key + "_ms", 0.0)
                                    + (time.perf_counter() - _GC_START[0]) * 1e3, 3)


def install() -> None:
    from vllm.renderers.base import BaseRenderer

    gc.callbacks.append(_gc_timer)

    from dtok.integrations import patching

    hooked = BaseRenderer._tokenize_prompt  # dtok's AROUND hook
    vllm_own = hooked.__wrapped__

    def tokenize_prompt(self, prompt, params, *args, **kwargs):
        mode = MODE.get()
        COUNTS[mode] = COUNTS.get(mode, 0) + 1
        t0 = time.perf_counter()
        try:
            if mode == "oracle" and not args and not kwargs:
                return _oracle(self, prompt, params, vllm_own)
            if mode in ("vllm", "oracle"):
                return vllm_own(self, prompt, params, *args, **kwargs)
            return hooked(self, prompt, params, *args, **kwargs)
        finally:  # the executor call's own time, per mode (the tokenizer's share)
            key = f"{mode}_ms"
            COUNTS[key] = round(COUNTS.get(key, 0.0) + (time.perf_counter() - t0) * 1e3, 3)

    BaseRenderer._tokenize_prompt = tokenize_prompt

    init = BaseRenderer.__init__

    def renderer_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        dtok_async = self._tokenize_prompt_async

        async def tokenize_prompt_async(prompt, params):
            if MODE.get() == "dtok":
                return await dtok_async(prompt, params)
            return await patching.run_in_context(asyncio.get_running_loop(), self._executor,
                                                 self._tokenize_prompt, prompt, params)

        self._tokenize_prompt_async = tokenize_prompt_async

    BaseRenderer.__init__ = renderer_init

    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion

    OpenAIServingCompletion.create_completion = _bind_mode(
        OpenAIServingCompletion.create_completion)
    OpenAIServingChat.create_chat_completion = _bind_mode(OpenAIServingChat.create_chat_completion)
    try:  # /tokenize too (tools/engines/serve_check.py compares bad input and bursts through it)
        from vllm.entrypoints.serve.tokenize.serving import ServingTokenization
    except ImportError:
        pass
    else:
        ServingTokenization.create_tokenize = _bind_mode(ServingTokenization.create_tokenize)
    _add_route()


def _add_route() -> None:
    """``GET /ttft_switch``: the counters (and dtok's hook stats) of this API process."""
    try:
        from vllm.entrypoints.launchers.api_server import entry
    except ImportError:
        return
    build_app = entry.build_app

    def build(*args, **kwargs):
        app = build_app(*args, **kwargs)

        from dtok.integrations import vllm as plugin

        @app.get("/ttft_switch")
        async def counters():
            return {"pid": os.getpid(), "switch": dict(COUNTS), "dtok": dict(plugin.stats),
                    "report": plugin.HOOK.report(), "timings": plugin.HOOK.recent_timings()}

        return app

    entry.build_app = build
