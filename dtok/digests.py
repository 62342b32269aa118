"""SHA-256 and BLAKE2b by Python's own implementations, not OpenSSL's.

Importing ``hashlib`` loads OpenSSL's libcrypto, RSS in a process that has no other use for it.
dtok's digests (a tokenizer file's SHA-256, keys of session fingerprints, long client strings)
are few, so the built-in SHA-256, slower on a whole file but run once per load, is the cheaper
choice (docs/benchmarks.md#a-loaded-tokenizers-memory-step-by-step).
"""
from __future__ import annotations

__all__ = ["sha256", "blake2b"]

try:
    from _sha256 import sha256  # CPython 3.11
except ImportError:  # pragma: no cover - other interpreters
    try:
        from _sha2 import sha256  # CPython 3.12+
    except ImportError:
        from hashlib import sha256
try:
    from _blake2 import blake2b
except ImportError:  # pragma: no cover
    from hashlib import blake2b
