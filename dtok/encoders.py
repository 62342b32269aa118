"""Chunk encoders: text of an admitted tokenizer -> int32 IDs, without post-processing.

Every route that encodes a piece of text (chunked encode, session repair, pool workers) goes
through one :class:`ChunkEncoder`. The reference encoder asks ``tokenizers`` for IDs without
offsets (``encode_batch_fast``, which also releases the GIL) and copies them into one int32 array.
"""
from __future__ import annotations

from array import array
from typing import Protocol

from dtok_ext.buffers import ids_from_list


class ChunkEncoder(Protocol):
    name: str

    def encode(self, text: str) -> array:
        """int32 IDs of ``text`` (no special-token post-processing)."""


class ReferenceEncoder:
    """The ``tokenizers`` library itself."""

    name = "reference"

    def __init__(self, reference) -> None:
        self.reference = reference

    def encode(self, text: str) -> array:
        (enc,) = self.reference.encode_batch_fast([text], add_special_tokens=False)
        return ids_from_list(enc.ids)

    def encode_many(self, texts: list[str]) -> list[array]:
        return [ids_from_list(e.ids) for e in
                self.reference.encode_batch_fast(texts, add_special_tokens=False)]
