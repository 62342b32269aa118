"""Bench-only per-request tokenizer switch inside one ``vllm serve`` (benches/bench_ttft.py).

The request header ``X-TTFT-Mode`` picks who turns the prompt text into IDs in vLLM's renderer:

* ``dtok``: dtok's hooks (the plugin as deployed);
* ``vllm``: vLLM's own ``_tokenize_prompt`` (the function dtok's hook wraps), in vLLM's executor;
* ``oracle``: a zero-cost tokenizer, the floor: the reference's IDs of every prompt, computed by
  the bench before the run (``DTOK_TTFT_ORACLE``: a pickle of {sha1(text) + special flag: list
  of IDs}), looked up by the text's hash on the event loop (the cheapest path any tokenizer
  takes: no executor hop, no queue behind other tokenizations; dtok's pool path answers on the
  loop too) and handed over as the table's own list (no copy; dtok hands over its list, vLLM's
  own path copies). A text not in the table is tokenized by vLLM's own code and counted as a
  miss.

Everything else about a request is identical, so modes can be compared paired inside one
server. ``GET /ttft_switch`` answers the counters and, per request, the mode and stamps in ms
since the handler began (``tok_call`` / ``tok_done``: the renderer's async tokenize call on the
loop; ``exec_start`` / ``exec_end``: the blocking ``_tokenize_prompt`` in the executor;
``add_request``: the renderer done, ``AsyncLLM.add_request``; ``core_sent``: the request handed
to the engine core; ``first_output``: the first output back), and the collector's time and full
passes (``gc_ms``, ``gc_full``) in this process between the handler and the first output.

Why the oracle once looked slower than dtok (``dtok - oracle -129 ms``): not its code path. In
the server its answer took ~0.7 ms (sha1 and a list copy in the executor) against dtok's ~0.7 ms;
the difference was the workload: each mode's session appended slices of equal *characters*
from random places of a transcript, and with the default seed (the same appends in every run,
hence the same sign in every run) the oracle's slices held 2-4x the tokens of dtok's (median
508 against 219 new tokens a turn: tool output and code against prose), and the
engine's prefill over a ~100K-token context costs ~0.55 ms per new token on this CPU (a fit of
that run's turns: at equal new tokens the oracle was ~45 ms below dtok). The bench now appends
the same number of tokens in every mode.
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
# per-request timestamps (ms since the handler began), the request's mode, and the collector's
# time and passes in this process between the handler and the first output
TRACE: contextvars.ContextVar[dict | None] = contextvars.ContextVar("ttft_trace", default=None)
TRACES: list[dict] = []
_GC_TOTAL = {"ms": 0.0, "passes": 0, "full": 0}
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


def _oracle(prompt, params):
    """The oracle's TokensPrompt for this call, or None (a miss, counted: vLLM then tokenizes).
    The table's own list is handed over, as dtok hands over its list (vLLM's own path copies)."""
    kwargs = params.get_encode_kwargs()
    ids = _table().get(oracle_key(prompt["prompt"], kwargs.get("add_special_tokens", True)))
    if ids is None:
        COUNTS["oracle_misses"] += 1
        return None
    max_length = kwargs.get("max_length")
    if kwargs.get("truncation") and max_length is not None and len(ids) > max_length:
        ids = ids[:max_length]  # right side; only over-long prompts, which vLLM then rejects
    return {"prompt_token_ids": ids, **prompt}


def _bind_mode(orig):
    async def create(self, request, raw_request=None, *args, **kwargs):
        headers = getattr(raw_request, "headers", None)
        mode = (headers.get(HEADER) if headers is not None else None) or "dtok"
        token = MODE.set(mode)
        rec = {"mode": mode, "t0": time.perf_counter(), "keyed": bool(
            headers is not None and headers.get("X-Session-ID")), "gc0": dict(_GC_TOTAL),
            "rid": headers.get("X-Request-Id") if headers is not None else None}
        TRACES.append(rec)
        del TRACES[:-4000]
        TRACE.set(rec)
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
        ms = (time.perf_counter() - _GC_START[0]) * 1e3
        key = f"gc{info.get('generation')}"
        COUNTS[key] = COUNTS.get(key, 0) + 1
        COUNTS[key + "_ms"] = round(COUNTS.get(key + "_ms", 0.0) + ms, 3)
        _GC_TOTAL["ms"] += ms
        _GC_TOTAL["passes"] += 1
        _GC_TOTAL["full"] += info.get("generation") == 2


def _rec_for(request_id) -> dict | None:
    """The trace of an engine request id: vLLM's id contains the ``X-Request-Id`` header."""
    if isinstance(request_id, str):
        for rec in reversed(TRACES[-64:]):
            if rec.get("rid") and rec["rid"] in request_id:
                return rec
    return None


