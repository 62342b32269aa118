"""Shared fixtures: real tokenizer files and real text (never mocks), from two sets.

**The repository's set** (always here):

* ``tests/data/tokenizers/<name>-tiny``: one small test tokenizer per admitted family, built by
  ``tools/data/build_test_tokenizers.py`` from the real file (its ``TINY`` lists them with
  their families: ``REAL_FILES``, ``TINY_FILES`` and ``FAMILY_OF`` here come from it): every
  stage of its pipeline (normalizer, pre-tokenizer, the model's flags, added tokens with their
  flags, post-processor, decoder) is the real file's; only the vocabulary is small, trained by
  ``tokenizers``' ``BpeTrainer`` on public-domain text. Safe cuts depend on the stages, not on the vocabulary, so the battery, its
  control, sessions, chunking, the pool and the fast encoder's guards run on them:
  ``qwen3-tiny`` (qwen2, NFC), ``llama3-tiny`` (llama3, BOS template, ``ignore_merges``),
  ``deepseek-v3-tiny`` (three Splits, ``normalized=true`` and overlapping added tokens),
  ``gpt-oss-tiny`` (o200k).
* the small files of the families with no real file in ``../shared`` (``MADE_TINY_FILES``:
  ``tekken-tiny``, Mistral's Tekken file as ``transformers`` converts it; ``kimi-tiny``, Kimi's
  pipeline as toktier converts it): made by the same script from those primary sources. The
  exactness battery and its control (``BATTERY_FILES``), admission and their family's tests run
  on them; the other ``MAIN_FILES`` tests (sessions, pool, edits, integrations) do not, to keep
  the suite's time.
* two real files: Qwen3-8B (bundled in the package, ``dtok/data/qwen3``) and gpt-oss-120b
  (``tests/data/tokenizers/gpt-oss``), both Apache-2.0, byte-identical to the shared copies.
* ``tests/data/corpus``: verbatim copies of the corpus files the tests read (public-domain prose,
  UDHR text, the adversarial files, two fzf sources, five agent transcripts; licences in its
  NOTICE), and stand-ins (``STAND_INS``) for the large ones.

**The shared set** (``../shared`` or ``$DTOK_SHARED``): the four real files of the admitted
families, the four files dtok does not admit, and the whole corpus. It is an extension:

* present: every helper reads from it, and ``MAIN_FILES`` holds the real four and the tiny four;
* absent: ``MAIN_FILES`` holds the tiny four and the two real files of the repository; a real
  name resolves to the repository's copy (``qwen3``, ``gpt-oss``) or to its family's tiny file
  (``llama3`` -> ``llama3-tiny``, ``deepseek-v3`` -> ``deepseek-v3-tiny``); corpus files to their
  copies or stand-ins; anything else (the non-admitted files, corpus files without a stand-in)
  is skipped with the reason;
* absent and ``CI`` set: every test that asks for shared data fails, as it always has (CI keeps
  requiring the real files).

The report header says which set a run used.
"""
from __future__ import annotations

import atexit
import gzip
import importlib.util
import os
import shutil
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools" / "data"))
import build_test_tokenizers  # noqa: E402  (the list of test tokenizers and their families)

DATA = ROOT / "tests" / "data"
# the package's data where dtok is imported from (the checkout, or an installed wheel)
PACKAGE_DATA = Path(importlib.util.find_spec("dtok").origin).parent / "data"
SHARED = Path(os.environ.get("DTOK_SHARED", ROOT.parent / "shared"))
HAVE_SHARED = (SHARED / "tokenizers").is_dir() and (SHARED / "corpus").is_dir()
REQUIRE_SHARED = bool(os.environ.get("CI"))

# real name -> family, one per admitted family; each has a small copy "<name>-tiny"
_TINY = {name: family for name, (family, _size) in build_test_tokenizers.TINY.items()}
# real files ../shared does not hold (the build script makes them from their primary sources):
# their small files are test files, they are not
MADE_FILES = list(build_test_tokenizers.MADE)
REAL_FILES = [name for name in _TINY if name not in MADE_FILES]
TINY_FILES = [f"{name}-tiny" for name in _TINY]
MADE_TINY_FILES = [f"{name}-tiny" for name in MADE_FILES]
IN_REPO = {  # real files the repository carries: gzip-compressed tokenizer.json, its config
    "qwen3": PACKAGE_DATA / "qwen3",
    "gpt-oss": DATA / "tokenizers" / "gpt-oss",
}
TINY_OF = {n: f"{n}-tiny" for n in REAL_FILES if n not in IN_REPO}  # without shared
_MAIN_TINY = [f"{name}-tiny" for name in REAL_FILES]
MAIN_FILES = REAL_FILES + _MAIN_TINY if HAVE_SHARED or REQUIRE_SHARED else \
    [n for n in REAL_FILES if n in IN_REPO] + _MAIN_TINY
