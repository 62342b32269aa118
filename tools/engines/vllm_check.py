"""dtok's vLLM plugin inside vLLM's real GPU-less render server, on a CPU.

Run from the repository root with any Python 3.10+:

    python tools/engines/vllm_check.py [qwen3 llama3 deepseek-v3 gpt-oss] [--pool N]
        [--vllm 0.34.0|0.33.0] [--rebuild]

The outer run (standard library only) builds or reuses a virtualenv outside the repository
(``~/.cache/dtok/vllm-<version>-venv``, see tools/engines/engine_setup.py) holding this checkout
(editable) and the real vLLM from PyPI (0.34.0, or the release ``--vllm`` names):
``torch==2.13.0`` (a CPU build on this machine), vLLM with ``--no-deps``, and what its render
path imports. Then it runs itself inside that venv:

* vLLM's own plugin loader (``load_general_plugins``, group ``vllm.general_plugins``, switched
  on by ``DTOK_VLLM=1``) loads dtok's hooks;
* per tokenizer file (``../shared/tokenizers`` or ``$DTOK_SHARED``), a weightless model
  directory and vLLM's render server app (``vllm launch render``: the renderer, OpenAI
  request parsing, chat templates), driven over HTTP in process (httpx ASGI transport); on
  vLLM 0.34, whose CPU platform refuses an x86 CPU without triton-cpu, the server's config is
  built as for a CPU with Triton (``_cpu_platform_without_triton``: no model runner starts);
* every request is sent twice, with dtok on and with dtok off (``HOOK.enabled = False``: vLLM's
  own tokenization), and the two JSON answers (IDs, computed ``max_tokens``, errors) must be
  equal: completions of corpus texts with and without a session key; chat requests growing
  turn by turn; a 30-turn agent transcript growing past 200K characters, keyed by the body's
  ``session_id``, the ``X-Session-ID`` header, ``cache_salt``, a request-id prefix, and by
  nothing (content lookup), timed against vLLM's own; ``truncate_prompt_tokens`` and an
  over-long prompt (vLLM's ``truncation=True, max_length=...`` call);
* ``--pool N``: the same with ``DTOK_POOL_WORKERS=N`` (keyed and long prompts through a
  ``dtok.Pool``).

The last line is ``N requests, M mismatches``. Exit status 1 on any mismatch, 2 when vLLM cannot
be installed or imported. ``tests/test_vllm.py`` runs it where the venv exists or vLLM imports.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import engine_setup  # tools/engines/engine_setup.py (this script's directory is on sys.path)
from engine_setup import FALLBACK_TEMPLATE, MODELS, SHARED, corpus, model_dir  # noqa: F401

ROOT = Path(__file__).resolve().parents[2]
VLLM_VERSION = "0.34.0"  # the default; ``--vllm 0.33.0`` checks the previous release
VERSIONS = ("0.34.0", "0.33.0")
# What vLLM's render server imports, from vLLM's requirements (GPU kernels left out; vLLM pins
# torch 2.14.0, a CUDA build; the render path runs on the CPU torch 2.13.0 and does not use
# vLLM's compiled ops). The pins that differ between the releases checked:
_PINS = {
    "0.33.0": ["transformers>=5.16.1,<5.21.0", "huggingface_hub>=1.31.0", "tokenizers>=0.23.2",
               "filelock>=3.20.3"],
    "0.34.0": ["transformers>=5.16.1,<5.23.0", "huggingface_hub>=2.0.0", "tokenizers>=0.23.3",
               "filelock>=4.2.4"],
}
_COMMON = [
    "regex", "cachetools", "psutil", "sentencepiece", "numpy", "requests", "tqdm", "blake3",
    "py-cpuinfo", "safetensors>=0.6.2", "protobuf", "fastapi[standard]>=0.133.0,<0.137.0",
    "starlette>=1.0.1", "aiohttp>=3.14.4", "openai>=2.25.0", "pydantic>=2.12.0", "orjson>=3.11.6",
    "prometheus_client>=0.18.0", "pillow", "prometheus-fastapi-instrumentator>=8.0.0",
    "tiktoken>=0.6.0", "typing_extensions>=4.10", "partial-json-parser",
    "jsonschema>=4.23.0", "pyzmq>=25.0.0", "msgspec", "pyyaml", "einops", "cloudpickle",
    "watchfiles", "python-json-logger", "pybase64", "cbor2", "ijson", "setproctitle",
    "anthropic>=0.71.0", "oss-harmony>=0.0.11", "xgrammar==0.2.8", "llguidance>=1.7.0,<1.8.0",
    "model-hosting-container-standards>=0.1.14,<1.0.0", "httpx",
]


def venv_name(version: str = VLLM_VERSION) -> str:
    return f"vllm-{version}-venv"


def deps(version: str = VLLM_VERSION) -> list[str]:
    return [*_COMMON, *_PINS[version]]


VENV_NAME = venv_name()
DEPS = deps()
ENV = {"DTOK_VLLM": "1", "VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1",
       "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
       "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
       "DTOK_SHARED": str(SHARED)}


def outer(args) -> int:
    """Build or reuse the venv, then run this script inside it."""
    try:
        py = engine_setup.ensure(venv_name(args.vllm), f"vllm=={args.vllm}", deps(args.vllm),
                                python=args.python, rebuild=args.rebuild)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"cannot build the vLLM venv: {exc}")
        return 2
    cmd = [*args.names, *(["--pool", str(args.pool)] if args.pool else []),
           *[flag for flag in ("--live", "--control") if getattr(args, flag[2:])]]
    return engine_setup.run_inside(py, Path(__file__).resolve(), cmd, ENV)


# --- inner run: inside the venv ---------------------------------------------------------------

MAX_MODEL_LEN = 131072
TRANSCRIPT = "minisweagent-gemini3pro__django__django-11138.json"


async def render_app(path: Path, *extra: str):
    """vLLM's render server app for a model directory (what ``vllm launch render`` serves)."""
    from vllm import AsyncEngineArgs
    from vllm.config import VllmConfig
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.render.app_state import init_render_app_state
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args(
        ["--model", str(path), "--max-model-len", str(MAX_MODEL_LEN), *extra])
    engine_args = AsyncEngineArgs.from_cli_args(args)
    model_config = engine_args.create_model_config()
    model_config.quantization = None
    with _cpu_platform_without_triton():
        config = VllmConfig(
            model_config=model_config, logging_config=engine_args.create_logging_config(),
            structured_outputs_config=engine_args.create_structured_outputs_config())
    app = build_app(args, ("render",))
    await init_render_app_state(config, app.state, args)
    return app


