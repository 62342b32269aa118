"""Chunk-parallel encoding of real long texts with the default chunk knobs."""
from __future__ import annotations

import pytest

from conftest import load_tokenizer, read_text, ref_ids, tokenizer_path
from dtok.tokenizer import parts_of

LONG = {
    "prose": lambda: read_text("prose", "gutenberg-2701_moby-dick.txt")[:400_000],
    "code": lambda: read_text("code", "javascript__lodash__lodash.js.txt")[:300_000],
    "multilingual": lambda: read_text("multilingual", "udhr_all-languages_concatenated.txt")[
        1_000_000:1_400_000],
    "nfd": lambda: read_text("adversarial", "udhr_mixed_NFD.txt"),
    "crlf": lambda: read_text("adversarial", "ws_mixed-line-endings_moby-dick.txt") * 2,
}


@pytest.mark.parametrize("kind", list(LONG))
@pytest.mark.parametrize("name", ["qwen3", "llama3", "deepseek-v3", "gpt-oss"])
def test_long_text_exact(name, kind):
    # two threads, as given: the default threads keep Latin text this short on one thread,
    # unchunked, where a split would not pay (docs/knobs.md#threads)
    tok = load_tokenizer(name, threads=2)
    text = LONG[kind]()
    ex = tok.explain(text)
    assert ex["route"] == "chunked" and len(ex["cuts"]) >= 1, ex
    assert sum(ex["chunk_chars"]) == len(text)
    for special in (True, False):
        assert list(tok.encode(text, add_special_tokens=special)) == ref_ids(tok, text, special)


def test_result_is_readonly_int32(main_tok):
    text = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[:50_000]
    view = main_tok.encode(text)
    assert view.format == "i" and view.itemsize == 4 and view.ndim == 1 and view.readonly
    with pytest.raises(TypeError):
        view[0] = 1


def test_explain_reports_plan():
    # the stateless route; the reference gets chunks of chunk_target
    tok = load_tokenizer("llama3", content_lookup=False, encoder="reference")
    text = read_text("prose", "gutenberg-2701_moby-dick.txt")[:1_000_000]
    ex = tok.explain(text)
    assert ex["route"] == "chunked" and ex["requested_chunks"] == 16
    assert len(ex["cuts"]) == 15 and all(k == "class transition" for k in ex["cut_kinds"])
    assert ex["cuts"] == sorted(ex["cuts"])
    assert min(ex["chunk_chars"]) >= 1024
    assert tok.explain("short")["route"] == "whole"


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("name", ["llama3", "gpt-oss"])
def test_fast_encoder_gets_latin_text_in_one_piece_per_thread(name, threads):
    """On a fast encoder Latin text is cut into one piece per encoding thread, no piece over
    LONGEST_FAST_CHUNK; other text in chunks of chunk_target on every file (until the ablation
    of 2026-12-07, long pieces on files whose guard table measured fastokens faster on it
    whole: docs/benchmarks.md#scheduling-mechanisms-each-switched-off)."""
    from dtok.chunk_encoder import LONGEST_FAST_CHUNK

    path = tokenizer_path(name)
    if path.name != name:
        pytest.skip(f"needs {name}'s own tables: its small stand-in {path.name} (the real file is "
                    "only in ../shared) has a gigatoken table that takes Latin text, which then "
                    "keeps the chunks of chunk_target")
    tok = load_tokenizer(name, content_lookup=False, threads=threads)
    prose = read_text("prose", "gutenberg-2701_moby-dick.txt")[:1_000_000]
    ex = tok.explain(prose)
    assert ex["requested_chunks"] == threads and len(ex["cuts"]) == threads - 1, ex["why"]
    assert ex["route"] == ("whole" if threads == 1 else "chunked")
    longer = prose * 3
    k = -(-len(longer) // LONGEST_FAST_CHUNK)
    assert tok.explain(longer)["requested_chunks"] == max(k, threads)
    other = read_text("multilingual", "udhr_all-languages_concatenated.txt")[:1_000_000]
    assert tok.explain(other)["requested_chunks"] == 16
    assert list(tok.encode(prose)) == ref_ids(tok, prose)
    assert list(tok.encode(other)) == ref_ids(tok, other)


def test_added_token_boundaries_are_cuts():
    """Text whose only safe cuts are at added tokens (CR LF runs: no accepted transition)."""
    # two threads, as given: Latin text this short goes whole on the default threads
    tok = load_tokenizer("qwen3", chunk_threshold=1000, chunk_target=500, threads=2)
    text = ("<|im_start|>" + "\r\n" * 150) * 10
    ex = tok.explain(text)
    assert ex["route"] == "chunked" and set(ex["cut_kinds"]) == {"special-token boundary"}
    assert list(tok.encode(text)) == ref_ids(tok, text)


def test_nfc_text_is_cut_exactly():
    tok = load_tokenizer("qwen3", chunk_threshold=1000, chunk_target=300)
    text = ("e\u0301" * 200 + " \u0958/" + "\u1100\u1161\u11a8" * 50 + "\r\n") * 8
    ex = tok.explain(text)
    assert ex["route"] == "chunked"
    assert list(tok.encode(text)) == ref_ids(tok, text)


def test_single_thread_and_batch():
    tok = load_tokenizer("gpt-oss", threads=1, chunk_threshold=4096, chunk_target=1024)
    texts = [read_text("code", "go__fzf__src_pattern.go.txt"), "", "short", "x" * 5000,
             read_text("multilingual", "udhr_jpn.txt")]
    got = tok.encode_batch(texts)
    assert [list(v) for v in got] == [ref_ids(tok, t) for t in texts]
    pairs = [("a", "b")]
    assert [list(v) for v in tok.encode_batch(pairs)] == [
        e.ids for e in tok.reference.encode_batch(pairs)]


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_each_thread_routes_its_own_run_of_chunks(name, monkeypatch):
    """With several threads, each takes a contiguous run of a long text's chunks and routes it
    itself (guard characters and text NFC would change go to the reference in a helper thread
    too): the IDs are the reference's, and more than one thread did the routing."""
    import threading

    from dtok import testing

    naughty = read_text("adversarial", "blns_big-list-of-naughty-strings.txt") \
        + " x\u0378y "  # U+0378: unassigned, a guard character
    many = LONG["multilingual"]()
    text = "".join(many[i * 50_000 : (i + 1) * 50_000] + naughty for i in range(4))
    tok = load_tokenizer(name, threads=3, chunk_target=16384)
    assert len(tok.explain(text)["cuts"]) >= 3
    chunk_encoder = parts_of(tok).chunk_encoder
    routed_by = set()

    stretches_by = set()
    encode_stretches = chunk_encoder.reference.encode_stretches

    def traced_stretches(texts):
        stretches_by.add(threading.get_ident())
        return encode_stretches(texts)

    monkeypatch.setattr(chunk_encoder.reference, "encode_stretches", traced_stretches)
    # each run taken whole: with the steps, which thread takes a run's later chunks is a
    # matter of timing (tests/test_fast.py checks the steps)
    with testing.switched_off(testing.OFF_STEPS), \
            testing.hooked(testing.CHUNKS_ROUTED, lambda _: routed_by.add(threading.get_ident())):
        for special in (True, False):
            assert list(tok.encode(text, add_special_tokens=special)) == ref_ids(tok, text,
                                                                                 special)
    assert len(routed_by) >= 2 and len(stretches_by) >= 2
