"""dtok: the exact IDs of Hugging Face ``tokenizers``, faster for long prompts.

>>> import dtok
>>> tok = dtok.Tokenizer.default()
>>> list(tok.encode("Hello")) == tok.reference.encode("Hello").ids
True
"""
from dtok.admission import Admission
from dtok.tokenizer import KNOBS, Tokenizer

__all__ = ["Tokenizer", "Pool", "PoolError", "Admission", "KNOBS", "__version__"]


def __getattr__(name):  # the pool needs posix_ipc: import it only when asked for
    if name in ("Pool", "PoolError"):
        from dtok import pool

        return getattr(pool, name)
    raise AttributeError(f"module 'dtok' has no attribute {name!r}")


__version__ = "0.1.0"
