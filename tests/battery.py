"""The exactness battery: adversarial texts, and checks of every accepted cut against the reference.

Used by test_exactness.py (which must find no difference) and by its control (which switches a
safety check off through ``dtok.testing.cut_checks_off`` and must find differences), and by the session and pool tests.
"""
from __future__ import annotations

import random
from contextlib import contextmanager
from dataclasses import dataclass

from conftest import read_text
from dtok import testing
from dtok.tokenizer import parts_of

# Fragments that break naive cuts, each a reason a check exists.
FRAGMENTS = [
    # decomposed accents and marks (NFC composes or reorders them)
    "e\u0301", "a\u0308", "n\u0303", "o\u0302\u0323", "\u0301", "\u0323\u0302", "\u0335",
    "\u0345", "\u0300", "\u20dd", "\u093c",
    # composition exclusions and singletons: NFC changes them alone
    "\u0958/", "\u0958", "\u212b", "\u2126", "\uf900", "\ufb01",
    # Hangul: jamo compose under NFC
    "\u1100\u1161\u11a8", "\u1100", "\u1161", "\u11a8", "\uac00", "한국어",
    # line ends
    "\r", "\n", "\r\n", "\n\n", "\r\r\n", "\u2028", "\u0085",
    # contractions (case-insensitive, long s)
    "'s", "'S", "'LL", "'ll", "'t", "'re", "'ve", "'m", "'d", "'", "\u2019s", "\u017f", "\u212a",
    "'lL", "a'rE", "'vE", "''\u0300", "x'", "l", "L", "E",  # case-mixed and mark-extended
    # whitespace runs and unusual spaces
    " ", "  ", "   ", "\t", "\t\t", " \n ", "\u00a0", "\u3000", "\u2003", "\u200b", "\ufeff",
    # digits
    "0", "12", "123", "12345", "\u0663\u0664", "\u00b2", "\u00bd", "\u216b",
    # emoji and ZWJ sequences
    "\U0001f469\u200d\U0001f469\u200d\U0001f467", "\U0001f44d\U0001f3fd", "\u2764\ufe0f",
    "\U0001f1fa\U0001f1f8", "\u200d",
    # CJK, kana, fullwidth
    "中文", "字", "ひらがな", "カタカナ", "\uff76\uff80\uff76\uff85", "，", "。", "\u309b",
    # letters and cases
    "abc", "Hello", "HELLO", "hELLO", "World", "\u0130", "\u01c5", "\u02b0", "\u00aa", "x",
    # other scripts
    "नमस्ते", "مرحبا", "שלום", "ไทย", "\u0f40", "Ελληνικά", "\u0915\u094d\u0937",
    # punctuation and symbols
    ".", ",", "!?", "...", "(", ")", "{", "}", "#", "$", "->", "==", "<", ">", "|", "<|", "|>",
    "_", "-", "+", "*", "\\", '"', "`", "/", "//", "@",
    # controls, unassigned, supplementary planes
    "\x00", "\x01", "\x7f", "\U00010000", "\U0001f600", "\U000e0001", "\U00050000",
    "\ufffe", "\ufdd0", "\U0010ffff",  # noncharacters: no guard characters
]

CORPUS_WINDOWS = [
    ("adversarial", "udhr_mixed_NFD.txt"),
    ("adversarial", "udhr_kor_NFD_jamo.txt"),
    ("adversarial", "udhr_vie_NFD.txt"),
    ("adversarial", "ws_mixed-line-endings_moby-dick.txt"),
    ("adversarial", "ws_unicode-spaces_moby-dick.txt"),
    ("adversarial", "ws_long-whitespace-runs_moby-dick.txt"),
    ("adversarial", "invisible-chars_moby-dick.txt"),
    ("adversarial", "blns_big-list-of-naughty-strings.txt"),
    ("adversarial", "mixed-script-interleaved_udhr_crlf.txt"),
    ("multilingual", "udhr_hin.txt"),
    ("multilingual", "udhr_tha.txt"),
    ("multilingual", "udhr_jpn.txt"),
    ("code", "rust__ripgrep__crates_globset_src_glob.rs.txt"),
]


