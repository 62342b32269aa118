"""dtok.allocator: the engine plugins set glibc's arena and mmap-threshold options, so that a
front end encoding megabyte texts does not grow with free memory kept in its arenas."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dtok import allocator

glibc = pytest.mark.skipif(allocator._mallopt() is None, reason="needs glibc")

# After a 4 MiB block is freed, glibc's defaults raise the mmap threshold past 2 MiB: the next
# 2 MiB block comes from the heap. Tuned, it is mapped on its own (mallinfo2's hblkhd grows).
_PROBE = r"""
import ctypes, json, os, sys
from dtok import allocator
done = allocator.tune() if sys.argv[1] == "tune" else {}

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
                 "uordblks", "fordblks", "keepcost")]

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
libc.mallinfo2.restype = Info
libc.free(libc.malloc(4 << 20))
before = libc.mallinfo2().hblkhd
block = libc.malloc(2 << 20)
print(json.dumps({"done": done, "mapped": libc.mallinfo2().hblkhd - before}))
"""


def probe(mode: str, **env: str) -> dict:
    import json
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], check=True, capture_output=True,
                         text=True, env={**os.environ, **env}).stdout
    return json.loads(out)


@glibc
def test_tuned_megabyte_blocks_are_mapped_on_their_own():
    tuned = probe("tune")
    assert tuned["done"] == {"MALLOC_ARENA_MAX": 2, "MALLOC_MMAP_THRESHOLD_": 1 << 20}
    assert tuned["mapped"] >= 2 << 20
    # the control: glibc's defaults cut the block from the heap
    assert probe("defaults")["mapped"] == 0


@glibc
def test_what_the_environment_chose_is_kept():
    assert probe("tune", MALLOC_ARENA_MAX="4")["done"] == {"MALLOC_MMAP_THRESHOLD_": 1 << 20}
    assert probe("tune", DTOK_MALLOC="keep")["done"] == {}


def test_module_examples():
    import doctest
    assert doctest.testmod(allocator).failed == 0
