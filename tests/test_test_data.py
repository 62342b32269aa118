"""The repository's own test data (tests/data): the tiny tokenizers keep their real files'
pipelines and are admitted with the same family, the fast encoder runs on them behind shipped
guard tables, the copies are the shared files' bytes, and the build script reproduces them."""
from __future__ import annotations

import gzip
import hashlib
import json
import subprocess
import sys

import pytest

import dtok
from battery import battery_texts, check_cuts, check_repairs, checks_disabled
from conftest import (DATA, FAMILY_OF, HAVE_SHARED, IN_REPO, REQUIRE_SHARED, ROOT, SHARED,
                      STAND_INS, TINY_FILES, load_tokenizer, read_text, repo_text, shared_path,
                      tokenizer_path)
from dtok.encoders import fastokens_version

sys.path.insert(0, str(ROOT / "tools" / "data"))
import build_test_tokenizers as build  # noqa: E402

needs_shared = pytest.mark.skipif(
    not (HAVE_SHARED or REQUIRE_SHARED),
    reason="compares with the real files in ../shared (absent)")


def real_name(tiny: str) -> str:
    return tiny[: -len("-tiny")]


@pytest.mark.parametrize("name", TINY_FILES)
def test_tiny_file_is_admitted_with_its_family(name):
    tok = dtok.Tokenizer.from_file(tokenizer_path(name), encoder="reference")
    a = tok.admission
    assert a.admitted and a.family == FAMILY_OF[name], a.reasons
    assert tok.reference.get_vocab_size(with_added_tokens=False) <= 4096 + 3
    spec = json.loads((tokenizer_path(name) / "tokenizer.json").read_bytes())
    flags = {t["content"]: (t["special"], t["normalized"]) for t in spec["added_tokens"]}
    if name == "qwen3-tiny":
        assert a.nfc and len(flags) == 26
    if name == "llama3-tiny":
        assert a.prefix == (tok.reference.token_to_id("<|begin_of_text|>"),)
        assert spec["model"]["ignore_merges"] and len(flags) == 256
    if name == "deepseek-v3-tiny":
        assert len(spec["pre_tokenizer"]["pretokenizers"]) == 4  # three Splits and ByteLevel
        assert sum(n for _s, n in flags.values()) == 15 and len(flags) == 818
        assert any("normalized=true" in r for r in a.reasons)
        # markers that overlap: one is a prefix of another
        assert flags.keys() >= {"<｜tool▁call▁begin｜>", "<｜tool▁calls▁begin｜>"}
    if name == "gpt-oss-tiny":
        assert spec["model"]["ignore_merges"] and len(flags) == 21
    if name == "tekken-tiny":  # transformers' conversion: Tekken's control tokens first
        assert spec["model"]["ignore_merges"] and spec["normalizer"] is None
        assert len(flags) == 1000 and spec["added_tokens"][1]["content"] == "<s>"
    if name == "kimi-tiny":  # toktier's conversion: reserved ids above the vocabulary
        assert spec["model"]["ignore_merges"] and spec["normalizer"] is None
        assert len(flags) == build.KIMI_RESERVED_TOKENS
        assert all(t["content"] == f"<|reserved_token_{t['id']}|>" for t in spec["added_tokens"])


@pytest.mark.parametrize("name", TINY_FILES)
def test_tiny_file_uses_the_fast_encoder_behind_its_guards(name):
    if fastokens_version() is None:
        pytest.skip("fastokens not installed")
    tok = dtok.Tokenizer.from_file(tokenizer_path(name))
    assert tok.encoder.name == "fastokens", tok.stats()
    assert "guard table" in " ".join(tok.stats()["notes"])


def test_nfc_control_finds_differences_on_the_tiny_nfc_file():
    """The battery's NFC control (test_exactness.py runs it on the real Qwen3) also sees a missing
    NFC check on qwen3-tiny: the small vocabulary does not hide what NFC does to cuts."""
    tok = load_tokenizer("qwen3-tiny")
    texts = battery_texts(tok)
    with checks_disabled(tok, nfc=True):
        assert len(check_cuts(tok, texts, stop_after=20)) >= 20
        assert len(check_repairs(tok, texts, stop_after=20)) >= 20
    assert not check_cuts(tok, texts)


