#!/usr/bin/env python3
"""A session's next turn against its floor: what encoding only the new text costs .

    python benches/bench_turn.py [--sizes 65000 300000 1000000 4000000] [--turns 12]
                                 [--repeats 3] [--forms chat raw] [--modes spaced b2b]
                                 [--tokenizer PATH] [--segment-cache-mib 256] [--pool]
                                 [--peers gigatoken toktier]
    python benches/bench_turn.py --breakdown [--sizes ...] [--turns 12] [--forms chat raw]

Sessions are the real agent transcripts (../shared/corpus/transcripts, JSON message lists read
with ``newline=""``), joined in name order into one long message stream (message contents cut
at ``--max-message-chars``, as agents cut long tool output). A row's context is the first
messages whose rendering reaches the size; each turn then adds the next assistant message and
the messages that follow it up to the next assistant message (at least ``--turn-messages``
messages: an assistant message, a tool output, a user message...). Two forms:

* ``chat``: Qwen3's own chat template (transformers' ``apply_chat_template`` on the tokenizer's
  ``tokenizer_config.json``, ``add_generation_prompt=True``): every turn extends the last;
* ``raw``: the message contents (and tool calls as JSON) joined by blank lines.

Columns, each timed per turn on the same text, in one process, side by side:

* ``floor``: fastokens alone (its caches off) on the new text only (``text[len(previous):]``);
* ``fastokens``: fastokens alone on the whole text (what a user would run instead);
* ``fastokens+seg``: another fastokens instance with its segment cache
  (``enable_segment_cache(MiB)``), the whole text;
* ``dtok``: ``tok.encode(text, session=key)`` (the result dropped before the next turn);
* ``dtok list``: ``tok.encode_list(text, session=key)`` on its own tokenizer, the previous
  turn's list held by the caller during the call (``ids = tok.encode_list(...)`` in a loop);
* ``dtok pool`` (``--pool``): ``dtok.Pool(workers=1).encode(text, session=key)``;
* ``gigatoken`` (``--peers``): gigatoken's ``encode`` on the whole text (it keeps no session
  state: a user re-encodes the whole text each turn), loaded from the same tokenizer.json;
* ``toktier session`` (``--peers``): toktier 0.3.0's own sessions,
  ``encode(text, session=key, add_special_tokens=False)`` (its documented session call; it
  repairs the tail of a strict append and returns an ``Encoding`` of the whole stream), on
  its in-process store, a new key primed at the context like dtok's. toktier is not a
  dependency (``pip install toktier==0.3.0``); it loads its certified artifact offline as
  ``bench_fast.py`` does (the Qwen3-8B file: ``../shared/tokenizers/qwen3`` when the bench runs
  on the bundled Qwen3). A peer that is not importable or refuses the file is left out with
  the reason printed. toktier's route of each timed turn (``explain()``'s
  ``last_execution_path``, read untimed after the call) is counted and printed.

Modes: ``spaced``: per turn, every column once in a balanced order (Williams design), each call
20 ms after the last; ``b2b``: back to back, each column runs all its turns in a block (blocks in
a balanced order across repeats), no pause. Every repeat replays the same turns from the same
context (sessions re-primed, untimed). The first ``--skip`` turns of each repeat are warm-up and
not counted. Per cell: median, P99 and the spread (lowest and highest median of the repeats);
``x floor``: dtok's median over the floor's, from the same run.

Every turn's IDs of every column (the peers' too) are compared with fastokens' whole-text IDs
and a column's count of differing turns is printed (``exact: ... NO {column: turns}``); the
last turn's with the reference's (``tok.reference.encode(text).ids``). The goal of issue 60 per
cell: dtok's median <= 1.1 x floor + 0.15 ms + 0.1 ms per million characters of context, and no
more than fastokens or fastokens+seg (a dtok column slower than any other column but the floor
prints ``LOSES to`` with their names).

``--breakdown``: the stages of one turn inside dtok (``tok.encode(text, session=key)``), timed
with ``time.perf_counter`` wrappers around the pieces the session store calls: ``compare``
(``common_prefix`` of the stored and the new text), ``plan`` (the rest of the continuation's
plan: seams, grid cuts, slicing the texts to encode; for a repair, ``Planner.append``'s one pass
less its encode: that and the check of the re-encoded old text and the anchors), ``encode``
(``ChunkEncoder.encode_texts``),
``assemble`` (the rest of ``execute``: checking the re-encoded old text against the stored IDs,
the ID slices), ``anchors`` (``anchors_after``), ``splice`` (the new IDs into the session's
buffer), ``result`` (the view / the kept list) and ``python`` (the call's total less all of
these: locks, dict lookups, accounting, the wrappers themselves, ~1 us).
"""
from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")

