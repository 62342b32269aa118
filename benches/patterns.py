"""Turns as a serving process lives them: how results are held, and how cold the caches are.
Shared by ``bench_append.py``, ``bench_edits.py`` and ``bench_pool.py`` (``--patterns``).

Results (``PATTERNS``):

* ``dropped``: each result released before the next turn;
* ``held``: the previous turn's view still alive while the next is encoded (what
  ``ids = tok.encode(text, session=key)`` in a loop does, and an engine that keeps a request's
  IDs);
* ``list_held``: the same with ``encode_list`` (what engines take).

Caches (``CONDITIONS``), the state the next turn of a session finds:

* ``hot``: turns back to back;
* ``sweep``: 400 MB of other memory read and written between turns;
* ``ref_thread``: a 1M-character encode by another instance of the reference, on another thread,
  between turns (the engine's own work: caches evicted);
* ``ref_same``: the same encode on the calling thread. Besides evicting caches this leaves that
  thread's glibc arena with tens of MB of freed chunks, and the first malloc-heavy call after it
  pays for sorting them (milliseconds), whoever makes it: ``allocator_tax`` measures that with a
  burst of mallocs made first, and the turn after it;
* ``interleaved``: ``--sessions`` sessions (64, as the paper's testbed) served round robin;
* ``local_between`` (the pool's bench): an in-process dtok encode of 1M characters between two
  pool calls.

The prompt of a turn reaches the encoder as a server has it: a new string, just decoded (in
cache), while the session's stored text (the string sent last time) is not touched in between;
building it is not timed. An edit turn first sends the text with the think block it then drops
(untimed), as a reasoning chat does.
"""
from __future__ import annotations

import ctypes
import statistics
import threading
import time
from typing import Callable

from common import corpus, summary

PATTERNS = ("dropped", "held", "list_held")
CONDITIONS = ("hot", "sweep", "ref_thread", "ref_same", "interleaved")
EDIT_REMOVED, EDIT_BEFORE_END, APPEND = 20_000, 30_000, 400


def take(src: str, at: int, n: int) -> str:
    """``n`` characters of ``src`` from ``at``, wrapping around at its end."""
    at %= len(src)
    out = src[at : at + n]
    while len(out) < n:
        out += src[: n - len(out)]
    return out


def next_turn(kind: str, prev: str, src: str, at: int) -> tuple[list[str], str, int]:
    """A turn after ``prev``: (texts sent first, untimed; the timed text; where the next turn
    takes new text in ``src``). ``append``: the next 400 characters. ``edit``: a reasoning
    turn as templates produce it: the session first receives ``prev`` + a 20K think block + 10K
    kept, then the timed prompt drops the think block (20K removed 30K before that text's end)
    and appends 400 characters."""
    if kind == "append":
        return [], prev + take(src, at, APPEND), at + APPEND
    think = take(src, at, EDIT_REMOVED)
    kept = take(src, at + EDIT_REMOVED, EDIT_BEFORE_END - EDIT_REMOVED)
    new = take(src, at + EDIT_BEFORE_END, APPEND)
    return [prev + think + kept], prev + kept + new, at + EDIT_BEFORE_END + APPEND


class Cold:
    """The work a server does between two turns of one session (see the module docstring)."""

    def __init__(self, reference, local: Callable | None = None) -> None:
        self.reference = reference  # another instance than the one under test
        self.local = local
        self.text = (corpus("prose", "gutenberg-2701_moby-dick.txt") * 2)[:1_000_000]
        self._sweep: bytearray | None = None
        self._libc = ctypes.CDLL(None)
        self._libc.malloc.restype = ctypes.c_void_p
        self._libc.free.argtypes = [ctypes.c_void_p]

    def __call__(self, condition: str) -> None:
        if condition == "sweep":
            if self._sweep is None:
                self._sweep = bytearray(400 << 20)
            mem = self._sweep
            for i in range(0, len(mem), 4096):
                mem[i] = (mem[i] + 1) & 255
            bytes(mem[: 200 << 20])
        elif condition == "ref_thread":
            t = threading.Thread(target=self.reference.encode, args=(self.text,))
            t.start()
            t.join()
        elif condition == "ref_same":
            self.reference.encode(self.text)
        elif condition == "local_between" and self.local is not None:
            self.local(self.text)  # an in-process dtok encode between two pool calls

    def allocator_tax(self) -> float:
        """ms of 240 mallocs and frees (12 sizes) made right after ``ref_same``: the cost of the
        arena's first malloc-heavy call, paid by whoever calls first."""
        self("ref_same")
        t0 = time.perf_counter()
        sizes = (24, 40, 72, 136, 264, 520, 1032, 2056, 4104, 8200, 16392, 65544)
        ptrs = [self._libc.malloc(size) for size in sizes for _ in range(20)]
        for p in ptrs:
            self._libc.free(p)
        return (time.perf_counter() - t0) * 1e3


