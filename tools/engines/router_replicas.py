"""Two vLLM render-server replicas with dtok behind the real vllm-router, on a CPU.

    python tools/engines/router_replicas.py [--tokenizer qwen3] [--sessions 9] [--turns 12]
                                            [--policies consistent_hash round_robin] [--no-body-key]
                                            [--vllm 0.34.0|0.33.0]

Runs in tools/engines/vllm_check.py's cached venv of vLLM 0.34.0 (or the release ``--vllm``
names; plus ``vllm-router`` from PyPI). For each router policy: two ``vllm launch render``
replicas (GPU-less render servers, dtok's plugin on with ``DTOK_VLLM=1``, built from the model's
tokenizer.json, each writing its dtok report at exit through ``DTOK_STATS_FILE``), and
``vllm-router --policy POLICY`` in front of them. Each replica is a real process running vLLM's
own CLI (``vllm launch render``) through this script (``--replica``), which does one thing
first: vLLM 0.34's CPU platform refuses an x86 CPU without triton-cpu while the render server's
config is built (``vLLM on x86 CPUs requires Triton (triton-cpu)``; triton-cpu is not on PyPI,
and a render server starts no model runner), so the ``VllmConfig`` that ``vllm launch render``
builds is built inside ``vllm_check._cpu_platform_without_triton`` (``HAS_TRITON`` read as true
for that construction only, then put back); on 0.33, which only warns, nothing is changed. Agent sessions are replayed turn by turn, interleaved, through the router's
``/v1/completions/render`` with an ``X-Session-ID`` header (which the router hashes) and, unless
``--no-body-key``, the same key as the body's ``session_id`` (vllm-router 0.1.17 forwards client
headers on its OpenAI routes but not on ``/tokenize`` or the render paths it proxies; without a
key the replicas find each session by content lookup). Every answer is compared with the
reference ``tokenizers`` library on the same file. Prints per replica: requests, keyed requests,
full encodes, repairs, stored sessions and bytes; and the turn latency through the router.
``consistent_hash`` pins a session to one replica; ``round_robin`` spreads its turns, so each
replica pays a full encode per session and stores it.

The last line is ``N requests, M mismatches``; exit status 1 on a mismatch, 2 when the venv,
the replicas or the router cannot start.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import engine_setup  # tools/engines/engine_setup.py (this script's directory is on sys.path)
import vllm_check

ROUTER = "vllm-router==0.1.17"


def outer(args) -> int:
    try:
        py = engine_setup.ensure(vllm_check.venv_name(args.vllm), f"vllm=={args.vllm}",
                                vllm_check.deps(args.vllm))
        if subprocess.run([str(py), "-c", "import vllm_router.router"],
                          capture_output=True).returncode != 0:
            subprocess.run([str(py), "-m", "pip", "install", "-q", ROUTER], check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"cannot build the venv: {exc}")
        return 2
    argv = [f"--tokenizer={args.tokenizer}", f"--sessions={args.sessions}",
            f"--turns={args.turns}", "--policies", *args.policies,
            *(["--no-body-key"] if args.no_body_key else [])]
    return engine_setup.run_inside(py, Path(__file__).resolve(), argv, vllm_check.ENV)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 600) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:4]} exited with {proc.returncode}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"{url} not ready within {timeout} s")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def sessions(n: int, turns: int, style: str) -> list[list[str]]:
    """``n`` agent transcripts from the corpus, each as ``turns`` growing texts."""
    from dtok.chat import render_turns

    files = sorted((vllm_check.SHARED / "corpus" / "transcripts").glob("minisweagent-*.json"))
    out = []
    for f in files[:n]:
        texts = render_turns(json.loads(f.read_bytes()), style)
        step = max(1, len(texts) // turns)
        out.append(texts[step - 1::step][:turns])
    return out


def run_policy(policy: str, model: Path, work: Path, replay: list[list[str]], reference,
               log, body_key: bool) -> tuple[int, int, list[dict], list[float]]:
    import httpx

    py = sys.executable
    env = {**os.environ, "DTOK_VLLM": "1", "DTOK_VLLM_TOKENIZER": str(model / "tokenizer.json"),
           "DTOK_STATS_FILE": str(work / f"{policy}-{{pid}}.json")}
    ports = [_free_port(), _free_port()]
    replicas = [subprocess.Popen(
        [py, str(Path(__file__).resolve()), "--replica", str(model), "--host",
         "127.0.0.1", "--port", str(p), "--max-model-len", str(vllm_check.MAX_MODEL_LEN),
         "--disable-uvicorn-access-log"], env=env, stdout=log, stderr=log) for p in ports]
    router = None
    try:
        for p, proc in zip(ports, replicas):
            _wait_ready(f"http://127.0.0.1:{p}/health", proc)
        rport = _free_port()
        router = subprocess.Popen(
            [py, "-m", "vllm_router.launch_router", "--worker-urls",
             *[f"http://127.0.0.1:{p}" for p in ports], "--policy", policy, "--host",
             "127.0.0.1", "--port", str(rport)], stdout=log, stderr=log)
        _wait_ready(f"http://127.0.0.1:{rport}/health", router)
        requests = mismatches = 0
        latencies = []
        with httpx.Client(base_url=f"http://127.0.0.1:{rport}", timeout=600) as client:
            for turn in range(max(len(s) for s in replay)):
                for i, texts in enumerate(replay):
                    if turn >= len(texts):
                        continue
                    body = {"model": str(model), "prompt": texts[turn], "max_tokens": 1}
                    if body_key:
                        body["session_id"] = f"session-{i}"
                    t0 = time.perf_counter()
                    r = client.post("/v1/completions/render", json=body,
                                    headers={"X-Session-ID": f"session-{i}"})
                    latencies.append(time.perf_counter() - t0)
                    requests += 1
                    want = reference.encode(texts[turn]).ids
                    if r.status_code != 200 or r.json()[0].get("token_ids") != want:
                        mismatches += 1
                        print(f"  MISMATCH {policy} session {i} turn {turn}: {r.status_code}")
    finally:
        for proc in ([router] if router else []) + replicas:
            _stop(proc)
    reports = []
    for f in sorted(work.glob(f"{policy}-*.json")):
        reports += json.loads(f.read_text())
    return requests, mismatches, reports, latencies


def inner(args) -> int:
    from tokenizers import Tokenizer

    from dtok.chat import detect_style

    work = Path(tempfile.mkdtemp(prefix="dtok-router-"))
    model = vllm_check.model_dir(args.tokenizer, work)
    reference = Tokenizer.from_file(str(model / "tokenizer.json"))
    style = detect_style(t.content for t in reference.get_added_tokens_decoder().values())
    replay = sessions(args.sessions, args.turns, style)
    chars = [len(s[-1]) for s in replay]
    import vllm

    print(f"# vLLM {vllm.__version__}, {args.sessions} sessions x {args.turns} turns ({min(chars):,}-{max(chars):,} chars "
          f"at the last turn), {args.tokenizer}, 2 render replicas, {ROUTER}, key in the header"
          f"{'' if args.no_body_key else ' and the body'}", flush=True)
    total = bad = 0
    with open(work / "servers.log", "w") as log:
        for policy in args.policies:
            try:
                n, m, reports, lat = run_policy(policy, model, work, replay, reference, log,
                                                not args.no_body_key)
            except RuntimeError as exc:
                print(f"{policy}: cannot run: {exc} (log: {work / 'servers.log'})")
                return 2
            total, bad = total + n, bad + m
            lat.sort()
            print(f"{policy}: {n} requests, {m} mismatches, turn latency through the router "
                  f"median {lat[len(lat) // 2] * 1e3:.0f} ms, max {lat[-1] * 1e3:.0f} ms")
            for r in reports:
                s = r["stats"]
                for t in r["tokenizers"]:
                    ss = t["sessions"]
                    print(f"  replica pid {r['pid']}: {s['dtok_calls']} requests "
                          f"({s['keyed_calls']} keyed), full encodes {ss['full_encodes']}, "
                          f"repairs {ss['repairs']}, hits {ss['hits']}, sessions stored "
                          f"{ss['keyed']}, {(ss['text_bytes'] + ss['id_bytes']) / 2**20:.1f} "
                          f"MiB, encoder {t['encoder']}")
            if not reports:
                print("  (no replica wrote its dtok report)")
    print(f"{total} requests, {bad} mismatches")
    return 1 if bad else 0


def replica(argv: list[str]) -> int:
    """One replica (inside the venv): vLLM's own ``vllm launch render ARGV``, its config built
    as for a CPU with Triton where vLLM's CPU platform would refuse this one (see above)."""
    from vllm.entrypoints.cli.main import main as vllm_main
    from vllm.entrypoints.launchers.render import entry

    build_config = entry.VllmConfig

    def config_without_triton(*a, **k):
        with vllm_check._cpu_platform_without_triton():
            return build_config(*a, **k)

    entry.VllmConfig = config_without_triton  # what run_launch_fastapi calls, by this name
    sys.argv = ["vllm", "launch", "render", *argv]
    return vllm_main() or 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--replica"]:
        return replica(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", default="qwen3")
    p.add_argument("--sessions", type=int, default=9)  # odd: round robin spreads each session
    p.add_argument("--turns", type=int, default=12)
    p.add_argument("--policies", nargs="+", default=["consistent_hash", "round_robin"])
    p.add_argument("--no-body-key", action="store_true",
                   help="the key in the header only (the replicas then see no key)")
    p.add_argument("--vllm", default=vllm_check.VLLM_VERSION, choices=vllm_check.VERSIONS,
                   help="the vLLM release whose cached venv runs the replicas")
    p.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    return inner(args) if args.inner else outer(args)


if __name__ == "__main__":
    sys.exit(main())
