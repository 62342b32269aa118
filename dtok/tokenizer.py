"""The public :class:`Tokenizer`: the reference's IDs, faster on long texts.

The parts it puts together follow the data flow: :mod:`dtok.loading` (the reference, admission,
cut rules and fast encoders of a file), :mod:`dtok.knobs`, :mod:`dtok.chunking` (the stateless
route's cuts), :mod:`dtok.chunk_encoder` (the encoder of chunks), :mod:`dtok.repair` (the
continuation planner) and :mod:`dtok.sessions` (the session store).
"""
from __future__ import annotations

import os
import time
from typing import Any, Hashable, NamedTuple, Sequence

from dtok.admission import Admission, TokenizerFiles, bundled_files, read_files
from dtok.chunking import Chunker, split_at
from dtok.knobs import KNOBS, validate
from dtok.loading import LoadedFile, fast_parts_from_cache, load
from dtok.chunk_encoder import ChunkEncoder
from dtok.planning import Planning
from dtok.repair import PlanKnobs, Planner
from dtok.sessions import LOOKUP_MIN_CHARS, SessionStore, scoped_key
from dtok_ext.buffers import IdBuffer, ids_from_list
from dtok_ext.cuts import CutRules, VERDICT_AT_SPECIAL

__all__ = ["Tokenizer", "KNOBS"]