from common import SHARED, balanced_order, balanced_period, header, machine, summary, write_json  # noqa: E402

import dtok  # noqa: E402
from dtok.tokenizer import parts_of  # noqa: E402

PAUSE_S = 0.020
TOKTIER_KEYS = itertools.count(1)  # toktier's store lives as long as the process


# --- sessions ----------------------------------------------------------------------------------

def messages(max_chars: int) -> list[dict]:
    """Every transcript's messages, in name order; contents cut at ``max_chars``."""
    out = []
    folder = SHARED / "corpus" / "transcripts"
    for path in sorted(folder.glob("*.json")):
        if path.name == "MANIFEST.json":
            continue
        with open(path, encoding="utf-8", newline="") as f:
            for m in json.load(f):
                m = dict(m)
                if m.get("role") not in ("system", "user", "assistant", "tool"):
                    m["role"] = "user"
                content = m.get("content") or ""
                if not isinstance(content, str):
                    content = json.dumps(content, ensure_ascii=False)
                m["content"] = content[:max_chars]
                out.append(m)
    return out


def raw_render(msgs: list[dict]) -> str:
    parts = []
    for m in msgs:
        text = m["content"]
        for call in m.get("tool_calls") or ():
            text += "\n" + json.dumps(call.get("function", call), ensure_ascii=False)
        parts.append(text + "\n\n")
    return "".join(parts)


def chat_renderer(tok: dtok.Tokenizer):
    """Qwen3's chat template from the tokenizer's config, rendered by transformers."""
    from transformers import AutoTokenizer

    files = tok.files
    config = files.config or {}
    if "chat_template" not in config:
        raise SystemExit("this tokenizer's config has no chat template: use --forms raw")
    d = Path(tempfile.mkdtemp(prefix="bench-turn-"))
    (d / "tokenizer.json").write_bytes(tok.tokenizer_json())
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    hf = AutoTokenizer.from_pretrained(str(d))
    return lambda msgs: hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


def turn_ends(msgs: list[dict], start: int, count: int, min_messages: int) -> list[int]:
    """Message counts after each of ``count`` turns from ``start``: a turn ends before an
    assistant message (the next request's answer), after at least ``min_messages``."""
    ends, k = [], start
    while len(ends) < count and k < len(msgs):
        j = k + min_messages
        while j < len(msgs) and msgs[j]["role"] != "assistant":
            j += 1
        ends.append(min(j, len(msgs)))
        k = j
    return ends


def session_texts(render, msgs: list[dict], size: int, turns: int, min_messages: int
                  ) -> list[str]:
    """The context (the first messages whose rendering reaches ``size``, cut before an
    assistant message) and the text after each of ``turns`` turns."""
    lo, hi = 1, len(msgs)
    while lo < hi:  # the fewest messages whose rendering reaches size
        mid = (lo + hi) // 2
        if len(render(msgs[:mid])) >= size:
            hi = mid
        else:
            lo = mid + 1
    while lo < len(msgs) and msgs[lo]["role"] != "assistant":
        lo += 1
    texts = [render(msgs[:lo])]
    for end in turn_ends(msgs, lo, turns, min_messages):
        texts.append(render(msgs[:end]))
    return texts


def kind_of(text: str) -> int:
    """Bytes per character of the str (PEP 393)."""
    m = max(map(ord, text)) if text else 0
    return 1 if m < 256 else 2 if m < 65536 else 4


