"""Route vLLM's prompt tokenization through dtok: exact IDs, session repair per request.

Opt in with ``DTOK_VLLM=1`` in the server's environment: dtok is a vLLM general plugin
(entry-point group ``vllm.general_plugins``), which vLLM loads in every process before it
builds the renderer; :func:`register` then patches the classes below. Without ``DTOK_VLLM=1``
it does nothing. For a process that does not load plugins, call :func:`install` first.

Hooks (names and signatures the same in vLLM 0.33 and 0.34; missing ones are skipped with a
warning):

* ``BaseRenderer._tokenize_prompt`` (around): the one place the renderer turns a text prompt
  into IDs, for completions and rendered chat alike (``HfRenderer`` inherits it). A ``str``
  prompt whose call dtok can reproduce (``add_special_tokens``, and the ``truncation=True,
  max_length=...`` vLLM passes to detect over-long prompts) is encoded by dtok with the
  request's session key; offsets (``return_token_offsets``) and anything else go to vLLM.
* ``BaseRenderer.__init__`` (around): the renderer's async tokenization runs
  ``_tokenize_prompt`` on its executor; dtok's version carries the request's context (the
  session key) into that thread, and with a pool (``DTOK_POOL_WORKERS=N``) awaits keyed and
  long prompts from the pool on the event loop instead of occupying an executor thread; in
  process, a prompt whose answer encodes at most ``DTOK_LOOP_CHARS`` characters (a session's
  next turn) is answered on the event loop, without the executor's hop.
* ``create_chat_completion``, ``create_completion``, ``create_responses``,
  ``create_messages`` (Anthropic), ``create_tokenize`` (``/tokenize``), and the GPU-less render
  server's ``render_chat_request`` / ``render_completion_request`` (around): bind the session
  key where the request is parsed, because vLLM itself resolves the session id only after
  rendering.

``DTOK_LOOP_LAG=PATH``: an event-loop lag probe (:mod:`dtok.integrations.lag`) starts on the
API server's loop at the first request and writes the lag and the stack of every stall there.

Session, first found: the body's ``session_id``, the ``X-Session-ID`` header, vLLM's
``vllm_xargs["session_id"]`` (the order of vLLM's own ``_get_session_id``), then the request id
(``X-Request-Id`` header, else the body's ``request_id``) up to ``DTOK_VLLM_RID_SEP`` when that
separator is set and present; none: dtok's content lookup. Scope (the tenant, which sessions and
content lookup never cross): the ``cache_salt`` and the ``model`` (a LoRA adapter's name).

Identity: dtok is built from the tokenizer the renderer holds (its live backend; vLLM's
thread-pool proxy around it only delegates to copies of the same tokenizer). With
``DTOK_VLLM_TOKENIZER=/path/tokenizer.json`` that file is compared with the live backend
section by section and dtok stays out on any difference; probe texts are encoded both ways and
any mismatch, any other tokenizer type (e.g. ``tokenizer_mode=mistral``), and any error in a
hook leave tokenization to vLLM. gpt-oss chat is rendered by openai-harmony, not by the HF
tokenizer, so it is not hooked.

vLLM takes the IDs as ``list[int]`` (``TokensPrompt.prompt_token_ids``; the engine request is a
msgspec struct typed ``list[int]``); its output processor may extend a request's prompt list
in place for streaming-input updates, so the list handed over belongs to vLLM.
"""
from __future__ import annotations

import asyncio
import logging
import os

from dtok import allocator
from dtok.integrations import engine, lag, patching
from dtok.integrations.engine import bound_key, encode_options

log = logging.getLogger("dtok.vllm")

__all__ = ["register", "install", "session_key", "dtok_for", "stats", "HOOK", "TARGETS"]

HOOK = engine.EngineHook(
    "vLLM", frozen_env="DTOK_VLLM_TOKENIZER",
    trusted_overrides=("vllm.tokenizers.hf.maybe_make_thread_pool.<locals>.TokenizerPool.",))
stats = HOOK.stats
dtok_for = HOOK.dtok_for

_LOOP_LAG = bool(os.environ.get("DTOK_LOOP_LAG"))  # see dtok.integrations.lag
SESSION_ID_HEADER = "X-Session-ID"
REQUEST_ID_HEADER = "X-Request-Id"


def _header(raw_request, name: str):
    headers = getattr(raw_request, "headers", None)
    return headers.get(name) if headers is not None else None


