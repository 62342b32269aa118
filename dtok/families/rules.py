"""The family rules: the splitting patterns dtok has an argument and a test battery for.

A family is a sequence of ``Split(Regex, behavior="Isolated", invert=False)`` pre-tokenizers
followed by ``ByteLevel(add_prefix_space=False, use_regex=False)``, identified by its exact
pattern strings. Any vocabulary with one of these pre-tokenizers is admissible.

Character classes
-----------------
Each family lists the *atoms* its patterns test characters with (``\\p{L}``, ``\\s``, a literal
``'``, the case-insensitive contraction letters, ...). A character's class is the set of atoms it
matches, probed with the installed ``tokenizers`` regex engine over every code point
(:mod:`dtok.tables`), never with Python's ``unicodedata`` or the ``regex`` module, whose Unicode
versions differ. Two characters of one class are indistinguishable to the patterns: every test the
patterns make on a character is one of the atoms.

Accepted transitions, and why they are safe
-------------------------------------------
A cut at ``b`` between ``x = S[b-1]`` and ``y = S[b]`` (normalized text, inside one added-token
segment) is safe for the pre-tokenizer when ``pre(S) == pre(S[:b]) + pre(S[b:])``. The regex scan
that produces the pieces is a left-to-right sequence of leftmost-first matches, and every match
starts where the previous one ended. Two things make the cut safe:

1. *No piece spans the pair.* Then some match of the whole-text scan ends exactly at ``b``, and
   the scan of ``S[b:]`` starts at its position 0 in the same state as the whole-text scan at
   ``b`` (the patterns have no look-behind, no anchors and no word boundaries), so the pieces from
   ``b`` on are equal.
2. *The piece that ends at b ends there also at end of input* (needed for independent chunks):
   every alternative that is still alive after consuming ``x`` must fail or stop on ``y`` exactly
   as it does at the end of the text. Greedy runs (``\\p{L}+``, ``[\\r\\n]*``) stop on both; a
   negative look-ahead ``(?!\\S)`` does not: it fails before a non-space and succeeds at the end.

Both conditions depend only on the regex state after ``x`` and on ``y``. For these patterns that
state is fixed by at most the two characters before ``b`` (the alternatives are character-class
runs, an optional one-character prefix, a one-space prefix, and contraction literals of at most
three characters), and whether a match can continue past ``y`` is decided within two more
characters. So the accepted set of each family is *derived* by enumerating every pair of classes
with every left context of up to two characters and every right context of up to two characters
(one representative per class) and keeping the pairs with no counterexample
(``tools/data/derive_transitions.py``, stored in ``dtok/families/_transitions.py``); the test
suite re-checks the stored set against the installed reference, pair by pair, and checks that
every rejected pair has a counterexample. Per family, what the derivation finds, and the reason:

``qwen2`` (Qwen2/Qwen3), ``llama3`` (Llama 3, GPT-4 cl100k)
    Accepted: letter -> {other, digit, whitespace, CR, LF, space, apostrophe}; digit -> anything
    (``qwen2`` only; ``llama3`` groups digits by three, so digit -> digit is rejected there);
    other -> {digit, whitespace, space}; CR/LF -> {other, letter, digit, apostrophe};
    apostrophe -> {digit, whitespace, space}. Rejected, with the reason:
    ``[^\\r\\n\\p{L}\\p{N}]?\\p{L}+`` lets a letter run take one preceding character that is not a
    letter, digit, CR or LF (so nothing -> letter except digit, CR, LF); `` ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*``
    lets a punctuation run take one preceding space and following CR/LF (no other -> other,
    other -> CR/LF, space -> other); contractions ``'s|'t|'re|...`` begin with an apostrophe (no
    apostrophe -> letter); ``\\s+(?!\\S)`` and ``\\s*[\\r\\n]+`` split a whitespace run according to
    what follows it, so no cut leaves a whitespace character on the left (nothing accepted after
    whitespace, space; CR/LF -> whitespace rejected).

``o200k`` (gpt-oss, o200k_harmony)
    As above for digits (grouped by three), whitespace and punctuation (plus ``/`` and CR/LF
    absorbed after a punctuation run: other -> ``/`` rejected), but letter runs are case-split
    words ``[upper]*[lower]+('s|'t|...)?`` and ``[upper]+[lower]*('s|...)?`` where marks, Lm and
    Lo count as both cases. A word ends before an uppercase letter that follows a lowercase one,
    so lowercase -> uppercase/titlecase is accepted while upper -> lower (``"Hello"``) is not;
    except inside a contraction that a word takes (``a'lL``, ``a'rE``, ``a'vE``: the state after
    ``'l`` needs two characters of left context to reach, which is why the derivation uses two).
    A word takes a following contraction, so letter -> apostrophe is rejected; marks extend words
    (letter -> mark rejected) and punctuation runs (mark -> other rejected).

``deepseek_v3``
    Three splits in sequence: digit groups ``\\p{N}{1,3}`` first, then runs of CJK/kana ranges,
    then the main pattern on what is left. A digit or CJK run is isolated before the main pattern
    sees it, so most transitions into or out of digits and CJK are accepted (digit -> digit and
    CJK -> CJK are not: the groups and runs continue). In the main pattern an ASCII punctuation
    character takes a following ASCII word (``.foo``), a letter run takes one preceding character
    that is not a letter, punctuation, symbol, CR or LF (so whitespace -> letter and mark ->
    letter are rejected), marks continue letter runs, and punctuation/symbol runs take one
    preceding space and following CR/LF. Characters matched by no alternative (controls, format
    characters, unassigned) form gap pieces that run together, so other -> other is rejected.

``qwen35`` (Qwen3.5/3.6)
    Qwen2's pattern with marks counted as letters: ``[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+`` and
    `` ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*``, so marks (``M``, a class of their own here; in
    ``qwen2`` they are "other") extend letter runs and are excluded from punctuation runs.
    Between classes without marks the derivation finds exactly ``qwen2``'s set. A mark is
    accepted where a letter is: mark -> {other, digit, whitespace, CR, LF, space, apostrophe}
    and {digit, CR, LF} -> mark. Rejected, with the reason: letter -> mark, mark -> letter and
    mark -> mark (one ``[\\p{L}\\p{M}]+`` run: ``"नि"`` is one piece, where ``qwen2`` cuts
    before the vowel sign); other, whitespace, space or apostrophe -> mark (the run's optional
    first character, which may itself be a mark, takes the preceding character). Against
    ``qwen2`` this adds mark -> {other, CR, LF, apostrophe} (there a punctuation run went on
    through the mark and took following CR/LF) and drops letter -> mark (accepted there as
    letter -> other).

``tekken`` (Mistral's Tekken: Ministral-3, NVIDIA Nemotron-3-Nano)
    ``o200k``'s pattern without the contraction suffix and with single digits (``\\p{N}``). On the
    classes the two share the derivation finds exactly ``o200k``'s set, plus digit -> digit
    (every digit is a piece of its own). With no contractions the apostrophe is punctuation like
    any other (class O) and the contraction letters are letters like any other, so a word
    ending before an apostrophe is cut there (letter -> other accepted; in ``o200k`` the word
    takes a following ``'s``). As in ``o200k``: a word ends before an uppercase letter that follows
    a lowercase one (lowercase -> uppercase/titlecase accepted, upper -> lower rejected), marks
    extend words and punctuation runs, and a punctuation run takes a following ``/``, CR or LF.

``kimi`` (Kimi, Moonshot)
    A first alternative ``[\\p{Han}]+`` takes runs of Han characters before ``o200k``'s
    alternatives see them; those take Han out of their letter classes (``&&[^\\p{Han}]``), and
    the punctuation run takes no ``/``. On the classes without Han the derivation finds exactly
    ``o200k``'s set. Han characters are letters (Lo, Lm), numerals, marks or symbols (the
    radicals), one class each. Accepted: Han letter -> anything but Han, and anything but Han and
    whitespace -> Han letter (a Han run stops at the first non-Han character, and the word
    alternatives take no Han letter); letter, CR and LF -> any Han; digit -> any Han but a
    numeral. Rejected, with the reason: Han -> Han (one run); whitespace -> anything (as in
    every family); other, apostrophe or mark -> Han symbol or Han mark, and Han symbol or Han
    mark -> other, apostrophe, mark, CR or LF (neither is a letter or digit, so a punctuation
    run `` ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*`` goes on through them: ``" ⺀"`` is one
    piece); digit -> Han numeral and Han numeral -> digit (``\\p{N}{1,3}`` counts a Han numeral
    as a digit when the digit group starts first).

Removed and inverted
--------------------
Some files (OLMo-3: Llama 3's pattern; MiniMax-M3: o200k's) write the split as
``Split(pattern, behavior="Removed", invert=true)``: the matches are the pieces and the text
between them is dropped. Where the pattern's matches tile every text, nothing is dropped and the
pieces are exactly the Isolated split's, so the family's classes, transitions and tables hold
unchanged. They tile when a match starts wherever the previous one ended: the scan restarts at
that position with no look-behind or anchor, so whether a non-empty match starts there depends
only on the characters from there on, and these patterns decide it on the first character (every
class starts some alternative: letter runs, digits, punctuation runs, ``\\s+``) and at most
one more (the look-ahead ``(?!\\S)``). Characters of one class are alike to the pattern (above), so
every string of up to three class representatives covers every case;
:func:`dtok.families.derive.gap_texts` finds none for the families in :data:`GAPLESS`, and
:func:`~dtok.families.derive.gaps_in_every_code_point` none over every code point in order
(both re-run by ``tests/test_families.py``, with a control pattern whose gaps they find).
Families with several splits (DeepSeek's digit and CJK splits match only some characters) are
not gapless.

Normalization and added tokens are separate conditions (:mod:`dtok_ext.cuts`).
"""
from __future__ import annotations

