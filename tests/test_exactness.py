"""Exactness battery over the four admitted files, and its control (proof that it can fail)."""
from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from battery import (FRAGMENTS, battery_texts, check_cuts, check_repairs, checks_disabled,
                     token_fragments)
from conftest import load_tokenizer, ref_ids
from dtok_ext.cuts import VERDICT_AT_SPECIAL, VERDICT_TRANSITION


def test_every_accepted_cut_is_exact(main_tok):
    texts = battery_texts(main_tok)
    diffs = check_cuts(main_tok, texts)
    assert not diffs, "\n".join(map(str, diffs[:5]))


def test_every_repair_cut_is_exact(main_tok):
    texts = battery_texts(main_tok, seed=7)
    diffs = check_repairs(main_tok, texts)
    assert not diffs, "\n".join(map(str, diffs[:5]))


def test_battery_reaches_cuts(main_tok):
    """The battery is not vacuous: it checks many accepted cuts, of both kinds."""
    texts = battery_texts(main_tok)
    kinds = [main_tok.rules.is_safe(t, b) for t in texts for b in range(1, len(t))]
    assert kinds.count(VERDICT_TRANSITION) > 2000
    assert kinds.count(VERDICT_AT_SPECIAL) > 100  # at added-token boundaries


def test_chunked_encode_matches_reference(main_tok):
    """Whole-Tokenizer route: battery texts glued into long texts, cut into many chunks."""
    rng = random.Random(3)
    texts = battery_texts(main_tok, seed=11)
    for _ in range(12):
        rng.shuffle(texts)
        text = "".join(texts[:60])
        assert main_tok.explain(text)["route"] == "chunked"
        for special in (True, False):
            assert list(main_tok.encode(text, add_special_tokens=special)) == ref_ids(
                main_tok, text, special)


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


def test_control_without_special_token_guard_finds_differences(main_tok):
    texts = battery_texts(main_tok)
    with checks_disabled(main_tok, specials=True):
        cut_diffs = check_cuts(main_tok, texts, stop_after=20)
        repair_diffs = check_repairs(main_tok, texts, stop_after=20)
    assert len(cut_diffs) >= 20 and len(repair_diffs) >= 20, \
        "the battery cannot see a missing special-token guard"
