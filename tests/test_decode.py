"""decode and decode_batch: the strings the reference gives, for every token of every file, for
the results of encode (memoryviews) and lists, with and without special tokens."""
from __future__ import annotations

import random
from array import array

import pytest

from conftest import load_tokenizer, read_text, tokenizer_path

TEXTS = [
    "",
    "Hello, world!",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
    "  leading spaces,\ttabs\r\nand CRLF  \n\n\n",
    "e\u0301 \u00e9 \ufb01 \u212b \uac00\u11a8 \U0001f600\U0001f1fa\U0001f1f8 \u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3068\u4e2d\u6587 \u0440\u0443\u0441\u0441\u043a\u0438\u0439 \u0928\u092e\u0938\u094d\u0924\u0947",
]


def _reference(name: str):
    """The reference loaded on its own from the file (not the instance dtok holds)."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(tokenizer_path(name) / "tokenizer.json"))


def _texts() -> list[str]:
    code = read_text("code", "shell__fzf__shell_key-bindings.zsh.txt")[:20_000]
    prose = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[:20_000]
    return TEXTS + [code, prose]


def _check(tok, ref) -> None:
    texts = _texts()
    for skip in (True, False):
        for special in (True, False):
            views = [tok.encode(t, add_special_tokens=special) for t in texts]
            lists = [list(v) for v in views]
            want = [ref.decode(ids, skip_special_tokens=skip) for ids in lists]
            assert [tok.decode(v, skip_special_tokens=skip) for v in views] == want
            assert [tok.decode(ids, skip) for ids in lists] == want
            assert tok.decode_batch(views, skip_special_tokens=skip) == want
            assert tok.decode_batch(lists, skip) == want
            assert tok.decode_batch(tuple(tuple(ids) for ids in lists), skip) == want
        # every token alone: the whole vocabulary, added tokens included
        n = ref.get_vocab_size(with_added_tokens=True)
        each = [[i] for i in range(n)]
        assert tok.decode_batch(each, skip_special_tokens=skip) == \
            ref.decode_batch(each, skip_special_tokens=skip)
        # random runs of IDs: split multi-byte characters, special tokens mid-text
        rng = random.Random(58)
        runs = [[rng.randrange(n) for _ in range(rng.randrange(1, 40))] for _ in range(2000)]
        assert tok.decode_batch(runs, skip) == ref.decode_batch(runs, skip)
        assert [tok.decode(memoryview(array("i", r)), skip) for r in runs[:200]] == \
            [ref.decode(r, skip) for r in runs[:200]]


def test_decode_is_the_references_on_admitted_files(main_tok):
    _check(main_tok, _reference(_name(main_tok)))


@pytest.mark.parametrize("name", ["phi3-mini", "roberta-base", "t5-small", "bert-base-uncased"])
def test_decode_is_the_references_on_other_files(name):
    """Files dtok does not admit (their own decoders: Metaspace, WordPiece, ByteLevel)."""
    _check(load_tokenizer(name), _reference(name))


def test_defaults_and_errors_are_the_references():
    tok = load_tokenizer("qwen3")
    ref = _reference("qwen3")
    ids = tok.encode_list("<|im_start|>user\nhi<|im_end|>")
    assert tok.decode(ids) == ref.decode(ids) == "user\nhi"  # skip_special_tokens=True
    assert tok.decode_batch([ids]) == ref.decode_batch([ids])
    for bad in (None, "ab", [1.5], [-1], [10**10], iter([1])):
        with pytest.raises(Exception) as want:
            ref.decode(bad)
        with pytest.raises(want.type):
            tok.decode(bad)
        with pytest.raises(Exception) as want:
            ref.decode_batch([bad])
        with pytest.raises(want.type):
            tok.decode_batch([bad])


def _name(tok) -> str:
    path = tok.files.path
    return (path if path.is_dir() else path.parent).name
