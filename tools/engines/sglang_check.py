"""dtok's SGLang hook inside a real SGLang TokenizerManager and OpenAIServingChat, on a CPU.

Run from the repository root with any Python 3.10+: the outer run builds or reuses a virtualenv
outside the repository (``~/.cache/dtok/sglang-<version>-venv``, see tools/engines/engine_setup.py)
holding this checkout and SGLang from PyPI (``--no-deps``, a CPU torch, what the tokenizer
manager imports, a stub for torchvision), then runs the check inside it (or directly, with
``--inner``, where ``sglang`` imports). The check builds a tiny model directory (a `config.json`
plus the real tokenizer files from ../shared/tokenizers), loads dtok's hooks through SGLang's own
`load_plugins()` (entry point `sglang.srt.plugins`, switched on by DTOK_SGLANG=1), and compares
every hooked result with SGLang's own tokenization of the same text, complete ID sequences:

* /generate path: corpus texts with no key and with a session id;
* a growing 30-turn transcript keyed by session id, cache salt, request-id prefix, and no key
  (content lookup), timed against SGLang's own encode;
* the OpenAI chat path: six growing chat requests with a session id.

    python tools/engines/sglang_check.py [qwen3 llama3 deepseek-v3] [--pool N]

``--pool N``: the hooks with ``DTOK_POOL_WORKERS=N`` (dtok built from the model's tokenizer.json
where the live tokenizer equals it, so the pool can load it). Exit status 1 on any mismatch, 2
when SGLang cannot be installed or imported. `tests/test_sglang.py::test_real_sglang` runs it
where `sglang` imports or the venv exists."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import engine_setup  # tools/engines/engine_setup.py (this script's directory is on sys.path)
from engine_setup import FALLBACK_TEMPLATE, MODELS, SHARED, corpus, model_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
SGLANG_VERSION = "0.5.23"
VENV_NAME = f"sglang-{SGLANG_VERSION}-venv"
# What SGLang's tokenizer manager and OpenAI chat server import on a CPU (SGLang 0.5.23's
# requirements without GPU kernels; torchvision is a stub, see tools/engines/engine_setup.py),
# with the tokenizer libraries at SGLang's own pins (tokenizers==0.23.2, transformers==5.19.0).
DEPS = [
    "aiohttp", "anthropic>=0.20.0", "fastapi", "msgspec", "numpy", "openai==2.8.0",
    "openai-harmony==0.0.4", "orjson", "packaging", "partial_json_parser", "pillow",
    "prometheus-client>=0.20.0", "psutil", "pybase64", "pydantic", "python-multipart",
    "pyzmq>=25.1.2", "regex", "requests", "setproctitle", "sentencepiece==0.2.1", "tiktoken",
    "tokenizers==0.23.2", "transformers==5.19.0", "uvicorn", "uvloop", "interegular",
    "llguidance>=1.7.6,<2.0.0", "einops", "scipy", "distro", "easydict", "blobfile==3.0.0",
    "httpx", "triton", "IPython", "jsonschema", "dill", "apache-tvm-ffi==0.1.11",
    "compressed-tensors", "gguf", "xgrammar",
]
# 0.28.0: the torchvision released beside torch 2.13 (engine_setup.TORCH).
STUBS = {"torchvision": {"version": "0.28.0",
                         "submodules": ["transforms", "transforms.functional", "transforms.v2",
                                        "transforms.v2.functional", "io"]}}

SGLANG_MODELS = ["qwen3", "llama3", "deepseek-v3"]


def tokenizer_manager(path: Path):
    """A real SGLang TokenizerManager for a model directory (no scheduler behind it)."""
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import PortArgs, ServerArgs

    sa = ServerArgs(model_path=str(path), device="cpu", skip_server_warmup=True)
    sa.resolve_once()
    sa.check_server_args()
    publish(sa, role="tokenizer")
    tm = TokenizerManager(sa, PortArgs.init_new(sa))
    tm.max_req_input_len = tm.context_len = 10**7
    return tm


async def tokenize_request(tm, text: str, **kw) -> list[int]:
    """The /generate path's tokenization of one request (``_tokenize_one_request``)."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    obj = GenerateReqInput(text=text, sampling_params={"max_new_tokens": 1}, **kw)
    obj.normalize_batch_and_arguments()
    tm._init_req_state(obj, None)
    try:
        return list((await tm._tokenize_one_request(obj)).input_ids)
    finally:
        tm.rid_to_state.pop(obj.rid, None)


