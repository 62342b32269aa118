"""Guards for the fast encoder, derived from the reference by probing, per tokenizer file.

A fast encoder is trusted with a stretch of text only where it has been shown to agree with the
reference. At build time every code point (surrogates excepted) is encoded in several contexts by
both; the code points where they ever disagree form the file's guard set, one bit in its class
table (bit 7, which already holds the code points the reference's regex engine treats as
unassigned). At run time a chunk containing a guard character, or (NFC files) text that NFC would
change, goes to the reference; only that chunk.

Probes are batched: the probe strings of a block are joined with one of the file's special added
tokens, which both encoders match before anything else, so each probe is encoded independently
inside one long text; a block whose flat ID arrays differ is compared probe by probe. The build
also checks every vocabulary entry's text through both encoders (vocabulary, merges, pattern).

**NFC (schema 2).** For a file whose normalizer is NFC, a stretch of text NFC would change used to
go to the reference in short stretches around each such spot. The build now also proves, by
probing, that the fast encoder's own NFC gives the reference's result on every input made of
non-guard characters; a table that records ``nfc.agrees`` lets such text go to the fast encoder
whole (:func:`prove_nfc`). The argument, for an implementation of UAX #15 (full canonical
decomposition, canonical ordering by combining class, canonical composition with blocking):
the output is a function of three tables (decomposition mappings, combining classes,
primary composites) and of the algorithm. Both encoders are made to normalize, and their results
compared (the fast encoder's IDs decoded back to text, against the reference normalizer):

* every code point alone and in eight contexts (the code-point probes above);
* every ordered pair of NFC non-anchors (``x y``: the canonical-ordering relation of every two
  non-starters, and every composition of two non-anchors); canonical ordering is a stable sort
  fixed by that pairwise relation, so runs of any length order alike;
* the full canonical decomposition ``d`` of every code point that has one (from the reference's
  NFD and from Python's ``unicodedata``, used only to enumerate candidates), alone, followed and
  preceded by a mark of every combining class, and with such a mark inserted at every position
  (primary composites, composition exclusions, blocking), and the code point itself followed by
  each such mark (its decomposition as seen through reordering);
* every Hangul L+V, LV+T and L+V+T sequence.

Compositions that neither source of candidates knows could only involve code points newer than
both; those (assigned for the reference's regex engine, unassigned for ``unicodedata``; not
the noncharacters, assigned in no version) are listed as ``nfc.unprobed`` and become guard
characters wherever the proof is used. Anchors
(:func:`dtok.tables.nfc_anchor_mask`) are where the reference normalizer splits; nothing here
changes the safe-cut predicate, only which encoder takes a stretch. The control
(``tests/test_fast.py``) runs the same probes against a fastokens built from the file without
its normalizer, which they must reject, and forces the proof onto that encoder, which the
battery must catch.

Where the proof finds disagreements (gigatoken: its normalization data differs from the
reference's for some marks), the code points that the failing probes share are added to the
guard set and the proof runs again over the remaining characters (``nfc.guarded``,
``nfc.rounds``), until it passes or ``NFC_ROUNDS`` is spent (then ``nfc.agrees`` is false and
the encoder is not used for that file).

Guard tables are keyed by the file's SHA-256 and the ``tokenizers`` and ``fastokens`` versions;
the test files' tables ship in ``dtok/data/guards`` (built by ``tools/data/build_guards.py``),
others are built on request (``encoder="fast"`` or ``dtok guards PATH``: minutes) into the cache.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping, NamedTuple

from dtok import tables
from dtok.encoders import FastEncoder, FastEncoderError

SCHEMA = 2
NFC_ROUNDS = 4  # proofs run, guarding what the failures of the last one share
CONTEXTS = ("a{c}b", " {c}", "{c}{c}", "1{c}", "{c}a", "'{c}", "A{c}b", " {c}a")
BUNDLED_DIR = Path(__file__).parent / "data" / "guards"
_BLOCK = 8192


_EMPTY: Mapping[str, Any] = MappingProxyType({})  # a read-only empty default (the tables are never changed)


class GuardTable(NamedTuple):
    """What one fast encoder's probes found on one file under one ``tokenizers`` version."""

    sha256: str
    tokenizers: str
    fastokens: str  # the fast encoder's version (the field keeps its first encoder's name)
    disagree: tuple[int, ...]  # code points where the probes found a difference
    checked: dict  # what the build compared
    source: str
    nfc: Mapping[str, Any] = _EMPTY  # the NFC proof: agrees, probes, unprobed, failures
    encoder: str = "fastokens"  # which fast encoder the probes ran ("fastokens", "gigatoken")
    # measured after the build (tools/data/build_guards.py): gigatoken's "ratio" to fastokens
    # by text class; fastokens' "long_piece": whole 1M-character documents against cut ones
    speed: Mapping[str, Any] = _EMPTY

    @property
    def nfc_proven(self) -> bool:
        """The probes showed the fast encoder normalizes (NFC) as the reference does."""
        return bool(self.nfc.get("agrees"))


