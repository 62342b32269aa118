"""Guards for the fast encoder, derived from the reference by probing, per tokenizer file.

A fast encoder is trusted with a piece of text only where it has been shown to agree with the
reference. At build time every code point (surrogates excepted) is encoded in several contexts by
both; the code points where they ever disagree form the file's guard set, one bit in its class
table (bit 7, which already holds the code points the reference's regex engine treats as
unassigned). At run time a chunk containing a guard character, or (NFC files) text that NFC would
change, goes to the reference; only that chunk.

Probes are batched: the probe strings of a block are joined with one of the file's special added
tokens, which both encoders match before anything else, so each probe is encoded independently
inside one long text; a block whose flat ID arrays differ is compared probe by probe. The build
also checks every vocabulary entry's text through both encoders (vocabulary, merges, pattern).

Guard tables are keyed by the file's SHA-256 and the ``tokenizers`` and ``fastokens`` versions;
the four test files' tables ship in ``dtok/data/guards`` (built by ``tools/build_guards.py``),
others are built on request (``encoder="fast"`` or ``dtok guards PATH``: minutes) into the cache.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from dtok import tables
from dtok.encoders import FastEncoder, FastEncoderError

SCHEMA = 1
CONTEXTS = ("a{c}b", " {c}", "{c}{c}", "1{c}", "{c}a", "'{c}", "A{c}b", " {c}a")
BUNDLED_DIR = Path(__file__).parent / "data" / "guards"
_BLOCK = 8192


@dataclass(frozen=True)
class GuardTable:
    sha256: str
    tokenizers: str
    fastokens: str
    disagree: tuple[int, ...]  # code points where the probes found a difference
    checked: dict  # what the build compared
    source: str


def _file_name(sha256: str, fast_version: str) -> str:
    return (f"{sha256[:16]}-tokenizers{tables.tokenizers_version()}-fastokens{fast_version}"
            f"-schema{SCHEMA}.json")


def load(sha256: str, fast_version: str) -> GuardTable | None:
    """The guard table for this file and these versions, if one was built."""
    name = _file_name(sha256, fast_version)
    for path in (BUNDLED_DIR / name, tables.cache_dir() / "guards" / name):
        if path.exists():
            d = json.loads(path.read_text())
            if d.get("sha256") != sha256:
                continue
            return GuardTable(d["sha256"], d["tokenizers"], d["fastokens"],
                              tuple(d["disagree"]), d["checked"], str(path))
    return None


def build(reference, fast: FastEncoder, sha256: str, out_dir: Path | None = None,
          progress: Callable[[str], None] | None = None) -> GuardTable:
    """Probe every code point through both encoders and check the vocabulary; write the table."""
    say = progress or (lambda msg: None)
    t0 = time.time()
    checked = {"vocab_strings": check_vocabulary(reference, fast)}
    say(f"vocabulary: {checked['vocab_strings']} entries agree ({time.time() - t0:.0f} s)")
    disagree: dict[int, list[str]] = {}
    sep = _separator(reference)
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    for ctx in CONTEXTS:
        for cp, _ in _probe_context(reference, fast, ctx, cps, sep):
            disagree.setdefault(cp, []).append(ctx)
        say(f"context {ctx!r}: {len(disagree)} code points disagree so far "
            f"({time.time() - t0:.0f} s)")
    checked.update(code_points=len(cps), contexts=list(CONTEXTS), seconds=round(time.time() - t0))
    table = GuardTable(sha256, tables.tokenizers_version(), fast.version,
                       tuple(sorted(disagree)), checked, "")
    out = out_dir or tables.cache_dir() / "guards"
    out.mkdir(parents=True, exist_ok=True)
    path = out / _file_name(sha256, fast.version)
    payload = {"sha256": sha256, "tokenizers": table.tokenizers, "fastokens": table.fastokens,
               "disagree": list(table.disagree),
               "disagree_contexts": {f"{c:04X}": v for c, v in sorted(disagree.items())},
               "checked": checked}
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)
    return GuardTable(**{**table.__dict__, "source": str(path)})


def _separator(reference) -> str | None:
    for tok in reference.get_added_tokens_decoder().values():
        if tok.special and tok.content:
            return tok.content
    return None


def _probe_context(reference, fast, ctx: str, cps: list[int], sep: str | None):
    """Yield (code point, context) where the two encoders disagree."""
    for k in range(0, len(cps), _BLOCK):
        block = cps[k : k + _BLOCK]
        probes = [ctx.replace("{c}", chr(c)) for c in block]
        if sep is not None:
            joined = sep.join(probes)
            want = reference.encode_batch_fast([joined], add_special_tokens=False)[0].ids
            if fast.encode(joined).tolist() == want:
                continue
        want_each = [e.ids for e in reference.encode_batch_fast(probes, add_special_tokens=False)]
        got_each = [p.tolist() for p in fast.encode_many(probes)]
        bad = [c for c, a, b in zip(block, want_each, got_each) if a != b]
        if sep is not None and not bad:
            raise FastEncoderError(f"added-token splitting differs from the reference ({ctx!r})")
        for c in bad:
            yield c, ctx


def check_vocabulary(reference, fast: FastEncoder) -> int:
    """Every vocabulary entry's text (decoded) encodes the same through both encoders."""
    n = reference.get_vocab_size(with_added_tokens=True)
    texts = []
    for i in range(n):
        text = reference.decode([i], skip_special_tokens=False)
        if text:
            texts.append(text)
    for k in range(0, len(texts), _BLOCK):
        chunk = texts[k : k + _BLOCK]
        want = [e.ids for e in reference.encode_batch_fast(chunk, add_special_tokens=False)]
        got = [p.tolist() for p in fast.encode_many(chunk)]
        for text, a, b in zip(chunk, want, got):
            if a != b:
                raise FastEncoderError(f"vocabulary text {text!r} encodes as {b}, reference {a}")
    return len(texts)


def guarded_table(family_table: bytes, guard: GuardTable) -> bytes:
    """The family's class table with this file's disagreeing code points added to the guard."""
    if not guard.disagree:
        return family_table
    t = bytearray(family_table)
    for cp in guard.disagree:
        t[cp] |= tables.FAST_GUARD
    return bytes(t)
