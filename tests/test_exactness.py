"""Exactness battery over the admitted test files (``BATTERY_FILES``), and its control (proof that
it can fail)."""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from battery import (FRAGMENTS, battery_texts, check_cuts, check_repairs, checks_disabled,
                     token_fragments)
from conftest import load_tokenizer, ref_ids, shared_path
from dtok.tokenizer import parts_of
from dtok_ext.cuts import VERDICT_AT_SPECIAL, VERDICT_TRANSITION


def test_every_accepted_cut_is_exact(battery_tok):
    texts = battery_texts(battery_tok)
    diffs = check_cuts(battery_tok, texts)
    assert not diffs, "\n".join(map(str, diffs[:5]))


def test_every_repair_cut_is_exact(battery_tok):
    texts = battery_texts(battery_tok, seed=7)
    diffs = check_repairs(battery_tok, texts)
    assert not diffs, "\n".join(map(str, diffs[:5]))


def test_battery_reaches_cuts(battery_tok):
    """The battery is not vacuous: it checks many accepted cuts, of both kinds."""
    texts = battery_texts(battery_tok)
    kinds = [parts_of(battery_tok).rules.is_safe(t, b) for t in texts for b in range(1, len(t))]
    assert kinds.count(VERDICT_TRANSITION) > 2000
    assert kinds.count(VERDICT_AT_SPECIAL) > 100  # at added-token boundaries


def test_chunked_encode_matches_reference(battery_tok):
    """Whole-Tokenizer route: battery texts glued into long texts, cut into many chunks."""
    rng = random.Random(3)
    texts = battery_texts(battery_tok, seed=11)
    for _ in range(12):
        rng.shuffle(texts)
        text = "".join(texts[:60])
        assert battery_tok.explain(text)["route"] == "chunked"
        for special in (True, False):
            assert list(battery_tok.encode(text, add_special_tokens=special)) == ref_ids(
                battery_tok, text, special)


@pytest.mark.parametrize("name", ["qwen3", "llama3", "deepseek-v3", "gpt-oss"])
def test_hypothesis_cuts(name):
    tok = load_tokenizer(name)
    pool = FRAGMENTS + token_fragments(tok)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck),
              derandomize=True)
    @given(st.lists(st.sampled_from(pool), min_size=1, max_size=30))
    def run(parts):
        text = "".join(parts)
        assert not check_cuts(tok, [text])
        assert not check_repairs(tok, [text], per_text=2)

    run()


# --- the control: the same battery with a safety check switched off must find differences ---


def test_control_without_nfc_check_finds_differences():
    tok = load_tokenizer("qwen3")  # the NFC file
    texts = battery_texts(tok)
    with checks_disabled(tok, nfc=True):
        cut_diffs = check_cuts(tok, texts, stop_after=20)
        repair_diffs = check_repairs(tok, texts, stop_after=20)
    assert len(cut_diffs) >= 20 and len(repair_diffs) >= 20, \
        "the battery cannot see a missing NFC check"
    assert not check_cuts(tok, texts), "checks were not restored"


def test_control_without_special_token_guard_finds_differences(battery_tok):
    texts = battery_texts(battery_tok)
    with checks_disabled(battery_tok, specials=True):
        cut_diffs = check_cuts(battery_tok, texts, stop_after=20)
        repair_diffs = check_repairs(battery_tok, texts, stop_after=20)
    assert len(cut_diffs) >= 20 and len(repair_diffs) >= 20, \
        "the battery cannot see a missing special-token guard"


# --- the other real files the paper admits (their families' small files are in MAIN_FILES) ---

# GLM-5.2 (llama3), OLMo-3 (llama3, Removed+invert), MiniMax-M3 (o200k, Removed+invert, NFC),
# Qwen3's compact serialisation (qwen2, an equivalent file): only in ../shared
OTHER_ADMITTED = ["glm-5.2", "olmo-3", "minimax-m3", "qwen3-compact"]


@pytest.mark.parametrize("name", OTHER_ADMITTED)
def test_battery_on_the_other_admitted_files(name):
    """Cuts, repairs and chunked encodes equal the reference; the fast encoder serves from a
    shipped (or equivalent) guard table; the control finds the differences a missing
    special-token guard lets through."""
    import dtok

    path = shared_path("tokenizers", name, "tokenizer.json")
    tok = dtok.Tokenizer(path, chunk_threshold=2048, chunk_target=1024, threads=2,
                         guard_probes="off")
    assert tok.admission.admitted and tok.encoder.name == "fastokens", tok.encoder_notes
    texts = battery_texts(tok)
    assert not check_cuts(tok, texts)
    assert not check_repairs(tok, texts)
    rng = random.Random(5)
    for _ in range(4):
        rng.shuffle(texts)
        text = "".join(texts[:60])
        assert tok.explain(text)["route"] == "chunked"
        assert list(tok.encode(text)) == ref_ids(tok, text)
    with checks_disabled(tok, specials=True):
        assert len(check_cuts(tok, texts, stop_after=20)) >= 20