def run(encode: Callable, kind: str, src: str, size: int, turns: int, pattern: str,
        condition: str, cold: Cold, sessions: int = 64, tag: str = "") -> tuple[list, dict]:
    """Latencies (seconds) of ``turns`` turns of ``kind`` on sessions of ``size`` characters, and
    each session's last text (to check). ``encode(text, key, as_list)`` serves one turn."""
    n_sessions = sessions if condition == "interleaved" else 1
    as_list = pattern == "list_held"
    texts, held, at = {}, {}, {}
    for k in range(n_sessions):
        key = f"{tag}{kind}-{pattern}-{condition}-{k}-{time.monotonic_ns()}"
        start = k * 7919
        texts[key] = take(src, start, size)
        at[key] = start + size
        encode(texts[key], key, as_list)
    lat = []
    for turn in range(turns + 1):  # turn 0 untimed: from then on held results take turns
        for key in texts:
            before, texts[key], at[key] = next_turn(kind, texts[key], src, at[key])
            for text in before:
                if pattern == "dropped":
                    encode(text, key, as_list)
                else:
                    held[key] = encode(text, key, as_list)
            cold(condition)
            # the prompt as a server has it: a new string, just decoded (hot), while the
            # session's stored text (the object sent last time) is not touched
            send = texts[key][:1] + texts[key][1:]
            t0 = time.perf_counter()
            out = encode(send, key, as_list)
            if turn:
                lat.append(time.perf_counter() - t0)
            if pattern != "dropped":
                held[key] = out  # the previous result is released only now
            del out  # one result of the session alive at most: the one ``held`` keeps
    return lat, texts


def table(label: str, encoders: dict[str, Callable], kind: str, src: str, size: int,
          turns: int, repeats: int, cold: Cold, check: Callable, sessions: int = 64,
          patterns=PATTERNS, conditions=CONDITIONS) -> list[dict]:
    """Every pattern under every condition for each encoder (alternating encoders within a
    repeat), ``repeats`` times; prints median and P99 per cell with the spread over repeats."""
    rows = []
    for condition in conditions:
        # fewer turns where each costs a 1M encode or a sweep; interleaved: two rounds
        n = {"hot": turns, "sweep": max(4, turns // 2), "interleaved": 2}.get(condition,
                                                                             max(4, turns // 4))
        for pattern in patterns:
            per = {who: [] for who in encoders}
            for rep in range(repeats):
                for who, enc in encoders.items():
                    lat, last = run(enc, kind, src, size, n, pattern, condition, cold, sessions,
                                    tag=f"{who}-{rep}-")
                    per[who].append(summary(lat))
                    for key, text in list(last.items())[:2]:  # the stored result: a hit
                        check(enc(text, key, False), text)
            row = {"label": label, "kind": kind, "size": size, "condition": condition,
                   "pattern": pattern}
            cells = []
            for who, reps in per.items():
                meds = [r["median_ms"] for r in reps]
                p99s = [r["p99_ms"] for r in reps]
                row[who] = {"median_ms": statistics.median(meds),
                            "median_spread": (min(meds), max(meds)),
                            "p99_ms": statistics.median(p99s), "p99_spread": (min(p99s), max(p99s)),
                            "turns": reps[0]["n"]}
                cells.append(f"{who} {row[who]['median_ms']:.3f} [{min(meds):.3f}-{max(meds):.3f}]"
                             f" P99 {row[who]['p99_ms']:.3f}")
            rows.append(row)
            print(f"{label} {kind:6s} {size:>9,} {condition:11s} {pattern:9s} | "
                  + " | ".join(cells), flush=True)
    return rows