# the exactness battery and its control run on these: the main files and the small files of
# the families without a real file (whose other tests are their family's: tables, transitions)
BATTERY_FILES = MAIN_FILES + MADE_TINY_FILES
OTHER_FILES = ["phi3-mini", "roberta-base", "t5-small", "bert-base-uncased"]
# the files an integration test repeated per file runs on by default (an NFC file without a BOS,
# a BOS template; both with and without ../shared); the others run under -m slow
DEFAULT_RUN_FILES = ("qwen3", "llama3-tiny")


def default_run_on(names, default=DEFAULT_RUN_FILES) -> list:
    """``names`` as parameters: those in ``default`` in the default run, the rest marked slow
    (the same code repeated on another file: ``-m slow`` runs them)."""
    return [n if n in default else pytest.param(n, marks=pytest.mark.slow) for n in names]


# a per-file test that is not the battery or a control: on every main file, but with ../shared
# the small copies of the real files run under -m slow (their real files run by default)
PER_FILE = default_run_on(MAIN_FILES, REAL_FILES + list(DEFAULT_RUN_FILES)) \
    if HAVE_SHARED or REQUIRE_SHARED else MAIN_FILES
FAMILY_OF = {**_TINY, **{f"{name}-tiny": family for name, family in _TINY.items()}}

_DEMO = PACKAGE_DATA / "demo"
_UDHR = sorted(p.name[: -len(".gz")] for p in (DATA / "corpus" / "multilingual").glob("*.gz"))
_CODE = [_DEMO / "ripgrep-walk.rs.gz", _DEMO / "ripgrep-glob.rs.gz",
         ("code", "go__fzf__src_pattern.go.txt"),
         ("code", "shell__fzf__shell_key-bindings.zsh.txt")]
# corpus file -> (what stands in for it, its length in characters: the stand-in is repeated to
# that length so every slice a test takes exists)
STAND_INS = {
    ("prose", "gutenberg-972_devils-dictionary.txt"):  # the demo's copy: Gutenberg header removed
        ([_DEMO / "devils-dictionary.txt.gz"], None),
    ("prose", "gutenberg-3261_news-from-nowhere.txt"):
        ([("prose", "gutenberg-1342_pride-and-prejudice.txt")], None),
    ("code", "rust__ripgrep__crates_globset_src_glob.rs.txt"):
        ([_DEMO / "ripgrep-glob.rs.gz"], None),
    ("code", "rust__ripgrep__crates_ignore_src_walk.rs.txt"):
        ([_DEMO / "ripgrep-walk.rs.gz"], None),
    ("code", "javascript__lodash__lodash.js.txt"): (_CODE, 545_941),
    ("code", "rust__ripgrep__crates_core_flags_defs.rs.txt"): (_CODE, 246_353),
    ("multilingual", "udhr_all-languages_concatenated.txt"):
        ([("multilingual", n) for n in _UDHR], 5_434_820),
}


def _missing(what: str) -> None:
    """Fail under CI (shared data is required there), skip otherwise."""
    msg = f"test data missing: {what}"
    if REQUIRE_SHARED:
        pytest.fail(msg + " (CI is set: shared test data must be present)")
    pytest.skip(msg)


