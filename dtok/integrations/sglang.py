"""Route SGLang's prompt tokenization through dtok: exact IDs, session repair per request.

Opt in with ``DTOK_SGLANG=1`` in the server's environment: dtok registers itself as an SGLang
general plugin (entry-point group ``sglang.srt.plugins``, SGLang >= 0.5.11), and SGLang applies
its hooks at start-up. For other versions call :func:`install` before serving.

Hooks (names of SGLang 0.5.22-0.5.23; missing ones are skipped with a warning):

* ``TokenizerManager._tokenize_one_request`` (around): binds the request's session key to a
  context variable for the duration of its tokenization;
* ``TokenizerManager._tokenize_texts`` (around): one prompt string of a generation model is
  encoded by dtok with that key; anything else goes to SGLang's own code;
* ``OpenAIServingChat._convert_to_internal_request`` (around): binds the key for chat requests,
  whose rendered prompt ``parallel_prompt_encode`` / ``encode_prompt_segments`` then encode
  (also hooked, when called with ``add_special_tokens`` and/or truncation to ``max_length``).

With ``DTOK_POOL_WORKERS=N`` (see :mod:`dtok.integrations.engine`), keyed sessions and long
prompts go to a :class:`dtok.Pool`: awaited in ``_tokenize_texts`` (the event loop never waits
behind an encode), waited for in the chat path's executor thread.

SGLang's tokenizer object is never replaced (type checks, chat templates, decoding and grammar
backends keep seeing its own). Session, first found: SGLang's ``session_id`` (the whole
transcript every turn), then the model gateway's routing key (``routing_key``, which SGLang's
OpenAI server fills from the ``x-smg-routing-key`` header), then the request id up to
``DTOK_SGLANG_RID_SEP`` when that separator is set and present; none: dtok's content lookup.
Scope (the tenant, which sessions and content lookup never cross): the ``cache_salt`` and the
LoRA adapter (``lora_path``) or ``model``.

Identity: dtok is built from the tokenizer SGLang actually loaded (its live backend, after
SGLang's own post-load fixes). With ``DTOK_SGLANG_TOKENIZER=/path/tokenizer.json`` that file is
compared with the live backend section by section (model, normalizer, pre-tokenizer, added
tokens, post-processor) and dtok stays out on any difference. Then probe texts are encoded both
ways; any mismatch, or a slow/non-tokenizers tokenizer, overridden ``encode``/``__call__`` or
``split_special_tokens``, also leaves tokenization to SGLang. Any error in a hook falls back to
SGLang's original code.

SGLang takes the IDs as a ``list[int]``: ``_validate_one_request`` may shorten it in place
(``del input_ids[context_len:]`` with ``allow_auto_truncate``) and ``_create_tokenized_object``
copies it into an ``array("q")`` for the scheduler.
"""
from __future__ import annotations

import logging
import os

from dtok import allocator
from dtok.integrations import engine, patching
from dtok.integrations.engine import EncodeOptions, bound_key, encode_options
from dtok.integrations.identity import compare_sections

log = logging.getLogger("dtok.sglang")

__all__ = ["register", "install", "session_key", "compare_sections", "dtok_for", "stats", "HOOK"]

HOOK = engine.EngineHook("SGLang", frozen_env="DTOK_SGLANG_TOKENIZER")
stats = HOOK.stats
dtok_for = HOOK.dtok_for
_build = HOOK.build


ROUTING_KEY_HEADER = "x-smg-routing-key"  # SGLang's model gateway pins a session by it


def session_key(request, rid_separator: str | None = None, raw_request=None):
    """The key (:class:`dtok.integrations.engine.RequestKey`) of a GenerateReqInput or an OpenAI
    request (and its HTTP request), or None: the session is ``session_id``, else the gateway's
    routing key (``routing_key``, or the ``x-smg-routing-key`` header), else the ``rid``
    prefix; the scope is ``cache_salt`` and the LoRA adapter (``lora_path``) or ``model``."""
    sep = rid_separator if rid_separator is not None else os.environ.get("DTOK_SGLANG_RID_SEP")
    headers = getattr(raw_request, "headers", None)
    sid = (getattr(request, "session_id", None) or getattr(request, "routing_key", None)
           or (headers.get(ROUTING_KEY_HEADER) if headers is not None else None))
    adapter = getattr(request, "lora_path", None) or getattr(request, "model", None)
    return engine.session_key(session_id=sid, cache_salt=getattr(request, "cache_salt", None),
                              request_id=getattr(request, "rid", None), rid_separator=sep,
                              model=adapter)


