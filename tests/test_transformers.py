"""The transformers drop-in: IDs identical to transformers' own for the same arguments."""
from __future__ import annotations

import os

import pytest

from conftest import MAIN_FILES, default_run_on, read_text, shared_path

transformers = pytest.importorskip("transformers") if not os.environ.get("CI") else \
    __import__("transformers")
from dtok.integrations.transformers import wrap  # noqa: E402

_HF = {}


def outcome(fn):
    try:
        return "ok", fn()
    except Exception as exc:  # noqa: BLE001 - the exception type is the answer
        return "raise", type(exc)


def hf(name):
    if name not in _HF:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        _HF[name] = transformers.AutoTokenizer.from_pretrained(
            str(shared_path("tokenizers", name)))
    return _HF[name]


TEXTS = ["Hello, world!", "", "<|im_start|>user\nhi<|im_end|>", "e\u0301 caf\u00e9 \u0958/",
         "<｜User｜>x<｜Assistant｜>", "<|start_header_id|>user<|end_header_id|>\n\nx",
         "<|start|>user<|message|>x<|end|>"]


@pytest.mark.parametrize("name", default_run_on(MAIN_FILES))
def test_same_ids_as_transformers(name):
    h = hf(name)
    tok = wrap(h)
    long = read_text("prose", "gutenberg-972_devils-dictionary.txt")[:200_000]
    for text in TEXTS + [long]:
        for special in (True, False):
            assert tok.encode(text, add_special_tokens=special) == \
                h.encode(text, add_special_tokens=special)
            assert tok(text, add_special_tokens=special)["input_ids"] == \
                h(text, add_special_tokens=special)["input_ids"]
    assert tok(TEXTS)["input_ids"] == h(TEXTS)["input_ids"]
    assert tok(TEXTS)["attention_mask"] == h(TEXTS)["attention_mask"]
    assert tok.batch_encode_plus(TEXTS)["input_ids"] == h(TEXTS)["input_ids"]
    assert tok.dtok.admission.admitted


@pytest.mark.parametrize("name", default_run_on(MAIN_FILES))
def test_sessions_and_fallbacks(name):
    h = hf(name)
    tok = wrap(h)
    text = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[:20000]
    for i in range(5):
        text += f" Turn {i}: more words."
        assert tok(text, session="s")["input_ids"] == h(text)["input_ids"]
    assert tok.dtok.sessions.stats()["repairs"] == 4
    # arguments dtok leaves to transformers: same answers
    assert tok("a b", "c d")["input_ids"] == h("a b", "c d")["input_ids"]
    assert tok("a b c d e", truncation=True, max_length=3)["input_ids"] == \
        h("a b c d e", truncation=True, max_length=3)["input_ids"]
    assert outcome(lambda: tok(["a", "b c d"], padding=True)["input_ids"]) == \
        outcome(lambda: h(["a", "b c d"], padding=True)["input_ids"])  # may raise: no pad token
    assert tok("a b", return_offsets_mapping=True)["offset_mapping"] == \
        h("a b", return_offsets_mapping=True)["offset_mapping"]
    np_out = tok(["one two", "six ten"], return_tensors="np")["input_ids"]
    rows = lambda a: [list(map(int, r)) for r in a]  # noqa: E731 - ragged under a small vocabulary
    assert rows(np_out) == rows(h(["one two", "six ten"], return_tensors="np")["input_ids"])
    assert tok.decode(tok.encode("round trip")) == h.decode(h.encode("round trip"))


def test_follows_changes_to_the_wrapped_tokenizer():
    h = transformers.AutoTokenizer.from_pretrained(str(shared_path("tokenizers", "qwen3")))
    tok = wrap(h)
    h.add_tokens(["<my_new_token>"])
    text = "x <my_new_token> y"
    assert tok.encode(text) == h.encode(text)


def test_deepseek_bos_follows_transformers():
    """DeepSeek-V3's config names LlamaTokenizerFast with add_bos_token=true; whether the
    installed transformers adds that BOS or not, the wrapper returns what it returns."""
    h = hf("deepseek-v3")
    tok = wrap(h)
    assert tok.encode("hi") == h.encode("hi")
    bos = h.encode("hi")[0] == 0
    assert (tok.dtok.admission.prefix == (0,)) == bos
