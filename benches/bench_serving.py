#!/usr/bin/env python3
"""Event-loop lag and session-append latency inside a hooked serving process: dtok's in-process
hook against its pool-backed hook, same run, same load.

    python benches/bench_serving.py [--engine vllm|sglang|both] [--tokenizer qwen3]
        [--seconds 20] [--repeats 3] [--workers 2] [--sessions 16] [--context 100000]
        [--rate 20] [--burst-every 10] [--encoder auto|reference]

Runs inside the engine's cached venv (tools/engines/engine_setup.py, as
tools/engines/vllm_check.py and tools/engines/sglang_check.py build it). The server process is
this process; its event loop serves:

* vLLM 0.33: the GPU-less render server's serving path (``ServingRender.
  render_completion_request``: request parsing, the renderer, dtok's hooks; no HTTP layer, so
  that JSON encoding of the IDs is not measured as loop lag); in-process, dtok encodes in the
  renderer's executor thread (vLLM's own offload), pool-backed, the loop awaits the pool;
* SGLang 0.5.23: a real ``TokenizerManager._tokenize_one_request``; in-process, dtok encodes on
  the event loop itself (as SGLang's own tokenizer call does), pool-backed, the loop awaits the
  pool.

Load (open loop, latency = completion - scheduled arrival): ``--sessions`` keyed sessions whose
agent transcripts start at ``--context`` characters, appends of about 1,300 characters at
``--rate`` per second in total (Poisson, one request in flight per session), and every
``--burst-every`` seconds a cluster of four distinct unkeyed 1M-character documents. A monitor
task sleeps 1 ms in a loop and records how late it wakes (the loop lag). Phases alternate
in-process / pool-backed, ``--repeats`` times each, with fresh session keys per phase (each
phase initializes its sessions before it is timed). Prints per phase and per mode (median over
repeats, min-max spread): max and P99 loop lag, append P50/P99, document P50/max; writes
bench-results/serving-ENGINE.json.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "engines"))
sys.path.insert(0, str(ROOT / "benches"))

import engine_setup  # noqa: E402


# --- outer run: the engine's venv -------------------------------------------------------------


def outer(args) -> int:
    import subprocess

    status = 0
    for name in (["vllm", "sglang"] if args.engine == "both" else [args.engine]):
        if name == "vllm":
            import vllm_check as tool

            spec, env, stubs = f"vllm=={tool.VLLM_VERSION}", tool.ENV, None
        else:
            import sglang_check as tool

            spec, env, stubs = f"sglang=={tool.SGLANG_VERSION}", {"DTOK_SGLANG": "1"}, tool.STUBS
        try:
            py = engine_setup.ensure(tool.VENV_NAME, spec, tool.DEPS, stubs=stubs)
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"cannot build the {name} venv: {exc}")
            return 2
        argv = [f"--engine={name}"] + [f"--{k.replace('_', '-')}={v}" for k, v in vars(args).items()
                                       if k not in ("engine", "inner")]
        status |= engine_setup.run_inside(py, Path(__file__).resolve(), argv,
                                         {**env, "HF_HUB_OFFLINE": "1",
                                          "TRANSFORMERS_OFFLINE": "1"})
    return status


# --- inner run: the server process --------------------------------------------------------------


async def vllm_server(path: Path):
    """(submit(text, key) -> n_ids, engine hook, live tokenizer) on vLLM's render serving path."""
    import vllm_check
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from dtok.integrations import vllm as plugin

    # 1M-character documents are ~250K tokens: past the weightless config's 131072
    os.environ["VLLM_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    app = await vllm_check.render_app(path, "--max-model-len", str(1 << 22))
    serving = app.state.serving_render
    tokenizer = app.state.online_renderer.renderer.tokenizer
    engine_setup.use_file_if_equal(tokenizer, path / "tokenizer.json", "DTOK_VLLM_TOKENIZER")

    async def submit(text: str, key: str | None) -> int:
        request = CompletionRequest(model=str(path), prompt=text, max_tokens=1, session_id=key)
        result = await serving.render_completion_request(request, None)
        return len(result[0].token_ids)

    return submit, plugin.HOOK, tokenizer


async def sglang_server(path: Path):
    """(submit(text, key) -> n_ids, engine hook, live tokenizer) on SGLang's TokenizerManager."""
    import sglang_check

    from dtok.integrations import sglang as plugin

    tm = sglang_check.tokenizer_manager(path)
    engine_setup.use_file_if_equal(tm.tokenizer, path / "tokenizer.json", "DTOK_SGLANG_TOKENIZER")

    async def submit(text: str, key: str | None) -> int:
        kw = {"session_id": key} if key else {}
        return len(await sglang_check.tokenize_request(tm, text, **kw))

    return submit, plugin.HOOK, tm.tokenizer


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


class Load:
    """The arrivals of one phase (the same shape for every phase of a run)."""

    def __init__(self, args, transcripts: list[str], pieces: list[str], docs: list[str],
                 seed: int) -> None:
        rng = random.Random(seed)
        self.appends: list[tuple[float, int, str]] = []  # (time, session, piece)
        t = rng.expovariate(args.rate)
        while t < args.seconds:
            self.appends.append((t, rng.randrange(args.sessions), rng.choice(pieces)))
            t += rng.expovariate(args.rate)
        self.clusters = [args.burst_every * (k + 0.5) for k in
                         range(int(args.seconds // args.burst_every))]
        self.transcripts, self.docs = transcripts, docs


async def run_phase(submit, load: Load, prefix: str, docs_from: int, seconds: float) -> dict:
    loop = asyncio.get_running_loop()
    n_sessions = len(load.transcripts)
    texts = list(load.transcripts)
    for i in range(n_sessions):  # initialize the phase's sessions (not timed)
        await submit(texts[i], f"{prefix}-{i}")
    locks = [asyncio.Lock() for _ in range(n_sessions)]
    lags: list[float] = []
    append_lat: list[float] = []
    doc_lat: list[float] = []
    stop = asyncio.Event()

    async def monitor():
        while not stop.is_set():
            t = loop.time()
            await asyncio.sleep(0.001)
            lags.append(loop.time() - t - 0.001)

    t0 = loop.time()

    async def append(at: float, session: int, piece: str):
        await asyncio.sleep(max(0.0, t0 + at - loop.time()))
        async with locks[session]:
            texts[session] += piece
            await submit(texts[session], f"{prefix}-{session}")
        append_lat.append(loop.time() - t0 - at)

    async def document(at: float, doc: str):
        await asyncio.sleep(max(0.0, t0 + at - loop.time()))
        await submit(doc, None)
        doc_lat.append(loop.time() - t0 - at)

    mon = asyncio.create_task(monitor())
    tasks = [append(*a) for a in load.appends]
    k = docs_from
    for at in load.clusters:
        for _ in range(4):
            tasks.append(document(at, load.docs[k % len(load.docs)]))
            k += 1
    await asyncio.gather(*tasks)
    elapsed = loop.time() - t0
    stop.set()
    await mon
    return {"loop_lag_max_ms": max(lags) * 1e3, "loop_lag_p99_ms": percentile(lags, 0.99) * 1e3,
            "append_p50_ms": percentile(append_lat, 0.5) * 1e3,
            "append_p99_ms": percentile(append_lat, 0.99) * 1e3,
            "doc_p50_ms": percentile(doc_lat, 0.5) * 1e3, "doc_max_ms": max(doc_lat) * 1e3,
            "appends": len(append_lat), "documents": len(doc_lat),
            "overrun_s": max(0.0, elapsed - seconds)}


def workload(args):
    from common import documents

    from dtok.chat import render_turns

    shared = Path(os.environ.get("DTOK_SHARED", ROOT.parent / "shared"))
    files = sorted((shared / "corpus" / "transcripts").glob("minisweagent-*.json"))
    transcripts, pieces = [], []
    for f in files:
        messages = json.loads(f.read_bytes())
        turns = render_turns(messages, "qwen")  # text only: the markers do not matter here
        whole = turns[-1]
        if len(whole) < args.context + 100_000:
            continue
        transcripts.append(whole[:args.context])
        pieces += [whole[i:i + 1300] for i in range(args.context, len(whole) - 1300, 1300)]
        if len(transcripts) == args.sessions:
            break
    found = len(transcripts)
    while len(transcripts) < args.sessions:  # more sessions than long transcripts: reuse
        transcripts.append(transcripts[len(transcripts) % found])
    n_docs = 4 * int(args.seconds // args.burst_every) * 2 * args.repeats
    docs = documents("prose", 1_000_000, max(4, n_docs))
    return transcripts, pieces, docs


async def inner_async(args) -> dict:
    import tempfile

    from dtok.integrations import engine

    if args.engine == "vllm":
        import vllm_check as tool
        from vllm.plugins import load_general_plugins

        load_general_plugins()
        server = vllm_server
    else:
        import sglang_check as tool
        from sglang.srt.plugins import load_plugins

        load_plugins()
        server = sglang_server
    tmp = Path(tempfile.mkdtemp())
    path = tool.model_dir(args.tokenizer, tmp)
    submit, hook, live = await server(path)
    engine.configure(pool_workers=args.workers,
                     knobs=None if args.encoder == "auto" else {"encoder": args.encoder})
    wrapper = hook.dtok_for(live)
    if wrapper is None:
        raise SystemExit(f"dtok stays out: {hook.refusal(live)}")
    tok = wrapper.current()
    pool = hook.pool_for(tok, wait=600)
    if pool is None:
        raise SystemExit(f"no pool: {hook.pool_state(tok)}")
    transcripts, pieces, docs = workload(args)
    info = {"engine": args.engine, "tokenizer": args.tokenizer, "encoder": tok.stats()["encoder"],
            "pool_encoder": pool.stats()["encoder"], "workers": args.workers,
            "sessions": args.sessions, "context": args.context, "rate": args.rate,
            "burst_every": args.burst_every, "seconds": args.seconds, "repeats": args.repeats}
    print(f"# {args.engine}, {args.tokenizer}: dtok encoder in process {info['encoder']}, pool "
          f"encoder {info['pool_encoder']} ({args.workers} workers)", flush=True)
    phases = []
    docs_from = 0
    for rep in range(args.repeats):
        for mode in ("in-process", "pool"):
            engine.configure(pool_workers=args.workers if mode == "pool" else 0)
            load = Load(args, transcripts, pieces, docs, seed=rep)
            row = await run_phase(submit, load, f"{mode}-{rep}", docs_from, args.seconds)
            docs_from += 4 * len(load.clusters)
            row.update(mode=mode, repeat=rep)
            phases.append(row)
            print(f"  {mode:10s} rep {rep}: loop lag max {row['loop_lag_max_ms']:8.1f} ms, "
                  f"P99 {row['loop_lag_p99_ms']:7.1f} ms | appends P50 "
                  f"{row['append_p50_ms']:7.1f} P99 {row['append_p99_ms']:8.1f} ms "
                  f"({row['appends']}) | documents P50 {row['doc_p50_ms']:7.0f} max "
                  f"{row['doc_max_ms']:7.0f} ms ({row['documents']}) | overrun "
                  f"{row['overrun_s']:.1f} s", flush=True)
    engine.configure()
    summary = {}
    for mode in ("in-process", "pool"):
        rows = [r for r in phases if r["mode"] == mode]
        summary[mode] = {k: {"median": statistics.median(r[k] for r in rows),
                             "min": min(r[k] for r in rows), "max": max(r[k] for r in rows)}
                         for k in ("loop_lag_max_ms", "loop_lag_p99_ms", "append_p50_ms",
                                   "append_p99_ms", "doc_p50_ms", "doc_max_ms")}
    for mode, s in summary.items():
        print(f"{mode:10s}: " + ", ".join(
            f"{k} {v['median']:.1f} [{v['min']:.1f}-{v['max']:.1f}]" for k, v in s.items()))
    ratio = (summary["pool"]["append_p99_ms"]["median"]
             / summary["in-process"]["append_p99_ms"]["median"])
    print(f"append P99 pool / in-process = {ratio:.3f} (goal <= 0.2); pool loop lag max "
          f"{summary['pool']['loop_lag_max_ms']['median']:.1f} ms (goal <= 5 ms)")
    pool.close()
    return {"info": info, "phases": phases, "summary": summary, "append_p99_ratio": ratio}


def inner(args) -> int:
    from common import header, machine, write_json

    info = machine()
    print(header(info), flush=True)
    result = asyncio.run(inner_async(args))
    result["machine"] = info
    print("wrote", write_json(f"serving-{args.engine}-{result['info']['encoder']}.json", result))
    return 0


def appends(args) -> int:
    """The hooked path's cost of one append, end to end, in this interpreter (no engine): a
    400-character append to a keyed session of 100K and 1M characters through
    ``EngineHook.encode`` (what both hooks call; the IDs as a list: the tokenizer's
    ``encode_list`` where it has one, else ``list()`` of the view), against dtok's own
    ``encode`` (a view) and the ``list()`` alone; interleaved, ``--repeats`` rounds."""
    from common import header, machine, summary, write_json
    from transformers import AutoTokenizer

    from dtok.integrations import engine
    from dtok.integrations.engine import EncodeOptions

    info = machine()
    print(header(info), flush=True)
    path = engine_setup.SHARED / "tokenizers" / args.tokenizer
    os.environ["DTOK_APPENDS_FILE"] = str(path)
    hook = engine.EngineHook("bench", frozen_env="DTOK_APPENDS_FILE")
    wrapper = hook.dtok_for(AutoTokenizer.from_pretrained(str(path)))
    tok = wrapper.current()
    has_list = hasattr(tok, "encode_list")
    print(f"# {args.tokenizer}, encoder {tok.stats()['encoder']}, encode_list "
          f"{'yes' if has_list else 'no (list() of the view)'}", flush=True)
    from dtok.chat import render_turns

    files = sorted((engine_setup.SHARED / "corpus" / "transcripts").glob("minisweagent-*.json"))
    rendered = [render_turns(json.loads(f.read_bytes()), "qwen")[-1] for f in files]
    base = ""
    for text in rendered[1:]:  # agent transcripts, one after another, past 1M characters
        base += text
        if len(base) > 1_000_000:
            break
    text_pieces = [rendered[0][i:i + 400] for i in range(0, len(rendered[0]) - 400, 400)]
    result = {"info": {**info, "tokenizer": args.tokenizer, "encode_list": has_list}, "sizes": {}}
    for size in (100_000, 1_000_000):
        rows = {"hook.encode (list)": [], "dtok encode (view)": [], "list(view)": []}
        for rep in range(args.repeats):
            texts = {"hook": base[:size], "view": base[:size]}
            hook.encode(wrapper, texts["hook"], EncodeOptions(), f"h{size}-{rep}")
            tok.encode(texts["view"], session=f"v{size}-{rep}")
            for i in range(200):
                piece = text_pieces[i % len(text_pieces)]
                texts["hook"] += piece
                t0 = time.perf_counter()
                hook.encode(wrapper, texts["hook"], EncodeOptions(), f"h{size}-{rep}")
                rows["hook.encode (list)"].append(time.perf_counter() - t0)
                texts["view"] += piece
                t0 = time.perf_counter()
                view = tok.encode(texts["view"], session=f"v{size}-{rep}")
                rows["dtok encode (view)"].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                list(view)
                rows["list(view)"].append(time.perf_counter() - t0)
                del view
        result["sizes"][size] = {k: summary(v) for k, v in rows.items()}
        for k, v in result["sizes"][size].items():
            print(f"{size:>9,} chars  {k:20s} median {v['median_ms']:.3f} ms  P99 "
                  f"{v['p99_ms']:.3f} ms  min {v['min_ms']:.3f} ms  ({v['n']})", flush=True)
    print("wrote", write_json(f"serving-appends-{args.tokenizer}.json", result))
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--engine", choices=["vllm", "sglang", "both"], default="both")
    p.add_argument("--tokenizer", default="qwen3")
    p.add_argument("--encoder", choices=["auto", "reference"], default="auto",
                   help="dtok's encoder in process and in the pool's workers")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--sessions", type=int, default=16)
    p.add_argument("--context", type=int, default=100_000)
    p.add_argument("--rate", type=float, default=20.0, help="appends per second, all sessions")
    p.add_argument("--burst-every", type=float, default=10.0,
                   help="seconds between clusters of four 1M-character documents")
    p.add_argument("--inner", action="store_true", help="run here (the engine must import)")
    p.add_argument("--appends", action="store_true",
                   help="only the hooked append's end-to-end cost, here, without an engine")
    args = p.parse_args(argv)
    if args.appends:
        return appends(args)
    return inner(args) if args.inner else outer(args)


if __name__ == "__main__":
    sys.exit(main())
