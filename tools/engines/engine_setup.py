"""What the serving-engine tools share (tools/engines/vllm_check.py,
tools/engines/sglang_check.py, tools/engines/router_replicas.py, benches/bench_serving.py): a
cached virtualenv holding an engine from PyPI and this checkout (editable), and weightless model
directories around the real tokenizer files. Standard library only, so the tools run from any
Python 3.10+.

The engine is installed with ``--no-deps`` beside a CPU torch and the dependencies its
tokenization path imports (each tool lists them); a stamp file records what was installed, so
a second run only checks that the venv's ``dtok`` is this checkout. Stubs are small stand-in
packages for modules an engine imports at module level but the checks never use (SGLang's
multimodal processors import torchvision; PyPI's torchvision cannot load beside the CPU torch
wheel of this machine).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("DTOK_SHARED", ROOT.parent / "shared"))
CACHE = Path(os.environ.get("DTOK_ENGINE_VENVS", Path.home() / ".cache" / "dtok"))
# The local CPU wheel on the development machine; elsewhere pip downloads torch 2.13.0.
TORCH = "torch==2.13.0"
# What dtok needs to be installed editable without build isolation, and its fast encoder.
DTOK_DEPS = ["cython>=3.0", "setuptools>=64,<81", "wheel", "posix_ipc>=1.1", "fastokens==0.3.5",
             "numpy", "setproctitle"]

_STUB = '''"""A stand-in written by dtok's tools/engines/engine_setup.py: the real package cannot be
installed in this check venv; the engine imports it at module level only for code the checks
never run."""

# What the real package would report beside this venv's torch: libraries compare it (transformers
# parses it with ``packaging``), so it must be a real version, not a placeholder.
__version__ = "{version}"


class _Anything(type):
    def __getattr__(cls, name):
        return cls


class _Missing(metaclass=_Anything):
    def __init__(self, *a, **k):
        raise ImportError("{name} is a stub in this venv (tools/engines/engine_setup.py)")


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _Missing
'''


def _pip(python: Path, *args: str) -> None:
    cmd = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args]
    print("+ pip install", " ".join(args), flush=True)
    subprocess.run(cmd, check=True)


def _write_stub(python: Path, package: str, version: str, submodules: list[str]) -> None:
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    base = Path(site.stdout.strip()) / package
    for module in ["", *submodules]:
        d = base.joinpath(*module.split(".")) if module else base
        d.mkdir(parents=True, exist_ok=True)
        (d / "__init__.py").write_text(_STUB.replace("{name}", package)
                                       .replace("{version}", version))


def ensure(name: str, engine: str, deps: list[str], *, python: str = sys.executable,
           stubs: dict[str, dict] | None = None, rebuild: bool = False) -> Path:
    """The interpreter of venv ``CACHE/name`` with ``engine`` (``--no-deps``), ``deps``,
    ``TORCH``, dtok's own needs, ``stubs`` (package: ``{"version": ..., "submodules": [...]}``)
    and this checkout; built or completed as needed."""
    venv = CACHE / name
    py = venv / "bin" / "python"
    stamp = venv / "dtok-stamp.json"
    want = {"engine": engine, "torch": TORCH, "deps": deps + DTOK_DEPS, "stubs": stubs or {}}
    if rebuild or not py.exists():
        subprocess.run([python, "-m", "venv", "--clear", str(venv)], check=True)
    if not stamp.exists() or json.loads(stamp.read_text()) != want:
        constraint = venv / "constraints.txt"
        constraint.write_text(TORCH + "\n")
        _pip(py, "--upgrade", "pip")
        _pip(py, TORCH)
        _pip(py, "--no-deps", engine)
        _pip(py, "-c", str(constraint), *deps, *DTOK_DEPS)
        for package, stub in (stubs or {}).items():
            _write_stub(py, package, stub["version"], stub["submodules"])
        stamp.write_text(json.dumps(want))
    # from "/", so that a dtok in the current directory does not answer for the venv's
    where = subprocess.run([str(py), "-c", "import dtok, sys; sys.stdout.write(dtok.__file__)"],
                           capture_output=True, text=True, cwd="/")
    if where.returncode != 0 or not Path(where.stdout).resolve().is_relative_to(ROOT):
        _pip(py, "--no-deps", "--no-build-isolation", "-e", str(ROOT))
    return py


def use_file_if_equal(live_tokenizer, file: Path, env_name: str) -> list[str]:
    """As an operator would deploy (inside a venv): set ``env_name`` (``DTOK_VLLM_TOKENIZER``,
    ``DTOK_SGLANG_TOKENIZER``) to the model's tokenizer.json when the engine's live tokenizer
    equals it, so dtok is built from the file (the fast encoder's guard tables apply and a pool
    can load it); unset it otherwise. Returns the sections that differ."""
    from dtok.integrations.identity import compare_sections

    differ = compare_sections(live_tokenizer.backend_tokenizer.to_str(),
                              file.read_text(encoding="utf-8"))
    os.environ.pop(env_name, None)
    if not differ:
        os.environ[env_name] = str(file)
    return differ


def hook_summary(hook, tok) -> list[str]:
    """Lines for a check's output (inside a venv): the hook's counters, its pool's counters for
    dtok tokenizer ``tok``, the encoder and the session stats."""
    lines = [f"  hook stats: {hook.stats}"]
    for state in hook.pool_state(tok):
        if state["ready"]:
            st = state["stats"]
            lines.append("  pool stats: " + ", ".join(f"{k}={st[k]}" for k in (
                "requests", "stateless", "chunked", "session_full_encodes", "session_repairs",
                "session_hits", "failovers", "errors") if k in st))
    stats = tok.stats()
    lines.append(f"  dtok: encoder {stats['encoder']} ({'; '.join(stats['notes'])}), "
                 f"sessions {tok.sessions.stats()}")
    return lines


def built(name: str) -> bool:
    """Whether venv ``name`` was built (tests run the tools only then; they never build it)."""
    return (CACHE / name / "dtok-stamp.json").exists()


def run_inside(python: Path, script: Path, args: list[str], env: dict[str, str]) -> int:
    """Run ``script --inner ARGS`` with the venv's interpreter from the repository root."""
    return subprocess.run([str(python), str(script), "--inner", *args],
                          env={**os.environ, **env}, cwd=str(ROOT)).returncode