@contextlib.contextmanager
def _cpu_platform_without_triton():
    """Build the render server's config on an x86 CPU that has no Triton.

    From vLLM 0.34 ``CpuPlatform.check_and_update_config`` (run by ``VllmConfig``) raises
    ``RuntimeError: vLLM on x86 CPUs requires Triton (triton-cpu)`` where ``HAS_TRITON`` is
    false: the CPU *model runner* compiles Triton kernels, and triton-cpu is built from source
    (vLLM's CPU image), not on PyPI. ``vllm launch render`` builds the same config (its
    ``run_launch_fastapi``) and starts no model runner. So, for the config's construction only,
    the platform reads ``vllm.triton_utils.HAS_TRITON`` as true; on x86 that flag decides nothing
    else there (``uses_standalone_cpu_model_runner`` is false on x86 either way), and it is put
    back before any request. Everything that renders and tokenizes is vLLM's own code, unchanged.
    A vLLM whose platform does not raise there (0.33 warns), another platform or a venv with
    triton-cpu: nothing is changed."""
    import inspect

    import vllm.triton_utils as tu
    from vllm.platforms import current_platform

    check = getattr(current_platform, "check_and_update_config", None)
    if tu.HAS_TRITON or not current_platform.is_cpu() or check is None \
            or "requires Triton" not in inspect.getsource(check):
        yield
        return
    print("  (vLLM's CPU platform requires Triton for its model runner: the render server's "
          "config is built with HAS_TRITON read as true, see _cpu_platform_without_triton)",
          flush=True)
    tu.HAS_TRITON = True
    try:
        yield
    finally:
        tu.HAS_TRITON = False


