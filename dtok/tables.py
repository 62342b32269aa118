"""Per-family class tables: one byte per code point, probed from the installed reference.

Byte layout (see ``dtok_ext/cuts.pxd``): bits 0-5 the family's character class (0 = BLOCK: a
surrogate, or a class the stored transition set does not know, never cut next to), bit 6 the NFC
anchor flag, bit 7 the fast encoder's guard: here the code points the reference's regex engine
treats as unassigned (``\\p{Cn}``) and the surrogates, where a fast encoder with other Unicode
data would most likely disagree (not the noncharacters: see ``NONCHARACTERS``);
:mod:`dtok.guards` adds, per tokenizer file, every code point where a probe found the fast
encoder disagreeing with the reference.

Tables depend on the installed ``tokenizers`` (its regex engine's and normalizer's Unicode data),
so they are stored keyed by its version. A table built for another version is never used: the
loader rebuilds it (about ten seconds) into the user cache, or refuses when ``DTOK_TABLES=strict``.
``tools/data/build_tables.py`` builds the tables that ship inside the package, in
``dtok/families/tables`` beside the family rules and transitions they belong to. numpy is
imported only by the functions that build tables: loading one does not need it, and a process
that loads a tokenizer does not pay its RSS (docs/benchmarks.md#memory).
"""
from __future__ import annotations

import os
import zlib
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from dtok.families import ACCEPTED, CLASSES, FAMILIES, TABLES_DIR, Family
from dtok.logs import logger

if TYPE_CHECKING:  # annotations only: loading a table does not import numpy
    import numpy as np


SCHEMA = 3  # 3: noncharacters are not guard characters
N_CODEPOINTS = 0x110000
CLASS_MASK = 0x3F
NFC_ANCHOR = 0x40
FAST_GUARD = 0x80
BLOCK = 0  # class id 0

BUNDLED_DIR = TABLES_DIR
UNASSIGNED = r"\p{Cn}"
_SURROGATES = slice(0xD800, 0xE000)
# The 66 noncharacters are unassigned in every Unicode version and stay so (Unicode's stability
# policy), with default properties, so no fast encoder's Unicode data can class them otherwise:
# the unassigned guard (other versions' data) does not need them. Each is still probed per file
# like every code point (dtok.guards). Guarding them would send whole documents through the
# guard route for one character (docs/benchmarks.md#the-noncharacters).
NONCHARACTERS = (*range(0xFDD0, 0xFDF0),
                 *(plane + last for plane in range(0, N_CODEPOINTS, 0x10000)
                   for last in (0xFFFE, 0xFFFF)))
_PROBE_BLOCK = 8192  # the reference's Split is much faster on short strings than on one long one


def tokenizers_version() -> str:
    import tokenizers

    return tokenizers.__version__


def cache_dir() -> Path:
    base = os.environ.get("DTOK_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "dtok"
    )
    return Path(base)


# --- probing the reference -------------------------------------------------------------------


def code_points() -> list[int]:
    """Every code point but the surrogates (what the probes of tables and guards go over)."""
    return [c for c in range(N_CODEPOINTS) if not 0xD800 <= c <= 0xDFFF]


@lru_cache(maxsize=1)
def _all_codepoints() -> tuple[np.ndarray, str]:
    import numpy as np  # building tables only: a loaded tokenizer does not import it
    cps = np.concatenate([np.arange(0, 0xD800), np.arange(0xE000, N_CODEPOINTS)])
    return cps, "".join(map(chr, cps.tolist()))


def probe_atom(regex: str) -> np.ndarray:
    """Boolean mask over all code points: does the reference regex engine match ``regex`` on it?"""
    import numpy as np
    from tokenizers import Regex, pre_tokenizers

    cps, text = _all_codepoints()
    split = pre_tokenizers.Split(Regex(regex), "removed")
    mask = np.ones(N_CODEPOINTS, dtype=bool)
    mask[_SURROGATES] = False
    for i in range(0, len(text), _PROBE_BLOCK):
        for _piece, (start, end) in split.pre_tokenize_str(text[i : i + _PROBE_BLOCK]):
            mask[cps[i + start : i + end]] = False  # "removed" keeps what did NOT match
    return mask