# --- the columns -------------------------------------------------------------------------------

class Columns:
    """The encoders of one row, each with its own state; ``run(label, i)`` encodes turn i."""

    def __init__(self, tok: dtok.Tokenizer, texts: list[str], seg_mib: int, pool: bool,
                 labels: list[str], peers: dict | None = None) -> None:
        import fastokens

        raw = tok.tokenizer_json().decode("utf-8")
        self.alone = fastokens.Tokenizer.from_json_str(raw)
        self.alone.enable_segment_cache(0)
        self.seg = fastokens.Tokenizer.from_json_str(raw)
        self.seg.enable_segment_cache(seg_mib)
        self.tok = tok
        self.texts = texts
        self.labels = labels
        self.view_tok = tok.with_knobs()
        self.list_tok = tok.with_knobs()
        self.pool = dtok.Pool(tok, workers=1, name="bench-turn") if pool else None
        self.held_list = None
        self.peers = peers or {}  # label -> the peer's loaded tokenizer (load_peers)
        self.toktier_paths: dict[str, int] = {}  # toktier's route per timed turn: count
        self.out: dict[str, object] = {}
        self.key = 0

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()

    def prime(self) -> None:
        """New sessions at the context (untimed); the segment cache sees the context."""
        self.key += 1
        ctx = self.texts[0]
        self.view_tok.sessions.clear()
        self.list_tok.sessions.clear()
        self.view_tok.encode(ctx, session=self.key, add_special_tokens=False)
        self.held_list = self.list_tok.encode_list(ctx, session=self.key, add_special_tokens=False)
        self.seg.encode_batch_flat([ctx], add_special_tokens=False)
        if self.pool is not None:
            self.pool.encode(ctx, session=self.key, add_special_tokens=False)
        if "toktier session" in self.peers:  # a key never used before in this process
            self.toktier_key = f"turn-{next(TOKTIER_KEYS)}"
            self.peers["toktier session"].encode(ctx, session=self.toktier_key,
                                                 add_special_tokens=False)

    def run(self, label: str, i: int) -> float:
        """Seconds for column ``label`` on turn i (1-based; texts[0] is the context)."""
        text, prev = self.texts[i], self.texts[i - 1]
        if label == "floor":
            new = text[len(prev):] if text.startswith(prev) else text  # (an edit: all of it)
            t0 = time.perf_counter()
            out = self.alone.encode_batch_flat([new], add_special_tokens=False)
            dt = time.perf_counter() - t0
        elif label == "fastokens":
            t0 = time.perf_counter()
            out = self.alone.encode_batch_flat([text], add_special_tokens=False)
            dt = time.perf_counter() - t0
            out = out[0]
        elif label == "fastokens+seg":
            t0 = time.perf_counter()
            out = self.seg.encode_batch_flat([text], add_special_tokens=False)
            dt = time.perf_counter() - t0
            out = out[0]
        elif label == "dtok":
            t0 = time.perf_counter()
            view = self.view_tok.encode(text, session=self.key, add_special_tokens=False)
            dt = time.perf_counter() - t0
            out = view.tobytes()  # (untimed) the caller drops the view before the next turn
            view.release()
        elif label == "dtok list":
            t0 = time.perf_counter()
            lst = self.list_tok.encode_list(text, session=self.key, add_special_tokens=False)
            dt = time.perf_counter() - t0
            self.held_list = lst  # held until after the next turn's call
            out = lst
        elif label == "dtok pool":
            t0 = time.perf_counter()
            view = self.pool.encode(text, session=self.key, add_special_tokens=False)
            dt = time.perf_counter() - t0
            out = bytes(view)
            del view
        elif label == "gigatoken":
            gt = self.peers[label]
            t0 = time.perf_counter()
            got = gt.encode(text)
            dt = time.perf_counter() - t0
            out = got.astype("<u4", copy=False).tobytes()  # (untimed) a uint32 array
        elif label == "toktier session":
            tt = self.peers[label]
            t0 = time.perf_counter()
            enc = tt.encode(text, session=self.toktier_key, add_special_tokens=False)
            dt = time.perf_counter() - t0
            out = array("i", enc.ids).tobytes()  # (untimed) a tuple of ints
            path = tt.explain(summary=True).get("last_execution_path")  # (untimed) its route
            self.toktier_paths[path] = self.toktier_paths.get(path, 0) + 1
        else:
            raise ValueError(label)
        self.out[label] = out
        return dt

    def check(self, i: int) -> list[str]:
        """Labels whose turn-i IDs differ from fastokens' whole-text IDs (run this turn)."""
        want = self.out.get("fastokens")
        if want is None:
            return []
        want_bytes = memoryview(want).cast("B").tobytes()
        bad = []
        for label, got in self.out.items():
            if label in ("floor", "fastokens"):
                continue
            if got != want_bytes and frozen(got) != want_bytes:
                bad.append(label)
        return bad


