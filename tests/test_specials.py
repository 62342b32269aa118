"""The added-token automaton reports every occurrence, overlapping ones included."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import load_tokenizer
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
    m = tok.rules.specials
    assert m.n_patterns == len(set(tok.admission.added_tokens)) >= 800
    text = "x<｜User｜>hi<｜Assistant｜><｜tool▁calls▁begin｜>"
    occ = m.find_all(text)
    assert (1, 1 + len("<｜User｜>")) in occ
    assert occ == brute(tok.admission.added_tokens, text)


def test_no_added_tokens():
    m = SpecialMatcher([])
    assert m.find_all("anything") == [] and not m.covers_position("abc", 1)