def nfc_anchor_mask() -> np.ndarray:
    """Code points before which the reference NFC normalizer always splits.

    c is an anchor when it is not a mark (reference ``\\p{M}``), NFC leaves it unchanged, placing
    the probe marks U+0301 or U+0335 before or after it does not reorder it, and it does not
    compose with a preceding probe (the marks, or the Hangul U+1100 / U+AC00). Then, for any X
    and Y, N(X + c + Y) == N(X) + N(c + Y). All probes go through the reference normalizer in one
    call, separated by LF (a starter that never composes or reorders); the piece count is checked.
    """
    import numpy as np
    from tokenizers import normalizers

    nfc = normalizers.NFC()
    cps, text = _all_codepoints()
    chars = [c for c in text if c != "\n"]
    before = ("\u0301", "\u0335", "\u1100", "\uac00")
    after = ("\u0301", "\u0335")
    probes = []
    for c in chars:
        probes.append(c)
        probes.extend(p + c for p in before)
        probes.extend(c + p for p in after)
    out = nfc.normalize_str("\n".join(probes)).split("\n")
    if len(out) != len(probes):
        raise RuntimeError("NFC probe separators were not preserved; cannot build anchor table")
    per = 1 + len(before) + len(after)
    marks = probe_atom(r"\p{M}")
    anchor = np.zeros(N_CODEPOINTS, dtype=bool)
    for i, c in enumerate(chars):
        row = out[i * per : (i + 1) * per]
        ok = (
            row[0] == c
            and all(row[1 + j] == p + c for j, p in enumerate(before))
            and all(not row[1 + len(before) + j].startswith(p) for j, p in enumerate(after))
        )
        anchor[ord(c)] = ok and not marks[ord(c)]
    anchor[ord("\n")] = True
    return anchor


# --- building -------------------------------------------------------------------------------


def class_names(family: Family, masks: dict[str, np.ndarray]
                ) -> tuple[np.ndarray, dict[int, str]]:
    """Per code point, the name of its class ("+"-joined atom labels, "O" for none)."""
    import numpy as np
    sig = np.zeros(N_CODEPOINTS, dtype=np.int64)
    for i, (_label, regex) in enumerate(family.atoms):
        sig |= masks[regex].astype(np.int64) << i
    sig[_SURROGATES] = -1
    names = {}
    for s in np.unique(sig):
        if s < 0:
            continue
        labels = [label for i, (label, _r) in enumerate(family.atoms) if (int(s) >> i) & 1]
        names[int(s)] = "+".join(labels) or "O"
    return sig, names


def build_table(family: Family, classes: list[str], anchor: np.ndarray | None = None,
                masks: dict[str, np.ndarray] | None = None) -> tuple[bytes, list[str]]:
    """The class table of ``family`` with class ids from ``classes`` (id = index + 1).

    Returns the table and the names of classes found that ``classes`` does not list (their code
    points get BLOCK, so no cut is ever made next to them).
    """
    import numpy as np
    masks = masks if masks is not None else {}
    for _label, regex in family.atoms:
        if regex not in masks:
            masks[regex] = probe_atom(regex)
    sig, names = class_names(family, masks)
    table = np.zeros(N_CODEPOINTS, dtype=np.uint8)
    unknown = []
    ids = {name: i + 1 for i, name in enumerate(classes)}
    for s, name in names.items():
        if name in ids:
            table[sig == s] = ids[name]
        else:
            unknown.append(name)
    if anchor is None:
        anchor = nfc_anchor_mask()
    table[anchor] |= NFC_ANCHOR
    if UNASSIGNED not in masks:
        masks[UNASSIGNED] = probe_atom(UNASSIGNED)
    table[masks[UNASSIGNED]] |= FAST_GUARD
    table[list(NONCHARACTERS)] &= ~FAST_GUARD & 0xFF
    table[_SURROGATES] |= FAST_GUARD
    return table.tobytes(), unknown