async def _check_model(path: Path, out, pool: int = 0) -> int:
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.parser.template_manager import TemplateManager

    from dtok.integrations import sglang as hook

    tm = tokenizer_manager(path)
    differ = engine_setup.use_file_if_equal(tm.tokenizer, path / "tokenizer.json",
                                           "DTOK_SGLANG_TOKENIZER")
    wrapper = hook.dtok_for(tm.tokenizer)
    source = "the file" if not differ else f"the live backend (differs in {', '.join(differ)})"
    out(f"{path.name}: {type(tm.tokenizer).__name__}, dtok {'ON' if wrapper else 'OFF'}, built "
        f"from {source}")
    if wrapper is None:
        out(f"  why: {hook.HOOK.refusal(tm.tokenizer)}")
        return 1
    if pool:
        ready = hook.HOOK.pool_for(wrapper.current(), wait=300)
        out(f"  pool: {'ready' if ready else hook.HOOK.pool_state(wrapper.current())[0]['error']}")

    async def hooked(text, **kw):
        return await tokenize_request(tm, text, **kw)

    def sglang_own(text):  # what SGLang's _tokenize_texts computes without the hook
        return list(tm.tokenizer([text])["input_ids"][0])

    bad_total = 0
    texts = corpus()
    bad = 0
    for i, t in enumerate(texts):
        ref = sglang_own(t)
        bad += (await hooked(t) != ref) + (await hooked(t, session_id=f"s{i}") != ref)
    out(f"  /generate: {len(texts)} texts x (no key, session_id): mismatches={bad}")
    bad_total += bad

    turns = [c[:8000] for c in texts[:30]]

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
        tm.tokenizer.chat_template = FALLBACK_TEMPLATE
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
    for line in engine_setup.hook_summary(hook.HOOK, wrapper.current()):
        out(line)
    return bad_total


def run(names, out=print, pool: int = 0) -> int:
    """Check each named tokenizer; returns the number of mismatching results (0 = exact)."""
    os.environ.setdefault("DTOK_SGLANG", "1")
    if pool:
        from dtok.integrations import engine

        engine.configure(pool_workers=pool)
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    load_plugins()
    out(f"patched: {sorted(HookRegistry._patched)}")
    total = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            total += asyncio.run(_check_model(model_dir(name, Path(tmp)), out, pool))
    from dtok.integrations import sglang as hook

    hook.HOOK.close()
    return total


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", default=SGLANG_MODELS,
                   help=f"files in ../shared/tokenizers ({', '.join(MODELS)})")
    p.add_argument("--pool", type=int, default=0, help="DTOK_POOL_WORKERS for the hooks")
    p.add_argument("--rebuild", action="store_true", help="rebuild the venv from scratch")
    p.add_argument("--python", default=sys.executable, help="interpreter for a new venv")
    p.add_argument("--inner", action="store_true", help="run here (sglang must import)")
    args = p.parse_args(argv)
    if not args.inner:
        try:
            py = engine_setup.ensure(VENV_NAME, f"sglang=={SGLANG_VERSION}", DEPS,
                                    python=args.python, stubs=STUBS, rebuild=args.rebuild)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"cannot build the SGLang venv: {exc}")
            return 2
        extra = ["--pool", str(args.pool)] if args.pool else []
        return engine_setup.run_inside(py, Path(__file__).resolve(), [*args.names, *extra],
                                      {"DTOK_SGLANG": "1", "DTOK_SHARED": str(SHARED),
                                       "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    try:
        import sglang  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        print(f"SGLang cannot be imported: {type(exc).__name__}: {exc}")
        return 2
    return 1 if run(args.names, pool=args.pool) else 0


if __name__ == "__main__":
    sys.exit(main())