import json
from typing import Any, NamedTuple

from dtok.digests import sha256

__all__ = ["Family", "FAMILIES", "GAPLESS", "identify"]

_CONTRACTION_LETTERS = tuple((ch, f"(?i:{ch})") for ch in "strevmld")

_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3.5/3.6: Qwen2's pattern with marks (\p{M}) counted as letters.
_QWEN35 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_O200K = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# DeepSeek-V3's third pattern holds literal CR and LF characters (not the escapes \r \n).
_DEEPSEEK_ASCII_PUNCT = "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~]"
_DEEPSEEK_V3 = (
    r"\p{N}{1,3}",
    "[一-龥぀-ゟ゠-ヿ]+",
    _DEEPSEEK_ASCII_PUNCT + "[A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+"
    "| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
)

# Mistral's Tekken pattern (Ministral-3 and NVIDIA Nemotron-3-Nano use it): o200k's words
# without the contraction suffix, single digits. Exactly as mistral-common's tekken.json holds it
# (config.pattern); transformers' converter writes it into one isolated Split.
_TEKKEN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Kimi (Moonshot): a leading Han-run branch, then o200k's words with Han taken out of their
# letter classes (class intersection ``&&``) and without the ``/`` after a punctuation run.
# Exactly as toktier 0.3.0 converts Kimi's tiktoken files (artifacts/conversion.py, which
# re-reads it from Kimi's tokenization_kimi.py).
_KIMI_WORD_UPPER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
_KIMI_WORD_LOWER = r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]"
_KIMI = (
    r"[\p{Han}]+"
    r"|[^\r\n\p{L}\p{N}]?" + _KIMI_WORD_UPPER + "*" + _KIMI_WORD_LOWER
    + r"+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?" + _KIMI_WORD_UPPER + "+" + _KIMI_WORD_LOWER
    + r"*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

_WS_ATOMS = (("W", r"\s"), ("CR", r"\r"), ("LF", r"\n"), ("SP", " "))
_CASE_ATOMS = (("Lu", r"\p{Lu}"), ("Lt", r"\p{Lt}"), ("Lm", r"\p{Lm}"), ("Lo", r"\p{Lo}"),
               ("Ll", r"\p{Ll}"), ("M", r"\p{M}"), ("L", r"\p{L}"), ("N", r"\p{N}"))

# One-split families whose pattern leaves no gap: Split(behavior="Removed", invert=true) keeps
# exactly the matches, so where the matches tile the text it splits as Isolated does (the
# argument: module docstring, "Removed and inverted"; tests/test_families.py re-proves it on
# the installed reference).
GAPLESS = frozenset({"qwen2", "llama3", "o200k", "qwen35", "tekken", "kimi"})


class Family(NamedTuple):
    """One admitted pre-tokenizer: its Split patterns and the atoms its classes are made of."""

    name: str
    splits: tuple[str, ...]
    atoms: tuple[tuple[str, str], ...]  # (label, regex source), probed over all code points

    @property
    def key(self) -> str:
        """Changes whenever the patterns or atoms change (part of the table cache key)."""
        blob = json.dumps([self.name, self.splits, self.atoms], ensure_ascii=False)
        return sha256(blob.encode()).hexdigest()[:12]

    def pre_tokenizer(self):
        """The family's pre-tokenizer, built with the installed reference."""
        from tokenizers import Regex, pre_tokenizers

        steps = [pre_tokenizers.Split(Regex(p), "isolated", invert=False) for p in self.splits]
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        return pre_tokenizers.Sequence(steps)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family(
            "qwen2",
            (_QWEN2,),
            (("L", r"\p{L}"), ("N", r"\p{N}"), *_WS_ATOMS, ("APOS", "'"), *_CONTRACTION_LETTERS),
        ),
        Family(
            "llama3",
            (_LLAMA3,),
            (("L", r"\p{L}"), ("N", r"\p{N}"), *_WS_ATOMS, ("APOS", "'"), *_CONTRACTION_LETTERS),
        ),
        Family(
            "o200k",
            (_O200K,),
            (*_CASE_ATOMS, *_WS_ATOMS, ("SLASH", "/"), ("APOS", "'"), *_CONTRACTION_LETTERS),
        ),
        Family(
            "deepseek_v3",
            _DEEPSEEK_V3,
            (
                ("N", r"\p{N}"), ("CJK", "[一-龥぀-ゟ゠-ヿ]"), ("AP", _DEEPSEEK_ASCII_PUNCT),
                ("AZ", "[A-Za-z]"), ("L", r"\p{L}"), ("P", r"\p{P}"), ("S", r"\p{S}"),
                ("M", r"\p{M}"), *_WS_ATOMS,
            ),
        ),
        Family(
            "qwen35",
            (_QWEN35,),
            (
                ("L", r"\p{L}"), ("M", r"\p{M}"), ("N", r"\p{N}"), *_WS_ATOMS, ("APOS", "'"),
                *_CONTRACTION_LETTERS,
            ),
        ),
        Family("tekken", (_TEKKEN,), (*_CASE_ATOMS, *_WS_ATOMS, ("SLASH", "/"))),
        Family(
            "kimi",
            (_KIMI,),
            (("Han", r"\p{Han}"), *_CASE_ATOMS, *_WS_ATOMS, ("APOS", "'"), *_CONTRACTION_LETTERS),
        ),
    )
}