def session_key(request, raw_request=None, rid_separator: str | None = None):
    """The key (:class:`dtok.integrations.engine.RequestKey`) of an OpenAI-style request (and
    its HTTP request), scoped by its ``cache_salt`` and ``model``, or None."""
    sid = getattr(request, "session_id", None) or _header(raw_request, SESSION_ID_HEADER)
    xargs = getattr(request, "vllm_xargs", None)
    if not sid and isinstance(xargs, dict):
        sid = xargs.get("session_id")
    sep = rid_separator if rid_separator is not None else os.environ.get("DTOK_VLLM_RID_SEP")
    rid = _header(raw_request, REQUEST_ID_HEADER) or getattr(request, "request_id", None)
    return engine.session_key(session_id=sid, cache_salt=getattr(request, "cache_salt", None),
                              request_id=rid, rid_separator=sep,
                              model=getattr(request, "model", None))  # a LoRA adapter's name too


# --- hooks (AROUND: called with the original function first) ----------------------------------


async def _bind_request_key(orig, self, request, raw_request=None, *args, **kwargs):
    if _LOOP_LAG:
        lag.start_on_running_loop()
    with bound_key(session_key(request, raw_request)):
        return await orig(self, request, raw_request, *args, **kwargs)


def _dtok_call(renderer, prompt, params):
    """(tokenizer, text, options) when dtok may answer this ``_tokenize_prompt`` call, else
    None: a ``str`` prompt without offsets, with options dtok can reproduce."""
    text = prompt.get("prompt") if isinstance(prompt, dict) else None
    if not isinstance(text, str) or renderer._wants_offsets(prompt, params):
        return None
    tokenizer = renderer.tokenizer
    options = encode_options(tokenizer, params.get_encode_kwargs())
    return None if options is None else (tokenizer, text, options)


def _tokens_prompt_of(prompt):
    """IDs -> the TokensPrompt answering ``prompt``: vLLM's _build_tokens_prompt without
    offsets, minus its list() copy of the IDs (a TypedDict: at run time, this dict)."""
    return lambda ids: {"prompt_token_ids": ids, **prompt}


def _tokenize_prompt(orig, self, prompt, params, *args, **kwargs):
    return HOOK.serve(lambda: None if args or kwargs else _dtok_call(self, prompt, params),
                      lambda: orig(self, prompt, params, *args, **kwargs),
                      _tokens_prompt_of(prompt))


def _renderer_init(orig, self, *args, **kwargs):
    orig(self, *args, **kwargs)
    executor = getattr(self, "_executor", None)
    if executor is None or not hasattr(self, "_tokenize_prompt_async"):
        log.warning("dtok: this vLLM renderer has no executor-backed _tokenize_prompt_async; "
                    "async requests are tokenized without their session key")
        return

    async def tokenize_prompt_async(prompt, params):
        # on the event loop: only a built dtok, a started pool and short work (a session's next
        # turn); the rest in the executor, where the blocking hook runs with the request's
        # context
        return await HOOK.serve_async(
            lambda: _dtok_call(self, prompt, params),
            lambda: patching.run_in_context(asyncio.get_running_loop(), executor,
                                            self._tokenize_prompt, prompt, params),
            _tokens_prompt_of(prompt), executor_backed=True)

    self._tokenize_prompt_async = tokenize_prompt_async


_BASE = "vllm.renderers.base.BaseRenderer"
_OPENAI = "vllm.entrypoints.openai"
_RENDER = "vllm.entrypoints.scale_out.render.serving.ServingRender"
TARGETS = (
    (f"{_BASE}.__init__", _renderer_init),
    (f"{_BASE}._tokenize_prompt", _tokenize_prompt),
    (f"{_OPENAI}.chat_completion.serving.OpenAIServingChat.create_chat_completion",
     _bind_request_key),
    (f"{_OPENAI}.completion.serving.OpenAIServingCompletion.create_completion",
     _bind_request_key),
    (f"{_OPENAI}.responses.serving.OpenAIServingResponses.create_responses", _bind_request_key),
    ("vllm.entrypoints.anthropic.serving.AnthropicServingMessages.create_messages",
     _bind_request_key),
    (f"{_RENDER}.render_chat_request", _bind_request_key),
    (f"{_RENDER}.render_completion_request", _bind_request_key),
    ("vllm.entrypoints.serve.tokenize.serving.ServingTokenization.create_tokenize",
     _bind_request_key),
)


def install() -> list[str]:
    """Patch vLLM in this process; returns the targets patched now (idempotent). Call before
    vLLM builds its renderer."""
    done = patching.patch(TARGETS, "vllm.")
    for target, _hook in TARGETS:
        if target not in done and patching.resolve(target)[0] is None:
            log.warning("dtok: this vLLM has no %s; hook skipped", target)
    return done


def register() -> None:
    """vLLM general-plugin entry point (``load_general_plugins()``, in every vLLM process).
    A no-op unless ``DTOK_VLLM=1``."""
    if os.environ.get("DTOK_VLLM") != "1":
        return
    allocator.tune()  # a front end that encodes megabyte texts stays flat (dtok.allocator)
    install()
