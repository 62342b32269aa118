"""dtok's logger, ``logging.getLogger("dtok")``, with ``logging`` imported when something is
first logged: a process that loads a tokenizer and logs nothing would otherwise pay its RSS
(``docs/benchmarks.md#a-loaded-tokenizers-memory-step-by-step``)."""
from __future__ import annotations


def logger():
    """The ``dtok`` logger."""
    import logging

    return logging.getLogger("dtok")
