"""dtok's SGLang hook inside a real SGLang TokenizerManager and OpenAIServingChat, on a CPU.

Needs the `sglang` package importable (it is not in dtok's test extra: the full install pulls a
CUDA build of torch). The check builds a tiny model directory (a `config.json` plus the real
tokenizer files from ../shared/tokenizers), loads dtok's hooks through SGLang's own
`load_plugins()` (entry point `sglang.srt.plugins`, switched on by DTOK_SGLANG=1), and compares
every hooked result with SGLang's own tokenization of the same text, complete ID sequences:

* /generate path: corpus texts with no key and with a session id;
* a growing 30-turn transcript keyed by session id, cache salt, request-id prefix, and no key
  (content lookup), timed against SGLang's own encode;
* the OpenAI chat path: six growing chat requests with a session id.

    DTOK_SGLANG=1 python tools/sglang_check.py qwen3 llama3 deepseek-v3

Exit status 1 on any mismatch. `tests/test_sglang.py::test_real_sglang` runs it where `sglang`
can be imported."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

SHARED = Path(os.environ.get("DTOK_SHARED", Path(__file__).resolve().parents[2] / "shared"))

# Just enough model config for SGLang's ServerArgs/ModelConfig; no weights are loaded.
_CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 2, "max_position_embeddings": 131072,
           "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
           "hidden_act": "silu"}
MODELS = {
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=16,
                  vocab_size=151936, bos_token_id=151643, eos_token_id=151645),
    "llama3": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256,
                   bos_token_id=128000, eos_token_id=128009),
    "deepseek-v3": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=129280,
                        bos_token_id=0, eos_token_id=1),
}
_FALLBACK_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
    "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def model_dir(name: str, into: Path) -> Path:
    """A weightless model directory: SGLang's config plus the real tokenizer files."""
    d = into / name
    d.mkdir(parents=True, exist_ok=True)
    for f in (SHARED / "tokenizers" / name).iterdir():
        shutil.copy(f, d / f.name)
    (d / "config.json").write_text(json.dumps({**_CONFIG, **MODELS[name]}))
    return d


def _corpus(n: int = 40, chars: int = 60000) -> list[str]:
    files = sorted((SHARED / "corpus").glob("*/*.txt"))[:n]
    return [f.read_bytes().decode("utf-8")[:chars] for f in files]


async def _check_model(path: Path, out) -> int:
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.parser.template_manager import TemplateManager
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import PortArgs, ServerArgs

    from dtok.integrations import sglang as hook

    sa = ServerArgs(model_path=str(path), device="cpu", skip_server_warmup=True)
    sa.resolve_once()
    sa.check_server_args()
    publish(sa, role="tokenizer")
    tm = TokenizerManager(sa, PortArgs.init_new(sa))
    tm.max_req_input_len = tm.context_len = 10**7
    wrapper = hook.dtok_for(tm.tokenizer)
    out(f"{path.name}: {type(tm.tokenizer).__name__}, dtok {'ON' if wrapper else 'OFF'}")
    if wrapper is None:
        return 1

    async def hooked(text, **kw):
        obj = GenerateReqInput(text=text, sampling_params={"max_new_tokens": 1}, **kw)
        obj.normalize_batch_and_arguments()
        tm._init_req_state(obj, None)
        try:
            return list((await tm._tokenize_one_request(obj)).input_ids)
        finally:
            tm.rid_to_state.pop(obj.rid, None)

    def sglang_own(text):  # what SGLang's _tokenize_texts computes without the hook
        return list(tm.tokenizer([text])["input_ids"][0])

    bad_total = 0
    corpus = _corpus()
    bad = 0
    for i, t in enumerate(corpus):
        ref = sglang_own(t)
        bad += (await hooked(t) != ref) + (await hooked(t, session_id=f"s{i}") != ref)
    out(f"  /generate: {len(corpus)} texts x (no key, session_id): mismatches={bad}")
    bad_total += bad

    turns = [c[:8000] for c in corpus[:30]]

    def transcript(n):
        return "".join(f"<|im_start|>{'user' if k % 2 == 0 else 'assistant'}\n{turns[k]}"
                       f"<|im_end|>\n" for k in range(n))

    os.environ["DTOK_SGLANG_RID_SEP"] = ":"
    for label, kw in [("session_id", {"session_id": "conv-1"}),
                      ("cache_salt", {"cache_salt": "tenant-9"}),
                      ("rid prefix", {"rid": None}), ("no key", {})]:
        bad, t_hook, t_own = 0, 0.0, 0.0
        for n in range(1, len(turns) + 1):
            text, k = transcript(n), dict(kw)
            if "rid" in k:
                k["rid"] = f"convR:{n}"
            t0 = time.perf_counter()
            ids = await hooked(text, **k)
            t_hook += time.perf_counter() - t0
            t0 = time.perf_counter()
            bad += ids != sglang_own(text)
            t_own += time.perf_counter() - t0
        out(f"  transcript, key {label:10s}: 30 turns to {len(transcript(30)):,} chars, "
            f"mismatches={bad}, hooked {t_hook * 1e3:.0f} ms vs SGLang's own {t_own * 1e3:.0f} ms")
        bad_total += bad

    if getattr(tm.tokenizer, "chat_template", None) is None:
        tm.tokenizer.chat_template = _FALLBACK_TEMPLATE
    templates = TemplateManager()
    templates.initialize_templates(tokenizer_manager=tm, model_path=str(path))
    chat = OpenAIServingChat(tm, templates)
    msgs, bad, before = [], 0, hook.stats["dtok_calls"]
    loop = asyncio.get_running_loop()
    for k in range(12):
        msgs.append({"role": "user" if k % 2 == 0 else "assistant", "content": turns[k]})
        if msgs[-1]["role"] != "user":
            continue
        req = ChatCompletionRequest(model="m", messages=list(msgs), session_id="chat-7",
                                    max_tokens=1)
        adapted, _ = await loop.run_in_executor(
            None, chat._convert_to_internal_request, req, None)
        prompt = tm.tokenizer.apply_chat_template(msgs, tokenize=False,
                                                  add_generation_prompt=True)
        want = list(tm.tokenizer(prompt, add_special_tokens=False)["input_ids"])
        bad += adapted.input_ids is None or list(adapted.input_ids) != want
    out(f"  chat: 6 growing requests, mismatches={bad}, "
        f"through dtok={hook.stats['dtok_calls'] - before}")
    bad_total += bad
    out(f"  hook stats: {hook.stats}")
    return bad_total


def run(names, out=print) -> int:
    """Check each named tokenizer; returns the number of mismatching results (0 = exact)."""
    os.environ.setdefault("DTOK_SGLANG", "1")
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    load_plugins()
    out(f"patched: {sorted(HookRegistry._patched)}")
    total = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            total += asyncio.run(_check_model(model_dir(name, Path(tmp)), out))
    return total


if __name__ == "__main__":
    sys.exit(1 if run(sys.argv[1:] or list(MODELS)) else 0)
