"""A tokenizer.json's outline (admission's input) is exactly the file parsed with the model's
vocabulary and merges emptied: on every real file, on spellings a scan could misread
(escaped names, duplicate members, brackets and quotes inside strings), and on random
documents; what the scan does not expect is parsed whole."""
from __future__ import annotations

import json
import random

import pytest

from conftest import MAIN_FILES, OTHER_FILES, tokenizer_path

from dtok.admission import TokenizerFiles, read_files
from dtok_ext.outline import emptied

BULK = frozenset({"vocab", "merges"})


def parsed_then_emptied(raw: bytes):
    """What the outline must be: the whole document parsed, then the model's vocab and merges
    (where they are containers) emptied in every top-level "model" object."""
    doc = json.loads(raw)
    model = doc.get("model") if isinstance(doc, dict) else None
    if isinstance(model, dict):
        for key in BULK:
            if isinstance(model.get(key), (dict, list)):
                model[key] = type(model[key])()
    return doc


def outline_of(raw: bytes):
    return TokenizerFiles(tokenizer_path("qwen3-tiny"), raw, None, None).outline()


@pytest.mark.parametrize("name", MAIN_FILES + OTHER_FILES)
def test_outline_of_every_file_is_its_parse_emptied(name):
    raw = read_files(tokenizer_path(name)).raw
    light = emptied(raw, "model", BULK)
    assert light is not None and len(light) < len(raw)
    assert json.loads(light) == parsed_then_emptied(raw)


@pytest.mark.parametrize("raw", [
    # names spelled with escapes, as the parser reads them
    rb'{"mod\u0065l": {"voc\u0061b": {"a": 1}, "merges": ["a b"]}, "x": 1}',
    # duplicate members: the parser keeps the last, whichever it is
    rb'{"model": {"vocab": {"a": 1}}, "model": {"vocab": {"b": 2}, "type": "BPE"}}',
    rb'{"model": {"vocab": {"a": 1}, "vocab": [1, 2]}}',
    # brackets, quotes and backslashes inside strings; a vocab whose tokens are named like members
    rb'{"model": {"vocab": {"}": 0, "\"]": 1, "\\": 2, "merges": 3, "{[": 4}, "merges": [["}", "]"]]}}',
    # nested "model" members elsewhere are not the model
    rb'{"pre_tokenizer": {"model": {"vocab": {"a": 1}}}, "model": {"type": "BPE"}}',
    # values that are not containers stay
    rb'{"model": {"vocab": null, "merges": "x", "dropout": 0.5, "fuse_unk": false}}',
    # whitespace everywhere, empty objects, a non-ASCII name
    b' \r\n\t{ "model" :\n{ "vocab" : { } , "merges" : [ ] , "\xc3\xa9" : 1 } , "a" : { } } \n',
    rb'{}',
    rb'{"model": {}}',
])
def test_outline_on_spellings_a_scan_could_misread(raw):
    assert outline_of(raw) == parsed_then_emptied(raw)


@pytest.mark.parametrize("raw", [
    b'[1, 2]', b'"model"', b'{"model": {"vocab": {"a": 1}', b'{"model" {"vocab": {}}}',
    b'{"model": {"vocab": {"a": 1}}} x', b'{"a": }', b'{"a": 1,}', b'{"\xff": 1}',
    b'{"model": {"vocab": {"a": 1}, }}',
])
def test_what_the_scan_does_not_expect_is_parsed_whole(raw):
    """None from the scan, and the outline is then the whole parse (or its error)."""
    assert emptied(raw, "model", BULK) is None
    try:
        want = parsed_then_emptied(raw)
    except ValueError:
        with pytest.raises(ValueError, match="not valid JSON"):
            outline_of(raw)
    else:
        assert outline_of(raw) == want


def _random_value(rng: random.Random, depth: int):
    kinds = ["int", "str", "null", "bool", "float"] + (["list", "dict"] * 2 if depth < 4 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.randint(-10**12, 10**12)
    if kind == "float":
        return rng.random() * 10 ** rng.randint(-5, 5)
    if kind == "str":
        return "".join(rng.choice('ab{}[]":,\\ \n\t\u00e9\u4e2d\U0001f600') for _ in range(rng.randint(0, 8)))
    if kind == "null":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "list":
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    names = ["vocab", "merges", "model", "type", "a", "{", '"', "\\"]
    return {rng.choice(names): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def test_outline_of_random_documents():
    rng = random.Random(7)
    for _ in range(2000):
        doc = {"model": _random_value(rng, 1), "x": _random_value(rng, 1)}
        if rng.random() < 0.5:
            doc["model"] = {"vocab": _random_value(rng, 2), "merges": _random_value(rng, 2),
                            "type": "BPE"}
        raw = json.dumps(doc, ensure_ascii=rng.random() < 0.5,
                         indent=rng.choice([None, 0, 2]),
                         separators=rng.choice([None, (",", ":"), (" ,  ", " :\n")])).encode()
        assert outline_of(raw) == parsed_then_emptied(raw), raw