def real_spec(tiny: str) -> dict:
    """The real file a small one is made from: ../shared's, or the one the build script makes
    (skipped where ../shared, or what the script makes it from, is absent)."""
    name = real_name(tiny)
    if name in build.MADE:
        if build.missing_source(name):
            pytest.skip(build.missing_source(name))
        return build.real_file(SHARED, name)[0]
    if not (HAVE_SHARED or REQUIRE_SHARED):
        pytest.skip("compares with the real files in ../shared (absent)")
    return json.loads(shared_path("tokenizers", name, "tokenizer.json").read_bytes())


@pytest.mark.parametrize("name", TINY_FILES)
def test_tiny_file_keeps_the_real_pipeline(name):
    """Every section but the vocabulary is the real file's; added tokens keep flags, order and
    gaps; the post-processor's ids follow them."""
    real = real_spec(name)
    tiny = json.loads((tokenizer_path(name) / "tokenizer.json").read_bytes())
    assert list(real) == list(tiny)
    for key in real:
        if key not in ("model", "added_tokens", "post_processor"):
            assert real[key] == tiny[key], key
    flags = {k: v for k, v in real["model"].items() if k not in ("vocab", "merges")}
    assert {"ignore_merges": False, **flags} == {k: v for k, v in tiny["model"].items()
                                                 if k not in ("vocab", "merges")}
    strip = lambda t: {k: v for k, v in t.items() if k != "id"}  # noqa: E731
    assert list(map(strip, real["added_tokens"])) == list(map(strip, tiny["added_tokens"]))
    ids = {t["id"]: u["id"] for t, u in zip(real["added_tokens"], tiny["added_tokens"])}
    end = max(real["model"]["vocab"].values()) + 1
    assert all(new == old for old, new in ids.items() if old < end)  # DeepSeek's first three
    assert len({new - old for old, new in ids.items() if old >= end}) <= 1  # same gaps after
    renumbered = json.loads(json.dumps(real["post_processor"]))
    for step in [renumbered] + (renumbered or {}).get("processors", []):
        for special in (step or {}).get("special_tokens", {}).values():
            special["ids"] = [ids[i] for i in special["ids"]]
    assert renumbered == tiny["post_processor"]


@needs_shared
def test_copies_are_the_shared_bytes():
    for folder, name in build.CORPUS:
        copy = build.corpus_file(DATA, folder, name).read_bytes()
        if folder != "transcripts":
            copy = gzip.decompress(copy)
        assert copy == shared_path("corpus", folder, name).read_bytes(), name
    for name in IN_REPO:
        repo = gzip.decompress((IN_REPO[name] / "tokenizer.json.gz").read_bytes())
        assert repo == shared_path("tokenizers", name, "tokenizer.json").read_bytes(), name


def test_gpt_oss_copy_is_the_real_file():
    raw = gzip.decompress((IN_REPO["gpt-oss"] / "tokenizer.json.gz").read_bytes())
    assert hashlib.sha256(raw).hexdigest() == build.GPT_OSS_SHA256


def test_stand_ins_have_the_length_of_what_they_stand_for():
    for (folder, name), (_sources, chars) in STAND_INS.items():
        text = repo_text(folder, name)
        assert text and (chars is None or len(text) == chars), name
        if HAVE_SHARED and chars is not None:
            assert len(read_text(folder, name)) == chars, name


@needs_shared
@pytest.mark.slow
def test_build_script_reproduces_the_test_data(tmp_path):
    """tools/data/build_test_tokenizers.py, rerun: the same bytes (about 20 s)."""
    subprocess.run([sys.executable, str(ROOT / "tools" / "data" / "build_test_tokenizers.py"),
                    "--out", str(tmp_path)], check=True, capture_output=True)
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert made
    for rel in made:
        new, old = (tmp_path / rel).read_bytes(), (DATA / rel).read_bytes()
        if rel.suffix == ".gz":
            new, old = gzip.decompress(new), gzip.decompress(old)
        assert new == old, rel
