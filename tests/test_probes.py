"""Guard tables for files dtok has not seen (dtok.probes): equivalent files, the probe file,
the background probes and the switch to the fast encoder, each checked against the reference."""
from __future__ import annotations

import json
import random
import time

import pytest

from conftest import HAVE_SHARED, repo_text, shared_path, tokenizer_path
from dtok import Tokenizer, guards, probes
from dtok.admission import bundled_files, read_files
from dtok.encoders import FastEncoder, fastokens_version

pytestmark = pytest.mark.skipif(fastokens_version() is None, reason="fastokens not installed")


def _reserialised(raw: bytes) -> bytes:
    """The same tokenizer written otherwise: merges as "a b" strings, ignore_merges left out
    where false, keys in another order, minified, with a final newline."""
    doc = json.loads(raw)
    model = doc["model"]
    model["merges"] = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    if model.get("ignore_merges") is False:
        del model["ignore_merges"]
    doc = dict(reversed(list(doc.items())))
    return (json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def _texts(n: int, seed: int) -> list[str]:
    """Distinct texts (no content-lookup hit between them) of prose, code and other scripts."""
    rng = random.Random(seed)
    sources = [repo_text("prose", "gutenberg-2701_moby-dick.txt"),
               repo_text("code", "go__fzf__src_pattern.go.txt"),
               repo_text("multilingual", "udhr_hin.txt"),
               repo_text("adversarial", "udhr_vie_NFD.txt")]
    out = []
    for i in range(n):
        src = sources[i % len(sources)]
        start = rng.randrange(0, max(1, len(src) - 200_000))
        out.append(src[start:start + rng.choice([3000, 40_000, 200_000])])
    return out


# --- the same tokenizer, serialised otherwise -------------------------------------------------


def test_a_reserialised_file_uses_the_known_files_tables_at_once(tmp_path, monkeypatch):
    monkeypatch.setenv("DTOK_CACHE_DIR", str(tmp_path / "cache"))
    files = bundled_files()
    path = tmp_path / "tokenizer.json"
    path.write_bytes(_reserialised(files.raw))
    assert probes.equivalent_sha(path.read_bytes()) == files.sha256
    tok = Tokenizer(path, guard_probes="off")
    assert tok.admission.sha256 != files.sha256  # other bytes ...
    assert tok.encoder.name == "fastokens"  # ... the same tables
    assert any("same content as the known file" in n for n in tok.encoder_notes)
    for text in _texts(4, seed=1):
        assert list(tok.encode(text)) == tok.reference.encode(text).ids


def test_another_tokenizer_is_not_taken_for_an_equivalent():
    """Control: one merge dropped is another tokenizer, with another digest."""
    raw = bundled_files().raw
    doc = json.loads(raw)
    doc["model"]["merges"] = doc["model"]["merges"][:-1]
    assert probes.equivalent_sha(json.dumps(doc).encode()) is None


@pytest.mark.skipif(not HAVE_SHARED, reason="Qwen3's compact serialisation is only in ../shared")
def test_qwen3_compact_is_qwen3():
    path = shared_path("tokenizers", "qwen3-compact", "tokenizer.json")
    tok = Tokenizer(path, guard_probes="off")
    assert tok.encoder.name == "fastokens" and tok.probes() == {"state": "none"}
    text = repo_text("prose", "gutenberg-2701_moby-dick.txt")[:300_000]
    assert list(tok.encode(text)) == tok.reference.encode(text).ids


# --- the probe file tells the pieces -----------------------------------------------------------


@pytest.mark.parametrize("name", ["qwen3", "gpt-oss"])
def test_the_probe_file_ids_are_the_pieces(name):
    """Its IDs are the normalized text's bytes, each marked where a piece ends: decoding them
    gives back the reference's own pre-tokenization, piece by piece."""
    from tokenizers import Tokenizer as Reference
    from tokenizers.pre_tokenizers import ByteLevel

    spec = json.loads(read_files(tokenizer_path(name)).raw)
    probe = Reference.from_str(probes.probe_file_json(spec))
    real = Reference.from_str(json.dumps(spec))
    alphabet = sorted(ByteLevel.alphabet())
    text = "Hello, world!  It's 12345 \u00e9te\u0301\n\n\ttabs 日本語 \U0001F980 x"
    pieces, piece = [], ""
    for i in probe.encode(text, add_special_tokens=False).ids:
        piece += alphabet[i % 256]
        if i >= 256:
            pieces.append(piece)
            piece = ""
    normalized = real.normalizer.normalize_str(text) if real.normalizer else text
    assert pieces == [p for p, _ in real.pre_tokenizer.pre_tokenize_str(normalized)]


class _WrongOnOneCharacter:
    """Control: a real fast encoder whose IDs lose their last element wherever U+10FFFD (a
    private-use character no vocabulary entry holds) is."""

    name = "fastokens"

    def __init__(self, fast) -> None:
        self.fast, self.version = fast, fast.version

    def _fix(self, text, ids):
        return ids[:-1] if "\U0010fffd" in text and len(ids) else ids

    def encode(self, text):
        return self._fix(text, self.fast.encode(text))

    def encode_many(self, texts):
        return [self._fix(t, ids) for t, ids in zip(texts, self.fast.encode_many(texts))]


def test_the_files_part_finds_where_the_fast_encoder_disagrees(tmp_path):
    """On Qwen3's small test file, over a sample of code points that holds U+10FFFD."""
    from tokenizers import Tokenizer as Reference

    raw = read_files(tokenizer_path("qwen3-tiny")).raw
    reference = Reference.from_buffer(raw)
    fast = FastEncoder(raw, reference)
    pipeline = probes.load_pipeline(json.loads(raw), fast.version)
    sample = [*range(0x20, 0x3000), *range(0x10F000, 0x110000)]
    wrong = probes.build_file(reference, _WrongOnOneCharacter(fast), "0" * 64, pipeline,
                              out_dir=tmp_path, code_points=sample)
    assert 0x10FFFD in wrong.disagree
    table = probes.build_file(reference, fast, "0" * 64, pipeline, out_dir=tmp_path,
                              code_points=sample)
    assert 0x10FFFD not in table.disagree and set(pipeline.disagree) <= set(table.disagree)


# --- a file dtok has never seen -----------------------------------------------------------------


def _new_file_of_a_known_pipeline(tmp_path) -> "Path":  # noqa: F821
    """Llama 3's small test file with its last merge dropped: another tokenizer, no table,
    the shipped pipeline's."""
    doc = json.loads(read_files(tokenizer_path("llama3-tiny")).raw)
    doc["model"]["merges"] = doc["model"]["merges"][:-1]
    path = tmp_path / "new" / "tokenizer.json"
    path.parent.mkdir()
    path.write_text(json.dumps(doc))
    return path


def test_a_new_file_reaches_the_fast_path_in_the_background(tmp_path, monkeypatch):
    """A tokenizer and a pool over a new file start on the reference and probe it once
    (the two jobs share the cache's lock); the tokenizer then takes the fast encoder between
    two requests, and the pool's zygote takes it and renews the workers one at a time. Every
    request is exact before, while and after they switch; sessions carry across."""
    from dtok.pool import Pool

    monkeypatch.setenv("DTOK_CACHE_DIR", str(tmp_path / "cache"))
    path = _new_file_of_a_known_pipeline(tmp_path)
    spec = json.loads(path.read_bytes())
    assert probes.load_pipeline(spec, fastokens_version()) is not None, "pipeline table ships"
    with Pool(path, workers=2, name="renew", chunk_threshold=50_000) as pool:
        tok = Tokenizer(path)
        assert tok.encoder.name == "reference" and tok.probes()["state"] == "running"
        assert tok.explain("x")["probes"]["state"] == "running"
        assert pool.encoder_name == "reference" and pool.stats()["probes"]["state"] == "running"
        ref, session, encodes = tok.reference, "", 0
        while True:  # exact while the probes run and as each switches
            (text,) = _texts(1, seed=1000 + encodes)
            ids = ref.encode(text).ids
            assert list(tok.encode(text)) == ids and list(pool.encode(text)) == ids
            session += text[:2000]
            assert list(pool.encode(session, session="s")) == ref.encode(session).ids
            encodes += 1
            stats = pool.stats()
            if tok.probes()["state"] != "running" and stats["encoder"] == "fastokens" \
                    and stats["workers_to_renew"] == 0 or encodes == 400:
                break
            time.sleep(0.05)  # requests spaced out: the probes run at the lowest priority
        status = tok.probes(wait=120)
        assert status["state"] == "done", status
        assert tok.encoder.name == "fastokens"
        assert stats["probes"]["state"] == "done", stats["probes"]
        assert stats["encoder"] == "fastokens" and stats["workers_to_renew"] == 0
        assert stats["worker_renewals"] == 2 and stats["worker_deaths"] == 0
        assert all(w["alive"] for w in stats["workers"])
        before = tok.stats()["fast_pieces"]
        for text in _texts(8, seed=3):
            ids = ref.encode(text).ids
            assert list(tok.encode(text)) == ids and list(pool.encode(text)) == ids
            assert list(tok.encode(text + " more", session="s")) == \
                ref.encode(text + " more").ids
            session += text[:3000]
            assert list(pool.encode(session, session="s")) == ref.encode(session).ids
        assert tok.stats()["fast_pieces"] > before
    table = guards.load(tok.admission.sha256, fastokens_version())
    assert table is not None and table.checked["pipeline"].startswith(
        probes.pipeline_key(spec)[:16])
    # the next process (here: the next load) finds the table in the cache and starts fast
    again = Tokenizer(path)
    assert again.encoder.name == "fastokens" and again.probes() == {"state": "none"}
    assert encodes > 0


def test_probes_off_keeps_the_reference(tmp_path, monkeypatch):
    monkeypatch.setenv("DTOK_CACHE_DIR", str(tmp_path / "cache"))
    tok = Tokenizer(_new_file_of_a_known_pipeline(tmp_path), guard_probes="off")
    assert tok.encoder.name == "reference" and tok.probes() == {"state": "none"}
    with pytest.raises(ValueError, match="guard_probes"):
        Tokenizer.default(guard_probes="sometimes")


@pytest.mark.skipif(not HAVE_SHARED, reason="Llama-3.1's file is only in ../shared")
def test_llama_instruct_and_nemotron_files_are_llama_3_1():
    """The Llama-3.1-8B/70B/405B-Instruct file is Llama-3.1-8B's without its final newline;
    NVIDIA's Llama-Nemotron repositories ship it as ``to_str(pretty=True)`` writes it (their
    SHA-256 as toktier's sibling_aliases.v1.json records them)."""
    from tokenizers import Tokenizer as Reference

    from dtok.digests import sha256

    raw = shared_path("tokenizers", "llama3", "tokenizer.json").read_bytes()
    known = sha256(raw).hexdigest()
    instruct = raw.rstrip(b"\n")
    nemotron = Reference.from_buffer(raw).to_str(pretty=True).encode("utf-8")
    assert sha256(instruct).hexdigest().startswith("79e3e522635f3171")
    assert sha256(nemotron).hexdigest().startswith("6b9e4e7fb171f92f")
    assert probes.equivalent_sha(instruct) == known == probes.equivalent_sha(nemotron)


def test_probes_that_cannot_start_leave_the_reference_serving(tmp_path, monkeypatch):
    """A cache that cannot be written (a file where its folder should be): the load succeeds,
    the reference serves exactly, and the probes say why they failed."""
    blocked = tmp_path / "cache"
    blocked.write_text("not a folder")
    monkeypatch.setenv("DTOK_CACHE_DIR", str(blocked))
    path = _new_file_of_a_known_pipeline(tmp_path)
    raw = path.read_bytes()
    from dtok.admission import TokenizerFiles

    # bytes whose path does not exist: the probes need a copy in the cache
    tok = Tokenizer(TokenizerFiles(tmp_path / "gone" / "tokenizer.json", raw, None, None))
    status = tok.probes()
    assert status["state"] == "failed" and "Error" in status["error"], status
    text = repo_text("prose", "gutenberg-2701_moby-dick.txt")[:50_000]
    assert tok.encoder.name == "reference"
    assert list(tok.encode(text)) == tok.reference.encode(text).ids
