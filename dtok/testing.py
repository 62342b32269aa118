"""Hooks for tests: moments inside dtok that a test cannot reach from outside (a race it must
force), named here so that no test sets a private attribute of a production class.

dtok calls :func:`run_hook` where each moment is; it does nothing unless a test installed a
function for that hook with :func:`hooked`:

>>> from dtok import testing
>>> seen = []
>>> with testing.hooked(testing.AFTER_PUBLISH, seen.append):
...     testing.run_hook(testing.AFTER_PUBLISH, "entry")
>>> testing.run_hook(testing.AFTER_PUBLISH, "after")
>>> seen
['entry']

A test or bench reads a tokenizer's private parts (its chunk encoder, planner, chunker, cut
rules, loaded file) through :func:`dtok.tokenizer.parts_of`, never through its private
attributes. This module imports nothing of dtok's: every module may import it.

Benches switch dtok's scheduling mechanisms off the same way, one at a time, to measure what
each is worth (:func:`switched_off`; benches/bench_split_stream.py ``--variants``,
docs/benchmarks.md#scheduling-mechanisms-each-switched-off):

>>> with testing.switched_off(testing.OFF_TWO_ENDS):
...     testing.is_off(testing.OFF_TWO_ENDS)
True
>>> testing.is_off(testing.OFF_TWO_ENDS)
False
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

#: The session store made a content-lookup entry visible to other requests (its caller's
#: result already taken); called with the entry (:mod:`dtok.sessions`).
AFTER_PUBLISH = "after_publish"

#: A pool encodes a request in its own process (failover, or no worker); called with the text,
#: on the thread that encodes it (:mod:`dtok.pool.failover`).
IN_PROCESS_ENCODE = "in_process_encode"

#: A thread is about to route and encode a list of chunks (its run, or a text's chunks);
#: called with the chunks, on that thread (:mod:`dtok.chunk_encoder`).
CHUNKS_ROUTED = "chunks_routed"

#: A pool is about to start its zygote; called with the configuration it sends, which the
#: function may change (:mod:`dtok.pool.api`; the zygote's own test hooks, such as
#: ``_hang_starts``: {worker index: starts that never come up}).
ZYGOTE_CONFIG = "zygote_config"

#: Scheduling mechanisms :func:`switched_off` turns off (those the ablation of 2026-12-07 kept;
#: it removed long chunks of other text and text weights): a text's chunks shared among threads
#: in contiguous runs, each thread routing its own (dtok.chunk_encoder; off: routed in the calling
#: thread, then each encoder's calls shared out);
OFF_RUNS = "runs of chunks"
#: a pool thread's run taken a step (RUN_STEP_CHARS) at a time (off: whole);
OFF_STEPS = "steps of runs"
#: the calling thread, done with its run, takes the others' rest from the back (off: it waits);
OFF_TWO_ENDS = "two-ended take"
#: pool threads handed work beside the caller kept off the caller's CPU (dtok.encode_threads;
#: off: not placed);
OFF_AFFINITY = "CPU affinity"
#: the split bound for fastokens on one BPE thread (AUTO_SPLIT_SAVING; off: the bound beside
#: fastokens' own BPE threads, AUTO_SPLIT_SAVING_BESIDE_BPE_THREADS, everywhere).
OFF_TWO_BOUNDS = "two split bounds"
MECHANISMS = (OFF_RUNS, OFF_STEPS, OFF_TWO_ENDS, OFF_AFFINITY, OFF_TWO_BOUNDS)

#: Checks of exactness a test's control switches off with :func:`switched_off`, to show that
#: the test sees what they prevent (dtok.chunk_encoder): cut-free stretches longer than
#: LONGEST_FAST_STRETCH kept from the fast encoders (tests/test_memory.py);
CHECK_LONG_STRETCHES = "long cut-free stretches"
#: special-token strings that are plain text (encode_special_tokens) kept from the fast
#: encoders, which would match them (tests/test_literal_specials.py).
CHECK_PLAIN_SPECIALS = "plain special-token strings"
CHECKS = (CHECK_LONG_STRETCHES, CHECK_PLAIN_SPECIALS)

#: The safe-cut predicate's own checks (dtok_ext.cuts.CutRules, flags read in its compiled
#: loops, so switched per rules object with :func:`cut_checks_off`): NFC's reach across a cut,
CUT_CHECK_NFC = "_check_nfc"
#: special-token strings across a cut,
CUT_CHECK_SPECIALS = "_check_specials"
#: a continuation's seam being a cut of the new text too (dtok.repair).
CUT_CHECK_NEW_TEXT = "_check_new_text"
CUT_CHECKS = (CUT_CHECK_NFC, CUT_CHECK_SPECIALS, CUT_CHECK_NEW_TEXT)

_installed: dict[str, Callable] = {}
_off: set[str] = set()


def run_hook(name: str, *args) -> None:
    """Call the function a test installed for ``name``, if any."""
    fn = _installed.get(name)
    if fn is not None:
        fn(*args)


@contextmanager
def hooked(name: str, fn: Callable) -> Iterator[None]:
    """Run ``fn`` at the moment ``name`` while the block runs (one function a hook)."""
    if name in _installed:
        raise RuntimeError(f"hook {name!r} is installed already")
    _installed[name] = fn
    try:
        yield
    finally:
        del _installed[name]


def is_off(name: str) -> bool:
    """Whether a bench or test switched the mechanism or check ``name`` off (one set lookup:
    dtok asks on every call that schedules work)."""
    return name in _off


@contextmanager
def cut_checks_off(rules, *checks: str) -> Iterator[None]:
    """Switch the safe-cut predicate's ``checks`` off on one ``CutRules`` object (a tokenizer's:
    ``dtok.tokenizer.parts_of(tok).rules``) while the block runs: the exactness battery's
    controls show the battery finds the differences they prevent."""
    unknown = set(checks) - set(CUT_CHECKS)
    if unknown:
        raise ValueError(f"no such cut check: {sorted(unknown)}")
    saved = {c: getattr(rules, c) for c in checks}
    for c in checks:
        setattr(rules, c, False)
    try:
        yield
    finally:
        for c, on in saved.items():
            setattr(rules, c, on)


@contextmanager
def switched_off(*names: str) -> Iterator[None]:
    """Switch the scheduling mechanisms or checks ``names`` off while the block runs
    (process-wide: every tokenizer, every thread)."""
    unknown = set(names) - set(MECHANISMS) - set(CHECKS)
    if unknown:
        raise ValueError(f"no such mechanism: {sorted(unknown)}")
    added = set(names) - _off
    _off.update(added)
    try:
        yield
    finally:
        _off.difference_update(added)
