"""Structural admission: the four main files are admitted, the four small ones are not."""
from __future__ import annotations

import hashlib

import pytest

import dtok
from dtok.tokenizer import parts_of
from conftest import (FAMILY_OF, OTHER_FILES, PER_FILE, load_tokenizer, read_text, ref_ids,
                      shared_path)

QWEN3_SHA = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"

NOT_ADMITTED_BECAUSE = {
    "phi3-mini": ["rstrip", "normalizer"],
    "roberta-base": ["lstrip", "RobertaProcessing"],
    "t5-small": ["Unigram", "Precompiled"],
    "bert-base-uncased": ["WordPiece", "BertNormalizer"],
}


@pytest.mark.parametrize("name", PER_FILE)
def test_main_files_are_admitted(name):
    tok = load_tokenizer(name)
    a = tok.admission
    assert a.admitted and a.family == FAMILY_OF[name]
    assert a.sha256 == hashlib.sha256(shared_path("tokenizers", name, "tokenizer.json")
                                      .read_bytes()).hexdigest()
    assert parts_of(tok).rules is not None


def test_admission_details():
    assert load_tokenizer("qwen3").admission.nfc
    llama3 = load_tokenizer("llama3")  # the BOS id: 128000 in the real file
    assert llama3.admission.prefix == (llama3.reference.token_to_id("<|begin_of_text|>"),)
    assert not load_tokenizer("deepseek-v3").admission.prefix  # the bare file adds no BOS
    assert any("normalized=true" in r for r in load_tokenizer("deepseek-v3").admission.reasons)


@pytest.mark.parametrize("name", OTHER_FILES)
def test_small_files_are_not_admitted_and_still_exact(name):
    tok = load_tokenizer(name, chunk_threshold=1000, chunk_target=200)
    a = tok.admission
    assert not a.admitted and parts_of(tok).rules is None
    joined = " ".join(a.reasons)
    for word in NOT_ADMITTED_BECAUSE[name]:
        assert word in joined, (word, a.reasons)
    text = read_text("prose", "gutenberg-972_devils-dictionary.txt")[:5000] + " <s> </s> <mask>"
    for special in (True, False):
        assert list(tok.encode(text, add_special_tokens=special)) == ref_ids(tok, text, special)
    ex = tok.explain(text)
    assert ex["route"] == "reference" and "not admitted" in ex["why"]


def test_default_is_bundled_qwen3():
    tok = dtok.Tokenizer.default()
    assert tok.admission.admitted and tok.admission.family == "qwen2"
    assert tok.admission.sha256 == QWEN3_SHA
    assert tok.files.config is not None and "chat_template" in tok.files.config


def test_directory_and_file_paths(tmp_path):
    d = shared_path("tokenizers", "llama3")
    a = dtok.Tokenizer.from_file(d).admission
    b = dtok.Tokenizer.from_file(d / "tokenizer.json").admission
    assert a.sha256 == b.sha256 and a.admitted
    with pytest.raises(FileNotFoundError):
        dtok.Tokenizer.from_file(tmp_path / "missing")
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        dtok.Tokenizer.from_file(tmp_path)


def test_unknown_knob_and_bad_values():
    with pytest.raises(TypeError, match="unknown knob"):
        dtok.Tokenizer.default(chunk_size=5)
    with pytest.raises(ValueError):
        dtok.Tokenizer.default(chunk_target=0)
    with pytest.raises(ValueError):
        dtok.Tokenizer.default(threads=-1)
    with pytest.raises(ValueError):
        dtok.Tokenizer.default(scan_budget=(-1,))


def _with_added(tmp_path, base: str, specials: list[str], added: list[str]):
    """A real file with extra added tokens, made through the tokenizers API (as transformers'
    add_special_tokens / add_tokens do): specials are normalized=false, added normalized=true."""
    from tokenizers import AddedToken, Tokenizer

    ref = Tokenizer.from_file(str(shared_path("tokenizers", base, "tokenizer.json")))
    ref.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in specials])
    ref.add_tokens([AddedToken(t, normalized=True) for t in added])
    path = tmp_path / "tokenizer.json"
    ref.save(str(path))
    return dtok.Tokenizer.from_file(path, encoder="reference")


