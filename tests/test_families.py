"""Transition sets: every stored pair holds on the reference pre-tokenizer, every other pair fails.

That the derivation reproduces the stored sets exactly (tools/data/derive_transitions.py, rerun)
is tests/test_family_recipe.py's slow part."""
from __future__ import annotations

import random

import numpy as np
import pytest

from conftest import FAMILY_OF, MADE_TINY_FILES, MAIN_FILES, shared_path
from dtok import tables
from dtok.families import ACCEPTED, CLASSES, FAMILIES, identify
from dtok.families.derive import PairChecker, gap_texts, gaps_in_every_code_point
from dtok.families.rules import GAPLESS

FAMILY_NAMES = list(FAMILIES)


def members_from_table(name: str) -> dict[str, np.ndarray]:
    """Class name -> code points, from the table the runtime uses."""
    t = tables.load(name)
    ids = np.frombuffer(t.table, dtype=np.uint8) & tables.CLASS_MASK
    return {cls: np.flatnonzero(ids == i + 1) for i, cls in enumerate(t.classes)
            if (ids == i + 1).any()}


def reps(members, rng=None):
    return {n: chr(int(c[0] if rng is None else c[rng.randrange(len(c))]))
            for n, c in members.items()}


@pytest.mark.parametrize("name", MAIN_FILES + MADE_TINY_FILES)
def test_main_files_identify_their_family(name):
    import json

    spec = json.loads(shared_path("tokenizers", name, "tokenizer.json").read_bytes())
    family, reason = identify(spec["pre_tokenizer"])
    assert family is not None and family.name == FAMILY_OF[name], reason


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_every_class_in_table_is_known(name):
    members = members_from_table(name)
    assert set(members) <= set(CLASSES[name])
    ids = np.frombuffer(tables.load(name).table, dtype=np.uint8) & tables.CLASS_MASK
    blocked = np.flatnonzero(ids == tables.BLOCK)
    assert set(blocked.tolist()) == set(range(0xD800, 0xE000)), "only surrogates are BLOCK"


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_accepted_pairs_hold(name):
    """Exhaustive over one-character contexts, plus random contexts of up to four characters on
    the left and two on the right, drawn at random from each class."""
    family = FAMILIES[name]
    members = members_from_table(name)
    r = reps(members)
    checker = PairChecker(family, r, left=1, right=1)
    for a, b in ACCEPTED[name]:
        ce = checker.counterexample(r[a], r[b])
        assert ce is None, f"{a} -> {b} fails at {ce!r}"
    rng = random.Random(name)
    pre = family.pre_tokenizer()
    split = lambda s: [p for p, _ in pre.pre_tokenize_str(s)]  # noqa: E731
    any_char = lambda: chr(int(rng.choice(members[rng.choice(list(members))])))  # noqa: E731
    for a, b in ACCEPTED[name]:
        for _ in range(30):
            left = "".join(any_char() for _ in range(rng.randint(0, 4))) + chr(
                int(rng.choice(members[a])))
            right = chr(int(rng.choice(members[b]))) + "".join(
                any_char() for _ in range(rng.randint(0, 2)))
            assert split(left + right) == split(left) + split(right), (a, b, left, right)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_rejected_pairs_have_counterexamples(name):
    """The stored set is the whole safe set for short contexts: every other pair can break."""
    family = FAMILIES[name]
    r = reps(members_from_table(name))
    accepted = set(map(tuple, ACCEPTED[name]))
    short = PairChecker(family, r, left=1, right=1)
    longer = PairChecker(family, r, left=2, right=1)
    for a in sorted(r):
        for b in sorted(r):
            if (a, b) in accepted:
                continue
            assert (short.counterexample(r[a], r[b]) or longer.counterexample(r[a], r[b])), \
                f"{a} -> {b} is rejected without a counterexample"


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_table_classes_match_reference_probe(name):
    """The table's classes are what the installed regex engine says, on a sample of code points."""
    from tokenizers import Regex, pre_tokenizers

    family = FAMILIES[name]
    t = tables.load(name)
    rng = random.Random(0)
    sample = sorted(({rng.randrange(0x110000) for _ in range(3000)} | set(range(0x3100)))
                    - set(range(0xD800, 0xE000)))
    text = "".join(map(chr, sample))
    matched = {}
    for label, regex in family.atoms:
        hit = np.ones(len(sample), dtype=bool)
        for _p, (s, e) in pre_tokenizers.Split(Regex(regex), "removed").pre_tokenize_str(text):
            hit[s:e] = False
        matched[label] = hit
    for i, cp in enumerate(sample):
        labels = [label for label, _r in family.atoms if matched[label][i]]
        expected = "+".join(labels) or "O"
        assert t.classes[(t.table[cp] & tables.CLASS_MASK) - 1] == expected, hex(cp)



# --- Split(behavior="Removed", invert=true): the same split where the pattern is gapless -----


@pytest.mark.parametrize("name", sorted(GAPLESS))
def test_gapless_families_remove_nothing_when_inverted(name):
    """The argument of rules.py ("Removed and inverted"), re-proved on the installed reference:
    every string of up to three class representatives and every code point in order split
    alike under Removed+invert and Isolated."""
    family = FAMILIES[name]
    assert gap_texts(family, reps(members_from_table(name))) == []
    assert gaps_in_every_code_point(family) == []


def test_gap_check_finds_the_gaps_of_a_pattern_that_leaves_some():
    """Control: a pattern matching only letters and digits removes the rest when inverted."""
    control = FAMILIES["qwen2"]._replace(name="control", splits=(r"\p{L}+|\p{N}",))
    members = reps(members_from_table("qwen2"))
    assert gap_texts(control, members)
    assert gaps_in_every_code_point(control)


def _inverted(pre_tokenizer: dict) -> dict:
    steps = [dict(s) for s in pre_tokenizer["pretokenizers"]]
    for s in steps[:-1]:
        s.update(behavior="Removed", invert=True)
    return {**pre_tokenizer, "pretokenizers": steps}


@pytest.mark.parametrize("name", ["llama3", "qwen3", "gpt-oss", "deepseek-v3", *MADE_TINY_FILES])
def test_removed_inverted_split_is_admitted_only_where_gapless(name):
    import json

    spec = json.loads(shared_path("tokenizers", name, "tokenizer.json").read_bytes())
    family, reason = identify(_inverted(spec["pre_tokenizer"]))
    if FAMILY_OF[name] in GAPLESS:
        assert family is not None and family.name == FAMILY_OF[name], reason
    else:
        assert family is None and "not proven gapless" in reason
    other = _inverted(spec["pre_tokenizer"])
    other["pretokenizers"][0]["invert"] = False  # Removed alone drops the matches
    assert identify(other)[0] is None