def transcript_messages(target_chars: int = 200_000) -> list[dict]:
    """A real agent transcript, cut after the message that passes ``target_chars``."""
    messages = json.loads((SHARED / "corpus" / "transcripts" / TRANSCRIPT).read_bytes())
    out, total = [], 0
    for m in messages:
        out.append({"role": m["role"] if m["role"] in ("system", "user", "assistant") else "user",
                    "content": m["content"] if isinstance(m["content"], str)
                    else json.dumps(m["content"], ensure_ascii=False)})
        total += len(out[-1]["content"])
        if total > target_chars:
            break
    return out


class Checker:
    """Sends each request with dtok on and off and compares the answers."""

    def __init__(self, client, hook, out) -> None:
        self.client, self.hook, self.out = client, hook, out
        self.requests = self.mismatches = 0

    async def _send(self, path: str, body: dict, headers: dict, enabled: bool):
        import time

        self.hook.enabled = enabled
        try:
            t0 = time.perf_counter()
            r = await self.client.post(path, json=body, headers=headers)
            return r.status_code, _comparable(r.json()), time.perf_counter() - t0
        finally:
            self.hook.enabled = True

    async def both(self, label: str, path: str, body: dict, headers: dict | None = None
                   ) -> tuple[float, float, dict]:
        """(seconds hooked, seconds vLLM's own, the hooked answer); counts a mismatch."""
        headers = headers or {}
        s1, got, t1 = await self._send(path, body, headers, True)
        s2, want, t2 = await self._send(path, body, headers, False)
        self.requests += 1
        if (s1, got) != (s2, want):
            self.mismatches += 1
            self.out(f"  MISMATCH {label}: status {s1} vs {s2}; {_first_difference(got, want)}")
        return t1, t2, got


def _comparable(answer):
    """The answer without what differs between any two calls (random request ids)."""
    if isinstance(answer, list):
        return [_comparable(a) for a in answer]
    if isinstance(answer, dict):
        return {k: _comparable(v) for k, v in answer.items() if k != "request_id"}
    return answer


def _first_difference(a, b) -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if a.get(k) != b.get(k):
                return f"{k}: {_first_difference(a.get(k), b.get(k))}"
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"[{i}] {_first_difference(x, y)}"
        return f"lengths {len(a)} vs {len(b)}"
    return f"{str(a)[:120]!r} vs {str(b)[:120]!r}"


