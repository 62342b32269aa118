"""``encode_special_tokens``: special-token strings encoded as plain text, as the reference's
switch of that name does, on every route (stateless, chunked, sessions, the pool), with a
control: the check that keeps such strings away from the fast encoders switched off."""
from __future__ import annotations

import random

import pytest

import dtok
from dtok import testing
from battery import battery_texts, check_cuts, check_repairs
from conftest import SHARED, default_run_on, load_tokenizer, read_text


# by default an NFC file and the one with overlapping added tokens; all four under -m slow
LITERAL_FILES = default_run_on(["qwen3", "llama3", "deepseek-v3", "gpt-oss"],
                               default=("qwen3", "deepseek-v3"))


@pytest.fixture(scope="module", params=LITERAL_FILES)
def literal_tok(request):
    return load_tokenizer(request.param, encode_special_tokens=True, chunk_threshold=2048,
                          chunk_target=1024, threads=2)


def literal_ids(tok, text, special=True):
    assert tok.reference.encode_special_tokens  # the reference with the same switch
    return tok.reference.encode(text, add_special_tokens=special).ids


def glued(tok, seed: int, n: int = 8, parts: int = 60) -> list[str]:
    rng = random.Random(seed)
    texts = battery_texts(tok, seed=seed)
    out = []
    for _ in range(n):
        rng.shuffle(texts)
        out.append("".join(texts[:parts]))
    return out


def test_the_knob_is_checked_and_off_by_default():
    tok = load_tokenizer("qwen3")
    assert tok.knobs["encode_special_tokens"] is False
    assert list(tok.encode("<|im_start|>")) == [151644]
    with pytest.raises(ValueError, match="encode_special_tokens"):
        tok.with_knobs(encode_special_tokens=1)


def test_literal_cuts_are_exact(literal_tok):
    """Every cut the literal rules accept is exact for the literal reference (battery)."""
    texts = battery_texts(literal_tok)
    assert not check_cuts(literal_tok, texts)
    assert not check_repairs(literal_tok, texts[::3])


def test_literal_encodes_match_the_reference(literal_tok):
    """Short, chunked and batched encodes with special-token strings in the text."""
    tok = literal_tok
    texts = battery_texts(tok, seed=5)[:120] + glued(tok, 9, n=4)
    assert any(tok.explain(t)["route"] == "chunked" for t in texts)
    for text in texts:
        for special in (True, False):
            assert list(tok.encode(text, add_special_tokens=special)) == \
                literal_ids(tok, text, special)
    short = texts[:40]
    assert [list(v) for v in tok.encode_batch(short)] == [literal_ids(tok, t) for t in short]
    assert tok.stats()["fast_pieces"] > 0  # not everything went to the reference


def test_literal_sessions_match_the_reference(literal_tok):
    """Appends and an edit of a session whose turns hold special-token strings."""
    tok = literal_tok.with_knobs(chunk_threshold=131072, chunk_target=65536)
    turns = battery_texts(tok, seed=13)
    text = read_text("prose", "gutenberg-2701_moby-dick.txt")[:20_000]
    for i, turn in enumerate(turns[:30]):
        text += turn
        if i == 20:  # an edit: a special-token string put in the middle
            text = text[:5000] + tok.admission.special_tokens[0] + text[5000:]
        assert list(tok.encode(text, session="s")) == literal_ids(tok, text)
        assert tok.encode_list(text, session="s", add_special_tokens=False) == \
            literal_ids(tok, text, False)
    st = tok.sessions.stats()
    assert st["repairs"] > 10 and st["edits"] + st["repairs"] >= 29


def test_literal_pool_matches_the_reference():
    """The pool's workers load the same switch: from the tokenizer, and from Pool's knob."""
    pytest.importorskip("posix_ipc")
    tok = load_tokenizer("qwen3")
    texts = glued(tok, 21, n=2, parts=200) + battery_texts(tok, seed=21)[:20]
    literal = tok.with_knobs(encode_special_tokens=True)
    with dtok.Pool(tok, workers=2, encode_special_tokens=True, chunk_threshold=4096,
                   chunk_target=1024) as pool:
        assert pool.tokenizer.knobs["encode_special_tokens"]
        for text in texts:
            assert list(pool.encode(text)) == literal_ids(literal, text)
        for i in range(1, 4):  # keyed turns
            t = "".join(texts[2:2 + 4 * i])
            assert list(pool.encode(t, session="k")) == literal_ids(literal, t)
        assert pool.stats()["chunked"] >= 1


def read_bert_path():
    path = SHARED / "tokenizers" / "bert-base-uncased"
    if not path.exists():
        pytest.skip("shared tokenizers not present")
    return path


def test_not_admitted_files_take_the_switch_too():
    tok = dtok.Tokenizer.from_file(read_bert_path(), encode_special_tokens=True)
    assert not tok.admission.admitted
    text = "[CLS] hello [SEP] world [MASK]"
    assert list(tok.encode(text)) == literal_ids(tok, text)
    assert list(tok.encode(text)) != list(tok.with_knobs(encode_special_tokens=False).encode(text))


def test_control_without_the_literal_check_finds_differences():
    """With the check off, the fast encoder gets special-token strings and matches them: the
    same texts then come out wrong (the tests above can fail)."""
    tok = load_tokenizer("qwen3").with_knobs(encode_special_tokens=True)
    assert tok.encoder.name != "reference"
    texts = battery_texts(tok, seed=5)[:120]
    wants = [literal_ids(tok, t) for t in texts]
    with testing.switched_off(testing.CHECK_PLAIN_SPECIALS):
        diffs = sum(list(tok.encode(t)) != w for t, w in zip(texts, wants))
    assert diffs >= 20, "the literal tests cannot see special-token strings sent to fastokens"
    assert [list(tok.encode(t)) for t in texts] == wants