def frozen(out) -> bytes:
    """A column's IDs as int32 bytes (a list copied out: the caller holds no extra reference to
    a session's list)."""
    if isinstance(out, tuple):  # fastokens' (ids, offsets)
        out = out[0]
    if isinstance(out, list):
        return array("i", out).tobytes()
    if isinstance(out, bytes):
        return out
    return memoryview(out).cast("B").tobytes()


PEERS = ("gigatoken", "toktier")


def load_peers(tok: dtok.Tokenizer, tokenizer_dir: str | None, picked: list[str]) -> dict:
    """The peers a user would switch on instead, each loaded once for the whole run: label ->
    tokenizer. One that cannot be imported or loaded is left out, its reason printed."""
    from bench_fast import TOKTIER_FAMILIES, toktier_tokenizer

    out = {}
    if "gigatoken" in picked:
        try:
            import gigatoken

            out["gigatoken"] = gigatoken.Tokenizer.from_json(tok.tokenizer_json().decode("utf-8"))
            print(f"# gigatoken {_version('gigatoken')}: the whole text each turn", flush=True)
        except Exception as exc:  # not installed, or refuses the file
            print(f"# gigatoken not measured: {exc!r}"[:300], flush=True)
    if "toktier" in picked:
        # toktier certifies files by their bytes: the bundled Qwen3 is stood in for by the
        # Qwen3-8B file it certifies (the IDs are compared with fastokens' on every turn)
        folder = Path(tokenizer_dir) if tokenizer_dir else SHARED / "tokenizers" / "qwen3"
        name = folder.name
        try:
            if name not in TOKTIER_FAMILIES:
                raise LookupError(f"no toktier family for {name!r} "
                                  f"(known: {sorted(TOKTIER_FAMILIES)})")
            import toktier  # noqa: F401 (the reason, where it is not installed)

            out["toktier session"] = toktier_tokenizer(name, folder)
            print(f"# toktier {_version('toktier')}: family {TOKTIER_FAMILIES[name]} from "
                  f"{folder}, encode(text, session=key) on its in-process store", flush=True)
        except Exception as exc:  # not installed, no family, or refuses the file
            print(f"# toktier not measured: {exc!r}"[:300], flush=True)
    return out


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


def goal_ms(floor_ms: float, context: int) -> float:
    return 1.1 * floor_ms + 0.15 + 0.1 * context / 1e6