# --- hooks (AROUND: called with the original function first) ----------------------------------


async def _tokenize_one_request(orig, self, obj, *args, **kwargs):
    with bound_key(session_key(obj)):
        return await orig(self, obj, *args, **kwargs)


def _generation_text(self, texts, is_cross_encoder, args, kwargs):
    """(tokenizer, text, options) when dtok may answer this ``_tokenize_texts`` call: one
    prompt string of a generation model (SGLang calls ``self.tokenizer([text])``:
    add_special_tokens defaults to True), else None."""
    if (isinstance(texts, str) and not is_cross_encoder and not args and not kwargs
            and getattr(self, "is_generation", False)
            and not getattr(getattr(self, "model_config", None), "is_embedding_gemma", False)):
        return self.tokenizer, texts, EncodeOptions()
    return None


async def _tokenize_texts(orig, self, texts, is_cross_encoder=False, *args, **kwargs):
    # on SGLang's event loop: dtok is built in the background at the first request, which
    # SGLang's own code serves meanwhile; keyed and long prompts are awaited from the pool
    return await HOOK.serve_async(
        lambda: _generation_text(self, texts, is_cross_encoder, args, kwargs),
        lambda: orig(self, texts, is_cross_encoder, *args, **kwargs),
        lambda ids: (ids, None))


def _convert_to_internal_request(orig, self, request, raw_request=None, *args, **kwargs):
    # runs in an executor thread (SGLang's run_in_executor), so the key is bound here
    with bound_key(session_key(request, raw_request=raw_request)):
        return orig(self, request, raw_request, *args, **kwargs)


def _parallel_prompt_encode(orig, tokenizer, text, encode_kwargs=None, *args, **kwargs):
    def call():
        options = encode_options(tokenizer, encode_kwargs or {})
        if isinstance(text, str) and not args and not kwargs and options is not None:
            return tokenizer, text, options
        return None

    return HOOK.serve(call, lambda: orig(tokenizer, text, encode_kwargs, *args, **kwargs))


def _encode_prompt_segments(orig, tokenizer, segments, encode_kwargs=None, *args, **kwargs):
    def original(tok, text, options, *a, **k):
        return orig(tok, segments, options, *a, **k)

    if not isinstance(segments, (list, tuple)) or not all(isinstance(s, str) for s in segments):
        return orig(tokenizer, segments, encode_kwargs, *args, **kwargs)
    return _parallel_prompt_encode(original, tokenizer, "".join(segments), encode_kwargs,
                                   *args, **kwargs)


_TM = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
_CHAT = "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat"
_PPE = "sglang.srt.entrypoints.openai.parallel_prompt_encode"
TARGETS = (
    (f"{_TM}._tokenize_one_request", _tokenize_one_request),
    (f"{_TM}._tokenize_texts", _tokenize_texts),
    (f"{_CHAT}._convert_to_internal_request", _convert_to_internal_request),
    (f"{_PPE}.parallel_prompt_encode", _parallel_prompt_encode),
    (f"{_PPE}.encode_prompt_segments", _encode_prompt_segments),
)


def register() -> None:
    """SGLang general-plugin entry point (``load_plugins()``): register the AROUND hooks.
    A no-op unless ``DTOK_SGLANG=1``."""
    if os.environ.get("DTOK_SGLANG") != "1":
        return
    allocator.tune()  # a front end that encodes megabyte texts stays flat (dtok.allocator)
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook in TARGETS:
        owner, _attr = patching.resolve(target)
        if owner is None:
            log.warning("dtok: this SGLang has no %s; hook skipped", target)
            continue
        HookRegistry.register(target, hook, HookType.AROUND)


def install() -> list[str]:
    """Patch SGLang in this process by hand (any version with these names); returns the
    targets patched. Use when SGLang's plugin system is not there."""
    return patching.patch(TARGETS, "sglang.")