# --- weightless model directories -------------------------------------------------------------

# Just enough model config for the engines' model configs; no weights are loaded.
_CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
           "num_key_value_heads": 2, "num_hidden_layers": 2, "max_position_embeddings": 131072,
           "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "torch_dtype": "bfloat16",
           "hidden_act": "silu"}
# gpt-oss gets a Llama config: with model_type gpt_oss vLLM renders chat with openai-harmony,
# not with the tokenizer (not hooked by dtok; see dtok/integrations/vllm.py).
MODELS = {
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", head_dim=16,
                  vocab_size=151936, bos_token_id=151643, eos_token_id=151645),
    "llama3": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=128256,
                   bos_token_id=128000, eos_token_id=128009),
    "deepseek-v3": dict(architectures=["LlamaForCausalLM"], model_type="llama",
                        vocab_size=129280, bos_token_id=0, eos_token_id=1),
    "gpt-oss": dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=201088,
                    bos_token_id=199998, eos_token_id=200002),
}
# For files without a chat template (llama3, gpt-oss): Llama-3's format.
FALLBACK_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
    "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")


def model_dir(name: str, into: Path) -> Path:
    """A weightless model directory: a config.json plus the real tokenizer files."""
    import shutil

    d = into / name
    d.mkdir(parents=True, exist_ok=True)
    for f in (SHARED / "tokenizers" / name).iterdir():
        shutil.copy(f, d / f.name)
    (d / "config.json").write_text(json.dumps({**_CONFIG, **MODELS[name]}))
    return d


def corpus(n: int = 40, chars: int = 60000) -> list[str]:
    """The first ``chars`` characters of the first ``n`` corpus files."""
    files = sorted((SHARED / "corpus").glob("*/*.txt"))[:n]
    return [f.read_bytes().decode("utf-8")[:chars] for f in files]
