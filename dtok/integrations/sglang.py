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
  (also hooked, when called with no option other than ``add_special_tokens``).

SGLang's tokenizer object is never replaced (type checks, chat templates, decoding and grammar
backends keep seeing its own). Session key, first found: SGLang's ``session_id`` (the whole
transcript every turn), then the ``cache_salt``, then the request id up to
``DTOK_SGLANG_RID_SEP`` when that separator is set and present; no key: dtok's content lookup.

Identity: dtok is built from the tokenizer SGLang actually loaded (its live backend, after
SGLang's own post-load fixes). With ``DTOK_SGLANG_TOKENIZER=/path/tokenizer.json`` that file is
compared with the live backend section by section (model, normalizer, pre-tokenizer, added
tokens, post-processor) and dtok stays out on any difference. Then probe texts are encoded both
ways; any mismatch, or a slow/non-tokenizers tokenizer, overridden ``encode``/``__call__`` or
``split_special_tokens``, also leaves tokenization to SGLang. Any error in a hook falls back to
SGLang's original code.
"""
from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
import threading
import weakref
from typing import Any

log = logging.getLogger("dtok.sglang")

__all__ = ["register", "install", "session_key", "compare_sections", "dtok_for", "stats"]

_KEY: contextvars.ContextVar = contextvars.ContextVar("dtok_sglang_key", default=None)
SECTIONS = ("model", "normalizer", "pre_tokenizer", "added_tokens", "post_processor")
PROBES = (
    "", "Hello, world!", " leading space", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>",
    "<｜User｜>x<｜Assistant｜>", "<|start|>user<|message|>x<|end|>",
    "数字 12345 καλημέρα 🙂\r\n\t  end   ", "a" * 5000, "don't you'll  \n\n\n  x", "cafe\u0301 \u0958/",
)
stats = {"dtok_calls": 0, "keyed_calls": 0, "passed_through": 0, "errors": 0}
_lock = threading.Lock()
_by_tok: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_refused: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()


def session_key(request, rid_separator: str | None = None) -> str | None:
    """The session key of a GenerateReqInput or an OpenAI request, or None."""
    sid = getattr(request, "session_id", None)
    if isinstance(sid, str) and sid:
        return "sid:" + sid
    salt = getattr(request, "cache_salt", None)
    if isinstance(salt, str) and salt:
        return "salt:" + salt
    sep = rid_separator if rid_separator is not None else os.environ.get("DTOK_SGLANG_RID_SEP")
    rid = getattr(request, "rid", None)
    if sep and isinstance(rid, str) and sep in rid:
        return "rid:" + rid.split(sep, 1)[0]
    return None


def compare_sections(live_json: str, file_json: str) -> list[str]:
    """The sections of two tokenizer.json documents that differ (empty: identical)."""
    live, frozen = json.loads(live_json), json.loads(file_json)
    return [s for s in SECTIONS if live.get(s) != frozen.get(s)]


def dtok_for(hf_tokenizer):
    """dtok's wrapper for SGLang's tokenizer, or None when dtok must stay out (cached)."""
    if hf_tokenizer is None:
        return None
    try:
        if hf_tokenizer in _by_tok:
            return _by_tok[hf_tokenizer]
        if hf_tokenizer in _refused:
            return None
    except TypeError:  # not weak-referenceable
        return None
    with _lock:
        if hf_tokenizer not in _by_tok and hf_tokenizer not in _refused:
            wrapper, why = _build(hf_tokenizer)
            if wrapper is None:
                _refused[hf_tokenizer] = why
                log.warning("dtok stays out of SGLang's tokenization: %s", why)
            else:
                _by_tok[hf_tokenizer] = wrapper
                log.info("dtok encodes SGLang's prompts (%r)", wrapper.dtok)
        return _by_tok.get(hf_tokenizer)


def _build(hf):
    backend = getattr(hf, "backend_tokenizer", None)
    if not getattr(hf, "is_fast", False) or backend is None or not hasattr(backend, "to_str"):
        return None, f"not a tokenizers-backed fast tokenizer ({type(hf).__name__})"
    if getattr(hf, "split_special_tokens", False):
        return None, "split_special_tokens is on"
    for name in ("encode", "__call__"):
        if name in vars(hf) or "transformers" not in (getattr(type(hf), name).__module__ or ""):
            return None, f"{type(hf).__name__}.{name} is overridden"
    frozen = os.environ.get("DTOK_SGLANG_TOKENIZER")
    if frozen:
        try:
            from dtok.admission import read_files

            differ = compare_sections(backend.to_str(), read_files(frozen).raw.decode("utf-8"))
        except Exception as exc:  # noqa: BLE001
            return None, f"cannot compare with {frozen}: {exc}"
        if differ:
            return None, f"differs from {frozen} in: {', '.join(differ)}"
    try:
        from dtok.integrations.transformers import wrap

        wrapper = wrap(hf)
        for special in (True, False):
            for text in PROBES:
                want = hf([text], add_special_tokens=special)["input_ids"][0]
                if list(want) != list(wrapper.dtok.encode(text, add_special_tokens=special)):
                    return None, f"probe {text[:30]!r} encodes differently"
    except Exception as exc:  # noqa: BLE001
        return None, f"{type(exc).__name__}: {exc}"
    return wrapper, ""


def _encode(wrapper, text: str, add_special_tokens: bool = True) -> list[int]:
    key = _KEY.get()
    stats["dtok_calls"] += 1
    stats["keyed_calls"] += key is not None
    return list(wrapper._fresh().encode(text, session=key, add_special_tokens=add_special_tokens))


# --- hooks (AROUND: called with the original function first) ----------------------------------


async def _tokenize_one_request(orig, self, obj, *args, **kwargs):
    token = _KEY.set(session_key(obj))
    try:
        return await orig(self, obj, *args, **kwargs)
    finally:
        _KEY.reset(token)


async def _tokenize_texts(orig, self, texts, is_cross_encoder=False, *args, **kwargs):
    if (isinstance(texts, str) and not is_cross_encoder and not args and not kwargs
            and getattr(self, "is_generation", False)
            and not getattr(getattr(self, "model_config", None), "is_embedding_gemma", False)):
        try:
            wrapper = dtok_for(self.tokenizer)
            if wrapper is not None:
                # SGLang calls self.tokenizer([text]): add_special_tokens defaults to True
                return _encode(wrapper, texts), None
        except Exception as exc:  # noqa: BLE001 - never break serving
            stats["errors"] += 1
            log.warning("dtok hook failed, SGLang tokenizes: %s", exc)
    stats["passed_through"] += 1
    return await orig(self, texts, is_cross_encoder, *args, **kwargs)


def _convert_to_internal_request(orig, self, request, *args, **kwargs):
    token = _KEY.set(session_key(request))
    try:
        return orig(self, request, *args, **kwargs)
    finally:
        _KEY.reset(token)


def _parallel_prompt_encode(orig, tokenizer, text, encode_kwargs=None, *args, **kwargs):
    options = encode_kwargs or {}
    if isinstance(text, str) and not args and not kwargs and set(options) <= {"add_special_tokens"}:
        try:
            wrapper = dtok_for(tokenizer)
            if wrapper is not None:
                return _encode(wrapper, text, options.get("add_special_tokens", True))
        except Exception as exc:  # noqa: BLE001
            stats["errors"] += 1
            log.warning("dtok hook failed, SGLang tokenizes: %s", exc)
    stats["passed_through"] += 1
    return orig(tokenizer, text, encode_kwargs, *args, **kwargs)


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


def _resolve(target: str):
    import pkgutil

    owner_name, _, attr = target.rpartition(".")
    try:
        owner = pkgutil.resolve_name(owner_name)
    except (ImportError, AttributeError, ValueError):
        return None, attr
    return (owner, attr) if hasattr(owner, attr) else (None, attr)


def register() -> None:
    """SGLang general-plugin entry point (``load_plugins()``): register the AROUND hooks.
    A no-op unless ``DTOK_SGLANG=1``."""
    if os.environ.get("DTOK_SGLANG") != "1":
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook in TARGETS:
        owner, _attr = _resolve(target)
        if owner is None:
            log.warning("dtok: this SGLang has no %s; hook skipped", target)
            continue
        HookRegistry.register(target, hook, HookType.AROUND)


def install() -> list[str]:
    """Patch SGLang in this process by hand (any version with these names); returns the
    targets patched. Use when SGLang's plugin system is not there."""
    import functools
    import inspect

    done = []
    for target, hook in TARGETS:
        owner, attr = _resolve(target)
        if owner is None:
            continue
        orig = getattr(owner, attr)
        if getattr(orig, "__dtok_hook__", False):
            continue
        if inspect.iscoroutinefunction(orig):
            async def patched(*a, __orig=orig, __hook=hook, **k):
                return await __hook(__orig, *a, **k)
        else:
            def patched(*a, __orig=orig, __hook=hook, **k):
                return __hook(__orig, *a, **k)
        patched = functools.wraps(orig)(patched)
        patched.__dtok_hook__ = True
        setattr(owner, attr, patched)
        if not isinstance(owner, type):  # a module function: also where it was imported to
            for module in list(sys.modules.values()):
                if (getattr(module, "__name__", "").startswith("sglang.")
                        and getattr(module, attr, None) is orig):
                    setattr(module, attr, patched)
        done.append(target)
    return done
