"""Load a tokenizer file and decide, structurally, whether dtok may cut it.

A file is admitted when every stage of its pipeline is one dtok has an argument and a test
battery for, whatever its vocabulary:

* model: BPE without dropout (each pre-token piece is encoded independently and deterministically);
* normalizer: none, an empty Sequence, or NFC;
* pre-tokenizer: one of the families in :mod:`dtok.families`;
* post-processor: none, ByteLevel (offsets only), or TemplateProcessing that adds a fixed prefix
  and/or suffix of special tokens (alone or in a Sequence), applied once to the whole text;
* added tokens: no ``lstrip``, ``rstrip`` or ``single_word``; ``normalized=True`` only when the
  normalizer leaves text unchanged (then matching before or after it is the same), and no
  ``normalized=True`` token may overlap a ``normalized=False`` one (see :func:`overlapping_pair`);
* no truncation or padding, and the reference matches special tokens in text
  (``encode_special_tokens`` off).

Anything else is encoded by the reference, whole, and :attr:`Admission.reasons` says why.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple

from dtok.digests import sha256 as _sha256
from dtok.families import identify
from dtok.reference import missing
from dtok.reference import version as tokenizers_version
from dtok_ext.outline import emptied


class Admission(NamedTuple):
    """Whether dtok may cut texts for this file, and why (or why not)."""

    admitted: bool
    family: str | None
    reasons: list[str]
    sha256: str = ""
    nfc: bool = False
    prefix: tuple[int, ...] = ()  # IDs the post-processor puts before the text
    suffix: tuple[int, ...] = ()  # ... and after it
    added_tokens: tuple[str, ...] = ()
    special_tokens: tuple[str, ...] = ()  # those marked special
    # strings tokenizer_config.json declares as tokens that the file does not hold: an engine
    # that loads both adds them, so cuts keep away from them too
    declared_tokens: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.admitted

    def __repr__(self) -> str:  # without the token lists (hundreds of strings)
        return (f"Admission(admitted={self.admitted!r}, family={self.family!r}, "
                f"reasons={self.reasons!r}, sha256={self.sha256!r}, nfc={self.nfc!r}, "
                f"prefix={self.prefix!r}, suffix={self.suffix!r})")


class TokenizerFiles:
    """The files behind one tokenizer: tokenizer.json (bytes) and its optional config (parsed).

    A loaded :class:`dtok.Tokenizer` keeps only :meth:`released` (no bytes, ~11 MB for Qwen3);
    ``Tokenizer.tokenizer_json()`` serializes the loaded reference when the JSON is needed."""

    __slots__ = ("path", "raw", "config", "config_path", "sha256")

    def __init__(self, path: Path, raw: bytes, config: dict[str, Any] | None,
                 config_path: Path | None, sha256: str = "") -> None:
        self.path = path
        self.raw = raw
        self.config = config
        self.config_path = config_path
        # of the file's bytes; computed from raw when not given
        self.sha256 = sha256 or _sha256(raw).hexdigest()

    def __repr__(self) -> str:
        return f"TokenizerFiles({str(self.path)!r}, {len(self.raw)} bytes, sha256={self.sha256!r})"

    def with_raw(self, raw: bytes) -> "TokenizerFiles":
        """The same description holding ``raw`` as its bytes (path, config and SHA-256 kept)."""
        return TokenizerFiles(self.path, raw, self.config, self.config_path, self.sha256)

    def released(self) -> "TokenizerFiles":
        """The same description without the file's bytes (path, config and SHA-256 kept)."""
        return self.with_raw(b"")

    def outline(self) -> dict[str, Any]:
        """tokenizer.json parsed, on each call, with the model's vocabulary and merges empty:
        nothing dtok decides from a file reads them (the reference holds them), and parsed they
        would cost a load time and leave allocator space behind
        (docs/benchmarks.md#a-loaded-tokenizers-memory-step-by-step;
        :func:`dtok_ext.outline.emptied`: the document scanned, those two values emptied, then
        parsed)."""
        light = emptied(self.raw, "model", _BULK)
        if light is not None:
            try:
                return json.loads(light)
            except ValueError:
                pass  # the whole document's own error, below
        try:
            return json.loads(self.raw)
        except ValueError as exc:
            raise ValueError(f"{self.path} is not valid JSON: {exc}") from None


#: The model's members that :meth:`TokenizerFiles.outline` leaves empty.
_BULK = frozenset({"vocab", "merges"})


