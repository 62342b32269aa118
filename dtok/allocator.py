"""glibc's allocator options for a server process that encodes megabyte texts on many threads.

With glibc's defaults such a process keeps growing with free memory in its per-thread arenas:
once a large block is freed, glibc raises its mmap threshold up to 32 MiB, and megabyte buffers
(texts, their IDs, the encoders' scratch) are then cut from the arenas, where they fragment
(docs/memory.md has the soak that shows it). :func:`tune` sets the two options that keep the
process flat, for the whole process: at most two arenas, and blocks of 1 MiB or more mapped
on their own. The engine plugins call it when they are switched on; ``DTOK_MALLOC=keep`` opts
out, and an option the environment already sets (``MALLOC_ARENA_MAX``,
``MALLOC_MMAP_THRESHOLD_``) is left as it is. :func:`release_free_heap` gives the free pages
back where dtok knows it has just freed much (after a load, after renewed encoding threads end).

>>> ARENA_MAX, MMAP_THRESHOLD
(2, 1048576)
"""
from __future__ import annotations

import ctypes
import os

__all__ = ["tune", "release_free_heap", "ARENA_MAX", "MMAP_THRESHOLD"]

ARENA_MAX = 2
MMAP_THRESHOLD = 1 << 20
_M_MMAP_THRESHOLD = -3  # glibc's malloc.h
_M_ARENA_MAX = -8
_OPTIONS = (("MALLOC_ARENA_MAX", _M_ARENA_MAX, ARENA_MAX),
            ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, MMAP_THRESHOLD))


def tune() -> dict[str, int]:
    """Set glibc's arena and mmap-threshold options for this process (see the module
    docstring); returns the options set, by their environment names ({} where the C library
    is not glibc, or with ``DTOK_MALLOC=keep``)."""
    if os.environ.get("DTOK_MALLOC") == "keep":
        return {}
    mallopt = _mallopt()
    if mallopt is None:
        return {}
    done = {}
    for env, option, value in _OPTIONS:
        if env not in os.environ and mallopt(option, value) == 1:
            done[env] = value
    return done


def release_free_heap() -> None:
    """Give the free pages of every arena back to the system (glibc's ``malloc_trim(0)``;
    nothing where the C library is not glibc)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def _mallopt():
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # glibc only: other C libraries' options differ
    except (OSError, AttributeError):
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt
