"""Shared fixtures: the real tokenizer files and corpus in ../shared (never mocks)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DTOK_SHARED", ROOT.parent / "shared"))
MAIN_FILES = ["qwen3", "llama3", "deepseek-v3", "gpt-oss"]
OTHER_FILES = ["phi3-mini", "roberta-base", "t5-small", "bert-base-uncased"]
FAMILY_OF = {"qwen3": "qwen2", "llama3": "llama3", "deepseek-v3": "deepseek_v3", "gpt-oss": "o200k"}


def shared_path(*parts: str) -> Path:
    """A path under ../shared; fails (not skips) when it is missing and CI is set."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        msg = f"test data missing: {path}"
        if os.environ.get("CI"):
            pytest.fail(msg + " (CI is set: shared test data must be present)")
        pytest.skip(msg)
    return path


def read_text(*parts: str) -> str:
    """Corpus text exactly as stored (no newline translation)."""
    with open(shared_path("corpus", *parts), encoding="utf-8", newline="") as f:
        return f.read()


_TOKENIZERS: dict[str, object] = {}


def load_tokenizer(name: str, **knobs):
    """A tokenizer for a file in ../shared/tokenizers, loaded once per test session."""
    import dtok

    if name not in _TOKENIZERS:
        _TOKENIZERS[name] = dtok.Tokenizer.from_file(shared_path("tokenizers", name))
    key = (name, tuple(sorted(knobs.items())))
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = _TOKENIZERS[name].with_knobs(**knobs)
    return _TOKENIZERS[key]


@pytest.fixture(params=MAIN_FILES, scope="session")
def main_tok(request):
    """Each admitted tokenizer, with a low chunk threshold so tests exercise the chunked route."""
    return load_tokenizer(request.param, chunk_threshold=2048, chunk_target=1024, threads=2)


@pytest.fixture(params=OTHER_FILES, scope="session")
def other_tok(request):
    return load_tokenizer(request.param, chunk_threshold=2048, chunk_target=1024)


def ref_ids(tok, text: str, add_special_tokens: bool = True) -> list[int]:
    """The reference answer: the real tokenizers library on the real file."""
    return tok.reference.encode(text, add_special_tokens=add_special_tokens).ids


def ref_ids_many(tok, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
    """The reference answers for many texts (``encode_batch``: same as ``encode`` each, on all
    cores)."""
    return [e.ids for e in tok.reference.encode_batch(texts, add_special_tokens=add_special_tokens)]