async def check_model(name: str, tmp: Path, out, pool_workers: int = 0,
                      live_only: bool = False, control: bool = False) -> tuple[int, int]:
    import httpx

    from dtok.chat import detect_style, render_turns
    from dtok.integrations import vllm as plugin

    path = model_dir(name, tmp)
    template = tmp / "fallback_template.jinja"
    template.write_text(FALLBACK_TEMPLATE)
    has_template = "chat_template" in json.loads((path / "tokenizer_config.json").read_text())
    app = await render_app(path, *([] if has_template else ["--chat-template", str(template)]))
    renderer = app.state.online_renderer.renderer
    differ = engine_setup.use_file_if_equal(renderer.tokenizer, path / "tokenizer.json",
                                           "DTOK_VLLM_TOKENIZER")
    if live_only:
        os.environ.pop("DTOK_VLLM_TOKENIZER", None)
    wrapper = plugin.dtok_for(renderer.tokenizer)
    source = ("the file" if "DTOK_VLLM_TOKENIZER" in os.environ else "the live backend"
              + (f" (it differs from the file in {', '.join(differ)})" if differ else ""))
    out(f"{name}: {type(renderer).__name__}, {type(renderer.tokenizer).__name__}, "
        f"dtok {'ON' if wrapper else 'OFF: ' + str(plugin.HOOK.refusal(renderer.tokenizer))}, "
        f"built from {source}")
    if wrapper is None:
        return 1, 1
    if pool_workers:
        pool = plugin.HOOK.pool_for(wrapper.current(), wait=300)
        out(f"  pool: {'ready' if pool else plugin.HOOK.pool_state(wrapper.current())[0]['error']}")
    model = str(path)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://render",
                                 timeout=600) as client:
        check = Checker(client, plugin.HOOK, out)
        cmpl, chat = "/v1/completions/render", "/v1/chat/completions/render"
        if control:
            return await run_control(check, wrapper.current(), model, out)
        texts = corpus()
        for i, text in enumerate(texts):
            await check.both(f"completion {i}", cmpl, {"model": model, "prompt": text})
            await check.both(f"completion {i} keyed", cmpl, {"model": model, "prompt": text},
                             {"X-Session-ID": f"doc-{i}"})
            if i % 8 == 0:
                await check.both(f"completion {i} no specials", cmpl,
                                 {"model": model, "prompt": text, "add_special_tokens": False})
        out(f"  completions: {len(texts)} corpus texts x (no key, X-Session-ID), "
            f"mismatches so far {check.mismatches}")

        messages = transcript_messages()
        style = detect_style(wrapper.current().admission.added_tokens)
        turns = render_turns(messages, style)
        points = [turns[round((k + 1) * len(turns) / 30) - 1] for k in range(30)]
        os.environ["DTOK_VLLM_RID_SEP"] = ":"
        for label, body, headers in [
                ("session_id", {"session_id": "conv-1"}, {}),
                ("X-Session-ID", {}, {"X-Session-ID": "conv-2"}),
                ("cache_salt", {"cache_salt": "tenant-9"}, {}),
                ("rid prefix", {}, {"X-Request-Id": "conv-4:{n}"}),
                ("no key", {}, {})]:
            before = dict(plugin.stats)
            t_hook = t_own = 0.0
            for n, text in enumerate(points):
                hdrs = {k: v.format(n=n) for k, v in headers.items()}
                t1, t2, _ = await check.both(f"transcript {label} turn {n}", cmpl,
                                             {"model": model, "prompt": text, **body}, hdrs)
                t_hook, t_own = t_hook + t1, t_own + t2
            keyed = plugin.stats["keyed_calls"] - before["keyed_calls"]
            out(f"  transcript, key {label:12s}: 30 turns to {len(points[-1]):,} chars, keyed "
                f"calls {keyed}, hooked {t_hook * 1e3:.0f} ms vs vLLM's own {t_own * 1e3:.0f} ms")

        chat_msgs, t_hook, t_own, n_chat = [], 0.0, 0.0, 0
        for m in messages[:24]:
            chat_msgs.append(m)
            if m["role"] != "user":
                continue
            t1, t2, _ = await check.both(f"chat {len(chat_msgs)}", chat,
                                         {"model": model, "messages": list(chat_msgs),
                                          "session_id": "chat-7"})
            t_hook, t_own, n_chat = t_hook + t1, t_own + t2, n_chat + 1
        out(f"  chat: {n_chat} growing requests with session_id, hooked {t_hook * 1e3:.0f} ms "
            f"vs vLLM's own {t_own * 1e3:.0f} ms")

        for k in (7, 1000):
            await check.both(f"truncate_prompt_tokens={k}", cmpl,
                             {"model": model, "prompt": points[-1], "truncate_prompt_tokens": k})
            await check.both(f"truncate_prompt_tokens={k} keyed", cmpl,
                             {"model": model, "prompt": points[-1], "truncate_prompt_tokens": k},
                             {"X-Session-ID": "conv-2"})
        long_text = "".join(texts)[:600_000] * 2  # more tokens than max_model_len
        await check.both("over-long prompt", cmpl, {"model": model, "prompt": long_text})
        out(f"  truncation: truncate_prompt_tokens 7 and 1000 (with and without key), an "
            f"over-long prompt of {len(long_text):,} chars")
        for line in engine_setup.hook_summary(plugin.HOOK, wrapper.current()):
            out(line)
        return check.requests, check.mismatches