def measure_row(tok, texts, form, size, mode, args, labels, peers=None) -> dict:
    cols = Columns(tok, texts, args.segment_cache_mib, "dtok pool" in labels, labels, peers)
    n_turns = len(texts) - 1
    times = {label: [[] for _ in range(args.repeats)] for label in labels}
    wrong: dict[str, int] = {label: 0 for label in labels}
    try:
        for r in range(args.repeats):
            if mode == "spaced":
                cols.prime()
                for i in range(1, n_turns + 1):
                    cols.out.clear()
                    order = balanced_order(labels, (r * n_turns + i) % balanced_period(len(labels)))
                    for label in order:
                        time.sleep(PAUSE_S)
                        times[label][r].append(cols.run(label, i))
                    for label in cols.check(i):
                        wrong[label] += 1
            else:  # back to back: a block of turns per column
                outs: dict[int, dict] = {i: {} for i in range(1, n_turns + 1)}
                for label in balanced_order(labels, r % balanced_period(len(labels))):
                    cols.prime()
                    time.sleep(PAUSE_S)
                    for i in range(1, n_turns + 1):
                        times[label][r].append(cols.run(label, i))
                        outs[i][label] = frozen(cols.out.pop(label))  # (untimed) no list held
                for i in range(1, n_turns + 1):
                    cols.out = outs[i]
                    for label in cols.check(i):
                        wrong[label] += 1
                cols.out = {}
    finally:
        cols.close()
    last = texts[-1]
    want = tok.reference.encode(last, add_special_tokens=False).ids
    ref_ok = list(tok.with_knobs().encode(last, add_special_tokens=False)) == want and \
        memoryview(cols.alone.encode_batch_flat([last], add_special_tokens=False)[0]).cast("I").tolist() == want
    cells = {}
    for label in labels:
        counted = [t[args.skip:] for t in times[label]]
        flat = [x for t in counted for x in t]
        per_rep = [statistics.median(t) * 1e3 for t in counted if t]
        cells[label] = {**summary(flat), "rep_medians_ms": per_rep}
    floor = cells["floor"]["median_ms"]
    new_chars = [len(b) - len(a) for a, b in zip(texts, texts[1:])]
    row = {"form": form, "size": size, "context_chars": len(texts[0]), "mode": mode,
           "kind_bytes": kind_of(last), "turns": n_turns, "new_chars_median": statistics.median(new_chars),
           "new_chars_max": max(new_chars), "cells": cells, "wrong_vs_fastokens": wrong,
           "last_turn_equals_reference": ref_ok, "loadavg": os.getloadavg(),
           "goal_ms": goal_ms(floor, len(texts[0]))}
    if cols.toktier_paths:
        row["toktier_routes"] = cols.toktier_paths
    st = cols.view_tok.sessions.stats()
    row["dtok_routes"] = {k: st[k] for k in ("hits", "repairs", "edits", "full_encodes", "fallbacks")}
    return row


def print_row(row: dict, labels: list[str]) -> None:
    c = row["cells"]
    floor = c["floor"]["median_ms"]
    print(f"{row['form']:4s} {row['context_chars']:>9,} {row['mode']:6s} "
          f"(kind {row['kind_bytes']}B, new {row['new_chars_median']:,.0f}/{row['new_chars_max']:,} chars, "
          f"load {row['loadavg'][0]:.1f}, routes {row['dtok_routes']})", flush=True)
    for label in labels:
        x = c[label]
        reps = x["rep_medians_ms"]
        ratio = x["median_ms"] / floor if floor else float("nan")
        extra = ""
        if label.startswith("dtok"):
            verdict = "MET" if x["median_ms"] <= row["goal_ms"] else "not met"
            loses = [p for p in c if not p.startswith("dtok") and p != "floor"
                     and x["median_ms"] > c[p]["median_ms"]]
            extra = (f"  goal {row['goal_ms']:.3f} ms: {verdict}"
                     + (f"; LOSES to {', '.join(loses)}" if loses else ""))
        print(f"    {label:15s} median {x['median_ms']:8.3f} ms  p99 {x['p99_ms']:8.3f}  "
              f"repeats [{min(reps):.3f}-{max(reps):.3f}]  x floor {ratio:6.2f}{extra}", flush=True)
    bad = {k: v for k, v in row["wrong_vs_fastokens"].items() if v}
    print(f"    exact: every turn vs fastokens {'yes' if not bad else 'NO ' + str(bad)}; "
          f"last turn vs reference {'yes' if row['last_turn_equals_reference'] else 'NO'}"
          + (f"; toktier's routes {row['toktier_routes']}" if "toktier_routes" in row else ""),
          flush=True)


# --- breakdown ---------------------------------------------------------------------------------

STAGES = ("compare", "plan", "encode", "assemble", "anchors", "splice", "result", "python")