def file_name(family: Family, version: str) -> str:
    """The table's file name: the family, its pattern hash, the tokenizers version, the schema
    (a table is used only when all four match)."""
    return f"{family.name}-{family.key}-tokenizers{version}-schema{SCHEMA}.bin.gz"


def write_table(path: Path, table: bytes) -> None:
    import gzip  # only where a table is built: reading needs zlib alone

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(gzip.compress(table, 9, mtime=0))
    os.replace(tmp, path)  # atomic: concurrent builders never see half a file


# --- loading --------------------------------------------------------------------------------


class FamilyTables(NamedTuple):
    family: Family
    table: bytes  # N_CODEPOINTS bytes
    accept: bytes  # 64 x 64 bytes, accept[x * 64 + y]
    classes: tuple[str, ...]  # class id - 1 -> name
    source: str  # where the table came from


def accept_matrix(classes: list[str], accepted: list[tuple[str, str]]) -> bytes:
    ids = {name: i + 1 for i, name in enumerate(classes)}
    m = bytearray(64 * 64)
    for x, y in accepted:
        m[ids[x] * 64 + ids[y]] = 1
    return bytes(m)


# tables built in this process that could not be written to the cache: kept, so built once
_BUILT_IN_MEMORY: dict[tuple[str, str], FamilyTables] = {}


def load(family_name: str) -> FamilyTables:
    """Class table and transition matrix of a family for the installed ``tokenizers``.

    Read from the package (or the cache) on each call (a few ms), not kept: a loaded tokenizer
    holds its own guarded copy of the table, and a kept family table would be a second copy in
    every process (docs/benchmarks.md#a-loaded-tokenizers-memory-step-by-step)."""
    family = FAMILIES[family_name]
    classes = list(CLASSES[family.name])
    if len(classes) >= 64:
        raise RuntimeError(f"{family.name}: too many classes for the table layout")
    version = tokenizers_version()
    if (family.name, version) in _BUILT_IN_MEMORY:
        return _BUILT_IN_MEMORY[family.name, version]
    name = file_name(family, version)
    table = None
    for path in (BUNDLED_DIR / name, cache_dir() / name):
        if path.exists():
            try:
                data = zlib.decompress(path.read_bytes(), 16 + zlib.MAX_WBITS)  # gzip's format
            except zlib.error:  # cut short or corrupted: damaged, as a wrong length is
                data = b""
            if len(data) == N_CODEPOINTS:
                table, source = data, str(path)
                break
            logger().warning("dtok: ignoring damaged table %s", path)
    if table is None:
        if os.environ.get("DTOK_TABLES") == "strict":
            raise RuntimeError(
                f"no class table for family {family.name} and tokenizers {version} "
                "(DTOK_TABLES=strict forbids building one)"
            )
        logger().warning("dtok: building %s tables for tokenizers %s (one-time)", family.name,
                         version)
        table, unknown = build_table(family, classes)
        if unknown:
            logger().warning("dtok: %s: classes %s are new in tokenizers %s; never cut next to "
                             "them", family.name, unknown, version)
        path = cache_dir() / name
        try:
            write_table(path, table)
            source = str(path)
        except OSError as exc:  # read-only home: keep it in memory
            logger().warning("dtok: could not cache table at %s: %s", path, exc)
            source = "built in memory"
    loaded = FamilyTables(family, table, accept_matrix(classes, ACCEPTED[family.name]),
                          tuple(classes), source)
    if source == "built in memory":
        _BUILT_IN_MEMORY[family.name, version] = loaded
    return loaded
