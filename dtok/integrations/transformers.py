"""A drop-in for a ``transformers`` fast tokenizer: ``encode``, ``__call__`` and batches through
dtok, with an optional session key; everything else is the wrapped tokenizer's own.

dtok is built from the wrapped tokenizer's *live* backend (``backend_tokenizer.to_str()``), not
from the file on disk: whatever ``transformers`` changed when it loaded the tokenizer (a BOS
post-processor installed from ``tokenizer_config.json``, added tokens) is what dtok reproduces,
so the IDs equal ``transformers``' own for the same arguments. Calls dtok does not handle
(pairs, truncation, padding, offsets, overflow, pre-split words, ``split_special_tokens``) go
to the wrapped tokenizer unchanged.

>>> from transformers import AutoTokenizer                      # doctest: +SKIP
>>> hf = AutoTokenizer.from_pretrained("path/to/Qwen3-8B")      # doctest: +SKIP
>>> tok = wrap(hf)                                              # doctest: +SKIP
>>> tok("Hello", session="chat-1")["input_ids"]                 # doctest: +SKIP
[9707]
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Hashable

from dtok.admission import TokenizerFiles, read_files
from dtok.integrations.identity import compare_sections
from dtok.tokenizer import Tokenizer

__all__ = ["DtokTransformersTokenizer", "wrap"]

# Keyword arguments of __call__/encode that dtok answers itself when they have these values.
_NEUTRAL = {
    "padding": (False, None, "do_not_pad"),
    "truncation": (False, None, "do_not_truncate"),
    "max_length": (None,),
    "stride": (0,),
    "is_split_into_words": (False,),
    "pad_to_multiple_of": (None,),
    "padding_side": (None,),
    "return_overflowing_tokens": (False,),
    "return_special_tokens_mask": (False,),
    "return_offsets_mapping": (False,),
    "return_length": (False,),
    "split_special_tokens": (None, False),
    "verbose": (True, False),
    "return_token_type_ids": (None, False),
}


def wrap(hf_tokenizer, *, source: str | os.PathLike | None = None,
         **knobs: Any) -> "DtokTransformersTokenizer":
    """Wrap a ``transformers`` fast tokenizer (``AutoTokenizer.from_pretrained(...)``).

    ``source``: a tokenizer.json (or its directory) to build dtok from instead of the live
    backend; it must equal the live backend in every section that decides IDs (ValueError
    otherwise). A file gets the fast encoder's shipped guard tables and can be pooled."""
    return DtokTransformersTokenizer(hf_tokenizer, source=source, **knobs)