class Stages:
    """perf_counter wrappers around the pieces a keyed turn goes through (patched in, then
    restored)."""

    def __init__(self, tok: dtok.Tokenizer) -> None:
        import dtok.repair as repair
        import dtok.sessions as sessions

        self.acc = dict.fromkeys(STAGES, 0.0)
        self.patches = []
        acc = self.acc

        def wrap(owner, name, stage, inner_stages=()):
            orig = getattr(owner, name)

            def timed(*a, **k):
                before = sum(acc[s] for s in inner_stages)
                t0 = time.perf_counter()
                try:
                    return orig(*a, **k)
                finally:
                    dt = time.perf_counter() - t0
                    acc[stage] += dt - (sum(acc[s] for s in inner_stages) - before)
            self.patches.append((owner, name, orig))
            setattr(owner, name, timed)

        wrap(repair, "common_prefix", "compare")
        wrap(sessions, "common_prefix", "compare")  # the store compares before it plans
        wrap(parts_of(tok).planner, "plan", "plan", ("compare",))
        wrap(parts_of(tok).planner, "append", "plan", ("encode",))  # a repair's one pass
        wrap(parts_of(tok).chunk_encoder, "encode_texts", "encode")
        wrap(sessions, "execute", "assemble", ("encode",))
        wrap(parts_of(tok).planner, "anchors_after", "anchors")
        wrap(tok.sessions, "_splice", "splice")
        wrap(tok.sessions, "_result", "result")

    def reset(self) -> None:
        for k in self.acc:
            self.acc[k] = 0.0

    def restore(self) -> None:
        for owner, name, orig in reversed(self.patches):
            if isinstance(owner, type) or owner.__class__.__name__ == "module":
                setattr(owner, name, orig)
            else:
                delattr(owner, name)  # the instance attribute hid the class's method


def breakdown(tok: dtok.Tokenizer, texts: list[str], args, as_list: bool, spaced: bool) -> dict:
    t = tok.with_knobs()
    st = Stages(t)
    samples = {s: [] for s in (*STAGES, "total")}
    try:
        for r in range(args.repeats):
            t.sessions.clear()
            held = t.encode_list(texts[0], session=r, add_special_tokens=False) if as_list else None
            if not as_list:
                t.encode(texts[0], session=r, add_special_tokens=False).release()
            for i in range(1, len(texts)):
                if spaced:
                    time.sleep(PAUSE_S)
                st.reset()
                t0 = time.perf_counter()
                if as_list:
                    out = t.encode_list(texts[i], session=r, add_special_tokens=False)
                else:
                    out = t.encode(texts[i], session=r, add_special_tokens=False)
                total = time.perf_counter() - t0
                if not as_list:
                    out.release()
                held = out  # noqa: F841 (a list held across the next call)
                if i <= args.skip:
                    continue
                inside = sum(st.acc[s] for s in STAGES if s != "python")
                for s in STAGES:
                    samples[s].append(st.acc[s] if s != "python" else total - inside)
                samples["total"].append(total)
    finally:
        st.restore()
    return {s: statistics.median(v) * 1e3 for s, v in samples.items()}


