"""The fast encoder behind its guards: routes, confinement of the fallback, loading checks."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from contextlib import nullcontext

import pytest

import dtok
from dtok.tokenizer import parts_of
from conftest import (FAMILY_OF as FAMILY, PER_FILE, ROOT, load_tokenizer, read_text, ref_ids,
                      ref_ids_many, shared_path, tokenizer_path)
from dtok import guards
from dtok.chat import detect_style, render_turns
from dtok.encoders import FastEncoder, FastEncoderError, fastokens_version


@pytest.fixture(autouse=True)
def _need_fastokens():
    if fastokens_version() is None:
        if os.environ.get("CI"):
            pytest.fail("fastokens (the test extra) must be installed in CI")
        pytest.skip("fastokens not installed")


def fast_tok(name: str, **knobs) -> dtok.Tokenizer:
    tok = load_tokenizer(name, **knobs)
    assert tok.encoder.name == "fastokens", tok.stats()
    return tok


def fastokens_alone(name: str, **knobs) -> dtok.Tokenizer:
    """A fresh clone of :func:`fast_tok` with no specialist: fastokens takes every chunk its
    guards allow, as on the real files these tests name (gigatoken's tables measured it no
    faster there). Without ../shared, a real file's small stand-in (``llama3-tiny`` for
    ``llama3``: tests/conftest.py) may load one (its gigatoken table measured gigatoken
    faster on Latin text): the clone then drops it, and runs on the stand-in's own fastokens
    and guard table."""
    tok = fast_tok(name, **knobs).with_knobs()
    encoder = parts_of(tok).chunk_encoder
    if encoder.specialist is not None and tokenizer_path(name).name != name:  # a stand-in
        encoder.specialist, encoder.specialist_classes = None, frozenset()
    assert encoder.specialist is None, tok.stats()
    return tok


def test_installed_version_is_what_importlib_metadata_finds(monkeypatch, tmp_path):
    """The guard tables are chosen by the encoders' versions: dtok's own lookup (no
    importlib.metadata import) must give what importlib.metadata gives, wherever it looks."""
    from importlib.metadata import PackageNotFoundError, version

    from dtok.encoders import installed_version

    def metadata(name):
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    for name in ("tokenizers", "fastokens", "gigatoken", "Cython", "typing-extensions",
                 "typing_extensions", "no-such-distribution-dtok"):
        assert installed_version(name) == metadata(name), name
    # first on sys.path wins; a folder with two dist-infos of one name is left to importlib
    for folder, versions in (("a", ["9.8.7"]), ("b", ["1.0"]), ("c", ["2.0", "3.0"])):
        for v in versions:
            info = tmp_path / folder / f"Dtok_Probe-{v}.dist-info"
            info.mkdir(parents=True)
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: dtok-probe\n"
                                           f"Version: {v}\n\nVersion: 0\n")
    for order in (["a", "b"], ["b", "a"], ["c", "a"]):
        monkeypatch.setattr(sys, "path", [str(tmp_path / f) for f in order] + sys.path)
        assert installed_version("dtok-probe") == metadata("dtok-probe"), order
        assert installed_version("dtok_probe") == metadata("dtok_probe"), order


@pytest.mark.parametrize("name", PER_FILE)
def test_auto_uses_fast_encoder_with_shipped_guards(name):
    tok = fast_tok(name)
    assert "guard table" in " ".join(tok.stats()["notes"])
    assert dtok.Tokenizer.from_file(shared_path("tokenizers", name),
                                    encoder="reference").encoder.name == "reference"


@pytest.mark.parametrize("name", PER_FILE)
def test_real_text_differential(name):
    """Code, prose, multilingual and adversarial text through the fast route, whole and chunked."""
    tok = fast_tok(name, chunk_threshold=65536, chunk_target=16384)
    texts = [
        read_text("code", "rust__ripgrep__crates_core_flags_defs.rs.txt")[:200_000],
        read_text("prose", "gutenberg-3261_news-from-nowhere.txt")[:200_000],
        read_text("multilingual", "udhr_all-languages_concatenated.txt")[2_000_000:2_300_000],
        read_text("adversarial", "blns_big-list-of-naughty-strings.txt"),
        read_text("adversarial", "ws_long-whitespace-runs_moby-dick.txt"),
    ]
    for text, want in zip(texts, ref_ids_many(tok, texts)):
        assert list(tok.encode(text)) == want
    stats = tok.stats()  # the fast encoders' pieces (gigatoken's where it measured faster)
    assert stats["fast_pieces"] + stats["second_pieces"] > 10


def nfc_checked(tok: dtok.Tokenizer) -> dtok.Tokenizer:
    """The same tokenizer without the NFC proof: text NFC would change goes to the reference."""
    clone = tok.with_knobs()
    encoder = parts_of(clone).chunk_encoder
    encoder.general = encoder.general._replace(nfc_by_fast=False)
    return clone


def test_guarded_chunk_goes_to_reference_alone():
    """One decomposed accent in a long Qwen3 text, NFC proof not used: only its chunk pays a
    reference encode."""
    tok = nfc_checked(fast_tok("qwen3", content_lookup=False, threads=4))
    text = read_text("prose", "gutenberg-2701_moby-dick.txt")[:600_000]
    text = text[:300_000] + "Cafe\u0301" + text[300_000:]
    ex = tok.explain(text)
    routes = ex["chunk_routes"]
    assert ex["route"] == "chunked" and len(routes) == 4  # Latin text: a piece per thread
    assert sum(r != "fast" for r in routes) == 1 and "not NFC" in " ".join(routes)
    guarded = next(r for r in routes if r != "fast")
    assert int(guarded.split()[2]) < 100, guarded  # only a short stretch around the accent
    before = tok.stats()
    assert list(tok.encode(text)) == ref_ids(tok, text)
    after = tok.stats()
    assert after["reference_pieces"] - before["reference_pieces"] == 1
    assert after["fast_pieces"] - before["fast_pieces"] in (4, 5)  # + the guarded one's rest


def test_unassigned_code_point_is_guarded():
    tok = fast_tok("llama3")
    text = "abc \u0378 def"  # U+0378 is unassigned
    route = tok.explain(text)["chunk_routes"][0]
    assert route.startswith("reference for") and "guard character U+0378" in route
    assert list(tok.encode(text)) == ref_ids(tok, text)
    assert tok.explain("abc def")["chunk_routes"] == ["fast"]


@pytest.mark.parametrize("name", PER_FILE)
def test_noncharacters_are_not_guarded_and_encode_exactly(name):
    """The 66 noncharacters are not guard characters (``dtok.tables.NONCHARACTERS``: no Unicode
    version assigns them), while another unassigned code point and the surrogates are; text
    holding them, in every context of the guard probes and in the naughty-strings file
    (U+FFFE), goes to the fast encoder whole and comes out as the reference's IDs."""
    from dtok.tables import FAST_GUARD, NONCHARACTERS

    assert len(set(NONCHARACTERS)) == 66
    tok = fast_tok(name)
    table = dtok.tables.load(FAMILY[name]).table
    assert not any(table[c] & FAST_GUARD for c in NONCHARACTERS)
    assert table[0x378] & FAST_GUARD and table[0xDFFF] & FAST_GUARD
    probes = "\n".join(ctx.format(c=chr(c)) for c in NONCHARACTERS for ctx in guards.CONTEXTS)
    naughty = read_text("adversarial", "blns_big-list-of-naughty-strings.txt")
    assert "\ufffe" in naughty
    # without the file's own guard characters (U+180E, where tables come from the pipeline's
    # probes: docs/new-files.md), which go to the reference by design
    disagree = set(guards.load(tok.admission.sha256, tok.encoder.version).disagree)
    naughty = "".join(ch for ch in naughty if ord(ch) not in disagree)
    for text in (probes, naughty, probes + naughty[:5000]):
        assert set(tok.explain(text)["chunk_routes"]) == {"fast"}
        assert list(tok.encode(text)) == ref_ids(tok, text)
    for c in NONCHARACTERS[::5]:
        text = f"x{chr(c)}y {chr(c)}{chr(c)} 1{chr(c)}"
        assert list(tok.encode(text)) == ref_ids(tok, text)


