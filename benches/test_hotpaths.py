"""The hot paths as pytest-benchmark suites, to see a change that slows one against a saved
baseline. Not part of the test run (``testpaths`` is ``tests``); timings are not assertions,
but every benchmarked call's result is compared with the reference once.

    python -m pytest benches/test_hotpaths.py --benchmark-autosave          # save a baseline
    python -m pytest benches/test_hotpaths.py --benchmark-compare           # compare with it
    python -m pytest benches/test_hotpaths.py --benchmark-compare=0001 \\
        --benchmark-compare-fail=median:15%                                  # fail on a regression

Baselines go to ``.benchmarks/`` (per machine, git-ignored): compare runs of one machine only.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("FASTOKENS_BPE_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dtok  # noqa: E402
from bench_append import stream  # noqa: E402
from common import SHARED, documents  # noqa: E402
from patterns import next_turn  # noqa: E402

SIZES = [100_000, 1_000_000]


@pytest.fixture(scope="module")
def qwen3():
    return dtok.Tokenizer.from_file(SHARED / "tokenizers" / "qwen3", threads=1,
                                    content_lookup=False)


@pytest.fixture(scope="module")
def source(qwen3):
    return stream(qwen3, 1_000_000 + 400_000)


def _turns(benchmark, encode, kind, src, size, check):
    """Benchmark one turn of ``kind`` on a session of ``size`` characters: each round is the
    next turn (the previous result held, as a caller in a loop holds it)."""
    state = {"text": src[:size], "at": size, "held": None}
    encode(state["text"])

    def setup():
        before, state["text"], state["at"] = next_turn(kind, state["text"], src, state["at"])
        for text in before:  # an edit's think block arrives first (untimed)
            state["held"] = encode(text)
        return (state["text"],), {}

    def turn(text):
        state["held"] = encode(text)

    benchmark.pedantic(turn, setup=setup, rounds=30, warmup_rounds=2)
    check(encode(state["text"]), state["text"])


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("kind", ["append", "edit"])
def test_session_turn(benchmark, qwen3, source, kind, size):
    tok = qwen3.with_knobs()
    _turns(benchmark, lambda t: tok.encode(t, session="b"), kind, source, size,
           lambda ids, t: _exact(qwen3, ids, t))


@pytest.mark.parametrize("encoder", ["auto", "reference"])
def test_stateless_1m(benchmark, encoder):
    tok = dtok.Tokenizer.from_file(SHARED / "tokenizers" / "qwen3", threads=1,
                                   content_lookup=False, encoder=encoder)
    docs = documents("prose", 1_000_000, 3)
    state = {"i": 0}

    def setup():  # distinct documents: no encoder cache of a document is measured
        state["i"] += 1
        return (docs[state["i"] % len(docs)],), {}

    benchmark.pedantic(tok.encode, setup=setup, rounds=3 if encoder == "reference" else 10)
    _exact(tok, tok.encode(docs[0]), docs[0])


def test_pool_append_1m(benchmark, qwen3, source):
    with dtok.Pool(qwen3, workers=2, name="bench-hot") as pool:
        _turns(benchmark, lambda t: pool.encode(t, session="p"), "append", source, 1_000_000,
               lambda ids, t: _exact(qwen3, ids, t))


def _exact(tok, ids, text):
    assert list(ids) == tok.reference.encode(text).ids