class DtokTransformersTokenizer:
    """Proxy for a ``transformers`` fast tokenizer; see the module docstring."""

    def __init__(self, hf_tokenizer, *, source: str | os.PathLike | None = None,
                 **knobs: Any) -> None:
        backend = getattr(hf_tokenizer, "backend_tokenizer", None)
        if backend is None:
            raise TypeError("dtok can only wrap a fast (tokenizers-backed) transformers tokenizer")
        self.hf = hf_tokenizer
        self._knobs = knobs
        self._fingerprint = None
        self.dtok: Tokenizer
        if source is not None:
            self.dtok = Tokenizer(self._source_files(source), **knobs)
            self._fingerprint = self._state()
        else:
            self._rebuild()

    def _source_files(self, source: str | os.PathLike) -> TokenizerFiles:
        files = read_files(source)
        spec = files.outline()
        if spec.get("truncation") is not None or spec.get("padding") is not None:
            raise ValueError(f"{files.path} sets truncation or padding")
        differ = compare_sections(self.hf.backend_tokenizer.to_str(), files.raw.decode("utf-8"))
        if differ:
            raise ValueError(f"differs from {files.path} in: {', '.join(differ)}")
        return files

    # --- keeping in step with the wrapped tokenizer ----------------------------------------

    def _state(self) -> tuple:
        be = self.hf.backend_tokenizer
        return (be.get_vocab_size(with_added_tokens=True), str(be.post_processor),
                str(be.normalizer), str(be.pre_tokenizer))

    def _rebuild(self) -> None:
        spec = json.loads(self.hf.backend_tokenizer.to_str())
        # transformers sets and resets truncation/padding per call; dtok answers only calls
        # without them, so the copy has neither.
        spec["truncation"] = None
        spec["padding"] = None
        raw = json.dumps(spec, ensure_ascii=False).encode("utf-8")
        name = getattr(self.hf, "name_or_path", "") or "transformers"
        files = TokenizerFiles(Path(f"<transformers:{name}>"), raw, None, None)
        self.dtok = Tokenizer(files, **self._knobs)
        self._fingerprint = self._state()

    def current(self) -> Tokenizer:
        """The dtok tokenizer for the wrapped tokenizer as it is now (rebuilt after tokens were
        added or its post-processor changed)."""
        if self._state() != self._fingerprint:  # tokens added, post-processor changed, ...
            self._rebuild()
        return self.dtok

    def _ours(self, kwargs: dict) -> bool:
        for key, value in kwargs.items():
            if key == "return_tensors" or key == "return_attention_mask":
                continue
            if key not in _NEUTRAL or not any(value is v or value == v for v in _NEUTRAL[key]):
                return False
        return not getattr(self.hf, "split_special_tokens", False)

    # --- the API that goes through dtok ------------------------------------------------------

    def encode(self, text, text_pair=None, add_special_tokens: bool = True, *,
               session: Hashable | None = None, **kwargs) -> list[int]:
        """``transformers``' ``encode``: a list of IDs (dtok for one str without extras)."""
        if isinstance(text, str) and text_pair is None and self._ours(kwargs) \
                and kwargs.get("return_tensors") is None:
            return list(self.current().encode(text, session=session,
                                              add_special_tokens=add_special_tokens))
        return self.hf.encode(text, text_pair, add_special_tokens=add_special_tokens, **kwargs)

    def __call__(self, text=None, text_pair=None, add_special_tokens: bool = True, *,
                 session: Hashable | list | None = None, **kwargs):
        """``transformers``' ``__call__``: a BatchEncoding with input_ids and attention_mask.

        ``session`` is a key for one text, or a list of keys (or None) for a batch."""
        batch = isinstance(text, (list, tuple))
        texts = list(text) if batch else [text]
        if (text is None or text_pair is not None or kwargs.get("text_target") is not None
                or not all(isinstance(t, str) for t in texts) or not self._ours(kwargs)):
            return self.hf(text, text_pair, add_special_tokens=add_special_tokens, **kwargs)
        from transformers import BatchEncoding

        tok = self.current()
        keys = session if batch and isinstance(session, (list, tuple)) else [session] * len(texts)
        if len(keys) != len(texts):
            raise ValueError("session: one key per text")
        if all(k is None for k in keys):
            ids = [list(v) for v in tok.encode_batch(texts, add_special_tokens=add_special_tokens)]
        else:
            ids = [list(tok.encode(t, session=k, add_special_tokens=add_special_tokens))
                   for t, k in zip(texts, keys)]
        data: dict[str, Any] = {"input_ids": ids}
        want_mask = kwargs.get("return_attention_mask")
        if want_mask or (want_mask is None and "attention_mask" in self.hf.model_input_names):
            data["attention_mask"] = [[1] * len(x) for x in ids]
        tensors = kwargs.get("return_tensors")
        if tensors is not None and len({len(x) for x in ids}) > 1:
            # ragged batch: transformers pads (or raises) here; let it decide
            return self.hf(text, text_pair, add_special_tokens=add_special_tokens, **kwargs)
        if not batch and tensors is None:
            data = {k: v[0] for k, v in data.items()}
        return BatchEncoding(data, tensor_type=tensors)

    def encode_plus(self, text, text_pair=None, add_special_tokens: bool = True, **kwargs):
        return self(text, text_pair, add_special_tokens=add_special_tokens, **kwargs)

    def batch_encode_plus(self, batch_text_or_text_pairs, add_special_tokens: bool = True,
                          **kwargs):
        return self(list(batch_text_or_text_pairs), add_special_tokens=add_special_tokens,
                    **kwargs)

    # --- everything else -----------------------------------------------------------------

    def __getattr__(self, name: str):
        return getattr(self.hf, name)

    def __len__(self) -> int:
        return len(self.hf)

    def __repr__(self) -> str:
        return f"<dtok wrapper of {type(self.hf).__name__} ({self.dtok!r})>"