def identify(pre_tokenizer: dict[str, Any] | None) -> tuple[Family | None, str]:
    """The family of a ``pre_tokenizer`` JSON section, or None and the reason it is not one."""
    if not pre_tokenizer:
        return None, "no pre-tokenizer"
    steps = (
        pre_tokenizer.get("pretokenizers", [])
        if pre_tokenizer.get("type") == "Sequence"
        else [pre_tokenizer]
    )
    if not steps or steps[-1].get("type") != "ByteLevel":
        return None, "pre-tokenizer does not end with ByteLevel"
    byte_level = steps[-1]
    if byte_level.get("add_prefix_space") or byte_level.get("use_regex", True):
        return None, "ByteLevel pre-tokenizer with add_prefix_space or use_regex"
    patterns = []
    kept_matches = False  # some step is Split(behavior="Removed", invert=true)
    for step in steps[:-1]:
        if step.get("type") != "Split":
            return None, f"pre-tokenizer step {step.get('type')!r} is not a Split"
        form = (step.get("behavior"), bool(step.get("invert")))
        if form == ("Removed", True):
            kept_matches = True
        elif form != ("Isolated", False):
            return None, (f"Split with behavior {form[0]} and invert={str(form[1]).lower()} "
                          "(admitted: Isolated, or Removed with invert=true for a gapless "
                          "pattern)")
        pattern = step.get("pattern", {})
        if "Regex" not in pattern:
            return None, "Split on a plain string"
        patterns.append(pattern["Regex"])
    for family in FAMILIES.values():
        if tuple(patterns) == family.splits:
            if not kept_matches:
                return family, f"pre-tokenizer family {family.name}"
            if family.name in GAPLESS:
                return family, (f"pre-tokenizer family {family.name} (Split Removed with "
                                "invert=true: the pattern matches every character, so nothing "
                                "is removed and the pieces are the Isolated ones)")
            return None, (f"Split Removed with invert=true on family {family.name}'s pattern, "
                          "which is not proven gapless (it could remove text)")
    return None, "unknown split pattern(s): " + " | ".join(p[:60] for p in patterns)