def breakdown_main(args, tok, sources) -> None:
    rows = []
    for form, (render, msgs) in sources.items():
        for mode in args.modes:
            spaced = mode == "spaced"
            cols = {}
            for size in args.sizes:
                texts = session_texts(render, msgs, size, args.turns, args.turn_messages)
                gc.collect()
                for as_list in (False, True):
                    label = f"{len(texts[0]) / 1e6:.2f}M" + (" list" if as_list else "")
                    cols[label] = breakdown(tok, texts, args, as_list, spaced)
                cols[f"{len(texts[0]) / 1e6:.2f}M"]["_kind"] = kind_of(texts[-1])
            print(f"\n## breakdown, {form}, {mode} (median ms per stage over "
                  f"{args.repeats} x {args.turns - args.skip} turns; load {os.getloadavg()[0]:.1f})")
            print(f"{'stage':10s}" + "".join(f"{k:>14s}" for k in cols))
            for s in (*STAGES, "total"):
                print(f"{s:10s}" + "".join(f"{v[s]:14.3f}" for v in cols.values()))
            print(f"{'kind (B)':10s}" + "".join(f"{v.get('_kind', ''):>14}" for v in cols.values()))
            rows.append({"form": form, "mode": mode, "columns": cols})
            sys.stdout.flush()
    print("wrote", write_json(args.out.replace("turn", "turn-breakdown", 1)
                              if args.out != "turn.json" else "turn-breakdown.json",
                              {"machine": machine(), "args": vars(args), "rows": rows,
                               "dtok": dtok.__file__}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[65_000, 300_000, 1_000_000, 4_000_000])
    ap.add_argument("--turns", type=int, default=12, help="turns per repeat (the first --skip not counted)")
    ap.add_argument("--skip", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--forms", nargs="*", default=["chat", "raw"], choices=["chat", "raw"])
    ap.add_argument("--modes", nargs="*", default=["spaced", "b2b"], choices=["spaced", "b2b"])
    ap.add_argument("--tokenizer", default=None,
                    help="a tokenizer folder (default: the bundled Qwen3), e.g. ../shared/tokenizers/llama3")
    ap.add_argument("--segment-cache-mib", type=int, default=256)
    ap.add_argument("--max-message-chars", type=int, default=12_000)
    ap.add_argument("--turn-messages", type=int, default=3)
    ap.add_argument("--pool", action="store_true", help="also dtok.Pool(workers=1)")
    ap.add_argument("--no-list", action="store_true", help="leave out dtok encode_list")
    ap.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS,
                    help="the peers to time beside dtok (none: --peers with no name)")
    ap.add_argument("--breakdown", action="store_true", help="the stages of a turn inside dtok")
    ap.add_argument("--out", default="turn.json", help="file name under bench-results/")
    args = ap.parse_args()
    info = machine()
    print(header(info))
    tok = dtok.Tokenizer.default() if args.tokenizer is None else dtok.Tokenizer.from_file(args.tokenizer)
    print(f"# dtok from {Path(dtok.__file__).parent}; tokenizer {args.tokenizer or 'bundled qwen3'}, encoder {tok.encoder.name}, "
          f"FASTOKENS_BPE_THREADS={os.environ.get('FASTOKENS_BPE_THREADS')}, dtok threads "
          f"{parts_of(tok).chunk_encoder.threads}", flush=True)
    msgs = messages(args.max_message_chars)
    sources = {}
    for form in args.forms:
        sources[form] = (chat_renderer(tok) if form == "chat" else raw_render, msgs)
    if args.breakdown:
        return breakdown_main(args, tok, sources)
    peers = load_peers(tok, args.tokenizer, args.peers)
    labels = ["floor", "fastokens", "fastokens+seg", *peers, "dtok"] \
        + ([] if args.no_list else ["dtok list"]) + (["dtok pool"] if args.pool else [])
    rows = []
    for form, (render, msgs) in sources.items():
        for size in args.sizes:
            texts = session_texts(render, msgs, size, args.turns, args.turn_messages)
            for mode in args.modes:
                gc.collect()
                row = measure_row(tok, texts, form, size, mode, args, labels, peers)
                print_row(row, labels)
                rows.append(row)
    bad = [(r["form"], r["size"], r["mode"]) for r in rows
           if any(v for k, v in r["wrong_vs_fastokens"].items() if k.startswith("dtok"))
           or not r["last_turn_equals_reference"]]
    print(f"exact: {'yes' if not bad else 'NO ' + str(bad)}")
    peers_bad = sorted({(k, r["form"], r["size"], r["mode"]) for r in rows
                        for k, v in r["wrong_vs_fastokens"].items() if v and k in peers})
    if peers_bad:
        print(f"peers whose IDs differed from fastokens': {peers_bad}")
    print("wrote", write_json(args.out, {"machine": info, "args": vars(args), "rows": rows,
                                         "dtok": dtok.__file__}))


if __name__ == "__main__":
    main()
