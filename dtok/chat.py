"""Render ``{role, content}`` message lists with a tokenizer's own chat markers.

Used to replay agent transcripts turn by turn (tests, ``dtok replay``, benchmarks). Each message
renders to a string that depends on that message alone, so the rendering of the first ``i``
messages is a prefix of the rendering of the first ``i + 1``: every turn extends the last one,
as an agent's re-sent transcript does. The formats follow each model family's chat template in
spirit (markers, roles, tool results); they are not byte-exact copies of the Jinja templates.
"""
from __future__ import annotations

import json
from typing import Any, Iterable

# style -> (marker that identifies it among the added tokens, per-role format strings)
STYLES: dict[str, tuple[str, dict[str, str]]] = {
    "qwen": ("<|im_start|>", {
        "*": "<|im_start|>{role}\n{content}<|im_end|>\n",
        "tool": "<|im_start|>user\n<tool_response>\n{content}\n</tool_response><|im_end|>\n",
    }),
    "llama3": ("<|start_header_id|>", {
        "*": "<|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>",
        "tool": "<|start_header_id|>ipython<|end_header_id|>\n\n{content}<|eot_id|>",
    }),
    "harmony": ("<|start|>", {
        "*": "<|start|>{role}<|message|>{content}<|end|>",
        "assistant": "<|start|>assistant<|channel|>final<|message|>{content}<|end|>",
    }),
    "deepseek": ("<｜User｜>", {
        "system": "{content}\n\n",
        "user": "<｜User｜>{content}",
        "assistant": "<｜Assistant｜>{content}<｜end▁of▁sentence｜>",
        "tool": "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>{content}"
                "<｜tool▁output▁end｜><｜tool▁outputs▁end｜>",
        "*": "<｜User｜>{content}",
    }),
}


def detect_style(added_tokens: Iterable[str]) -> str:
    """The chat style whose marker is among a tokenizer's added tokens."""
    tokens = set(added_tokens)
    for style, (marker, _formats) in STYLES.items():
        if marker in tokens:
            return style
    raise ValueError("no known chat markers among the added tokens")


def render_message(message: dict[str, Any], style: str) -> str:
    """One message as text; tool calls are appended to the content as JSON."""
    formats = STYLES[style][1]
    role = str(message.get("role", "user"))
    content = message.get("content") or ""
    if not isinstance(content, str):  # structured content: keep it, as JSON
        content = json.dumps(content, ensure_ascii=False)
    for call in message.get("tool_calls") or ():
        content += "\n" + json.dumps(call.get("function", call), ensure_ascii=False)
    fmt = formats.get(role, formats["*"])
    return fmt.format(role=role, content=content)


def render_turns(messages: list[dict[str, Any]], style: str) -> list[str]:
    """The transcript after each message: every item extends the previous one."""
    out, text = [], ""
    for message in messages:
        text += render_message(message, style)
        out.append(text)
    return out
