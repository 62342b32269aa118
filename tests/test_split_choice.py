"""With the threads left to dtok, whether a long text is split among threads is timed both ways
in the process and the faster taken (dtok.split_choice); the IDs are the reference's either
way."""
from __future__ import annotations

import pytest

from conftest import load_tokenizer, read_text, ref_ids
from dtok import pieces, split_choice
from dtok.split_choice import EXPLORE_EVERY, LEARN_MAX, LEARN_MIN, MIN_TRIALS, SplitChoice

PRIOR = pieces.AUTO_SPLIT_SAVING


def choices(choice: SplitChoice, saving: float, n: int, one_s: float, split_s: float) -> list:
    """``n`` encodes whose split saves ``saving``, each taking the choice offered and told
    the time it took: ``one_s`` on one thread, ``split_s`` split."""
    taken = []
    for _ in range(n):
        split = choice.pays(saving)
        choice.record(saving, split, split_s if split else one_s, work=2 * saving)
        taken.append(split)
    return taken


def test_both_choices_are_timed_then_the_faster_taken_and_the_other_now_and_then():
    c = SplitChoice(PRIOR)
    # the fixed rule first, then the other choice, until both have MIN_TRIALS
    start = choices(c, 500_000, 2 * MIN_TRIALS, one_s=0.004, split_s=0.003)
    assert start == [False, True] * MIN_TRIALS
    then = choices(c, 500_000, 3 * EXPLORE_EVERY, one_s=0.004, split_s=0.003)
    assert then.count(False) == 3 and all(then[k] is False for k in
                                         range(EXPLORE_EVERY - 1, len(then), EXPLORE_EVERY))
    # another bucket learns on its own: a split saving 1.5M starts split (the fixed rule)
    other = choices(c, 1_500_000, 2 * MIN_TRIALS + EXPLORE_EVERY - 1, one_s=0.005, split_s=0.009)
    assert other[:2] == [True, False] and not any(other[2 * MIN_TRIALS:])
    assert c.pays(500_000)  # unchanged by the other bucket
    # outside the measured band, the records change nothing
    assert not c.pays(LEARN_MIN - 1) and c.pays(LEARN_MAX)
    choices(c, LEARN_MAX, 10, one_s=0.001, split_s=1.0)
    assert c.pays(LEARN_MAX)
    summary = {b["saving"]: b for b in c.summary()}
    assert summary[(500_000, 1_000_000)]["split"]["ns_per_char"] == 3.0  # 3 ms for 1M
    assert summary[(1_000_000, 2_000_000)]["one_thread"]["encodes"] == split_choice.TRIALS


def test_a_change_in_what_a_split_costs_is_followed():
    """A split measured faster, then slower (a busy machine): the choice turns once the slower
    splits are most of the ones kept (the median), and stays turned."""
    c = SplitChoice(PRIOR)
    choices(c, 600_000, 40, one_s=0.004, split_s=0.002)
    assert c.pays(600_000)
    later = choices(c, 600_000, 4 * EXPLORE_EVERY, one_s=0.004, split_s=0.008)
    turned = split_choice.TRIALS // 2 + 1
    assert later[:turned] == [True] * turned and not later[turned]
    assert later[turned:].count(True) <= len(later) // EXPLORE_EVERY


@pytest.mark.parametrize("split_faster", [True, False])
def test_default_threads_split_a_text_where_this_process_timed_the_split_faster(
        monkeypatch, split_faster):
    """1M characters of prose (a split saving 500K: measured) on a 2-core machine, with the
    threads left to dtok and a clock that says one choice is faster: after both were tried,
    that choice is taken on all but one encode in EXPLORE_EVERY. The other case is the
    control: the same encodes with the clock the other way take the other choice. An explicit
    ``threads`` is used as given, untimed. Every answer's IDs are the reference's."""
    monkeypatch.setattr(pieces, "available_cpus", lambda: 2)  # a 2-core machine, whatever this is
    base = load_tokenizer("llama3", content_lookup=False)
    auto, two = base.with_knobs(threads=None), base.with_knobs(threads=2)
    prose = read_text("prose", "gutenberg-2701_moby-dick.txt")
    texts = [prose[:1_000_000], prose[1000:1_001_000]]
    want = [ref_ids(base, t) for t in texts]
    assert auto.explain(texts[0])["route"] == "whole"  # the fixed rule: one thread at first

    clock = [0.0]  # the time encodes take, as the test says: 4 ms one piece, 3 split
    encoder = auto.pieces.main.encoder
    whole, many = encoder.encode, encoder.encode_many
    one_s, split_s = (0.004, 0.003) if split_faster else (0.003, 0.004)

    def timed_whole(text):
        clock[0] += one_s
        return whole(text)

    def timed_many(items):
        clock[0] += split_s / 2  # one call a thread
        return many(items)

    monkeypatch.setattr(pieces, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(encoder, "encode", timed_whole)
    monkeypatch.setattr(encoder, "encode_many", timed_many)
    n = 2 * MIN_TRIALS + 2 * EXPLORE_EVERY
    routes = []
    for k in range(n):
        text = texts[k % 2]
        routes.append(auto.explain(text)["route"])
        assert list(auto.encode(text)) == want[k % 2]
    assert routes[:2] == ["whole", "chunked"]
    settled = routes[2 * MIN_TRIALS:]
    taken, other = ("chunked", "whole") if split_faster else ("whole", "chunked")
    assert settled.count(other) == 2 and settled.count(taken) == len(settled) - 2, routes
    assert "2 chunks on 2 thread(s)" in two.explain(texts[0])["why"]
    for text, ids in zip(texts, want):
        assert list(two.encode(text)) == ids
    timings = auto.stats()["split_timings"]
    assert [t["saving"] for t in timings] == [(500_000, 1_000_000)]
    assert two.stats()["split_timings"] == []
