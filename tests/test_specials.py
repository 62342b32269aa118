"""The added-token automaton reports every occurrence, overlapping ones included."""
from __future__ import annotations

import functools

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import load_tokenizer
from dtok.tokenizer import parts_of
from dtok_ext.specials import SpecialMatcher

ALPHABET = "ab<|>"


def brute(patterns, text):
    return sorted((i, i + len(p)) for p in set(patterns) if p
                  for i in range(len(text)) if text.startswith(p, i))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(ALPHABET, min_size=1, max_size=5), min_size=0, max_size=6),
       st.text(ALPHABET, max_size=30))
def test_matches_brute_force(patterns, text):
    m = SpecialMatcher(patterns)
    occ = brute(patterns, text)
    assert m.find_all(text) == occ
    for b in range(len(text) + 1):
        assert m.covers_position(text, b) == any(s < b < e for s, e in occ)
        for c in range(b, min(len(text), b + 6) + 1):
            assert m.touches_range(text, b, c) == any(s < c and e > b for s, e in occ)


def test_deepseek_818_tokens():
    tok = load_tokenizer("deepseek-v3")
    m = parts_of(tok).rules.specials
    assert m.n_patterns == len(set(tok.admission.added_tokens)) >= 800
    text = "x<｜User｜>hi<｜Assistant｜><｜tool▁calls▁begin｜>"
    occ = m.find_all(text)
    assert (1, 1 + len("<｜User｜>")) in occ
    assert occ == brute(tok.admission.added_tokens, text)


def test_no_added_tokens():
    m = SpecialMatcher([])
    assert m.find_all("anything") == [] and not m.covers_position("abc", 1)


# Texts where added tokens start near cuts and far from them: whole tokens, their fragments,
# astral characters (one pattern below starts with one), and stretches with none of them
# longer than a scan's block of positions.
SCAN_PARTS = ["<|eot_id|>", "<|", "|>", "<", "\U0001f642<x", "\U0001f642", "ab", " ", "\n",
              "xyz " * 12, "  \t", "é"]


@functools.cache
def scan_rules():
    """Llama-3.1's cut rules with its added tokens and two more (one starting astral)."""
    import dtok.tables
    from dtok_ext.cuts import CutRules

    fam = dtok.tables.load("llama3")
    patterns = list(load_tokenizer("llama3").admission.added_tokens) + ["\U0001f642<x", "ab"]
    return CutRules(fam.table, fam.accept, SpecialMatcher(patterns), None)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(SCAN_PARTS), max_size=40))
def test_scans_find_the_cuts_each_position_check_finds(parts):
    """scan_back and scan_forward ask SpecialMatcher.may_touch once per block of positions and
    skip the automaton where it says no: they must stop exactly where a check of every position
    (is_safe, the automaton always run) finds the nearest safe cut."""
    rules = scan_rules()
    text = "".join(parts)
    n = len(text)
    safe = [b for b in range(1, n) if rules.is_safe(text, b)]
    for b in range(1, n):
        back = max((p for p in safe if p <= b), default=-1)
        ahead = min((p for p in safe if p >= b), default=n)
        assert rules.scan(text, b, 1) == back, b
        assert rules.isolate(text, [(b, b)], n) == [(max(back, 0), ahead)], b