def file_name(sha256: str, fast_version: str, encoder: str = "fastokens") -> str:
    """The guard table's file name: the file's SHA-256 prefix, the tokenizers version, the
    fast encoder and its version, the schema."""
    return (f"{sha256[:16]}-tokenizers{tables.tokenizers_version()}-{encoder}{fast_version}"
            f"-schema{SCHEMA}.json")


def exists(sha256: str, fast_version: str, encoder: str = "fastokens") -> bool:
    """Whether a guard table for this file, these versions and this encoder ships or is cached
    (without reading it)."""
    name = file_name(sha256, fast_version, encoder)
    return (BUNDLED_DIR / name).exists() or (tables.cache_dir() / "guards" / name).exists()


def load(sha256: str, fast_version: str, encoder: str = "fastokens", folder: str = ""
         ) -> GuardTable | None:
    """The guard table for this file, these versions and this fast encoder, if one was built
    (``folder``: a subfolder of the shipped and cached tables, e.g. ``pipelines``)."""
    name = file_name(sha256, fast_version, encoder)
    for path in (BUNDLED_DIR / folder / name, tables.cache_dir() / "guards" / folder / name):
        if path.exists():
            d = json.loads(path.read_text())
            if d.get("sha256") != sha256 or d.get("encoder", "fastokens") != encoder:
                continue
            return GuardTable(d["sha256"], d["tokenizers"], d[encoder],
                              tuple(d["disagree"]), d["checked"], str(path), d.get("nfc", {}),
                              encoder, d.get("speed", {}))
    return None


def build(reference, fast: FastEncoder, sha256: str, out_dir: Path | None = None,
          progress: Callable[[str], None] | None = None, nfc_family: str | None = None,
          code_points_from: Path | None = None, speed: dict | None = None) -> GuardTable:
    """Probe every code point through both encoders and check the vocabulary; for an NFC file
    (``nfc_family``: its pre-tokenizer family, whose class table holds the NFC anchors) also
    run the NFC proof; write the table. ``code_points_from``: an existing table (any schema) for
    the same file and versions whose vocabulary and code-point results are reused. ``speed``:
    the encoder's measured ms per 1M characters by text class, recorded for routing."""
    say = progress or (lambda msg: None)
    t0 = time.time()
    disagree: dict[int, list[str]] = {}
    if code_points_from is not None:
        old = json.loads(Path(code_points_from).read_text())
        if (old["sha256"], old["tokenizers"], old.get(fast.name)) != (
                sha256, tables.tokenizers_version(), fast.version):
            raise ValueError(f"{code_points_from} is for another file or other versions")
        origin = old["checked"].get("reused_from", Path(code_points_from).name)
        checked = dict(old["checked"], reused_from=origin)  # where the probes really ran
        disagree = {int(k, 16): v for k, v in old.get("disagree_contexts", {}).items()}
        disagree.update({c: disagree.get(c, ["?"]) for c in old["disagree"]})
        say(f"code points and vocabulary reused from {code_points_from}")
    else:
        checked = {"vocab_strings": check_vocabulary(reference, fast)}
        say(f"vocabulary: {checked['vocab_strings']} entries agree ({time.time() - t0:.0f} s)")
        sep = separator(reference)
        cps = tables.code_points()
        for ctx in CONTEXTS:
            for cp, _ in probe_context(reference, fast, ctx, cps, sep):
                disagree.setdefault(cp, []).append(ctx)
            say(f"context {ctx!r}: {len(disagree)} code points disagree so far "
                f"({time.time() - t0:.0f} s)")
        checked.update(code_points=len(cps), contexts=list(CONTEXTS),
                       seconds=round(time.time() - t0))
    nfc: dict = {}
    if nfc_family is not None:
        family_table = tables.load(nfc_family).table
        nfc_guards: set[int] = set()
        rounds = []
        for _ in range(NFC_ROUNDS):
            guard_mask = _guard_mask(family_table, [*disagree, *nfc_guards])
            nfc = prove_nfc(reference, fast, family_table, guard_mask, say)
            failed = nfc.pop("failed")
            rounds.append(nfc["n_failures"])
            if not failed:
                break
            hit = _hitting_set(failed)
            say(f"NFC: {len(failed)} probes disagree; guarding the {len(hit)} code points "
                f"they share and proving again")
            nfc_guards |= hit
        if nfc_guards:
            for cp in nfc_guards:
                disagree.setdefault(cp, []).append("nfc")
            nfc["guarded"] = _ranges(sorted(nfc_guards))
            nfc["rounds"] = rounds
    return save(sha256, fast, disagree, checked, nfc, out_dir or tables.cache_dir() / "guards",
                speed)


