"""The reference: the installed Hugging Face ``tokenizers``, loaded through what its version has.

``tokenizers`` 0.21-0.23 is what dtok is built and proven on: its ``Tokenizer`` is used as it is.
``tokenizers`` 1.0 keeps only ``from_file``, ``encode``, ``encode_batch``, ``decode``,
``decode_tokens``, ``tokenize``, ``padding`` and ``truncation``; it removed the parts dtok's cut
rules are proven with (the normalizer, the pre-tokenizer, the added-token table, the
``normalizers`` and ``pre_tokenizers`` modules). There a :class:`Reference` adapter gives dtok the
calls of 0.2x it serves with, and :func:`missing` says what is gone: such a file is not admitted,
and the reference encodes every text (see docs/install.md).

>>> ref = load(bundled_raw())
>>> ref.encode("Hello, world!").ids
[9707, 11, 1879, 0]
>>> ref.decode([9707, 11, 1879, 0])
'Hello, world!'
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

__all__ = ["load", "missing", "version", "Reference", "bundled_raw"]

# What the fast path reads from the reference beyond encoding: the cut rules' normalizer and
# pre-tokenizer checks, the added-token table, the fast encoders' load check.
NEEDED = ("normalizer", "pre_tokenizer", "get_added_tokens_decoder", "get_vocab_size",
          "id_to_token", "encode_batch_fast", "to_str")


def version() -> str:
    """The installed ``tokenizers`` version, as it spells it (``1.0.0-rc.3`` for 1.0.0rc3)."""
    import tokenizers

    return str(tokenizers.__version__)


def bundled_raw() -> bytes:
    """The bundled Qwen3 ``tokenizer.json`` (Apache-2.0), uncompressed."""
    import gzip  # here only: a load needs zlib alone

    return gzip.decompress((Path(__file__).parent / "data" / "qwen3" / "tokenizer.json.gz")
                           .read_bytes())


def load(raw: bytes) -> Any:
    """A reference for a ``tokenizer.json``'s bytes: ``tokenizers.Tokenizer.from_buffer`` where
    it exists (0.2x), else ``from_file`` on an in-memory copy wrapped in :class:`Reference`."""
    from tokenizers import Tokenizer

    if hasattr(Tokenizer, "from_buffer"):
        return Tokenizer.from_buffer(raw)
    return Reference(_from_bytes(Tokenizer, raw))


def _from_bytes(cls: Any, raw: bytes) -> Any:
    """``cls.from_file`` on the bytes: an anonymous memory file where Linux has one."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fd = os.memfd_create("dtok-tokenizer.json", os.MFD_CLOEXEC)
        try:
            with os.fdopen(os.dup(fd), "wb") as f:
                f.write(raw)
            return cls.from_file(f"/proc/self/fd/{fd}")
        finally:
            os.close(fd)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # other platforms: a file only we can read
        path = Path(tmp) / "tokenizer.json"
        path.write_bytes(raw)
        return cls.from_file(str(path))


def missing(reference: Any) -> list[str]:
    """What dtok's fast path needs that ``reference`` does not have (empty on 0.2x)."""
    import tokenizers

    gone = [name for name in NEEDED if not hasattr(reference, name)]
    gone += [f"tokenizers.{m}" for m in ("normalizers", "pre_tokenizers")
             if not hasattr(tokenizers, m)]
    return gone


class Reference:
    """A ``tokenizers`` 1.x ``Tokenizer`` (``inner``) with the 0.2x calls dtok serves with:
    ``encode``, ``encode_batch``, ``encode_batch_fast``, ``decode``, ``decode_batch``,
    ``to_str`` and the ``encode_special_tokens`` switch (a per-call argument in 1.x)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.encode_special_tokens = False

    @property
    def padding(self) -> Any:
        return self.inner.padding

    @property
    def truncation(self) -> Any:
        return self.inner.truncation

    def encode(self, sequence: str, pair: str | None = None, *,
               add_special_tokens: bool = True) -> Any:
        """0.2x's ``encode(sequence, pair=None, add_special_tokens=True)``."""
        return self.inner.encode(sequence if pair is None else (sequence, pair),
                                 add_special_tokens=add_special_tokens,
                                 encode_special_tokens=self.encode_special_tokens)

    def encode_batch(self, inputs: Sequence[Any], add_special_tokens: bool = True) -> list[Any]:
        return self.inner.encode_batch(inputs, add_special_tokens=add_special_tokens,
                                       encode_special_tokens=self.encode_special_tokens)

    # 1.x has no offsets to skip: its batch call is the fast one
    encode_batch_fast = encode_batch

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self.inner.decode(ids, skip_special_tokens=skip_special_tokens))

    def decode_batch(self, sequences: Sequence[Sequence[int]],
                     skip_special_tokens: bool = True) -> list[str]:
        return [self.decode(ids, skip_special_tokens) for ids in sequences]

    def to_str(self, pretty: bool = False) -> str:
        """The tokenizer as JSON: 1.x serializes it only for pickling."""
        import json

        text = str(self.inner.__reduce__()[1][0])
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False) if pretty else text

    def __repr__(self) -> str:
        return f"<dtok.reference.Reference tokenizers {version()}: {self.inner!r}>"
