"""dtok's logger, ``logging.getLogger("dtok")``, with ``logging`` imported when something is
first logged: a process that loads a tokenizer and logs nothing would otherwise pay ~1 MiB of RSS
for it (``docs/encoders.md``, memory)."""
from __future__ import annotations


def logger():
    """The ``dtok`` logger."""
    import logging

    return logging.getLogger("dtok")
