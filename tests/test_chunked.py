"""Chunk-parallel encoding of real long texts with the default chunk knobs."""
from __future__ import annotations

import pytest

from conftest import load_tokenizer, read_text, ref_ids, tokenizer_path

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


def needs_real_guard_table(name: str) -> None:
    """Skip where the real file ``name`` is only in ../shared: the routing of other text these
    tests expect is read from its guard table's measurement of fastokens on whole 1M-character
    documents (``speed.long_piece``: Llama-3.1's and DeepSeek-V3's measured long pieces
    faster), and the small stand-in a clone has instead (tests/conftest.py) has a table
    without that measurement."""
    path = tokenizer_path(name)
    if path.name != name:
        pytest.skip(f"needs {name}'s own guard table (its speed.long_piece measurement); the "
                    f"real file is only in ../shared, and its stand-in {path.name}'s table has "
                    "no such measurement")


# llama3: its guard table measured long pieces of other text faster; gpt-oss (a real file in
# the repository too): slower, its other text keeps the chunks of chunk_target
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("name, long_other", [("llama3", True), ("gpt-oss", False)])
def test_fast_encoder_gets_latin_text_in_one_piece_per_thread(name, long_other, threads):
    """On a fast encoder Latin text is cut into one piece per encoding thread, no piece over
    LONGEST_FAST_PIECE; other text, on a file whose guard table measured long pieces faster,
    whole for one thread and LONG_PIECES_PER_THREAD pieces a thread for several
    (PieceEncoder.chunk_target), else in chunks of chunk_target."""
    from dtok.pieces import LONG_PIECES_PER_THREAD, LONGEST_FAST_PIECE

    needs_real_guard_table(name)
    tok = load_tokenizer(name, content_lookup=False, threads=threads)
    prose = read_text("prose", "gutenberg-2701_moby-dick.txt")[:1_000_000]
    ex = tok.explain(prose)
    assert ex["requested_chunks"] == threads and len(ex["cuts"]) == threads - 1, ex["why"]
    assert ex["route"] == ("whole" if threads == 1 else "chunked")
    longer = prose * 3
    k = -(-len(longer) // LONGEST_FAST_PIECE)
    assert tok.explain(longer)["requested_chunks"] == max(k, threads)
    other = read_text("multilingual", "udhr_all-languages_concatenated.txt")[:1_000_000]
    long_pieces = 1 if threads == 1 else threads * LONG_PIECES_PER_THREAD
    assert tok.explain(other)["requested_chunks"] == (long_pieces if long_other else 16)
    assert list(tok.encode(prose)) == ref_ids(tok, prose)
    assert list(tok.encode(other)) == ref_ids(tok, other)


@pytest.mark.parametrize("name, chunks", [("llama3", 1), ("deepseek-v3", 1), ("qwen3", 16),
                                          ("gpt-oss", 16)])
def test_other_text_is_whole_on_one_thread_only_where_measured_faster(name, chunks):
    """One thread: 1M characters of multilingual text go to fastokens whole where the file's
    guard table measured that faster (``long_piece``), else in chunks of chunk_target; a
    table without the measurement keeps the chunks."""
    needs_real_guard_table(name)
    tok = load_tokenizer(name, content_lookup=False, threads=1)
    other = read_text("multilingual", "udhr_all-languages_concatenated.txt")[:1_000_000]
    assert tok.explain(other)["requested_chunks"] == chunks
    tok.pieces.long_piece_classes = frozenset({"latin"})  # as loaded from a table without it
    assert tok.explain(other)["requested_chunks"] == 16


@pytest.mark.parametrize("name, chunks", [("llama3", 4), ("deepseek-v3", 4), ("qwen3", 16),
                                          ("gpt-oss", 16)])
def test_other_text_on_two_threads_goes_in_long_pieces_where_measured_faster(name, chunks,
                                                                              monkeypatch):
    """Two threads: the same text goes in LONG_PIECES_PER_THREAD pieces a thread where the file's
    guard table measured fastokens faster on it whole, each piece a step of its own (so the
    calling thread can take one from the back), else in chunks of chunk_target, two a step.
    The IDs are the reference's."""
    import threading

    from dtok.pieces import LONG_PIECES_PER_THREAD, RUN_STEP_CHARS

    needs_real_guard_table(name)
    tok = load_tokenizer(name, content_lookup=False, threads=2)
    other = read_text("multilingual", "udhr_all-languages_concatenated.txt")[:1_000_000]
    ex = tok.explain(other)
    assert ex["requested_chunks"] == chunks and "on 2 thread(s)" in ex["why"]
    assert chunks == 16 or chunks == 2 * LONG_PIECES_PER_THREAD
    caller, steps = threading.get_ident(), []
    routed = tok.pieces._encode_routed

    def traced(texts, parallel, *rest):
        steps.append((threading.get_ident() == caller, [len(t) for t in texts]))
        return routed(texts, parallel, *rest)

    monkeypatch.setattr(tok.pieces, "_encode_routed", traced)
    assert list(tok.encode(other, add_special_tokens=False)) == ref_ids(tok, other, False)
    own_run = next(i for i, (mine, _) in enumerate(steps) if mine)  # the caller's own run
    taken = [lengths for i, (_, lengths) in enumerate(steps) if i != own_run]
    assert sum(len(x) for _, x in steps) == chunks
    assert all(len(x) == 1 or sum(x) <= RUN_STEP_CHARS for x in taken), steps
    assert all(len(x) == 1 for x in taken) if chunks == 4 else \
        all(len(x) <= 2 for x in taken), steps


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

    naughty = read_text("adversarial", "blns_big-list-of-naughty-strings.txt") \
        + " x\u0378y "  # U+0378: unassigned, a guard character
    many = LONG["multilingual"]()
    text = "".join(many[i * 50_000 : (i + 1) * 50_000] + naughty for i in range(4))
    tok = load_tokenizer(name, threads=3, chunk_target=16384)
    assert len(tok.explain(text)["cuts"]) >= 3
    pieces = tok.pieces
    # each run taken whole: with the steps, which thread takes a run's later chunks is a
    # matter of timing (tests/test_fast.py checks the steps)
    monkeypatch.setattr(pieces, "_run_step_chars", 1 << 30)
    routed_by = set()
    encode_routed = pieces._encode_routed

    def traced(*args, **kwargs):
        routed_by.add(threading.get_ident())
        return encode_routed(*args, **kwargs)

    stretches_by = set()
    encode_stretches = pieces.reference.encode_stretches

    def traced_stretches(texts):
        stretches_by.add(threading.get_ident())
        return encode_stretches(texts)

    monkeypatch.setattr(pieces, "_encode_routed", traced)
    monkeypatch.setattr(pieces.reference, "encode_stretches", traced_stretches)
    for special in (True, False):
        assert list(tok.encode(text, add_special_tokens=special)) == ref_ids(tok, text, special)
    assert len(routed_by) >= 2 and len(stretches_by) >= 2