def save(sha256: str, fast: FastEncoder, disagree: dict[int, list[str]], checked: dict,
         nfc: dict, out_dir: Path, speed: dict | None = None) -> GuardTable:
    """Write what the probes found (``disagree``: code point -> the contexts where the encoders
    differed) as the guard table of ``sha256`` for ``fast``'s version, into ``out_dir``."""
    table = GuardTable(sha256, tables.tokenizers_version(), fast.version,
                       tuple(sorted(disagree)), checked, "", nfc, fast.name, speed or {})
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / file_name(sha256, fast.version, fast.name)
    payload = {"sha256": sha256, "tokenizers": table.tokenizers, fast.name: table.fastokens,
               "disagree": list(table.disagree),
               "disagree_contexts": {f"{c:04X}": v for c, v in sorted(disagree.items())},
               "checked": checked, "nfc": nfc}
    if fast.name != "fastokens":
        payload["encoder"] = fast.name
    if speed:
        payload["speed"] = speed
    write_table(path, payload)
    return table._replace(source=str(path))


def write_table(path: Path, payload: dict) -> None:
    """Write a guard table's JSON (atomically: a reader sees the old file or the new one)."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    text = json.dumps(payload, indent=1)
    tmp.write_text(re.sub(r"\[\n\s+(\d+),\n\s+(\d+)\n\s+\]", r"[\1, \2]", text))  # runs on one line
    os.replace(tmp, path)


def _guard_mask(table: bytes, disagree) -> bytearray:
    mask = bytearray(0x110000)
    for cp in range(0x110000):
        if table[cp] & tables.FAST_GUARD:
            mask[cp] = 1
    for cp in disagree:
        mask[cp] = 1
    return mask


# --- the NFC proof ---------------------------------------------------------------------------

_NFC_BLOCK = 1 << 20  # characters per probe block
_HANGUL_L = [chr(c) for c in range(0x1100, 0x1113)]
_HANGUL_V = [chr(c) for c in range(0x1161, 0x1176)]
_HANGUL_T = [chr(c) for c in range(0x11A8, 0x11C3)]


class _Pairs:
    """Every ordered pair of the given characters, generated as it is read (13M for Qwen3)."""

    def __init__(self, chars: list[str]) -> None:
        self.chars = chars

    def __len__(self) -> int:
        return len(self.chars) ** 2

    def __iter__(self):
        return (x + y for x in self.chars for y in self.chars)


def nfc_probe_sets(table: bytes, guard: bytearray, say=lambda msg: None) -> tuple[dict, list]:
    """The NFC probe strings (see the module docstring) and the ``unprobed`` code points."""
    import unicodedata

    from tokenizers import normalizers

    nfd = normalizers.NFD()
    usable = [c for c in range(0x110000) if not guard[c]]
    non_anchor = [chr(c) for c in usable if not table[c] & tables.NFC_ANCHOR]
    # a mark of every combining class Python knows, plus starters that are marks or jamo
    by_class: dict[int, str] = {}
    for ch in non_anchor:
        by_class.setdefault(unicodedata.combining(ch), ch)
    reps = list(by_class.values()) + ["\u093e", "\u0b3e", "\u1161", "\u11a8", "a"]
    chars = [chr(c) for c in usable if c != 0x0A]
    ref_nfd = nfd.normalize_str("\n".join(chars)).split("\n")
    if len(ref_nfd) != len(chars):
        raise RuntimeError("NFD probe separators were not preserved")
    decomposed: dict[str, set[str]] = {}
    for ch, d in zip(chars, ref_nfd):
        for cand in (d, unicodedata.normalize("NFD", ch)):
            if cand != ch:
                decomposed.setdefault(ch, set()).add(cand)
    pairs = _Pairs(non_anchor)
    comp = []
    hangul_syllable = lambda ch: 0xAC00 <= ord(ch) <= 0xD7A3  # noqa: E731
    for ch, ds in decomposed.items():
        marks = reps[:6] if hangul_syllable(ch) else reps
        comp.append(ch)
        comp.extend(ch + r for r in marks)
        for d in ds:
            comp.append(d)
            comp.extend(d + r for r in marks)
            comp.extend(r + d for r in marks)
            for i in range(1, len(d)):
                comp.extend(d[:i] + r + d[i:] for r in marks)
    hangul = [l + v for l in _HANGUL_L for v in _HANGUL_V]
    hangul += [l + v + t for l in _HANGUL_L for v in _HANGUL_V for t in _HANGUL_T]
    hangul += [chr(s) + t for s in range(0xAC00, 0xD7A4, 28) for t in _HANGUL_T]
    never_assigned = frozenset(tables.NONCHARACTERS)  # no composition can ever involve them
    unprobed = [c for c in usable if c >= 0x80 and unicodedata.category(chr(c)) == "Cn"
                and c not in never_assigned]
    say(f"NFC probes: {len(pairs)} pairs of {len(non_anchor)} non-anchors, {len(comp)} "
        f"decomposition probes of {len(decomposed)} code points, {len(hangul)} Hangul; "
        f"{len(unprobed)} code points unknown to unicodedata {unicodedata.unidata_version}")
    return {"pairs": pairs, "decompositions": comp, "hangul": hangul}, unprobed


def nfc_disagreements(reference, encode, probes, normalize=None) -> list[str]:
    """The probes whose NFC differs: ``encode`` (text -> IDs, e.g. the fast encoder) decoded
    back to text by the reference, against the reference normalizer (or ``normalize``).
    Probes are joined by LF, which NFC never changes and never joins with a neighbour."""
    normalize = normalize or reference.normalizer.normalize_str
    bad: list[str] = []
    it = iter(probes)
    while True:
        block, size = [], 0
        for p in it:
            block.append(p)
            size += len(p) + 1
            if size >= _NFC_BLOCK:
                break
        if not block:
            return bad
        joined = "\n".join(block)
        want = normalize(joined)
        got = reference.decode(_ids(encode(joined)), skip_special_tokens=False)
        if got != want:
            w, g = want.split("\n"), got.split("\n")
            if len(w) == len(g) == len(block):
                bad += [p for p, a, b in zip(block, w, g) if a != b]
            else:  # one by one
                bad += [p for p in block if reference.decode(
                    _ids(encode(p)), skip_special_tokens=False) != normalize(p)]


def prove_nfc(reference, fast, table: bytes, guard: bytearray, say=lambda msg: None) -> dict:
    """Run the NFC probes (module docstring) through ``fast`` and the reference."""
    t0 = time.time()
    sets, unprobed = nfc_probe_sets(table, guard, say)
    failures: list[str] = []
    counts = {}
    outside = 0
    for name, probes in sets.items():
        bad = nfc_disagreements(reference, fast.encode, probes)
        counts[name] = len(probes)
        # a probe holding a guard character (a decomposition's part) is no input the proof
        # speaks for: text with it never reaches the fast encoder
        inside = [p for p in bad if not any(guard[ord(c)] for c in p)]
        outside += len(bad) - len(inside)
        failures += inside
        say(f"NFC {name}: {len(probes)} probes, {len(inside)} disagree (+{len(bad) - len(inside)}"
            f" holding guard characters) ({time.time() - t0:.0f} s)")
    import unicodedata

    return {"agrees": not failures, "probes": counts, "failed": failures, "failures": [
                " ".join(f"{ord(c):04X}" for c in p) for p in failures[:50]],
            "n_failures": len(failures), "n_with_guard_characters": outside,
            "unprobed": _ranges(unprobed),
            "unicodedata": unicodedata.unidata_version, "seconds": round(time.time() - t0)}


def _hitting_set(failed: list[str]) -> set[int]:
    """Code points such that every failing probe holds one (greedy: the most frequent first;
    a mark whose data differs shows up in every pair it is part of)."""
    left = [set(map(ord, p)) for p in failed]
    chosen: set[int] = set()
    while left:
        counts: dict[int, int] = {}
        for cps in left:
            for c in cps:
                counts[c] = counts.get(c, 0) + 1
        best = max(counts, key=lambda c: (counts[c], -c))
        chosen.add(best)
        left = [cps for cps in left if best not in cps]
    return chosen


def separator(reference) -> str | None:
    """The string of the file's first special added token: probes joined with it are encoded
    independently inside one text (both encoders match it first), or None."""
    for tok in reference.get_added_tokens_decoder().values():
        if tok.special and tok.content:
            return tok.content
    return None


def probe_context(reference, fast, ctx: str, cps: list[int], sep: str | None):
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


def guarded_table(family_table: bytes, guard: GuardTable, use_nfc_proof: bool = False) -> bytes:
    """The family's class table with this file's disagreeing code points added to the guard
    (and, where the NFC proof is used, the code points it could not probe)."""
    extra = list(guard.disagree)
    if use_nfc_proof:
        extra += [c for a, b in guard.nfc.get("unprobed", []) for c in range(a, b + 1)]
    if not extra:
        return family_table
    t = bytearray(family_table)
    for cp in extra:
        t[cp] |= tables.FAST_GUARD
    return bytes(t)


def _ranges(cps: list[int]) -> list[list[int]]:
    """Sorted code points as inclusive [first, last] runs (the table stays small)."""
    out: list[list[int]] = []
    for c in cps:
        if out and out[-1][1] == c - 1:
            out[-1][1] = c
        else:
            out.append([c, c])
    return out


def _ids(buf) -> list[int]:
    return memoryview(buf).cast("B").cast("i").tolist()