def read_files(path: str | os.PathLike[str]) -> TokenizerFiles:
    """Read ``tokenizer.json`` (a file, or a directory holding one; gzip-compressed when its name
    ends in ``.gz``) and the ``tokenizer_config.json`` beside it."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer file at {path}")
    raw = path.read_bytes()
    if path.suffix == ".gz":
        import gzip

        raw = gzip.decompress(raw)
    config_path: Path | None = None
    config = None
    beside = path.parent / "tokenizer_config.json"
    if beside.is_file():
        config_path = beside
        try:
            config = json.loads(beside.read_bytes())
        except ValueError as exc:
            raise ValueError(f"{beside} is not valid JSON: {exc}") from None
    return TokenizerFiles(path, raw, config, config_path)


def bundled_files() -> TokenizerFiles:
    """The Qwen3 tokenizer shipped (gzip-compressed) inside the package."""
    import gzip

    # the package's own folder (its Cython modules keep it from running from a zip, so
    # importlib.resources, more imports at every load, would find the same files)
    data = Path(__file__).resolve().parent / "data" / "qwen3"
    raw = gzip.decompress((data / "tokenizer.json.gz").read_bytes())
    config = json.loads((data / "tokenizer_config.json").read_bytes())
    return TokenizerFiles(data / "tokenizer.json.gz", raw, config, data / "tokenizer_config.json")


def _normalizer(spec: dict | None) -> tuple[bool | None, str]:
    """(nfc?, reason); nfc is None when the normalizer is not admitted."""
    if spec is None:
        return False, "no normalizer"
    kind = spec.get("type")
    if kind == "NFC":
        return True, "normalizer NFC"
    if kind == "Sequence":
        inner = spec.get("normalizers", [])
        if not inner:
            return False, "empty normalizer Sequence"
        if all(n.get("type") == "NFC" for n in inner):
            return True, "normalizer Sequence[NFC]"
        return None, "normalizer Sequence of " + ", ".join(str(n.get("type")) for n in inner)
    return None, f"normalizer {kind} is not admitted (only none, empty, NFC)"


def _templates(spec: dict | None) -> tuple[list[dict] | None, str]:
    """The TemplateProcessing 'single' templates inside a post-processor, or None if refused."""
    if spec is None:
        return [], "no post-processor"
    kind = spec.get("type")
    if kind == "ByteLevel":
        return [], "ByteLevel post-processor (offsets only)"
    if kind == "TemplateProcessing":
        return [spec], "TemplateProcessing post-processor"
    if kind == "Sequence":
        found = []
        for step in spec.get("processors", []):
            inner, reason = _templates(step)
            if inner is None:
                return None, reason
            found.extend(inner)
        return found, "post-processor Sequence of " + ", ".join(
            str(s.get("type")) for s in spec.get("processors", [])
        )
    return None, f"post-processor {kind} is not admitted"


def _prefix_suffix(templates: list[dict]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    prefix: list[int] = []
    suffix: list[int] = []
    for tpl in templates:
        seen_sequence = False
        for item in tpl.get("single", []):
            if "Sequence" in item:
                if seen_sequence:
                    return None
                seen_sequence = True
            elif "SpecialToken" in item:
                ids = tpl["special_tokens"][item["SpecialToken"]["id"]]["ids"]
                (suffix if seen_sequence else prefix).extend(ids)
            else:
                return None
        if not seen_sequence:
            return None
    return tuple(prefix), tuple(suffix)


def overlapping_pair(normalized: list[str], raw: list[str]) -> tuple[str, str] | None:
    """A ``normalized=true`` token and a ``normalized=false`` token whose occurrences can overlap
    in some text (one contains the other, or a suffix of one is a prefix of the other), or None.

    The reference matches ``normalized=false`` tokens first, leftmost-longest, and
    ``normalized=true`` ones only in the gaps left between them. When no occurrence of one kind
    can overlap an occurrence of the other, the two passes select exactly what one
    leftmost-longest pass over all of them selects (two occurrences that start at the same
    position overlap), and that one pass is what dtok's cut rules model. Otherwise (e.g. special
    ``zq`` and added ``zqa``) the passes disagree with one pass, so such files are not admitted.
    """
    from dtok_ext.specials import SpecialMatcher

    normalized = [t for t in dict.fromkeys(normalized) if t]
    raw = [t for t in dict.fromkeys(raw) if t]
    if not normalized or not raw:
        return None
    for inner, outer in ((raw, normalized), (normalized, raw)):  # containment
        matcher = SpecialMatcher(inner)
        for text in outer:
            found = matcher.find_all(text)
            if found:
                s, e = found[0]
                return (text, text[s:e]) if outer is normalized else (text[s:e], text)
    for left, right in ((normalized, raw), (raw, normalized)):  # a suffix of left = a prefix of right
        prefixes: dict[str, str] = {}
        for text in right:
            for k in range(1, len(text)):
                prefixes.setdefault(text[:k], text)
        for text in left:
            for k in range(1, len(text)):
                other = prefixes.get(text[-k:])
                if other is not None:
                    return (text, other) if left is normalized else (other, text)
    return None


def admit(files: TokenizerFiles, spec: dict[str, Any], reference) -> Admission:
    """Decide admission for ``files`` (``spec``: its :meth:`~TokenizerFiles.outline`);
    ``reference`` is the loaded ``tokenizers.Tokenizer``."""
    sha = files.sha256
    refused: list[str] = []
    notes: list[str] = []

    model = spec.get("model", {})
    model_type = model.get("type") or (  # legacy serialisations carry no "type"
        "BPE" if "merges" in model else "Unigram" if "unk_id" in model
        else "WordPiece" if "max_input_chars_per_word" in model else "unknown")
    if model_type != "BPE":
        refused.append(f"model {model_type} is not admitted (only BPE)")
    elif model.get("dropout"):
        refused.append("BPE with dropout is not deterministic")
    else:
        notes.append("BPE model")

    nfc, reason = _normalizer(spec.get("normalizer"))
    (refused if nfc is None else notes).append(reason)

    family, reason = identify(spec.get("pre_tokenizer"))
    (notes if family else refused).append(reason)

    templates, reason = _templates(spec.get("post_processor"))
    affixes = None if templates is None else _prefix_suffix(templates)
    if affixes is None:
        refused.append(reason if templates is None else
                       "post-processor template is not a fixed prefix/suffix around the text")
    else:
        notes.append(reason)

    if spec.get("truncation"):
        refused.append("truncation is enabled")
    if spec.get("padding"):
        refused.append("padding is enabled")
    if getattr(reference, "truncation", None) or getattr(reference, "padding", None):
        refused.append("the loaded reference has truncation or padding enabled")
    if getattr(reference, "encode_special_tokens", False):
        refused.append("encode_special_tokens is on (added tokens are not matched in text)")

    gone = missing(reference)
    if gone:
        refused.append(f"tokenizers {tokenizers_version()} has no {', '.join(gone)}: what dtok's "
                       "cut rules are proven with (the reference encodes every text)")
    added = list(reference.get_added_tokens_decoder().values()) if not gone else []
    for flag in ("lstrip", "rstrip", "single_word"):
        hit = [t.content for t in added if getattr(t, flag)]
        if hit:
            refused.append(f"{len(hit)} added token(s) with {flag} (e.g. {hit[0]!r})")
    normalized = [t.content for t in added if t.normalized]
    if normalized:
        pair = overlapping_pair(normalized, [t.content for t in added if not t.normalized])
        if nfc:
            refused.append(f"{len(normalized)} added token(s) matched after NFC normalization")
        elif pair is not None:
            refused.append(f"normalized=true added token {pair[0]!r} overlaps normalized=false "
                           f"{pair[1]!r} (the reference matches them in two passes)")
        else:
            notes.append(f"{len(normalized)} added token(s) with normalized=true under an "
                         "identity normalizer (matched on raw text, none overlapping a "
                         "normalized=false one)")
    notes.append(f"{len(added)} added tokens")

    if affixes is not None and not refused:
        # The template must say what the reference does.
        prefix, suffix = affixes
        got = reference.encode("", add_special_tokens=True).ids
        if list(got) != list(prefix + suffix):
            refused.append(f"post-processor adds {got}, template parsing expected "
                           f"{list(prefix + suffix)}")
        elif prefix or suffix:
            notes.append(f"post-processor adds prefix {list(prefix)} suffix {list(suffix)}")

    have = {t.content for t in added}
    declared = tuple(t for t in declared_tokens(files.config) if t not in have)
    if declared:
        notes.append(f"{len(declared)} token string(s) declared only by tokenizer_config.json "
                     f"(e.g. {declared[0]!r}): cuts keep away from them too")

    admitted = not refused
    return Admission(
        admitted=admitted,
        family=family.name if family else None,
        reasons=notes if admitted else refused,
        sha256=sha,
        nfc=bool(nfc),
        prefix=affixes[0] if affixes else (),
        suffix=affixes[1] if affixes else (),
        added_tokens=tuple(t.content for t in added if t.content),
        special_tokens=tuple(t.content for t in added if t.content and t.special),
        declared_tokens=declared,
    )


def declared_tokens(config: dict[str, Any] | None) -> list[str]:
    """The token strings a ``tokenizer_config.json`` declares: its ``added_tokens_decoder``,
    additional and extra special tokens, and the named ones (bos, eos, pad, unk, ...)."""
    if not isinstance(config, dict):
        return []
    found: list[str] = []

    def take(value) -> None:
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, dict):
            if isinstance(value.get("content"), str):
                found.append(value["content"])
            else:
                for v in value.values():
                    take(v)
        elif isinstance(value, list):
            for v in value:
                take(v)

    take(config.get("added_tokens_decoder"))
    take(config.get("additional_special_tokens"))
    take(config.get("extra_special_tokens"))
    for key in ("bos_token", "eos_token", "pad_token", "unk_token", "sep_token", "cls_token",
                "mask_token"):
        take(config.get(key))
    return [t for t in dict.fromkeys(found) if t]
