"""Whether dtok may serve an engine's live tokenizer: the checks that need no dtok.

A tokenizer qualifies when it is a ``tokenizers``-backed fast tokenizer whose ``encode`` and
``__call__`` are transformers' own (or an engine's delegating proxy), without
``split_special_tokens``; a frozen tokenizer.json must equal its live backend in every section
that decides IDs (:data:`SECTIONS`); then :data:`PROBES` must encode identically both ways.
"""
from __future__ import annotations

import json
from typing import Any

__all__ = ["SECTIONS", "PROBES", "compare_sections", "unsupported", "probe_mismatch"]

#: tokenizer.json sections that decide IDs; a live tokenizer must equal a frozen file in each.
SECTIONS = ("model", "normalizer", "pre_tokenizer", "added_tokens", "post_processor")
#: Texts encoded by the engine's tokenizer and by dtok before dtok may serve the engine.
PROBES = (
    "", "Hello, world!", " leading space",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>",
    "<｜User｜>x<｜Assistant｜>", "<|start|>user<|message|>x<|end|>",
    "数字 12345 καλημέρα 🙂\r\n\t  end   ", "a" * 5000, "don't you'll  \n\n\n  x",
    "cafe\u0301 \u0958/",
)


def _deciding(document: str) -> dict[str, Any]:
    """The :data:`SECTIONS` of a tokenizer.json document, without ``trim_offsets`` (which
    changes offsets only) outside the model (whose vocabulary may hold a token of that name)."""
    def strip(node):
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if k != "trim_offsets"}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    doc = json.loads(document)
    return {s: doc.get(s) if s == "model" else strip(doc.get(s)) for s in SECTIONS}


def _as_installed_writes(document: str) -> str:
    """The document as the installed ``tokenizers`` writes it (merges as pairs or strings,
    defaults spelled out); as written when it cannot load it (the reference refuses it then)."""
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_str(document).to_str()
    except Exception:  # noqa: BLE001
        return document


def compare_sections(live_json: str, file_json: str) -> list[str]:
    """The :data:`SECTIONS` in which a live tokenizer's ``to_str()`` and a tokenizer.json file
    differ (empty: identical), compared as the installed ``tokenizers`` writes them.

    The file is compared as written first (one the same ``tokenizers`` wrote: seconds less at
    an engine's start), and rewritten by the installed ``tokenizers`` only when a section
    differs (merges as strings, defaults left out)."""
    live, frozen = _deciding(live_json), _deciding(file_json)
    if _differing(live, frozen):
        frozen = _deciding(_as_installed_writes(file_json))
    return _differing(live, frozen)


def _differing(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    return [s for s in SECTIONS if a[s] != b[s]]


def _overridden(hf, name: str, trusted_overrides: tuple[str, ...]) -> bool:
    if name in vars(hf):
        return True
    fn = getattr(type(hf), name)
    module = getattr(fn, "__module__", "") or ""
    qualname = getattr(fn, "__qualname__", "") or ""
    return "transformers" not in module and not any(
        f"{module}.{qualname}".startswith(prefix) for prefix in trusted_overrides)


def unsupported(hf, trusted_overrides: tuple[str, ...] = ()) -> str | None:
    """Why dtok cannot stand in for ``hf`` whatever it encodes, or None. ``trusted_overrides``:
    qualified-name prefixes of engine classes whose ``encode``/``__call__`` only delegate to
    transformers' own."""
    backend = getattr(hf, "backend_tokenizer", None)
    if not getattr(hf, "is_fast", False) or backend is None or not hasattr(backend, "to_str"):
        return f"not a tokenizers-backed fast tokenizer ({type(hf).__name__})"
    if getattr(hf, "split_special_tokens", False):
        return "split_special_tokens is on"
    for name in ("encode", "__call__"):
        if _overridden(hf, name, trusted_overrides):
            return f"{type(hf).__name__}.{name} is overridden"
    return None


def probe_mismatch(hf, tok) -> str | None:
    """The first probe (as a message) that dtok tokenizer ``tok`` encodes differently from
    ``hf``, with and without special tokens; None when all agree."""
    for special in (True, False):
        for text in PROBES:
            want = hf([text], add_special_tokens=special)["input_ids"][0]
            if list(want) != list(tok.encode(text, add_special_tokens=special)):
                return f"probe {text[:30]!r} encodes differently"
    return None