def test_nfc_text_with_marks_stays_fast():
    tok = nfc_checked(fast_tok("qwen3"))
    # NFC Devanagari and Thai, full of combining vowel signs: the NFC check passes them
    text = read_text("multilingual", "udhr_mar.txt") + read_text("multilingual", "udhr_tha.txt")
    assert tok.explain(text)["chunk_routes"] == ["fast"]
    assert list(tok.encode(text)) == ref_ids(tok, text)
    hindi = read_text("multilingual", "udhr_hin.txt")  # not NFC (nukta letters): stretches
    route = tok.explain(hindi)["chunk_routes"][0]  # around them go to the reference
    assert route.startswith("reference for") and "not NFC" in route
    assert int(route.split()[2]) < len(hindi) // 2
    assert list(tok.encode(hindi)) == ref_ids(tok, hindi)


def test_probe_disagreement_becomes_a_guard():
    """A code point listed in the guard table is routed to the reference."""
    tok = fast_tok("gpt-oss")
    fake = guards.GuardTable("x", "v", "v", (ord("q"),), {}, "test")
    table = guards.guarded_table(dtok.tables.load("o200k").table, fake)
    from dtok_ext.cuts import CutRules

    rules = CutRules(table, dtok.tables.load("o200k").accept, parts_of(tok).rules.specials, None)
    assert rules.route("plain q text") == (1, 6)
    assert parts_of(tok).rules.route("plain q text") == (0, -1)


def test_probe_finds_no_disagreement_on_a_sample():
    tok = fast_tok("deepseek-v3")
    sep = guards.separator(tok.reference)
    cps = list(range(0x20, 0x3000)) + list(range(0x1F600, 0x1F650))
    for ctx in guards.CONTEXTS[:3]:
        assert list(guards.probe_context(tok.reference, tok.encoder, ctx, cps, sep)) == []


def test_fast_encoder_refuses_a_different_file():
    base = load_tokenizer("qwen3")
    from tokenizers import AddedToken, Tokenizer

    other = Tokenizer.from_str(base.tokenizer_json().decode())
    other.add_tokens([AddedToken("<extra>", special=True)])
    with pytest.raises(FastEncoderError, match="vocabulary size|added tokens"):
        FastEncoder(base.tokenizer_json(), other)


def test_cache_variables_are_kept_out(monkeypatch):
    import fastokens

    seen = {}
    def spy(real):
        def load(raw, *a, **k):
            seen.update({v: os.environ.get(v) for v in ("FASTOKENS_INPUT_CACHE",
                                                         "FASTOKENS_SEGMENT_CACHE")})
            return real(raw, *a, **k)
        return staticmethod(load)

    # from a memory file where the system has them, else from a str
    for name in ("from_file", "from_json_str"):
        monkeypatch.setattr(fastokens.Tokenizer, name, spy(getattr(fastokens.Tokenizer, name)))
    monkeypatch.setenv("FASTOKENS_INPUT_CACHE", "1")
    monkeypatch.setenv("FASTOKENS_SEGMENT_CACHE", "64")
    base = load_tokenizer("llama3")
    enc = FastEncoder(base.tokenizer_json(), base.reference)
    assert seen == {"FASTOKENS_INPUT_CACHE": None, "FASTOKENS_SEGMENT_CACHE": None}
    assert os.environ["FASTOKENS_INPUT_CACHE"] == "1"  # restored for the caller
    assert enc.native.segment_cache_stats() is None