def mark(name: str, rec: dict | None = None) -> None:
    """Stamp this request's trace (first time only) with ``name``: ``rec``, else the context's
    (the handler's task; vLLM streams the response from another task, whose stamps pass
    ``rec``)."""
    rec = rec if rec is not None else TRACE.get()
    if rec is not None and name not in rec:
        rec[name] = round((time.perf_counter() - rec["t0"]) * 1e3, 3)
        if name == "first_output":
            rec["gc_ms"] = round(_GC_TOTAL["ms"] - rec["gc0"]["ms"], 3)
            rec["gc_full"] = _GC_TOTAL["full"] - rec["gc0"]["full"]
            rec["gc_passes"] = _GC_TOTAL["passes"] - rec["gc0"]["passes"]


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
        mark("exec_start")
        try:
            if mode == "oracle" and not args and not kwargs:
                answer = _oracle(prompt, params)
                if answer is not None:
                    return answer
            if mode in ("vllm", "oracle"):
                return vllm_own(self, prompt, params, *args, **kwargs)
            return hooked(self, prompt, params, *args, **kwargs)
        finally:  # the executor call's own time, per mode (the tokenizer's share)
            mark("exec_end")
            key = f"{mode}_ms"
            COUNTS[key] = round(COUNTS.get(key, 0.0) + (time.perf_counter() - t0) * 1e3, 3)

    BaseRenderer._tokenize_prompt = tokenize_prompt

    init = BaseRenderer.__init__

    def renderer_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        dtok_async = self._tokenize_prompt_async

        async def tokenize_prompt_async(prompt, params):
            mark("tok_call")
            try:
                if MODE.get() == "oracle":  # on the loop: no executor hop, no queue
                    t0 = time.perf_counter()
                    answer = _oracle(prompt, params)
                    COUNTS["oracle"] += 1
                    COUNTS["oracle_ms"] = round(COUNTS.get("oracle_ms", 0.0)
                                                + (time.perf_counter() - t0) * 1e3, 3)
                    if answer is not None:
                        return answer
                    return await patching.run_in_context(  # a miss: vLLM's own, as "vllm"
                        asyncio.get_running_loop(), self._executor, vllm_own, self, prompt,
                        params)
                if MODE.get() == "dtok":
                    return await dtok_async(prompt, params)
                return await patching.run_in_context(asyncio.get_running_loop(), self._executor,
                                                     self._tokenize_prompt, prompt, params)
            finally:
                mark("tok_done")

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
    _trace_engine()
    _add_route()


def _trace_engine() -> None:
    """Stamps: AsyncLLM.add_request (the renderer done), the request sent to the engine core,
    the first output back."""
    from vllm.v1.engine.async_llm import AsyncLLM

    add_request, add_core = AsyncLLM.add_request, AsyncLLM._add_request
    generate = AsyncLLM.generate

    async def traced_add_request(self, request_id, *args, **kwargs):
        mark("add_request", _rec_for(request_id))
        return await add_request(self, request_id, *args, **kwargs)

    async def traced_add_core(self, request, *args, **kwargs):
        try:
            return await add_core(self, request, *args, **kwargs)
        finally:
            mark("core_sent", _rec_for(getattr(request, "request_id", None)))

    async def traced_generate(self, prompt, sampling_params, request_id, *args, **kwargs):
        rec = _rec_for(request_id)
        async for out in generate(self, prompt, sampling_params, request_id, *args, **kwargs):
            mark("first_output", rec)
            yield out

    AsyncLLM.add_request, AsyncLLM._add_request = traced_add_request, traced_add_core
    AsyncLLM.generate = traced_generate


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
            # off the loop: the pools' stats read /proc (10-16 ms, stalls the probe names)
            report = await asyncio.get_running_loop().run_in_executor(None, plugin.HOOK.report)
            return {"pid": os.getpid(), "switch": dict(COUNTS), "dtok": dict(plugin.stats),
                    "report": report, "timings": plugin.HOOK.recent_timings(),
                    "traces": [{k: v for k, v in r.items() if k not in ("t0", "gc0")}
                               for r in TRACES]}

        return app

    entry.build_app = build
