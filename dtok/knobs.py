"""Operator knobs: their defaults (the paper's parameters, supplement S6.2) and their checks.

>>> validate({"chunk_target": 32768})["chunk_target"], KNOBS["max_chunks"]
(32768, 16)
>>> validate({"chunk_taget": 1})
Traceback (most recent call last):
TypeError: unknown knob(s): chunk_taget
"""
from __future__ import annotations

from typing import Any

__all__ = ["KNOBS", "ENCODERS", "validate", "positive_int", "POOL_SHARED", "validate_pool",
           "default_threads", "default_workers", "WORKER_RENEW_CHARS"]

# what ``threads=None`` and ``Pool(workers=None)`` take of a host's CPUs: each encoding thread
# and each worker holds a fast encoder's per-thread state, and the engine shares the host
# (the costs: docs/memory.md)
DEFAULT_THREADS_MAX = 4
DEFAULT_WORKERS_MAX = 8
#: characters a pool worker encodes before a fresh fork of the zygote replaces it: its fast
#: encoder's memo of the words it met ends with it, as a thread's does. 0 (never) by default:
#: fastokens caps that memo itself, and the slot is out while its successor starts
WORKER_RENEW_CHARS = 0

KNOBS: dict[str, Any] = {
    # encoder threads for chunked encodes; None = the CPUs this process may use, at most
    # DEFAULT_THREADS_MAX, a text shared out among them only where the split pays
    # (dtok.chunk_encoder.AUTO_SPLIT_SAVING)
    "threads": None,
    # characters dtok's encoding threads take in all before fresh threads replace them: a
    # fast encoder's memo of the words a thread met ends with the thread (0: never renewed)
    "thread_renew_chars": 1 << 24,
    "chunk_threshold": 131072,  # texts this long (code points) or longer are cut into chunks
    "chunk_target": 65536,  # aimed-at chunk length
    "max_chunks": 16,
    "scan_budget": (48, 4096),  # backward scan for a safe cut: first stage, then up to the second
    "content_lookup": True,  # unkeyed texts of 4096+ characters reuse a stored text's IDs
    "max_sessions": 4096,  # keyed sessions kept
    "session_bytes": 128 << 20,  # text + IDs kept for sessions and content lookup (LRU)
    "lookup_entries": 1024,  # content-lookup entries kept (oldest dropped first)
    "anchor_spacing": 2048,  # sessions record a cut with its token index about this often (chars)
    "edit_budget": 1 << 22,  # characters of alignment work an edited session may spend
    # a keyed session's text shorter than this (characters) is encoded whole, its state kept
    # for the next turn: below it a continuation's own work costs more than it saves (0: never)
    "session_whole_below": 8192,
    "encoder": "auto",  # "auto" (fast where admitted and guarded), "fast", "reference"
    # the reference's switch of that name: special-token strings in the text are plain text
    # (encoded as the characters they are made of), not the special tokens' IDs
    "encode_special_tokens": False,
    # a file with no guard table for the installed versions: "background" probes for one in a
    # child process at the lowest priority while the reference serves (dtok.probes); "off"
    "guard_probes": "background",
}
ENCODERS = ("auto", "fast", "reference")
STATELESS_QUEUES = ("shared", "round_robin")
#: the knobs a pool shares with its tokenizer (None in the pool: the tokenizer's value)
POOL_SHARED = ("chunk_threshold", "chunk_target", "max_chunks", "max_sessions", "session_bytes")
GUARD_PROBES = ("background", "off")
_COUNTS = ("chunk_threshold", "chunk_target", "max_chunks", "max_sessions", "session_bytes",
           "lookup_entries", "anchor_spacing", "edit_budget")


def default_threads(cpus: int) -> int:
    """The encoding threads of ``threads=None`` on ``cpus`` usable CPUs.

    >>> default_threads(2), default_threads(64)
    (2, 4)
    """
    return max(1, min(cpus, DEFAULT_THREADS_MAX))


def default_workers(cpus: int) -> int:
    """A :class:`dtok.Pool`'s workers when none are asked for, on ``cpus`` usable CPUs.

    >>> default_workers(2), default_workers(64)
    (2, 8)
    """
    return max(1, min(cpus, DEFAULT_WORKERS_MAX))


def positive_int(name: str, value) -> None:
    """The check every count-like knob gets (the tokenizer's and the pool's)."""
    if type(value) is not int or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def non_negative_int(name: str, value) -> None:
    """The check of a knob where 0 means never (renewals, ``session_whole_below``)."""
    if type(value) is not int or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")


def validate(knobs: dict[str, Any]) -> dict[str, Any]:
    """Every knob, the given ones checked and the others at their defaults (``scan_budget`` as
    a tuple); TypeError for an unknown name, ValueError for a bad value."""
    unknown = set(knobs) - set(KNOBS)
    if unknown:
        raise TypeError(f"unknown knob(s): {', '.join(sorted(unknown))}")
    k = {**KNOBS, **knobs}
    for name in _COUNTS:
        positive_int(name, k[name])
    if k["threads"] is not None and (type(k["threads"]) is not int or k["threads"] < 1):
        raise ValueError(f"threads must be a positive int or None, got {k['threads']!r}")
    for name in ("thread_renew_chars", "session_whole_below"):
        non_negative_int(name, k[name])
    try:
        budget = tuple(k["scan_budget"])
    except TypeError:
        budget = ()
    if not budget or any(type(b) is not int or b < 0 for b in budget):
        raise ValueError(f"scan_budget must be non-negative ints, got {k['scan_budget']!r}")
    k["scan_budget"] = budget
    if k["encoder"] not in ENCODERS:
        raise ValueError(f"encoder must be one of {ENCODERS}, got {k['encoder']!r}")
    if k["guard_probes"] not in GUARD_PROBES:
        raise ValueError(f"guard_probes must be one of {GUARD_PROBES}, got {k['guard_probes']!r}")
    for name in ("content_lookup", "encode_special_tokens"):
        if type(k[name]) is not bool:
            raise ValueError(f"{name} must be a bool, got {k[name]!r}")
    return k


def validate_pool(tokenizer_knobs: dict[str, Any], shared: dict[str, Any], *, workers,
                  shm_bytes, chunks_per_worker, stateless_queue,
                  worker_renew_chars: int = WORKER_RENEW_CHARS) -> dict[str, Any]:
    """A pool's knobs: the tokenizer's (``tokenizer_knobs``) with the ``shared`` ones given (not
    None) in their place, checked by :func:`validate`, and the pool's own (``workers`` and
    ``shm_bytes``: None for their defaults), checked here.

    >>> validate_pool(KNOBS, {"max_chunks": 4}, workers=None, shm_bytes=None,
    ...               chunks_per_worker=1, stateless_queue="shared")["max_chunks"]
    4
    """
    knobs = validate({**tokenizer_knobs, **{k: v for k, v in shared.items() if v is not None}})
    positive_int("chunks_per_worker", chunks_per_worker)
    for name, value in (("workers", workers), ("shm_bytes", shm_bytes)):
        if value is not None:
            positive_int(name, value)
    non_negative_int("worker_renew_chars", worker_renew_chars)
    if stateless_queue not in STATELESS_QUEUES:
        raise ValueError(f"stateless_queue must be one of {STATELESS_QUEUES}, got "
                         f"{stateless_queue!r}")
    return knobs
