"""Compiled hot loops of dtok (Cython): string access, special-token automaton, safe cuts, buffers.

The Python surface lives in :mod:`dtok`; nothing here is public API.
"""