@pytest.mark.parametrize("specials,added", [(["zq"], ["zqa"]), (["zqa"], ["qa"]),
                                            (["<x|"], ["|y>"]), (["ab"], ["cca"])])
def test_normalized_tokens_overlapping_raw_ones_are_not_admitted(tmp_path, specials, added):
    """The reference matches normalized=false tokens first and normalized=true ones in the gaps;
    one leftmost-longest automaton does not model that when their occurrences can overlap
    (this file was admitted before, and session appends returned wrong IDs)."""
    tok = _with_added(tmp_path, "deepseek-v3", specials, added)
    assert not tok.admission.admitted
    assert "overlaps" in " ".join(tok.admission.reasons)
    rng = __import__("random").Random(1)
    parts = ["z", "q", "a", "b", "c", "<x|", "|y>", " ", "x", *specials, *added]
    for i in range(200):
        old = "".join(rng.choice(parts) for _ in range(rng.randint(5, 60)))
        new = old + "".join(rng.choice(parts) for _ in range(rng.randint(1, 6)))
        tok.encode(old, session=i)
        assert list(tok.encode(new, session=i)) == ref_ids(tok, new)


def test_normalized_tokens_apart_from_raw_ones_stay_admitted(tmp_path):
    tok = _with_added(tmp_path, "deepseek-v3", ["<|zq|>"], ["qqq", "<<a>>"])
    assert tok.admission.admitted
    text = "x<|zq|>qqqq<<a>><|zq|qqq " * 40
    assert list(tok.encode(text)) == ref_ids(tok, text)


def test_tokens_declared_only_by_the_config_keep_cuts_away(tmp_path):
    """A config that declares a token the file does not hold (Qwen3.5's 7 audio and TTS
    markers): an engine loading both adds it, so no cut falls inside one; without the config
    the same text has cuts there (control)."""
    import json

    from dtok.admission import bundled_files
    from dtok_ext.cuts import VERDICT_NOT_SAFE

    files = bundled_files()
    marker = "<tts_text_bos_single>"
    (tmp_path / "tokenizer.json").write_bytes(files.raw)
    config = dict(files.config, added_tokens_decoder={
        **files.config["added_tokens_decoder"],
        "999999": {"content": marker, "special": True, "normalized": False, "lstrip": False,
                   "rstrip": False, "single_word": False}})
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    text = ("Some words " + marker + " and more text ") * 40
    inside = [b for b in range(1, len(text))
              if any(s < b < s + len(marker) for s in range(len(text)) if text.startswith(marker, s))]
    declared = dtok.Tokenizer(tmp_path, guard_probes="off")
    assert declared.admission.declared_tokens == (marker,)
    assert all(parts_of(declared).rules.is_safe(text, b) == VERDICT_NOT_SAFE for b in inside)
    (tmp_path / "tokenizer_config.json").unlink()
    plain = dtok.Tokenizer(tmp_path, guard_probes="off")
    assert plain.admission.declared_tokens == ()
    assert any(parts_of(plain).rules.is_safe(text, b) != VERDICT_NOT_SAFE for b in inside)
    assert list(declared.encode(text * 100)) == declared.reference.encode(text * 100).ids


def test_deepseek_v4_is_refused_for_its_overlapping_added_tokens():
    """Its normalized=true token '｜DSML｜' overlaps the normalized=false '<｜/table>｜': the
    reference matches the two kinds in two passes, which dtok's one scan does not model."""
    tok = dtok.Tokenizer(shared_path("tokenizers", "deepseek-v4-flash", "tokenizer.json"))
    assert not tok.admission.admitted
    (reason,) = tok.admission.reasons
    assert "'｜DSML｜' overlaps normalized=false '<｜/table>｜'" in reason
    text = "<｜/table>｜DSML｜ and ｜DSML｜ <｜/table>｜DSML｜" * 3
    assert list(tok.encode(text)) == tok.reference.encode(text).ids
