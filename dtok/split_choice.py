"""Whether sharing a text's work among threads pays, as measured in this process.

With the threads left to dtok (knob ``threads=None``), a long text for a fast encoder is either
encoded on one thread or cut and shared out among the threads. Which is faster was not one rule
on the machine dtok is measured on (a 2-vCPU KVM guest): a split of 1M characters of agent
transcripts new to the process took 0.77-0.82 of one thread's time, of 1M characters of prose
whose words fastokens had met 1.2-1.6x, and the answer moved with the requests' spacing, the
CPU count and what else ran (docs/benchmarks.md#default-threads). So where a split's saving is
neither clearly too small nor clearly large, the choice is made by timing both in this process:

* work is bucketed by the saving an even split is expected to make (the other threads' share,
  in characters of Latin text on a fast encoder: ``pieces.TEXT_WEIGHT``), a factor of two a
  bucket, from LEARN_MIN to LEARN_MAX; below LEARN_MIN one thread, from LEARN_MAX a split;
* in a bucket, each choice's last TRIALS encodes are kept as seconds per unit of work; until
  both have MIN_TRIALS the choices alternate, starting with the fixed rule's (a saving of
  ``prior_saving``); then the one with the lower median is taken, and every EXPLORE_EVERY-th
  time the other, so that its figure follows the process's traffic.

The choice never changes the IDs: a text is cut only at safe cuts, and every cut is exact.

>>> choice = SplitChoice(prior_saving=1_250_000)
>>> choice.pays(100_000), choice.pays(8_000_000), choice.pays(500_000)
(False, True, False)
>>> choice.record(500_000, False, seconds=0.004, work=1_000_000)
>>> choice.pays(500_000)  # the other choice is tried next
True
"""

from __future__ import annotations

import threading
from collections import deque
from statistics import median

# Savings (characters of Latin text on a fast encoder) whose choice is measured: below, one
# thread (a split of 500K characters of Latin text on two threads saves 250K, ~1 ms: a thread
# hand-off and a second thread's start cost about that); from LEARN_MAX, a split (8M Latin
# characters on two threads; 4M took 0.67x one thread's time).
LEARN_MIN = 250_000
LEARN_MAX = 4_000_000
TRIALS = 7  # each choice's last encodes kept in a bucket
MIN_TRIALS = 3  # each choice's encodes before the faster is preferred
EXPLORE_EVERY = 16  # one choice in this many is the slower one's, to keep its figure current


class _Bucket:
    __slots__ = ("times", "choices")

    def __init__(self) -> None:
        # seconds per unit of work, for one thread [0] and for a split [1]
        self.times: tuple[deque, deque] = (deque(maxlen=TRIALS), deque(maxlen=TRIALS))
        self.choices = 0  # choices made since both had MIN_TRIALS

    def split(self, prior: bool) -> bool:
        one, two = (len(t) for t in self.times)
        if one < MIN_TRIALS or two < MIN_TRIALS:
            if one == two:
                return prior
            return two < one
        faster = median(self.times[1]) < median(self.times[0])
        return faster if self.choices % EXPLORE_EVERY != EXPLORE_EVERY - 1 else not faster


class SplitChoice:
    """Whether a split saving a given amount of work pays (:meth:`pays`), learned from the
    encodes :meth:`record` is told of. Thread-safe."""

    def __init__(self, prior_saving: float) -> None:
        self.prior_saving = prior_saving  # the fixed rule, taken first in each bucket
        self._buckets = [_Bucket() for _ in range(bucket_count())]
        self._lock = threading.Lock()

    def pays(self, saving: float) -> bool:
        """Whether to split work whose split is expected to save ``saving`` (characters of
        Latin text on a fast encoder): the choice :meth:`record` is to be told of next."""
        k = bucket_of(saving)
        if k is None:
            return saving >= LEARN_MAX
        return self._buckets[k].split(saving >= self.prior_saving)

    def record(self, saving: float, split: bool, seconds: float, work: float) -> None:
        """One encode whose split would save ``saving``: split or not, how long it took and its
        ``work`` (characters of Latin text on a fast encoder)."""
        k = bucket_of(saving)
        if k is None or work <= 0:
            return
        b = self._buckets[k]
        with self._lock:
            if min(len(t) for t in b.times) >= MIN_TRIALS:
                b.choices += 1
            b.times[split].append(seconds / work)

    def summary(self) -> list[dict]:
        """For each bucket with encodes: its savings, and each choice's encodes kept and median
        time (ns per unit of work)."""
        out = []
        for k, b in enumerate(self._buckets):
            with self._lock:
                times = [list(t) for t in b.times]
            if not any(times):
                continue
            lo = LEARN_MIN << k
            out.append({"saving": (lo, min(lo * 2, LEARN_MAX)),
                        "one_thread": _figure(times[0]), "split": _figure(times[1])})
        return out


def bucket_count() -> int:
    k = 0
    while LEARN_MIN << k < LEARN_MAX:
        k += 1
    return k


def bucket_of(saving: float) -> int | None:
    """The bucket of a split's ``saving``, or None outside [LEARN_MIN, LEARN_MAX)."""
    if not LEARN_MIN <= saving < LEARN_MAX:
        return None
    return int(saving // LEARN_MIN).bit_length() - 1


def _figure(times: list[float]) -> dict:
    return {"encodes": len(times), "ns_per_char": round(median(times) * 1e9, 2) if times else None}