def token_fragments(tok) -> list[str]:
    """Every added-token string, whole and split in two."""
    out = []
    for t in tok.admission.added_tokens or [t.content for t in
                                            tok.reference.get_added_tokens_decoder().values()]:
        h = max(1, len(t) // 2)
        out += [t, t[:h], t[h:]]
    return out


def battery_texts(tok, n_random: int = 150, n_windows: int = 60, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    specials = token_fragments(tok)
    texts = []
    for _ in range(n_random):
        parts = [rng.choice(FRAGMENTS if rng.random() < 0.8 or not specials else specials)
                 for _ in range(rng.randint(2, 25))]
        texts.append("".join(parts))
    # every added-token string whole and split in two, among adversarial neighbours
    tokens = list(dict.fromkeys(tok.admission.added_tokens))
    for i in range(0, len(tokens), 4):
        parts = []
        for t in tokens[i : i + 4]:
            h = max(1, len(t) // 2)
            parts += [rng.choice(FRAGMENTS), t, rng.choice(FRAGMENTS), t[:h],
                      rng.choice(FRAGMENTS), t[h:], t[:h], t[h:]]
        texts.append("".join(parts))
    for j in range(n_windows):
        src = read_text(*CORPUS_WINDOWS[j % len(CORPUS_WINDOWS)])
        start = rng.randrange(max(1, len(src) - 400))
        texts.append(src[start : start + rng.randint(40, 400)])
    return texts


@dataclass
class Difference:
    text: str
    cut: int
    old_len: int | None
    what: str

    def __str__(self) -> str:
        where = f"cut {self.cut}" + (f", old_len {self.old_len}" if self.old_len is not None else "")
        return f"{self.what} at {where} in {self.text!r}"


def _encode_all(ref, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in ref.encode_batch_fast(texts, add_special_tokens=False)]


def check_cuts(tok, texts: list[str], stop_after: int | None = None) -> list[Difference]:
    """Every accepted cut of every text: encode(S[:b]) + encode(S[b:]) == encode(S)."""
    ref, rules = tok.reference, parts_of(tok).rules
    diffs = []
    for text in texts:
        if stop_after is not None and len(diffs) >= stop_after:
            break
        whole = ref.encode(text, add_special_tokens=False).ids
        cuts = rules.safe_positions(text)
        if not cuts:
            continue
        ids = _encode_all(ref, [text[:b] for b in cuts] + [text[b:] for b in cuts])
        n = len(cuts)
        for i, b in enumerate(cuts):
            if ids[i] + ids[n + i] != whole:
                diffs.append(Difference(text, b, None, "chunk concatenation differs"))
    return diffs


def check_repairs(tok, texts: list[str], per_text: int = 3, seed: int = 1,
                  stop_after: int | None = None) -> list[Difference]:
    """For old = S[:old_len]: every cut accepted for repair is safe in both old and S."""
    ref, rules = tok.reference, parts_of(tok).rules
    rng = random.Random(seed)
    diffs = []
    for text in texts:
        if stop_after is not None and len(diffs) >= stop_after:
            break
        if len(text) < 2:
            continue
        whole = ref.encode(text, add_special_tokens=False).ids
        for old_len in {rng.randrange(1, len(text)) for _ in range(per_text)}:
            old = text[:old_len]
            cuts = rules.safe_positions(text, limit=old_len)
            if rules.is_safe(text, old_len):
                cuts.append(old_len)
            if not cuts:
                continue
            old_ids = ref.encode(old, add_special_tokens=False).ids
            pieces = ([old[:b] for b in cuts] + [old[b:] for b in cuts] + [text[b:] for b in cuts])
            ids = _encode_all(ref, pieces)
            n = len(cuts)
            for i, b in enumerate(cuts):
                if ids[i] + ids[n + i] != old_ids:
                    diffs.append(Difference(text, b, old_len, "cut unsafe in the old text"))
                elif ids[i] + ids[2 * n + i] != whole:
                    diffs.append(Difference(text, b, old_len, "cut unsafe in the new text"))
    return diffs


@contextmanager
def checks_disabled(tok, *, nfc: bool = False, specials: bool = False):
    """The control: a safety check switched off (dtok.testing.cut_checks_off), for the block."""
    checks = [c for c, off in ((testing.CUT_CHECK_NFC, nfc), (testing.CUT_CHECK_SPECIALS, specials))
              if off]
    with testing.cut_checks_off(parts_of(tok).rules, *checks):
        yield