class Tokenizer:
    """Exact tokenizer: ``list(tok.encode(x)) == reference.encode(x).ids`` for every text.

    Long texts of admitted files are cut at provably safe positions and the chunks encoded on
    several threads; everything else goes to the reference whole. Results are read-only int32
    memoryviews: ``numpy.frombuffer`` wraps one without a copy.

    >>> tok = Tokenizer.default()
    >>> ids = tok.encode("Hello, world!")
    >>> ids.format, list(ids) == tok.reference.encode("Hello, world!").ids
    ('i', True)
    >>> import numpy as np
    >>> arr = np.frombuffer(ids, dtype=np.int32)  # shares the IDs' memory, read-only
    >>> arr.tolist(), arr.flags.writeable, np.shares_memory(arr, np.asarray(ids))
    ([9707, 11, 1879, 0], False, True)
    >>> tok.admission.admitted, tok.admission.family
    (True, 'qwen2')
    """

    # --- construction ---------------------------------------------------------------------

    def __init__(self, files: TokenizerFiles | str | os.PathLike, **knobs: Any) -> None:
        """``files``: a ``tokenizer.json`` path, a directory holding one (and maybe
        ``tokenizer_config.json``), or :class:`~dtok.admission.TokenizerFiles`.

        >>> from dtok.admission import bundled_files
        >>> Tokenizer(bundled_files().path).admission.family
        'qwen2'
        """
        knobs = validate(knobs)  # fail fast, before reading a large file
        # a file read here is handed over to load, which lets its bytes go once the fast
        # encoders' copy is made (a load's peak lower by the file's size)
        self._assemble(load(files if isinstance(files, TokenizerFiles) else read_files(files),
                            knobs["encoder"], knobs["encode_special_tokens"],
                            knobs["guard_probes"]), knobs)

    def _assemble(self, loaded: LoadedFile, knobs: dict[str, Any]) -> None:
        """The per-instance parts that the knobs decide, over the loaded ones."""
        self._loaded = loaded
        self.knobs = knobs
        self.files = loaded.files  # without the JSON bytes (see tokenizer_json)
        self.reference = loaded.reference  # the real tokenizers.Tokenizer
        self.admission: Admission = loaded.admission
        self._rules = loaded.rules  # dtok_ext.cuts.CutRules; None: not admitted
        self.encoder_notes = list(loaded.notes)
        self._chunker = Chunker(self._rules, knobs)
        self._chunk_encoder = ChunkEncoder(loaded, knobs, self._chunker)
        self.threads = self._chunk_encoder.threads
        self._planner = Planner(
            self._rules, PlanKnobs(knobs["scan_budget"][-1], knobs["anchor_spacing"],
                                  knobs["edit_budget"]), self._chunk_encoder.stateless_cuts)
        self.planning = Planning(  # the pool's door
            self._planner, self._chunk_encoder, self._chunker, loaded.upgrade)
        self.sessions = SessionStore(
            self._chunk_encoder, self._planner, max_sessions=knobs["max_sessions"],
            session_bytes=knobs["session_bytes"], lookup_entries=knobs["lookup_entries"],
            content_lookup=knobs["content_lookup"], whole_below=knobs["session_whole_below"])

    @classmethod
    def from_file(cls, path: str | os.PathLike, **knobs: Any) -> "Tokenizer":
        """Load a ``tokenizer.json`` (or a directory holding one and maybe tokenizer_config.json)."""
        return cls(path, **knobs)

    @classmethod
    def default(cls, **knobs: Any) -> "Tokenizer":
        """The bundled Qwen3 tokenizer (Apache-2.0)."""
        validate(knobs)
        return cls(bundled_files(), **knobs)

    def with_knobs(self, **knobs: Any) -> "Tokenizer":
        """A tokenizer for the same file with other knobs and its own (empty) session state;
        the loaded reference and tables are shared, so this is cheap."""
        merged = validate({**self.knobs, **knobs})
        if (merged["encoder"] != "reference" and self._loaded.fast is None
                and self.admission.admitted and self.knobs["encoder"] == "reference") \
                or merged["encode_special_tokens"] != self._loaded.encode_special_tokens:
            # the fast encoder was never loaded, or the reference's switch differs: load the
            # file again from the reference's JSON (same SHA-256 of the original bytes, so the
            # same guard table)
            return Tokenizer(self.files.with_raw(self.tokenizer_json()), **merged)
        clone = object.__new__(Tokenizer)
        clone._assemble(self._loaded, merged)
        return clone

    def tokenizer_json(self) -> bytes:
        """The loaded reference serialized as tokenizer.json (UTF-8 bytes). dtok does not keep
        the file's own bytes; ``admission.sha256`` is still the SHA-256 of those."""
        return self.reference.to_str().encode("utf-8")

    @property
    def encoder(self):
        """The encoder of admitted text (``.name``: "fastokens", "gigatoken" or "reference")."""
        return self._chunk_encoder.general.encoder

    def close(self) -> None:
        """Stop the encoder threads (they are also stopped when the tokenizer is collected)."""
        self._chunk_encoder.close()

    def __enter__(self) -> "Tokenizer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- encoding -------------------------------------------------------------------------

    def encode(self, text: str, *, session: Hashable | None = None,
               add_special_tokens: bool = True, scope: Hashable | None = None) -> memoryview:
        """IDs of ``text``, exactly as ``reference.encode(text, add_special_tokens=...).ids``.

        Special tokens, the reference's policy on every route:

        * ``add_special_tokens=True`` (the default, as the reference's): the post-processor's
          tokens go around the text (Llama 3's BOS; Qwen3 adds none). False: the text's alone.
        * Added-token strings in ``text`` (e.g. ``<|im_start|>``), special or not, become their
          IDs, whatever ``add_special_tokens`` says: text from an untrusted user can carry the
          chat format's control tokens. The knob ``encode_special_tokens=True`` (the reference's
          switch) makes the strings of tokens marked special plain text, in sessions and pools
          too; added tokens not marked special still match.

        With ``session=key``, the text and IDs are kept: when the next text for the key extends
        the stored one, only a short tail is re-encoded. Without a key, texts of ``LOOKUP_MIN_CHARS``
        (4096) characters or more are looked up by content (knob ``content_lookup``).
        ``scope`` (a tenant: e.g. a serving engine's ``cache_salt`` and model) keeps sessions and
        content lookup apart: the same key in another scope is another session, and a text is
        only continued from one stored under its scope.

        >>> tok = Tokenizer.default()
        >>> list(tok.encode("<|im_start|>user\\nhi<|im_end|>"))
        [151644, 872, 198, 6023, 151645]
        >>> turn1 = "<|im_start|>user\\nHello there<|im_end|>\\n" * 300  # (shorter: encoded whole)
        >>> a = tok.encode(turn1, session="chat-1")
        >>> b = tok.encode(turn1 + "<|im_start|>assistant\\nHi!", session="chat-1")
        >>> list(b)[: len(a)] == list(a), tok.sessions.stats()["repairs"]
        (True, 1)
        >>> plain = tok.with_knobs(encode_special_tokens=True)
        >>> list(plain.encode("<|im_start|>user"))
        [27, 91, 318, 4906, 91, 29, 872]
        """
        if self._straight_to_store(text, session, add_special_tokens, scope):
            # (never None without max_chars: a view)
            return self.sessions.encode_keyed(  # type: ignore[return-value]
                text, session, add_special_tokens)
        return self._encode(text, session, add_special_tokens, False, scope)

    def encode_list(self, text: str, *, session: Hashable | None = None,
                    add_special_tokens: bool = True, scope: Hashable | None = None) -> list[int]:
        """:meth:`encode` as a ``list[int]`` (what serving engines take). For a session (or a
        content-lookup entry) the list is kept and updated for the changed IDs only, in place
        when nobody else holds it; a list held elsewhere never changes.

        >>> tok = Tokenizer.default()
        >>> tok.encode_list("Hello, world!")
        [9707, 11, 1879, 0]
        """
        if self._straight_to_store(text, session, add_special_tokens, scope):
            # (never None without max_chars: the session's list)
            return self.sessions.encode_keyed(  # type: ignore[return-value]
                text, session, add_special_tokens, True)
        return self._encode(text, session, add_special_tokens, True, scope)

    def _straight_to_store(self, text: Any, session: Hashable | None, add_special_tokens: Any,
                           scope: Hashable | None) -> bool:
        """A keyed turn of well-typed input on an admitted file, the call a server makes most:
        it goes straight to the session store (anything else through :meth:`_encode`)."""
        return session is not None and scope is None and type(text) is str \
            and type(add_special_tokens) is bool and self._rules is not None

    def try_encode_list(self, text: str, *, max_chars: int, session: Hashable | None = None,
                        add_special_tokens: bool = True, scope: Hashable | None = None
                        ) -> list[int] | None:
        """:meth:`encode_list` where the answer costs at most ``max_chars`` characters of
        encoding (a fast encoder's characters; the reference's count a hundred each) and waits
        for nobody (a session busy with another request); else None, and nothing changed. For
        an event loop: a session's next turn re-encodes a short tail and is answered at once,
        where a long first turn is left to a thread (:meth:`encode_list` there).

        >>> tok = Tokenizer.default()
        >>> turn = "<|im_start|>user\\n" + "Tell me about tokenizers. " * 400
        >>> tok.try_encode_list(turn, max_chars=4096, session="s") is None  # 10K chars to encode
        True
        >>> first = tok.encode_list(turn, session="s")
        >>> ids = tok.try_encode_list(turn + "More.", max_chars=4096, session="s")
        >>> ids == tok.reference.encode(turn + "More.").ids, tok.sessions.stats()["repairs"]
        (True, 1)
        """
        return self._encode(text, session, add_special_tokens, True, scope, max_chars)

    def _encode(self, text, session, add_special_tokens, as_list, scope=None, max_chars=None):
        """:meth:`encode` (``as_list``: :meth:`encode_list`); ``max_chars``: see
        :meth:`try_encode_list`."""
        if type(text) is not str or type(add_special_tokens) is not bool or self._rules is None:
            if max_chars is not None:
                return None  # the reference decides (and raises what it raises) in the caller's
                # ordinary route
            view = memoryview(self._chunk_encoder.encode_by_reference(text, add_special_tokens))
            return view.tolist() if as_list else view
        if session is not None:
            return self.sessions.encode_keyed(text, scoped_key(session, scope),
                                              add_special_tokens, as_list, max_chars)
        if self.sessions.content_lookup and len(text) >= LOOKUP_MIN_CHARS:
            return self.sessions.encode_lookup(text, add_special_tokens, as_list, scope,
                                               max_chars)
        if max_chars is not None and self._chunk_encoder.encoding_cost(len(text)) > max_chars:
            return None
        view = self._chunk_encoder.encode_view(text, add_special_tokens)
        return view.tolist() if as_list else view

    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool = True
                     ) -> list[memoryview]:
        """:meth:`encode` for each text; the short ones are encoded together in one call.

        >>> tok = Tokenizer.default()
        >>> [list(v) for v in tok.encode_batch(["a b", "c"])]
        [[64, 293], [66]]
        """
        if (self._rules is None or not isinstance(texts, (list, tuple))
                or type(add_special_tokens) is not bool or any(type(t) is not str for t in texts)):
            # Not admitted, or pairs, odd sequences and bad items: the reference decides (and
            # raises its errors).
            encs = self.reference.encode_batch_fast(texts, add_special_tokens=add_special_tokens)
            return [memoryview(ids_from_list(e.ids)) for e in encs]
        a = self.admission
        prefix, suffix = (a.prefix, a.suffix) if add_special_tokens else ((), ())
        out: list[memoryview | None] = [None] * len(texts)
        short = [i for i, t in enumerate(texts) if len(t) < self.knobs["chunk_threshold"]]
        parts = self._chunk_encoder.encode_texts([texts[i] for i in short], batch=True)
        for i, chunk_parts in zip(short, parts):
            out[i] = memoryview(IdBuffer.concat(chunk_parts, prefix, suffix))
        for i, text in enumerate(texts):
            if out[i] is None:
                out[i] = self.encode(text, add_special_tokens=add_special_tokens)
        return out  # type: ignore[return-value]

    # --- decoding -------------------------------------------------------------------------

    def decode(self, ids: Sequence[int] | memoryview, skip_special_tokens: bool = True) -> str:
        """The text of ``ids``, exactly as ``reference.decode(ids, skip_special_tokens)``: the
        reference's decoder does it. ``ids``: a result of :meth:`encode` or :meth:`encode_list`,
        or any sequence of ints. ``skip_special_tokens`` (the reference's default, True) drops
        the tokens marked special, e.g. ``<|im_start|>``; added tokens not marked special stay.

        >>> tok = Tokenizer.default()
        >>> tok.decode(tok.encode("Hello, world!"))
        'Hello, world!'
        >>> ids = tok.encode_list("<|im_start|>user\\nhi<|im_end|>")
        >>> tok.decode(ids), tok.decode(ids, skip_special_tokens=False)
        ('user\\nhi', '<|im_start|>user\\nhi<|im_end|>')
        >>> tok.decode(tok.encode("<tool_call>{}</tool_call><|im_end|>"))  # added, not special
        '<tool_call>{}</tool_call>'
        """
        return self.reference.decode(_id_list(ids), skip_special_tokens=skip_special_tokens)

    def decode_batch(self, sequences: Sequence[Sequence[int] | memoryview],
                     skip_special_tokens: bool = True) -> list[str]:
        """:meth:`decode` for each sequence, exactly as ``reference.decode_batch``.

        >>> tok = Tokenizer.default()
        >>> tok.decode_batch(tok.encode_batch(["a b", "c"]))
        ['a b', 'c']
        """
        if isinstance(sequences, (list, tuple)):
            sequences = [_id_list(ids) for ids in sequences]
        return self.reference.decode_batch(sequences, skip_special_tokens=skip_special_tokens)

    # --- introspection --------------------------------------------------------------------

    def explain(self, text: str, *, session: Hashable | None = None,
                scope: Hashable | None = None) -> dict[str, Any]:
        """Which route ``encode(text)`` takes, where it cuts, and why (changes no state).

        >>> Tokenizer.default().explain("short text")["route"]
        'whole'
        """
        info: dict[str, Any] = {
            "chars": len(text) if isinstance(text, str) else None,
            "admitted": self.admission.admitted,
            "family": self.admission.family,
            "encoder": self.encoder.name,
            "cuts": [],
        }
        if self._loaded.upgrade is not None:
            info["probes"] = self.probes()
        specialist = self._chunk_encoder.specialist
        if specialist is not None:  # chunk_routes' "fast" is then either fast encoder
            info["second_encoder"] = specialist.encoder.name
            info["second_classes"] = sorted(self._chunk_encoder.specialist_classes)
        if type(text) is not str:
            return {**info, "route": "reference", "why": "not a str: the reference decides"}
        if self._rules is None:
            return {**info, "route": "reference",
                    "why": "not admitted: " + "; ".join(self.admission.reasons)}
        if session is not None or self.sessions.content_lookup:
            found = self.sessions.explain(  # a continuation, or only a note
                text, None if session is None else scoped_key(session, scope), scope)
            if "route" in found:
                return {**info, **found}
            info.update(found)
        n = len(text)
        if n < self.knobs["chunk_threshold"]:
            return {**info, "route": "whole", "chunk_routes": self._chunk_encoder.routes([text]),
                    "why": f"{n} chars < chunk_threshold {self.knobs['chunk_threshold']}"}
        k = self._chunk_encoder.chunk_count(text)
        t0 = time.perf_counter()
        cuts = self._chunker.cuts(text, k)
        plan_ms = (time.perf_counter() - t0) * 1e3
        bounds = [0, *cuts, n]
        info.update(
            requested_chunks=k, cuts=cuts, plan_ms=round(plan_ms, 3),
            chunk_chars=[b - a for a, b in zip(bounds, bounds[1:])],
            cut_kinds=[("special-token boundary"
                        if self._rules.is_safe(text, c) == VERDICT_AT_SPECIAL
                        else "class transition") for c in cuts],
        )
        chunks = split_at(text, cuts)
        info["chunk_routes"] = self._chunk_encoder.routes(chunks)
        if not cuts:
            why = (f"one piece: {n} chars fit the chunk length aimed at" if k == 1
                   else "no safe cut within the scan budget")
            return {**info, "route": "whole", "why": why}
        routes = info["chunk_routes"]
        n_ref = sum(r != "fast" for r in routes)
        why = f"{len(routes)} chunks on {self._chunk_encoder.split_threads(chunks)} thread(s)"
        if self.encoder is not self._chunk_encoder.reference:
            why += f", {n_ref} of them with stretches on the reference"
        return {**info, "route": "chunked", "why": why}

    def stats(self) -> dict[str, Any]:
        """The encoder in use, why, and how many stretches each encoder took so far (the keys
        ``*_pieces``)."""
        specialist = self._chunk_encoder.specialist
        upgrade = self._loaded.upgrade
        notes = self.encoder_notes + (upgrade.notes if upgrade is not None else [])
        return {"encoder": self.encoder.name, "notes": notes,
                "second_encoder": specialist.encoder.name if specialist else None,
                "second_classes": sorted(self._chunk_encoder.specialist_classes),
                "probes": self.probes(), **self._chunk_encoder.counts()}

    def probes(self, wait: float | None = None) -> dict[str, Any]:
        """The guard probes of a file that no guard table covered at load (:mod:`dtok.probes`):
        ``state`` "none" (none were needed, or ``guard_probes="off"``), "running" (with
        ``progress``), "done" (the fast encoder serves since) or "failed" (``error``; the
        reference goes on serving). ``wait``: seconds to wait for them to end first.

        >>> Tokenizer.default().probes()
        {'state': 'none'}
        """
        upgrade = self._loaded.upgrade
        if upgrade is None:
            return {"state": "none"}
        return upgrade.status(wait)

    def reload_guards(self) -> bool:
        """Take the fast encoder if the cache now holds a guard table for this file (written
        since the load by ``dtok guards PATH`` or another process's probes); whether the fast
        encoder serves now. Both encoders give the reference's IDs: a call in flight is exact
        whichever it meets, and sessions keep their state.

        >>> Tokenizer.default().reload_guards()
        True
        """
        if self.encoder is not self._chunk_encoder.reference:
            return True
        if self.knobs["encoder"] == "reference":
            return False
        parts, notes = fast_parts_from_cache(self._loaded)
        if parts is None:
            return False
        self.encoder_notes += notes
        self._chunk_encoder.take_fast(parts)
        return True

    def __repr__(self) -> str:
        a = self.admission
        state = f"family={a.family}" if a.admitted else "not admitted"
        return f"<dtok.Tokenizer {self.files.path} {state} encoder={self.encoder.name}>"


class TokenizerParts(NamedTuple):
    """A tokenizer's private parts, for tests, benches and tools (:func:`parts_of`): the loaded
    file, the load's cut rules (None: not admitted), the chunker, the chunk encoder and the
    continuation planner. The objects the tokenizer uses, not copies."""

    loaded: LoadedFile
    rules: CutRules | None
    chunker: Chunker
    chunk_encoder: ChunkEncoder
    planner: Planner


def parts_of(tok: Tokenizer) -> TokenizerParts:
    """The parts of ``tok``: the one door tests, benches and tools go through to reach inside a
    tokenizer (production code asks through :attr:`Tokenizer.planning` and the public methods).

    >>> parts = parts_of(Tokenizer.default())
    >>> parts.rules is not None, parts.chunk_encoder.general.encoder.name != "reference"
    (True, True)
    """
    return TokenizerParts(tok._loaded, tok._rules, tok._chunker, tok._chunk_encoder, tok._planner)


def _id_list(ids: Any) -> Any:
    """A memoryview of IDs as the list the reference takes; anything else as given, so that
    the reference decides (and raises its errors)."""
    return ids.tolist() if isinstance(ids, memoryview) else ids
