"""``tokenizers`` 1.0 as the reference: dtok loads through its public API, admits nothing (1.0
removed the normalizer, pre-tokenizer and added-token table dtok's cut rules are proven with),
and serves the reference's own IDs on every route. See docs/install.md.

On 0.2x the 1.0 surface is simulated over the installed library (only the calls 1.0.0rc3's
``Tokenizer`` has, the ``normalizers`` and ``pre_tokenizers`` modules gone); the tests of the real
release candidate skip there and run in a scratch virtualenv with
``python tools/release/check_tokenizers_rc.py``.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import tokenizers

from conftest import ROOT, read_text, tokenizer_path

import dtok
from dtok import reference
from dtok.encoders import FastEncoderError

ONE_ZERO = int(tokenizers.__version__.split(".")[0]) >= 1
needs_1_0 = pytest.mark.skipif(
    not ONE_ZERO, reason=f"tokenizers {tokenizers.__version__} is not 1.x: "
    "python tools/release/check_tokenizers_rc.py runs these in a scratch virtualenv")
needs_0_2x = pytest.mark.skipif(ONE_ZERO, reason="tokenizers 1.x is installed")

FILES = ["qwen3", "gpt-oss-tiny", "llama3-tiny", "deepseek-v3-tiny", "qwen3.5-tiny"]
GONE = ["normalizer", "pre_tokenizer", "get_added_tokens_decoder", "get_vocab_size",
        "id_to_token", "tokenizers.normalizers", "tokenizers.pre_tokenizers"]


class OneZeroSurface:
    """What ``tokenizers`` 1.0.0rc3's ``Tokenizer`` has, over an installed 0.2x one."""

    def __init__(self, inner) -> None:
        self._t = inner

    @staticmethod
    def from_file(path: str) -> "OneZeroSurface":
        return OneZeroSurface(_REAL.from_file(path))

    @property
    def padding(self):
        return self._t.padding

    @property
    def truncation(self):
        return self._t.truncation

    def encode(self, input, *, add_special_tokens=True, encode_special_tokens=False):
        self._t.encode_special_tokens = encode_special_tokens
        pair = (input,) if isinstance(input, str) else tuple(input)
        return self._t.encode(*pair, add_special_tokens=add_special_tokens)

    def encode_batch(self, inputs, *, add_special_tokens=True, encode_special_tokens=False):
        self._t.encode_special_tokens = encode_special_tokens
        return self._t.encode_batch(inputs, add_special_tokens=add_special_tokens)

    def decode(self, ids, skip_special_tokens=True):
        return self._t.decode(ids, skip_special_tokens=skip_special_tokens)

    def decode_tokens(self, ids, skip_special_tokens=False):
        return [self._t.id_to_token(i) for i in ids]

    def __reduce__(self):
        return (OneZeroSurface, (self._t.to_str(), None, None))


_REAL = tokenizers.Tokenizer


@pytest.fixture
def one_zero(monkeypatch):
    """The installed reference as 1.0 (real, or simulated on 0.2x): its Tokenizer class."""
    if ONE_ZERO:
        return tokenizers.Tokenizer
    monkeypatch.setattr(tokenizers, "Tokenizer", OneZeroSurface)
    for module in ("normalizers", "pre_tokenizers"):
        monkeypatch.delattr(tokenizers, module, raising=False)
    monkeypatch.setattr(tokenizers, "__version__", "1.0.0-rc.3 (simulated)")
    return OneZeroSurface


def _texts() -> list[str]:
    prose = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[:30_000]
    return ["", "Hello, world!", "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
            "<|start|>user<|message|>hi<|end|> e\u0301 \U0001f600 \u65e5\u672c", prose]


@pytest.mark.parametrize("name", FILES)
def test_served_by_the_reference_exactly(one_zero, name):
    path = tokenizer_path(name)
    tok = dtok.Tokenizer.from_file(path)
    ref = one_zero.from_file(str(path / "tokenizer.json"))  # its own, not dtok's
    assert not tok.admission.admitted
    (why,) = tok.admission.reasons
    assert all(gone in why for gone in GONE), why
    assert tok.encoder.name == "reference" and tok.explain("x")["route"] == "reference"
    try:
        ref.encode("Hello")
    except ValueError as exc:  # rc3's wheel cannot run Qwen3.5's Split regex: nor can dtok
        for call in (tok.encode, tok.encode_list, lambda t: tok.encode(t, session="s"),
                     lambda t: tok.encode_batch([t])):
            with pytest.raises(ValueError) as got:
                call("Hello")
            assert str(got.value) == str(exc)
        return
    texts = _texts()
    for special in (True, False):
        want = [ref.encode(t, add_special_tokens=special).ids for t in texts]
        assert [list(tok.encode(t, add_special_tokens=special)) for t in texts] == want
        assert [tok.encode_list(t, add_special_tokens=special) for t in texts] == want
        assert [list(v) for v in tok.encode_batch(texts, add_special_tokens=special)] == want
        for skip in (True, False):
            assert [tok.decode(ids, skip) for ids in want] == \
                [ref.decode(ids, skip_special_tokens=skip) for ids in want]
            assert tok.decode_batch(want, skip_special_tokens=skip) == \
                [ref.decode(ids, skip_special_tokens=skip) for ids in want]
    long = texts[-1]
    for n in (10_000, 20_000, 30_000):  # a growing session
        assert tok.encode_list(long[:n], session="s") == ref.encode(long[:n]).ids
    literal = tok.with_knobs(encode_special_tokens=True)  # 1.0's per-call switch
    for t in texts:
        assert list(literal.encode(t)) == ref.encode(t, encode_special_tokens=True).ids
    assert len(tok.tokenizer_json()) > 1000


def test_the_fast_path_is_refused_with_its_reason(one_zero):
    with pytest.raises(FastEncoderError, match="needs an admitted file: tokenizers 1.0"):
        dtok.Tokenizer.default(encoder="fast")


@needs_0_2x
def test_0_2x_has_what_the_fast_path_needs():
    ref = reference.load(reference.bundled_raw())
    assert type(ref) is tokenizers.Tokenizer and reference.missing(ref) == []
    assert dtok.Tokenizer.default().admission.admitted


@needs_1_0
def test_demo_runs_on_1_0():
    out = subprocess.run([sys.executable, "-m", "dtok", "demo", "--chars", "200000", "--turns",
                          "4"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "NOT admitted (tokenizers 1.0" in out.stdout
    assert out.stdout.count("identical") == 2 and out.stdout.count("yes") == 5, out.stdout


@needs_1_0
def test_1_0_has_only_what_is_documented():
    """The public surface dtok's adapter and docs/install.md are written against."""
    have = {n for n in dir(tokenizers.Tokenizer) if not n.startswith("_")}
    assert have == {"decode", "decode_tokens", "encode", "encode_batch", "from_file",
                    "from_pretrained", "padding", "tokenize", "truncation"}, have
    assert isinstance(dtok.Tokenizer.default().reference, reference.Reference)
