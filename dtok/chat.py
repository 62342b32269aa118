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


# --- reasoning chats: templates that rewrite earlier turns ------------------------------------
#
# Reasoning models' chat templates drop the reasoning of finished turns, so the prompt of the next
# request is an *edit* of the previous one, not an extension. Two rules, after the real templates:
# "r1" (DeepSeek-R1: every earlier assistant message loses its <think> block) with a tokenizer's
# own markers: the <think> blocks of turns before the last user query are dropped, those of the
# current turn's tool-calling steps kept) and "harmony" (gpt-oss: the analysis channel of turns
# that reached a final answer is dropped, the current turn's kept). Qwen3's own template
# (transformers' apply_chat_template) does the same. So while a turn calls tools, each request
# extends the last; the request after the next user query drops the blocks: an edit.

# The generation prompt each r1 style's template ends with (the roles render as in STYLES).
_GENERATION_PROMPT = {"deepseek": "<｜Assistant｜>",
                      "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
                      "qwen": "<|im_start|>assistant\n"}


def render_reasoning(messages: list[dict[str, Any]], style: str) -> str:
    """The prompt for the next assistant turn after ``messages`` (``{role, content,
    reasoning_content?, tool_calls?}``), with earlier reasoning dropped by the style's rule:
    ``r1:<markers>`` (markers: deepseek, llama3 or qwen) or ``harmony``."""
    if style == "harmony":
        return _render_harmony(messages)
    rule, _, markers = style.partition(":")
    if rule != "r1" or markers not in _GENERATION_PROMPT:
        raise ValueError(f"unknown reasoning style {style!r}")
    out = []
    for m, role, content, reasoning in _kept_reasoning(messages):
        if reasoning:
            m = {**m, "content": f"<think>\n{reasoning}\n</think>\n\n{content}"}
        out.append(render_message(m, markers))
    return "".join(out) + _GENERATION_PROMPT[markers]


def _kept_reasoning(messages: list[dict[str, Any]]):
    """(message, role, content, reasoning) per message; the reasoning only of the current turn's
    assistant messages (after the last user query), else None: the rule both styles share."""
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    for i, m in enumerate(messages):
        role = m["role"]
        keep = role == "assistant" and i > last_user
        yield m, role, m.get("content") or "", m.get("reasoning_content") if keep else None


def _render_harmony(messages: list[dict[str, Any]]) -> str:
    out = []
    for m, role, content, reasoning in _kept_reasoning(messages):
        if role == "assistant":
            if reasoning:
                out.append(f"<|start|>assistant<|channel|>analysis<|message|>{reasoning}<|end|>")
            for call in m.get("tool_calls") or ():
                fn = call.get("function", call)
                out.append(f"<|start|>assistant<|channel|>commentary to=functions.{fn['name']} "
                           f"<|constrain|>json<|message|>{json.dumps(fn['arguments'])}<|call|>")
            if content:
                out.append(f"<|start|>assistant<|channel|>final<|message|>{content}<|end|>")
        elif role == "tool":
            out.append(f"<|start|>functions.{m.get('name', 'tool')} to=assistant<|channel|>"
                       f"commentary<|message|>{content}<|end|>")
        else:
            out.append(f"<|start|>{role}<|message|>{content}<|end|>")
    return "".join(out) + "<|start|>assistant"


def reasoning_chat(prose: str, code: str, turns: int = 30, seed: int = 0,
                   think_chars: tuple[int, int] = (500, 6000)) -> list[list[dict[str, Any]]]:
    """A reasoning chat as the message lists of its ``turns`` requests: user queries quoting
    ``prose``, assistant turns with ``reasoning_content`` (from ``prose``), 0-3 tool steps per
    query whose results quote ``code``. Request i is answered by the assistant message that
    starts request i+1's extra messages."""
    import random

    rng = random.Random(seed)

    def piece(src: str, lo: int, hi: int) -> str:
        n = rng.randint(lo, hi)
        start = rng.randrange(max(1, len(src) - n))
        return src[start : start + n]

    messages: list[dict[str, Any]] = [{"role": "system",
                                       "content": "You are a careful assistant. " + piece(prose, 200, 600)}]
    requests: list[list[dict[str, Any]]] = []
    while len(requests) < turns:
        messages.append({"role": "user", "content": "Question: " + piece(prose, 100, 1500)})
        requests.append([dict(m) for m in messages])
        for step in range(rng.randint(0, 3)):
            if len(requests) >= turns:
                break
            call = {"name": rng.choice(["read_file", "grep", "run_tests"]),
                    "arguments": {"path": f"src/mod{step}.rs", "query": piece(prose, 5, 40)}}
            messages.append({"role": "assistant", "content": "",
                             "reasoning_content": piece(prose, *think_chars),
                             "tool_calls": [{"type": "function", "function": call}]})
            messages.append({"role": "tool", "name": call["name"], "content": piece(code, 200, 4000)})
            requests.append([dict(m) for m in messages])
        messages.append({"role": "assistant", "content": piece(prose, 100, 1500),
                         "reasoning_content": piece(prose, *think_chars)})
    return requests[:turns]
