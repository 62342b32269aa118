#!/usr/bin/env python3
"""Edited sessions: reasoning chats whose templates drop earlier think blocks.

    python benches/bench_edits.py [--contexts 100000 1000000] [--turns 30] [--repeats 3]
                                  [--encoders fast reference] [--files qwen3 llama3 ...]

1. **Replay** (Qwen3's own chat template, rendered by transformers): a long document in the
   system message brings the context to ~100K or ~1M characters, then a 30-turn reasoning chat
   (assistant turns with ``reasoning_content``, 0-3 tool steps per query; the template drops the
   think blocks of earlier turns at each new query). Per turn: dtok keyed session, dtok's own
   stateless route (content lookup off) and the HF reference's full encode (``encode(x).ids``),
   in the same run; per-turn median and P99 of each, split into edited turns (the prompt is not
   an extension of the last one) and extending turns.
2. **The edit 30K characters before a 1M end**: a session holds head (970K) + a 20K think block +
   10K kept, arriving as two requests (the block is appended in a turn); the next prompt drops
   the block and appends 400 characters. Median and P99 over 40 variants, against the HF full
   encode and dtok's stateless route of the same text.
3. **Other files**: the same chats rendered with a DeepSeek-R1 rule (Llama-3.1, DeepSeek-V3) and
   harmony (gpt-oss): how many turns were edits, repairs, full encodes; anchor bytes per 100K
   tokens.

Every result is checked against the reference (complete ID sequences). Writes
bench-results/edits.json.

    python benches/bench_edits.py --patterns [--sizes 100000 1000000] [--repeats 3]

measures the edit of (2) as a server lives it instead (:mod:`patterns`, as
``bench_append.py --patterns``): 20K characters removed 30K before the end and 400 appended, each
turn, results dropped, held and held as lists, hot and cold caches, 64 sessions interleaved.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ["FASTOKENS_BPE_THREADS"] = "1"

from common import SHARED, corpus, header, machine, summary, write_json  # noqa: E402

import dtok  # noqa: E402
from dtok.admission import bundled_files  # noqa: E402
from dtok.chat import reasoning_chat, render_reasoning  # noqa: E402

STYLES = {"qwen3": "r1:qwen", "llama3": "r1:llama3", "deepseek-v3": "r1:deepseek",
          "gpt-oss": "harmony"}


def texts() -> tuple[str, str]:
    prose = "".join(corpus("prose", p.name) for p in sorted((SHARED / "corpus" / "prose").iterdir()))
    code = "".join(corpus("code", p.name) for p in sorted((SHARED / "corpus" / "code").iterdir()))
    return prose, code


def qwen3_template():
    from transformers import AutoTokenizer

    d = Path(tempfile.mkdtemp())
    files = bundled_files()
    (d / "tokenizer.json").write_bytes(files.raw)
    (d / "tokenizer_config.json").write_bytes(files.config_path.read_bytes())
    return AutoTokenizer.from_pretrained(str(d))


def chat_prompts(render, prose: str, code: str, context: int, turns: int, seed: int) -> list[str]:
    requests = reasoning_chat(prose, code, turns=turns, seed=seed, think_chars=(2000, 12000))
    doc = prose[seed * 7919 % 100_000:][: max(0, context - 60_000)]
    for r in requests:
        r[0] = {"role": "system", "content": r[0]["content"] + "\n\nReference document:\n" + doc}
    return [render(r) for r in requests]


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def replay(tok, prompts: list[str], hf_samples: int, check) -> dict:
    """Per-turn times: session, stateless, reference (the reference on `hf_samples` turns)."""
    stateless = tok.with_knobs(content_lookup=False)
    out = {"edited": {"session": [], "stateless": []}, "extending": {"session": [], "stateless": []},
           "reference": []}
    step = max(1, len(prompts) // max(1, hf_samples))
    for i, text in enumerate(prompts):
        kind = "edited" if i and not text.startswith(prompts[i - 1]) else "extending"
        dt, ids = timed(lambda: tok.encode(text, session="chat"))
        if i:
            out[kind]["session"].append(dt)
        check(ids, text)
        del ids
        if i:
            dt, ids = timed(lambda: stateless.encode(text))
            out[kind]["stateless"].append(dt)
            del ids
        if i % step == 0:
            dt, _ = timed(lambda: tok.reference.encode(text).ids)
            out["reference"].append(dt)
    return out


def edit_scenario(tok, prose: str, variants: int, check) -> dict:
    head_len = 970_000
    src = prose * (1 + 1_200_000 // len(prose))
    lat = {"session": [], "stateless": [], "reference": []}
    stateless = tok.with_knobs(content_lookup=False)
    for i in range(variants):
        s = tok.with_knobs()
        head = src[i * 1000 : i * 1000 + head_len]
        think = "<think>\n" + src[1_000_000 + i * 100 : 1_020_000 + i * 100] + "\n</think>\n\n"
        kept = src[1_050_000 + i * 10 : 1_060_000 + i * 10]
        s.encode(head, session="e")
        s.encode(head + think + kept, session="e")
        new = head + kept + "<|im_start|>user\n" + src[1_100_000 + i * 400 : 1_100_380 + i * 400] \
            + "<|im_end|>\n"
        dt, ids = timed(lambda: s.encode(new, session="e"))
        lat["session"].append(dt)
        if i < 3:
            check(ids, new)
            lat["stateless"].append(timed(lambda: stateless.encode(new))[0])
            lat["reference"].append(timed(lambda: tok.reference.encode(new).ids)[0])
        del ids
        assert s.sessions.stats()["edits"] == 1, s.sessions.stats()
    return lat


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--turns", type=int, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--encoders", nargs="*", default=["fast", "reference"])
    ap.add_argument("--files", nargs="*", default=["llama3", "deepseek-v3", "gpt-oss"])
    ap.add_argument("--variants", type=int, default=40)
    ap.add_argument("--patterns", action="store_true",
                    help="results held/dropped/lists, hot and cold caches (see patterns.py)")
    ap.add_argument("--sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    ap.add_argument("--tokenizers", nargs="*", default=["qwen3", "llama3"])
    ap.add_argument("--appends", type=int, default=40, help="--patterns: turns per cell")
    args = ap.parse_args()
    info = machine()
    print(header(info))
    if args.patterns:
        from bench_append import patterns_main

        return patterns_main(args, info, "edit")
    prose, code = texts()
    hf = qwen3_template()
    bad = []

    def check(view, text):
        if list(view) != ref.encode(text).ids:
            bad.append(len(text))

    results: dict = {"machine": info, "args": vars(args), "replay": [], "scenario": {},
                     "files": []}
    for encoder in args.encoders:
        base = dtok.Tokenizer.from_file(SHARED / "tokenizers" / "qwen3",
                                        encoder="fast" if encoder == "fast" else "reference")
        ref = base.reference
        for context in args.contexts:
            reps = []
            counts = {}
            for seed in range(args.repeats):
                tok = base.with_knobs()
                prompts = chat_prompts(lambda r: hf.apply_chat_template(
                    r, tokenize=False, add_generation_prompt=True), prose, code, context,
                    args.turns, seed)
                reps.append(replay(tok, prompts, 3 if context > 500_000 else 10, check))
                for k, v in tok.sessions.stats().items():
                    counts[k] = counts.get(k, 0) + v
                n_tok = len(ref.encode(prompts[-1]).ids)
                counts["anchor_bytes_per_100k_tokens"] = (
                    tok.sessions.stats()["anchor_bytes"] * 100_000 / n_tok)
            row = {"encoder": encoder, "context": context, "counts": counts}
            ref_ms = statistics.median(x for r in reps for x in r["reference"]) * 1e3
            row["reference_median_ms"] = ref_ms
            for kind in ("edited", "extending"):
                for route in ("session", "stateless"):
                    meds = [summary(r[kind][route])["median_ms"] for r in reps if r[kind][route]]
                    p99s = [summary(r[kind][route])["p99_ms"] for r in reps if r[kind][route]]
                    if not meds:
                        continue
                    row[f"{kind}_{route}"] = {"median_ms": statistics.median(meds),
                                              "median_spread": (min(meds), max(meds)),
                                              "p99_ms": statistics.median(p99s),
                                              "p99_spread": (min(p99s), max(p99s))}
            results["replay"].append(row)
            e, x = row.get("edited_session", {}), row.get("extending_session", {})
            lo, hi = e.get("median_spread", (float("nan"),) * 2)
            print(f"qwen3 {encoder:9s} context {context:>9,}: edited turns session "
                  f"{e.get('median_ms', float('nan')):.3f} ms (repeats {lo:.3f}-{hi:.3f}, "
                  f"P99 {e.get('p99_ms', float('nan')):.3f}) vs stateless "
                  f"{row.get('edited_stateless', {}).get('median_ms', float('nan')):.2f} ms, "
                  f"reference {ref_ms:.1f} ms (x{ref_ms / e.get('median_ms', float('nan')):.0f}); "
                  f"extending turns {x.get('median_ms', float('nan')):.3f} ms (P99 "
                  f"{x.get('p99_ms', float('nan')):.3f}); counts edits {counts['edits']} repairs "
                  f"{counts['repairs']} full {counts['full_encodes']} fallbacks "
                  f"{counts['fallbacks']}; anchors {counts['anchor_bytes_per_100k_tokens']:.0f} "
                  f"B/100K tokens", flush=True)
        lat = edit_scenario(base, prose, args.variants, check)
        s = {k: summary(v) for k, v in lat.items()}
        results["scenario"][encoder] = s
        ratio = s["reference"]["median_ms"] / s["session"]["median_ms"]
        print(f"edit 30K before a 1M end, {encoder}: session {s['session']['median_ms']:.3f} ms "
              f"(P99 {s['session']['p99_ms']:.3f}, {args.variants} variants) vs stateless "
              f"{s['stateless']['median_ms']:.1f} ms, reference {s['reference']['median_ms']:.0f}"
              f" ms: x{ratio:.0f}", flush=True)
    for name in args.files:
        tok = dtok.Tokenizer.from_file(SHARED / "tokenizers" / name)
        ref = tok.reference
        turns = 0
        for seed in range(args.repeats):
            prompts = chat_prompts(lambda r: render_reasoning(r, STYLES[name]), prose, code,
                                   100_000, args.turns, seed)
            s = tok.with_knobs()
            for text in prompts:
                check(s.encode(text, session="c"), text)
            st = s.sessions.stats()
            turns += len(prompts)
            results["files"].append({"file": name, "seed": seed, **st})
        tot = {k: sum(r[k] for r in results["files"] if r["file"] == name)
               for k in ("edits", "repairs", "full_encodes", "fallbacks")}
        print(f"{name} ({STYLES[name]}), {turns} turns at ~100K: {tot}", flush=True)
    print(f"exact: {'yes' if not bad else 'NO ' + str(bad[:5])}")
    results["exact"] = not bad
    print("wrote", write_json("edits.json", results))


if __name__ == "__main__":
    main()