def test_no_cross_call_state():
    """A session's appends replayed in one process give what fresh processes give."""
    name = "qwen3"
    tok = fast_tok(name, content_lookup=False, chunk_threshold=8192, chunk_target=4096)
    turns = render_turns(json.loads(shared_path(
        "corpus", "transcripts", "sweagent-demo-ctf-rev__rock.json").read_bytes()),
        detect_style(tok.admission.added_tokens))
    here = [list(tok.encode(t)) for t in turns]  # every turn encoded whole: no session reuse
    assert here == ref_ids_many(tok, turns)
    script = (
        "import json, sys, dtok\n"
        "tok = dtok.Tokenizer.from_file(sys.argv[1], content_lookup=False,"
        " chunk_threshold=8192, chunk_target=4096)\n"
        "assert tok.encoder.name == 'fastokens'\n"
        "texts = json.load(sys.stdin)\n"
        "print(json.dumps([list(tok.encode(t)) for t in texts]))\n"
    )
    for pick in (turns[-1:], turns[len(turns) // 2 : len(turns) // 2 + 1], turns[::-7]):
        proc = subprocess.run([sys.executable, "-c", script, str(shared_path("tokenizers", name))],
                              input=json.dumps(pick), capture_output=True, text=True,
                              cwd=ROOT, check=True)
        fresh = json.loads(proc.stdout)
        assert fresh == [here[turns.index(t)] for t in pick]


def test_unstable_windows_match_per_window_normalization():
    """The one-call NFC check finds exactly the windows the reference normalizer changes."""
    import random

    tok = load_tokenizer("qwen3")
    normalize = tok.reference.normalizer.normalize_str
    frag = ["e\u0301", "\u0958", "a", " ", "\u1100\u1161", "\uac00\u11a8", "x\u0323\u0302",
            "\u0301\u0323", "\uf900", "\u212b", "\n", "\U0001d15e", "\u0f73"]
    rng = random.Random(1)
    for _ in range(2000):
        s = "".join(rng.choice(frag) for _ in range(rng.randint(1, 12)))
        windows = parts_of(tok).rules.nfc_windows(s)
        want = [(a, c) for a, c in windows if normalize(s[a:c]) != s[a:c]]
        assert parts_of(tok).rules.unstable_windows(s) == want, s
        assert parts_of(tok).chunk_encoder.unstable(s) == want
    assert parts_of(tok).rules.unstable_windows("a\ufdd0b\u0301") is None  # holds the separator
    assert parts_of(tok).chunk_encoder.unstable("a\ufdd0e\u0301\u0958") == [(2, 5)]  # by bisection


# --- the NFC proof, its control, coalescing, parallel calls, memory ---------------------------

NFD_TEXTS = [("adversarial", "udhr_mixed_NFD.txt"), ("adversarial", "udhr_kor_NFD_jamo.txt"),
             ("adversarial", "udhr_vie_NFD.txt"), ("multilingual", "udhr_hin.txt")]


def test_nfc_proof_is_recorded_and_used():
    """Qwen3's shipped guard table records the NFC proof: NFD text stays on fastokens, exact."""
    tok = fast_tok("qwen3", content_lookup=False, chunk_threshold=65536, chunk_target=16384)
    guard = guards.load(tok.admission.sha256, fastokens_version())
    assert guard.nfc_proven and guard.nfc["n_failures"] == 0
    assert guard.nfc["probes"]["pairs"] > 10_000_000 and guard.nfc["unprobed"]
    assert parts_of(tok).chunk_encoder.general.nfc_by_fast
    assert "proven" in " ".join(tok.stats()["notes"])
    texts = [read_text(*p) for p in NFD_TEXTS]
    texts.append("".join(texts))
    for text, want in zip(texts, ref_ids_many(tok, texts)):
        assert all(r == "fast" for r in tok.explain(text)["chunk_routes"])
        before = tok.stats()["reference_pieces"]
        assert list(tok.encode(text)) == want
        assert tok.stats()["reference_pieces"] == before
    # a code point newer than the probes' sources is a guard character where the proof is used
    new = chr(guard.nfc["unprobed"][0][0])
    assert parts_of(tok).rules.route("ab" + new) == (1, 2)


def _fastokens_without_nfc(tok: dtok.Tokenizer) -> FastEncoder:
    """A real fastokens on the same file with its normalizer removed: an encoder whose NFC
    differs from the reference's, which the NFC proof does not cover."""
    import fastokens

    spec = json.loads(tok.tokenizer_json())
    spec["normalizer"] = None
    enc = object.__new__(FastEncoder)
    enc.native = fastokens.Tokenizer.from_json_str(json.dumps(spec))
    enc.native.enable_segment_cache(0)
    enc.version = fastokens_version()
    return enc


def test_control_nfc_probes_reject_another_normalizer():
    """The control of the proof: the same probes through an encoder without NFC find
    disagreements in every probe set (while the real fast encoder passes them)."""
    tok = fast_tok("qwen3")
    table = dtok.tables.load("qwen2").table
    sets, _ = guards.nfc_probe_sets(table, guards._guard_mask(table, ()))
    wrong = _fastokens_without_nfc(tok)
    import itertools

    for name, probes in sets.items():
        sample = list(itertools.islice(iter(probes), 0, None, max(1, len(probes) // 20000)))
        assert guards.nfc_disagreements(tok.reference, wrong.encode, sample), name
        assert not guards.nfc_disagreements(tok.reference, tok.encoder.encode, sample), name


def test_control_forced_nfc_proof_finds_differences():
    """The control of the route: forcing the proof's use on an encoder it does not cover
    (fastokens without NFC) makes the battery find differences; with the NFC check on, the same
    encoder is exact on the same texts (the check sends what it cannot take to the reference)."""
    from battery import battery_texts

    base = fast_tok("qwen3", chunk_threshold=4096, chunk_target=1024)
    texts = battery_texts(base)[:150] + [read_text(*p)[:20_000] for p in NFD_TEXTS]
    wants = ref_ids_many(base, texts)
    wrong = _fastokens_without_nfc(base)
    forced = base.with_knobs()
    encoder = parts_of(forced).chunk_encoder
    encoder.general = encoder.general._replace(encoder=wrong, nfc_by_fast=True)
    diffs = sum(list(forced.encode(t)) != w for t, w in zip(texts, wants))
    assert diffs >= 20, "the battery cannot see an unproven normalizer"
    checked = nfc_checked(forced)
    encoder = parts_of(checked).chunk_encoder
    encoder.general = encoder.general._replace(encoder=wrong)
    assert [list(checked.encode(t)) for t in texts] == wants


class _CallCounter:
    """Counts the calls an encoder gets (and from which threads); the encoder itself runs."""

    def __init__(self, enc):
        self.enc, self.name, self.calls, self.threads = enc, enc.name, 0, set()

    def encode(self, text):
        return self.encode_many([text])[0]

    def encode_many(self, texts):
        import threading

        self.calls += 1
        self.threads.add(threading.get_ident())
        return self.enc.encode_many(texts)

    def encode_stretches(self, texts):
        self.calls += 1
        return self.enc.encode_stretches(texts)


def _counted(tok: dtok.Tokenizer) -> dtok.Tokenizer:
    p = parts_of(tok).chunk_encoder
    p.general = p.general._replace(encoder=_CallCounter(p.general.encoder))
    p.reference = _CallCounter(p.reference)
    return tok


@pytest.mark.parametrize("threads", [1, 2])
def test_thousands_of_spots_cost_few_calls(threads):
    """A text with thousands of guard characters (and, NFC proof off, thousands of spots NFC
    changes) costs at most `threads` reference calls and `threads` fast calls per encode."""
    prose = read_text("prose", "gutenberg-2701_moby-dick.txt")[:400_000]
    guarded = "".join(prose[i:i + 150] + "\u0378" for i in range(0, len(prose), 150))
    nfd = "".join(prose[i:i + 150] + "e\u0301" for i in range(0, len(prose), 150))
    for name, text, proof in (("llama3", guarded, True), ("qwen3", nfd, False)):
        tok = _counted(fastokens_alone(name, threads=threads, content_lookup=False))
        encoder = parts_of(tok).chunk_encoder
        general = encoder.general
        encoder.general = general._replace(nfc_by_fast=general.nfc_by_fast and proof)
        spots = len(text) // 150
        n_ref = sum(1 for seg in encoder.stretches(text) if seg[2] is not None)
        assert n_ref > spots // 10, (name, n_ref)  # not merged into one: many short stretches
        assert list(tok.encode(text, add_special_tokens=False)) == ref_ids(tok, text, False)
        assert encoder.reference.calls <= threads and tok.encoder.calls <= threads, name


def test_chunks_run_on_every_thread():
    """threads=2: the fast encoder gets two calls, one in this thread, one on the pool."""
    tok = _counted(fast_tok("gpt-oss", threads=2, content_lookup=False).with_knobs())
    text = read_text("prose", "gutenberg-2701_moby-dick.txt")[:1_000_000]
    assert list(tok.encode(text, add_special_tokens=False)) == ref_ids(tok, text, False)
    assert tok.encoder.calls == 2 and len(tok.encoder.threads) == 2
    one = _counted(fast_tok("gpt-oss", threads=1, content_lookup=False).with_knobs())
    one.encode(text)
    assert one.encoder.calls == 1


def test_close_ends_the_encoding_threads_and_the_next_encode_starts_them():
    """``tok.close()`` ends dtok's encoding threads, and with them what the fast encoder keeps
    on each (its memo of words is per thread: docs/encoders.md); the tokenizer still encodes,
    exactly, on a thread started again."""
    tok = _counted(fast_tok("qwen3", threads=2, content_lookup=False).with_knobs())
    text = read_text("prose", "gutenberg-2701_moby-dick.txt")[:1_000_000]
    want = ref_ids(tok, text, False)
    assert list(tok.encode(text, add_special_tokens=False)) == want
    pool_threads = tok.encoder.threads - {threading.get_ident()}
    assert len(pool_threads) == 1
    tok.close()
    assert not pool_threads & {t.ident for t in threading.enumerate()}
    tok.encoder.threads.clear()
    assert list(tok.encode(text, add_special_tokens=False)) == want
    assert len(tok.encoder.threads - {threading.get_ident()}) == 1


def test_one_piece_result_is_the_fast_encoders_buffer():
    """A text encoded in one fast piece with no affix to add is handed out as the encoder's own
    buffer (no copy); with affixes, or in several parts, as one concatenated buffer. Exact
    either way, read-only int32."""
    prose = read_text("prose", "gutenberg-2701_moby-dick.txt")[:300_000]
    for name, special, copied in (("qwen3", True, False), ("llama3", False, False),
                                  ("llama3", True, True)):
        tok = fastokens_alone(name, threads=1, content_lookup=False)
        view = tok.encode(prose, add_special_tokens=special)
        assert list(view) == ref_ids(tok, prose, special)
        assert view.readonly and view.format == "i"
        assert (type(view.obj) is not bytes) == copied, (name, special, type(view.obj))
        assert tok.encode_list(prose, add_special_tokens=special) == ref_ids(tok, prose, special)
    guarded = prose[:150_000] + "\u0378" + prose[150_000:]  # a reference stretch: three parts
    view = fastokens_alone(name, threads=1, content_lookup=False).encode(
        guarded, add_special_tokens=False)
    assert type(view.obj) is not bytes and list(view) == ref_ids(tok, guarded, False)


def test_one_whole_piece_is_one_fast_call(monkeypatch):
    """A text the stateless route keeps in one piece, all of it the fast encoder's, is one
    ``encode`` call with the text itself; with a guard character in it, the routed path
    (``encode_many`` for the fast stretches, the reference for the guarded one, in turn on
    one thread)."""
    tok = fastokens_alone("llama3", threads=1, content_lookup=False)
    enc, calls = tok.encoder, []
    for method in ("encode", "encode_many"):
        real = getattr(enc, method)
        monkeypatch.setattr(enc, method, lambda arg, real=real, method=method:
                            calls.append((method, arg)) or real(arg))
    prose = read_text("prose", "gutenberg-2701_moby-dick.txt")[:200_000]
    before = tok.stats()
    assert list(tok.encode(prose)) == ref_ids(tok, prose)
    assert len(calls) == 1 and calls[0][0] == "encode" and calls[0][1] is prose
    assert tok.stats()["fast_pieces"] == before["fast_pieces"] + 1
    calls.clear()
    guarded = prose[:100_000] + "\u0378" + prose[100_000:]
    threads = {t.ident for t in threading.enumerate()}
    assert list(tok.encode(guarded)) == ref_ids(tok, guarded)
    assert [method for method, _ in calls] == ["encode_many"]
    assert tok.stats()["reference_pieces"] == before["reference_pieces"] + 1
    # one thread: the reference's stretch is encoded in turn, no pool thread is started
    assert {t.ident for t in threading.enumerate()} <= threads


def test_tokenizer_json_replaces_the_file_bytes():
    """A loaded tokenizer keeps no copy of tokenizer.json; tokenizer_json() gives an equivalent
    one (same IDs, same admission), and admission.sha256 stays the file's SHA-256."""
    import hashlib

    from dtok.admission import TokenizerFiles

    path = shared_path("tokenizers", "llama3", "tokenizer.json")
    tok = fast_tok("llama3")
    assert tok.files.raw == b""
    assert tok.admission.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    again = dtok.Tokenizer(TokenizerFiles(path, tok.tokenizer_json(), None, None,
                                          sha256=tok.admission.sha256))
    assert again.encoder.name == "fastokens" and again.admission == tok.admission
    text = read_text("adversarial", "blns_big-list-of-naughty-strings.txt")
    assert list(again.encode(text)) == list(tok.encode(text)) == ref_ids(tok, text)
    ref_only = dtok.Tokenizer.from_file(path, encoder="reference")
    assert ref_only.with_knobs(encoder="auto").encoder.name == "fastokens"


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_route_scan_matches_a_plain_loop(name):
    """The vectorized routing scan gives what a per-character loop over the table gives, for
    strings of each PEP 393 width, around the edges of its clean ranges, with start/end."""
    import random

    tok = fast_tok(name)
    rules = parts_of(tok).rules
    table = guards.guarded_table(dtok.tables.load(FAMILY[name]).table,
                                 guards.load(tok.admission.sha256, fastokens_version()),
                                 parts_of(tok).chunk_encoder.general.nfc_by_fast)

    def plain(text, start, end, nfc):
        first_other = -1
        for i in range(start, end):
            c = table[ord(text[i])]
            if c & dtok.tables.FAST_GUARD:
                return 1, i
            if nfc and first_other < 0 and not c & dtok.tables.NFC_ANCHOR:
                first_other = i
        return (2, first_other) if first_other >= 0 else (0, -1)

    edges = [0x41, 0x7F, 0x80, 0xE9, 0xFF, 0x100, 0x2FF, 0x300, 0x301, 0x377, 0x378, 0x379,
             0x1FFF, 0x2000, 0x2019, 0x2064, 0x2065, 0x2066, 0xFFFD, 0xFFFF, 0x10000, 0x1F600,
             0xE0001, 0x10FFFF]
    rng = random.Random(5)
    for _ in range(3000):
        pool = rng.sample(edges, 3) + ["a"]
        n = rng.choice([1, 5, 63, 64, 65, 255, 256, 257, 700])
        text = "".join(chr(c) if type(c) is int else c for c in
                       (rng.choice(pool) if rng.random() < 0.05 else "a" for _ in range(n)))
        start = rng.randrange(0, n)
        end = rng.choice([None, rng.randrange(start, n + 1)])
        for nfc in (None, False):
            want = plain(text, start, n if end is None else end,
                         rules.nfc if nfc is None else False)
            assert rules.route(text, start, end, nfc=nfc) == want, (text, start, end, nfc)
        spans = [(i, i + 1) for i in range(start, n if end is None else end)
                 if table[ord(text[i])] & dtok.tables.FAST_GUARD]
        merged = []
        for a, b in spans:
            if merged and merged[-1][1] == a:
                merged[-1] = (merged[-1][0], b)
            else:
                merged.append((a, b))
        assert rules.guard_spans(text, start, end) == merged


@pytest.mark.parametrize("name", ["qwen3", "llama3"])
def test_route_writing_utf8_answers_as_the_scan(name):
    """``route(utf8=True)`` gives the scan's answer, and leaves on the str exactly CPython's
    UTF-8 when the text routes fast and nothing otherwise: strings of each PEP 393 width over
    the UTF-8 writer's threshold, a guard character or (NFC checked) a non-anchor at every
    place of a vector step, at the ends, in the last 16 characters."""
    from dtok_ext.cuts import ROUTE_FAST
    from dtok_ext.utf8 import MIN_CHARS, available, cache_utf8

    if not available():
        pytest.skip("this interpreter's build or allocators decline to write UTF-8")
    rules = parts_of(fast_tok(name)).rules
    n = MIN_CHARS + 37
    fast_seen = other_seen = 0
    for base in ("plain text, caf\u00e9 ", "\u201cquoted\u201d \u0101 ", "emoji \U0001f600 "):
        body = (base * n)[:n]
        for bad in (None, "\u0378", "\u0301", "\ud800", "\U000e01f0"):
            for at in ((0,) if bad is None else (0, 1, 15, 16, 17, 31, n // 2, n - 17, n - 1)):
                text = body if bad is None else body[:at] + bad + body[at + 1:]
                for nfc in (None, False):
                    want = rules.route((text + " ")[:-1], nfc=nfc)
                    s = (text + " ")[:-1]
                    assert rules.route(s, nfc=nfc, utf8=True) == want, (base, bad, at, nfc)
                    if want[0] == ROUTE_FAST:
                        fast_seen += 1
                        assert not cache_utf8(s)  # it holds its UTF-8 already
                        assert s.encode("utf-8") == text.encode("utf-8")
                    else:
                        other_seen += 1
                        assert cache_utf8(s) != ("\ud800" in text)  # nothing was left on it
    assert fast_seen >= 6 and other_seen >= 50


# --- gigatoken: the second fast encoder behind its own guards --------------------------------

def _need_gigatoken():
    from dtok.encoders import gigatoken_version

    if gigatoken_version() is None:
        if os.environ.get("CI"):
            pytest.fail("gigatoken (the test extra) must be installed in CI")
        pytest.skip("gigatoken not installed")


def giga_table(tok: dtok.Tokenizer) -> guards.GuardTable:
    from dtok.encoders import gigatoken_version

    guard = guards.load(tok.admission.sha256, gigatoken_version(), "gigatoken")
    assert guard is not None, f"no gigatoken guard table for {tok.files.path}"
    return guard


def with_giga(tok: dtok.Tokenizer, classes=("latin", "other"), guarded: bool = True,
              renew_chars: int | None = None) -> dtok.Tokenizer:
    """A clone whose specialist is gigatoken, taking ``classes`` (all: every chunk goes to it
    first). ``guarded=False`` is the control's private hook: gigatoken's guards switched off
    (no guard character at all, its NFC taken as proven), so it gets every piece whole."""
    from dtok.encoders import GigaEncoder
    from dtok.loading import GuardedEncoder
    from dtok_ext.cuts import CutRules

    guard = giga_table(tok)
    fam = dtok.tables.load(tok.admission.family)
    nfc = tok.admission.nfc and guard.nfc_proven
    if guarded:
        table = guards.guarded_table(fam.table, guard, nfc)
    else:
        table = bytes(c & ~dtok.tables.FAST_GUARD for c in fam.table)
        nfc = True
    normalize = tok.reference.normalizer.normalize_str if tok.admission.nfc else None
    clone = tok.with_knobs()
    encoder = parts_of(clone).chunk_encoder
    encoder.specialist = GuardedEncoder(
        GigaEncoder(tok.tokenizer_json(), tok.reference, renew_chars),
        CutRules(table, fam.accept, parts_of(tok).rules.specials, normalize), nfc)
    encoder.specialist_classes = frozenset(classes)
    return clone


def giga_adversarial(tok: dtok.Tokenizer, n: int = 40, seed: int = 3) -> list[str]:
    """Adversarial corpus windows with the code points gigatoken's probes disagree on (and, for
    an NFC file, the mark pairs its NFC gets wrong) inserted: text that needs its guards."""
    import random

    from battery import CORPUS_WINDOWS, FRAGMENTS

    guard = giga_table(tok)
    spots = [chr(c) for c in guard.disagree] or FRAGMENTS
    rng = random.Random(seed)
    out = []
    for j in range(n):
        src = read_text(*CORPUS_WINDOWS[j % len(CORPUS_WINDOWS)])
        start = rng.randrange(max(1, len(src) - 3000))
        text = src[start:start + rng.randint(500, 3000)]
        for _ in range(rng.randint(4, 12)):
            k = rng.randrange(len(text) + 1)
            text = text[:k] + rng.choice(spots) * rng.randint(1, 2) + text[k:]
        out.append(text)
    return out


@pytest.mark.parametrize("name", PER_FILE)
def test_gigatoken_guard_tables_ship(name):
    """Every tested file has a gigatoken guard table for these versions, with the probes'
    results and the speed measurement the router reads; a table without one (Qwen3.5's: its
    measurement ran on a busy machine) keeps gigatoken out of service."""
    _need_gigatoken()
    tok = load_tokenizer(name)
    guard = giga_table(tok)
    assert guard.encoder == "gigatoken" and guard.checked["code_points"] > 1_100_000
    if not guard.speed:
        assert parts_of(tok).chunk_encoder.specialist is None
        assert "no speed measurement" in " ".join(tok.stats()["notes"])
        return
    assert guard.speed["ratio"].keys() == {"latin", "other"}
    if tok.admission.nfc:
        assert guard.nfc["probes"]["pairs"] > 10_000_000
    notes = " ".join(tok.stats()["notes"])
    assert "gigatoken" in notes
    encoder = parts_of(tok).chunk_encoder
    assert (encoder.specialist is not None) == bool(encoder.specialist_classes)


@pytest.mark.parametrize("name", PER_FILE)
def test_gigatoken_lane_is_exact(name):
    """gigatoken first for every piece, behind its guards: battery texts, real text and text
    aimed at its guards, whole and chunked, give the reference's IDs; what its guards send away
    goes to fastokens where fastokens' guards allow, else to the reference."""
    _need_gigatoken()
    from battery import battery_texts

    base = fast_tok(name, chunk_threshold=8192, chunk_target=2048, content_lookup=False)
    tok = with_giga(base)
    texts = battery_texts(base)[:120] + giga_adversarial(base)
    texts += [read_text("prose", "gutenberg-2701_moby-dick.txt")[:60_000],
              read_text("multilingual", "udhr_all-languages_concatenated.txt")[:60_000]]
    texts.append("".join(texts[:200]))  # long: chunked
    wants = ref_ids_many(tok, texts, False)
    for text, want in zip(texts, wants):
        assert list(tok.encode(text, add_special_tokens=False)) == want, ascii(text[:80])
    assert list(tok.encode(texts[-1])) == ref_ids(tok, texts[-1])
    s = tok.stats()
    assert s["second_encoder"] == "gigatoken" and s["second_pieces"] > 50, s
    rules = parts_of(base).rules
    if any(rules.route(chr(c), nfc=False) == (0, -1) for c in giga_table(base).disagree):
        assert s["fast_pieces"] > 0  # stretches gigatoken's guards sent to fastokens


@pytest.mark.parametrize("name", PER_FILE)
def test_control_gigatoken_without_guards_finds_differences(name):
    """The control: the same texts with gigatoken's guards switched off (private hook) give
    differences; with them on, none (the test above)."""
    _need_gigatoken()
    base = fast_tok(name, chunk_threshold=8192, chunk_target=2048, content_lookup=False)
    if not giga_table(base).disagree:
        pytest.skip("gigatoken's probes found no disagreement on this file: no guard to remove")
    off = with_giga(base, guarded=False)
    texts = giga_adversarial(base)
    wants = ref_ids_many(base, texts, False)
    diffs = sum(list(off.encode(t, add_special_tokens=False)) != w for t, w in zip(texts, wants))
    assert diffs >= 5, f"the battery cannot see gigatoken without its guards ({diffs})"
    on = with_giga(base)
    assert [list(on.encode(t, add_special_tokens=False)) for t in texts] == wants


def test_gigatoken_instance_is_renewed():
    """The pre-token cache bound: after renew_chars characters the native instance is replaced,
    and the IDs stay the reference's."""
    _need_gigatoken()
    base = fast_tok("qwen3", content_lookup=False)
    tok = with_giga(base, renew_chars=100_000)
    giga = parts_of(tok).chunk_encoder.specialist.encoder
    first = giga.native
    text = read_text("prose", "gutenberg-2701_moby-dick.txt")[:300_000]
    for k in range(0, len(text), 30_000):
        part = text[k:k + 30_000]
        assert list(tok.encode(part, add_special_tokens=False)) == ref_ids(tok, part, False)
    assert giga.renewals >= 2 and giga.native is not first


def test_text_class_of_real_text():
    """The router's text classes: prose and code (curly quotes and dashes included) are
    'latin', text in other scripts 'other'."""
    from dtok.chunk_encoder import text_class

    for kind, name in (("prose", "gutenberg-2701_moby-dick.txt"),
                       ("code", "go__fzf__src_pattern.go.txt")):
        text = read_text(kind, name)
        assert {text_class(text[i:i + 65536]) for i in range(0, len(text), 65536)} == {"latin"}
    for name in ("udhr_cmn_hans.txt", "udhr_hin.txt", "udhr_rus.txt", "udhr_kor.txt"):
        assert text_class(read_text("multilingual", name)) == "other", name
    assert text_class("plain ascii") == "latin" and text_class("") == "latin"


@pytest.mark.parametrize("name", PER_FILE)
def test_cut_free_stretches_are_the_gaps_between_safe_cuts(name):
    """Every stretch between consecutive safe cuts longer than the bound, and nothing else, on
    real hard text with long single-class runs spliced in (checked against every safe cut)."""
    import random

    rules = parts_of(fast_tok(name)).rules
    rng = random.Random(11)
    src = (read_text("adversarial", "blns_big-list-of-naughty-strings.txt")[:3000]
           + read_text("code", "go__fzf__src_pattern.go.txt")[:2000])
    runs = ["a" * 90, " " * 70, "!" * 60, "1" * 80, "中" * 50, "\u00e9" * 40, "\n" * 45, "Ab" * 30]
    for _ in range(40):
        parts = []
        for _ in range(rng.randint(1, 6)):
            i = rng.randrange(len(src))
            parts += [src[i:i + rng.randint(0, 120)], rng.choice(runs)]
        text = "".join(parts)
        longest = rng.choice([8, 24, 41])
        cuts = [0] + rules.safe_positions(text) + [len(text)]
        want = [(a, b) for a, b in zip(cuts, cuts[1:]) if b - a > longest]
        assert rules.cut_free_stretches(text, longest) == want, (text, longest)


@pytest.mark.parametrize("name", ["qwen3", "gpt-oss"])
def test_long_cut_free_stretches_go_to_the_reference(name):
    """Stretches with no safe cut over LONGEST_FAST_STRETCH characters (huge single-class runs)
    are the reference's (see tests/test_memory.py for why); the rest of the text stays fast;
    the IDs are the reference's, through the stateless route, a session and a batch."""
    from dtok.chunk_encoder import LONGEST_FAST_STRETCH

    tok = fast_tok(name, content_lookup=False)
    prose = read_text("prose", "gutenberg-2701_moby-dick.txt")[:20_000]
    n = LONGEST_FAST_STRETCH + 10
    texts = [prose + "a" * n + prose, " " * n, prose + "=" * n, "x" + "\u4e2d" * n + "。" + prose]
    for text in texts:
        routes = tok.explain(text)["chunk_routes"]
        assert any("no safe cut for" in r for r in routes), routes
        assert list(tok.encode(text)) == ref_ids(tok, text)
    assert [list(x) for x in tok.encode_batch(texts)] == ref_ids_many(tok, texts)
    ok = "a" * LONGEST_FAST_STRETCH  # at the bound: the fast encoder's
    assert parts_of(tok).chunk_encoder.routes([ok]) == ["fast"]
    for text in (prose, prose + "b" * n, prose + "b" * n + prose):  # appends to a session
        assert list(tok.encode(text, session="long runs")) == ref_ids(tok, text)


def test_default_threads_share_a_text_only_where_the_split_pays(monkeypatch):
    """With the threads left to dtok, a text's chunks go on several threads only where the
    split is expected to save AUTO_SPLIT_SAVING (on two threads 800K characters of prose stay
    on one, 1M go on two), or where fastokens has BPE threads of its own the bound measured
    beside them (1M characters of prose on one thread); an explicit ``threads`` is used as
    given. The IDs are the reference's either way."""
    from dtok import chunk_encoder

    monkeypatch.setattr(chunk_encoder, "available_cpus", lambda: 2)  # a 2-core machine, whatever this is
    monkeypatch.setenv("FASTOKENS_BPE_THREADS", "1")  # as dtok holds it there
    base = fast_tok("qwen3", content_lookup=False)
    auto, two = base.with_knobs(threads=None), base.with_knobs(threads=2)
    assert parts_of(auto).chunk_encoder.threads == parts_of(two).chunk_encoder.threads == 2
    assert parts_of(auto).chunk_encoder.split_saving == chunk_encoder.AUTO_SPLIT_SAVING
    prose = read_text("prose", "gutenberg-2701_moby-dick.txt")
    multi = read_text("multilingual", "udhr_all-languages_concatenated.txt")
    small, mid, large = prose[:800_000], prose[:1_000_000], (prose * 4)[:4_200_000]
    assert auto.explain(small)["route"] == "whole"  # one piece on one thread, as threads=1
    assert two.explain(small)["why"].startswith("2 chunks on 2 thread(s)")
    assert auto.explain(mid)["why"].startswith("2 chunks on 2 thread(s)")
    assert "on 2 thread(s)" in auto.explain(large)["why"]
    # multilingual text whose first chunk is Latin text: the whole text's work decides
    many = prose[:70_000] + (multi * (1 + 1_000_000 // len(multi)))[:930_000]
    assert "on 2 thread(s)" in auto.explain(many)["why"]
    # other text counts as Latin text (weighed 3x until the ablation of 2026-12-07)
    assert "on 1 thread(s)" in auto.explain(many[-400_000:])["why"]
    assert "on 2 thread(s)" in two.explain(many[-400_000:])["why"]
    for text in (small, mid, large, many[-400_000:]):
        want = ref_ids(base, text)
        assert list(auto.encode(text)) == want and list(two.encode(text)) == want
    # where fastokens shares a call among BPE threads of its own, the bound measured beside them
    monkeypatch.setenv("FASTOKENS_BPE_THREADS", "2")
    beside = base.with_knobs(threads=None)
    assert parts_of(beside).chunk_encoder.split_saving \
        == chunk_encoder.AUTO_SPLIT_SAVING_BESIDE_BPE_THREADS
    assert beside.explain(mid)["route"] == "whole"
    # 1M of other text too (weighed 3x it was split there until 2026-12-07: the 16-core run had
    # such a split lose to fastokens' own threads, docs/benchmarks.md#on-16-cores)
    assert "on 1 thread(s)" in beside.explain(many)["why"]
    assert list(beside.encode(mid)) == ref_ids(base, mid)
    assert list(beside.encode(many)) == ref_ids(base, many)


def encode_recording_threads(monkeypatch, tok: dtok.Tokenizer, text: str
                             ) -> tuple[list[int], list[str]]:
    """``tok.encode(text)`` as a list, and the thread each fast-encoder call was made on."""
    seen: list[str] = []
    encoder = parts_of(tok).chunk_encoder.general.encoder
    many = encoder.encode_many

    def recording(texts):
        seen.append(threading.current_thread().name)
        return many(texts)

    with monkeypatch.context() as patch:
        patch.setattr(encoder, "encode_many", recording)
        ids = list(tok.encode(text))
    return ids, seen


def test_threads_take_runs_of_chunks_and_never_wait_for_one_that_did_not_start(monkeypatch):
    """A text cut into many chunks, which the characters say to split, goes in contiguous runs,
    one a thread, with the threads left to dtok as with an explicit ``threads``. A pool thread
    that never gets to run is not waited for: the calling thread encodes its run too. The IDs
    are the reference's each time."""
    from concurrent.futures import Future

    from dtok import chunk_encoder

    monkeypatch.setattr(chunk_encoder, "available_cpus", lambda: 2)  # a 2-core machine, whatever this is
    monkeypatch.setenv("FASTOKENS_BPE_THREADS", "1")  # as dtok holds it there
    base = fast_tok("qwen3", content_lookup=False)  # its other text in 64K chunks on any threads
    auto, two = base.with_knobs(threads=None), base.with_knobs(threads=2)
    multi = read_text("multilingual", "udhr_all-languages_concatenated.txt")
    text = (multi * (1 + 1_000_000 // len(multi)))[:1_000_000]
    assert "16 chunks on 2 thread(s)," in auto.explain(text)["why"]
    assert "16 chunks on 2 thread(s)," in two.explain(text)["why"]
    want = ref_ids(base, text)

    class NeverRuns:  # a pool whose threads never get a CPU: nothing handed out starts
        def beside(self, jobs, chars=0):
            return [Future() for _ in jobs]

    for tok in (auto, two):
        ids, seen = encode_recording_threads(monkeypatch, tok, text)
        assert ids == want and len(set(seen)) == 2, seen
        with monkeypatch.context() as patch:
            patch.setattr(parts_of(tok).chunk_encoder, "_pool", lambda: NeverRuns())
            done: list = []
            caller = threading.Thread(target=lambda: done.append(
                encode_recording_threads(monkeypatch, tok, text)), name="caller", daemon=True)
            caller.start()
            caller.join(60)  # it must not wait for the helper that never started
            assert done, "the calling thread waited for a pool thread that never ran"
        ids, seen = done[0]
        assert ids == want and set(seen) == {"caller"}, seen


def test_the_caller_takes_the_rest_of_a_slow_pool_threads_run_from_the_back(monkeypatch):
    """A pool thread whose CPU is shared (here each of its steps first waits 30 ms, as a thread
    given a slice of a busy CPU would) takes its run of chunks a step at a time from the front,
    and the calling thread, done with its own run, takes the rest from the back: it encodes
    most of the text instead of waiting. The control: with a step as long as the run (the run
    taken whole), the caller encodes only its own run. The IDs are the reference's each time."""
    from dtok import chunk_encoder, testing

    monkeypatch.setattr(chunk_encoder, "available_cpus", lambda: 2)  # a 2-core machine, whatever this is
    tok = fast_tok("qwen3", content_lookup=False).with_knobs(threads=2)
    multi = read_text("multilingual", "udhr_all-languages_concatenated.txt")
    text = (multi * (1 + 1_000_000 // len(multi)))[:1_000_000]
    assert "16 chunks on 2 thread(s)," in tok.explain(text)["why"]
    want = ref_ids(tok, text)
    caller = threading.current_thread()
    for whole, caller_takes_more in ((False, True), (True, False)):
        chunks = {"caller": 0, "pool": 0}
        pool_took = threading.Event()

        def slow_pool_thread(texts):
            mine = threading.current_thread() is caller
            if mine and not chunks["caller"]:
                # the caller's own run waits until the pool thread has taken its first step,
                # so a pool thread that starts late on a loaded machine cannot make the control
                # see the caller take the whole run (the fallback for a thread that never ran)
                assert pool_took.wait(10), "the pool thread never started"
            if not mine:
                pool_took.set()
                time.sleep(0.03)
            chunks["caller" if mine else "pool"] += len(texts)

        with testing.hooked(testing.CHUNKS_ROUTED, slow_pool_thread):
            with (testing.switched_off(testing.OFF_STEPS) if whole else nullcontext()):
                assert list(tok.encode(text)) == want
        assert chunks["caller"] + chunks["pool"] == 16, chunks
        assert (chunks["caller"] > 8) is caller_takes_more, (whole, chunks)


def test_default_threads_do_not_split_a_piece_unevenly(monkeypatch):
    """A piece's fast stretches around a guard character near its start are one short and one
    long: sharing them out puts nearly all the work on one thread, and with the threads left to
    dtok that split must pay as it is (not as an even split of the same work would, which here
    it does). An explicit ``threads`` still splits. The IDs are the reference's either way."""
    from dtok import chunk_encoder

    monkeypatch.setattr(chunk_encoder, "available_cpus", lambda: 2)  # a 2-core machine, whatever this is
    monkeypatch.setenv("FASTOKENS_BPE_THREADS", "1")  # as dtok holds it there
    base = fast_tok("qwen3", content_lookup=False)
    auto, two = base.with_knobs(threads=None), base.with_knobs(threads=2)
    prose = read_text("prose", "gutenberg-2701_moby-dick.txt")
    short, long = prose[:300], (prose * 2)[:1_000_000]
    # an even split pays
    assert parts_of(auto).chunk_encoder.useful_threads(len(short) + len(long), 1) == 2
    assert parts_of(auto).chunk_encoder.split_threads([short, long]) == 1
    assert parts_of(two).chunk_encoder.split_threads([short, long]) == 2
    text = short + "\u0378" + long[:700_000]  # U+0378: unassigned, a guard
    for tok, calls in ((auto, 1), (two, 2)):  # fast-encoder calls: one per thread used
        ids, seen = encode_recording_threads(monkeypatch, tok, text)
        assert ids == ref_ids(base, text)
        assert len(seen) == calls, seen