@lru_cache(maxsize=1)
def _scratch() -> Path:
    """A directory for decompressed copies, removed when the test process exits."""
    path = Path(tempfile.mkdtemp(prefix="dtok-test-data-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _in_repo_tokenizer(name: str) -> Path:
    """A directory holding the repository's copy of a real file, decompressed."""
    out = _scratch() / "tokenizers" / name
    if not (out / "tokenizer.json").exists():
        out.mkdir(parents=True, exist_ok=True)
        src = IN_REPO[name]
        raw = gzip.decompress((src / "tokenizer.json.gz").read_bytes())
        (out / "tokenizer.json").write_bytes(raw)
        shutil.copyfile(src / "tokenizer_config.json", out / "tokenizer_config.json")
    return out


def tokenizer_path(name: str) -> Path:
    """The directory of a tokenizer (``tokenizer.json`` and ``tokenizer_config.json``) by name."""
    if name in TINY_FILES:
        return DATA / "tokenizers" / name
    shared = SHARED / "tokenizers" / name
    if HAVE_SHARED or REQUIRE_SHARED:
        if not shared.is_dir():
            _missing(str(shared))
        return shared
    if name in IN_REPO:
        return _in_repo_tokenizer(name)
    if name in TINY_OF:
        return DATA / "tokenizers" / TINY_OF[name]
    _missing(f"{shared} (only in ../shared)")


def _corpus_copy(folder: str, name: str) -> Path | None:
    for path in (DATA / "corpus" / folder / name, DATA / "corpus" / folder / (name + ".gz")):
        if path.exists():
            return path
    return None


def _read(path: Path) -> str:
    data = path.read_bytes()
    return (gzip.decompress(data) if path.suffix == ".gz" else data).decode("utf-8")


@lru_cache(maxsize=None)
def repo_text(folder: str, name: str) -> str:
    """A corpus file's text from the repository: its copy, or its stand-in."""
    copy = _corpus_copy(folder, name)
    if copy is not None:
        return _read(copy)
    if (folder, name) not in STAND_INS:
        _missing(f"{SHARED / 'corpus' / folder / name} (only in ../shared; no stand-in)")
    sources, chars = STAND_INS[(folder, name)]
    text = "\n".join(_read(s) if isinstance(s, Path) else repo_text(*s) for s in sources)
    return text if chars is None else (text * (chars // len(text) + 1))[:chars]


def shared_path(*parts: str) -> Path:
    """The path of an item of the shared test data (``tokenizers/NAME[/FILE]`` or
    ``corpus/FOLDER/FILE``): in ../shared when present, else its copy or stand-in in the
    repository (decompressed into a scratch directory when needed); skipped (failed under CI)
    when there is none."""
    if parts[:1] == ("tokenizers",) and len(parts) >= 2:
        return tokenizer_path(parts[1]).joinpath(*parts[2:])
    path = SHARED.joinpath(*parts)
    if HAVE_SHARED or REQUIRE_SHARED:
        if not path.exists():
            _missing(str(path))
        return path
    if parts[:1] == ("corpus",) and len(parts) == 3:
        copy = _corpus_copy(*parts[1:])
        if copy is not None and copy.suffix != ".gz":
            return copy
        out = _scratch().joinpath(*parts)
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(repo_text(*parts[1:]), encoding="utf-8", newline="")
        return out
    _missing(str(path))


def read_text(*parts: str) -> str:
    """Corpus text exactly as stored (no newline translation): ``read_text("prose", NAME)``."""
    if HAVE_SHARED or REQUIRE_SHARED:
        with open(shared_path("corpus", *parts), encoding="utf-8", newline="") as f:
            return f.read()
    return repo_text(*parts)


_TOKENIZERS: dict[object, object] = {}


def load_tokenizer(name: str, **knobs):
    """A tokenizer by name (see the module docstring), loaded once per test session. Its
    sessions continue texts of any length (``session_whole_below=0``): the tests of
    continuations use short texts, which the default encodes whole."""
    import dtok

    knobs.setdefault("session_whole_below", 0)
    path = tokenizer_path(name)
    if path not in _TOKENIZERS:
        _TOKENIZERS[path] = dtok.Tokenizer.from_file(path)
    key = (path, tuple(sorted(knobs.items())))
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = _TOKENIZERS[path].with_knobs(**knobs)
    return _TOKENIZERS[key]


def pytest_report_header(config):
    if HAVE_SHARED:
        return [f"dtok test data: {SHARED} (real files and corpus) + tests/data (tiny files)"]
    if REQUIRE_SHARED:
        return [f"dtok test data: {SHARED} MISSING and CI is set: tests that need it fail"]
    return ["dtok test data: no ../shared; tests/data only (qwen3 and gpt-oss real, "
            "llama3 -> llama3-tiny, deepseek-v3 -> deepseek-v3-tiny, corpus copies and "
            "stand-ins; see tests/conftest.py)"]


@pytest.fixture(params=MAIN_FILES, scope="session")
def main_tok(request):
    """Each admitted tokenizer, with a low chunk threshold so tests exercise the chunked route."""
    return load_tokenizer(request.param, chunk_threshold=2048, chunk_target=1024, threads=2)


@pytest.fixture(params=BATTERY_FILES, scope="session")
def battery_tok(request):
    """``main_tok``'s files and the small files of the families without a real file."""
    return load_tokenizer(request.param, chunk_threshold=2048, chunk_target=1024, threads=2)


@pytest.fixture(params=OTHER_FILES, scope="session")
def other_tok(request):
    return load_tokenizer(request.param, chunk_threshold=2048, chunk_target=1024)


def ref_ids(tok, text: str, add_special_tokens: bool = True) -> list[int]:
    """The reference answer: the real tokenizers library on the real file."""
    return tok.reference.encode(text, add_special_tokens=add_special_tokens).ids


def ref_ids_many(tok, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
    """The reference answers for many texts (``encode_batch``: same as ``encode`` each, on all
    cores)."""
    return [e.ids for e in tok.reference.encode_batch(texts, add_special_tokens=add_special_tokens)]


def next_turn(rng, src: str, text: str) -> str:
    """A session's next text, drawn with ``rng``: an append (half the time), a return to an
    earlier point with something else after it, or a region in the middle removed and something
    appended (the shapes of agent turns and reasoning templates), new text taken from ``src``."""
    r = rng.random()
    start = rng.randrange(0, len(src) - 2000)
    if r < 0.5:
        return text + src[start : start + rng.randint(1, 600)]
    if r < 0.75:
        return text[: rng.randint(len(text) // 2, len(text))] + src[start : start + 400]
    a = rng.randint(len(text) // 3, len(text) // 2)
    return text[:a] + text[a + rng.randint(1, 3000):] + src[start : start + 300]