async def run_control(check: Checker, tok, model: str, out) -> tuple[int, int]:
    """The check's control: with dtok's special-token guard switched off (the private hook the
    exactness battery's control uses), keyed turns that end inside a chat marker must come
    out different from vLLM's own. Returns (requests, 0) when it found differences, else
    (requests, 1): a check that cannot see a missing guard is broken."""
    from dtok.chat import STYLES, detect_style

    if not tok.admission.admitted:
        out("  control: not admitted (dtok encodes whole), nothing to switch off")
        return 0, 0
    marker = STYLES[detect_style(tok.admission.added_tokens)][0]
    half = len(marker) - 2  # each turn ends inside the marker the next one completes
    text = corpus(1, 20000)[0]
    with _guard_off(tok):
        for k in range(20):
            for piece in (f" turn {k}\n{marker[:half]}", f"{marker[half:]}user\n"):
                text += piece
                await check.both(f"control turn {k}", "/v1/completions/render",
                                 {"model": model, "prompt": text}, {"X-Session-ID": "control"})
    found = check.mismatches
    out(f"  control (special-token guard off): {found} of {check.requests} requests differ "
        f"({'the check sees it' if found else 'CHECK CANNOT FAIL'})")
    return check.requests, 0 if found else 1


@contextlib.contextmanager
def _guard_off(tok):
    """The control's fault: the special-token check of the cut rules switched off
    (``dtok.testing.cut_checks_off``, as the battery's controls do), so this check proves it
    can see a wrong answer."""
    from dtok import testing
    from dtok.tokenizer import parts_of

    with testing.cut_checks_off(parts_of(tok).rules, testing.CUT_CHECK_SPECIALS):
        yield


def _is_patched(owner, attr: str) -> bool:
    return owner is not None and getattr(getattr(owner, attr), "__dtok_hook__", False)


def inner(args) -> int:
    import asyncio
    import tempfile

    from vllm.plugins import load_general_plugins

    from dtok.integrations import engine, patching
    from dtok.integrations import vllm as plugin

    if args.pool:
        engine.configure(pool_workers=args.pool)
    load_general_plugins()
    patched = [t for t, _h in plugin.TARGETS if _is_patched(*patching.resolve(t))]
    print(f"vLLM {__import__('vllm').__version__}: loaded through vLLM's plugin loader, "
          f"{len(patched)}/{len(plugin.TARGETS)} hooks patched", flush=True)
    requests = mismatches = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.names:
            r, m = asyncio.run(check_model(name, Path(tmp), lambda s: print(s, flush=True),
                                           args.pool, args.live, args.control))
            requests, mismatches = requests + r, mismatches + m
    plugin.HOOK.close()
    if args.control:
        found = "differences found" if not mismatches else "NO DIFFERENCES FOUND"
        print(f"control: {requests} requests, {found}", flush=True)
    else:
        print(f"{requests} requests, {mismatches} mismatches", flush=True)
    return 1 if mismatches or not patched else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", default=list(MODELS), help="files in ../shared/tokenizers")
    p.add_argument("--pool", type=int, default=0, help="DTOK_POOL_WORKERS for the hooks")
    p.add_argument("--control", action="store_true",
                   help="only the control: dtok's special-token guard off must show mismatches")
    p.add_argument("--live", action="store_true",
                   help="build dtok from the live backend even where it equals the file")
    p.add_argument("--vllm", default=VLLM_VERSION, choices=VERSIONS,
                   help=f"the vLLM release to check (default {VLLM_VERSION})")
    p.add_argument("--rebuild", action="store_true", help="rebuild the venv from scratch")
    p.add_argument("--python", default=sys.executable, help="interpreter for a new venv")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if not args.inner:
        return outer(args)
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        print(f"vLLM cannot be imported: {type(exc).__name__}: {exc}")
        return 2
    return inner(args)


if __name__ == "__main__":
    sys.exit(main())
