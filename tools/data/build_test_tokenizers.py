#!/usr/bin/env python3
"""Build the test data that lets a fresh clone test itself: ``tests/data/{corpus,tokenizers}``.

    python tools/data/build_test_tokenizers.py [--shared DIR] [--out DIR] [--only NAME ...]
                                               [--guards]

Reads the real files from ``../shared`` (or ``$DTOK_SHARED`` / ``--shared``) and writes, into
``tests/data`` (or ``--out``):

1. ``tests/data/corpus``: the corpus files the tests read, copied byte for byte and
   gzip-compressed (transcripts stay plain JSON: the CLI tests pass their paths). Only public-domain
   text and files under a licence that allows shipping them with their notice (CORPUS below,
   ``tests/data/corpus/NOTICE``).
2. ``tests/data/tokenizers/gpt-oss``: gpt-oss's real ``tokenizer.json`` (Apache-2.0),
   gzip-compressed, and its ``tokenizer_config.json``.
3. ``tests/data/tokenizers/<name>-tiny``: one small tokenizer per admitted family (``TINY``:
   the real file each is made from and its family; ``tests/conftest.py`` takes its lists of
   files and families from it). The real file with its model's ``vocab`` and ``merges``
   replaced by a BPE that ``tokenizers``' own ``BpeTrainer`` trains on the public-domain prose
   and UDHR text of (1), through the real file's normalizer and pre-tokenizer. Every other
   section is kept: normalizer, pre-tokenizer, the model's flags (``ignore_merges`` ...),
   decoder, post-processor, and every added token with its flags, in id order and with the same
   gaps (ids that were inside the vocabulary stay first in it; the rest follow the new
   vocabulary at their old offsets). The post-processor's and ``tokenizer_config.json``'s ids
   are renumbered to match; the config loses its chat template. ``--only NAME ...``: only the
   small files of these real names (and the corpus, their training text; not gpt-oss's copy).
   The real files of ``MADE`` are not in ``../shared``; they are made here from their primary
   sources: ``tekken``, mistral-common's Tekken file converted by ``transformers`` (both must be
   installed); ``kimi``, the pipeline toktier's conversion writes for Kimi.
4. ``--guards``: the fast encoder's guard tables for the small files, into ``dtok/data/guards``
   (``tools/data/build_guards.py``; minutes per file). Needed again whenever a small file's bytes
   change, because guard tables are keyed by the file's SHA-256.

The output is deterministic: rerunning it rewrites the same bytes (``tests/test_test_data.py``
checks this when ``../shared`` is present).
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"

# (folder, file) under shared/corpus, copied verbatim. Licences: tests/data/corpus/NOTICE.
CORPUS = [
    ("prose", "gutenberg-2701_moby-dick.txt"),
    ("prose", "gutenberg-1342_pride-and-prejudice.txt"),
    ("adversarial", "blns_big-list-of-naughty-strings.txt"),
    ("adversarial", "invisible-chars_moby-dick.txt"),
    ("adversarial", "mixed-script-interleaved_udhr_crlf.txt"),
    ("adversarial", "udhr_kor_NFD_jamo.txt"),
    ("adversarial", "udhr_mixed_NFD.txt"),
    ("adversarial", "udhr_vie_NFD.txt"),
    ("adversarial", "ws_long-whitespace-runs_moby-dick.txt"),
    ("adversarial", "ws_mixed-line-endings_moby-dick.txt"),
    ("adversarial", "ws_unicode-spaces_moby-dick.txt"),
    *[("multilingual", f"udhr_{lang}.txt") for lang in (
        "amh", "arb", "ben", "cmn_hans", "deu_1996", "ell_polytonic", "eng", "fra", "heb", "hin",
        "jpn", "khm", "kor", "mar", "rus", "tam", "tha", "tur", "vie", "yor")],
    ("code", "go__fzf__src_pattern.go.txt"),
    ("code", "shell__fzf__shell_key-bindings.zsh.txt"),
    ("transcripts", "sweagent-demo-ctf-rev__rock.json"),
    ("transcripts", "sweagent-demo-ctf-crypto__katy.json"),
    ("transcripts", "sweagent-demo-default-install-from-source__marshmallow-1867.json"),
    ("transcripts", "minisweagent-gemini3pro__django__django-15103.json"),
    ("transcripts",
     "minisweagent-deepseek-toolcalls__deepseek_chat_test_1-100__django__django-13660.json"),
]

# real name -> (family, vocabulary size of the small file); the small file is "<name>-tiny"
TINY = {
    "qwen3": ("qwen2", 4096),
    "llama3": ("llama3", 4096),
    "deepseek-v3": ("deepseek_v3", 4096),
    "gpt-oss": ("o200k", 4096),
    "qwen3.5": ("qwen35", 4096),
    "tekken": ("tekken", 4096),
    "kimi": ("kimi", 4096),
}
GPT_OSS_SHA256 = "0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3"
# mistral-common 1.13.1's data/tekken_240911.json, the Tekken file the "tekken" pipeline is
# converted from
TEKKEN_JSON = "tekken_240911.json"
TEKKEN_SHA256 = "1948e2d48b0e7377f1bb5f1210f1ae5f984934e75713fc07e2452729b8365316"
KIMI_RESERVED_TOKENS = 256  # the ids toktier's converter adds above Kimi's ranks
# real files that ../shared does not hold: made by real_file from their primary sources
MADE = ("tekken", "kimi")


def corpus_file(data: Path, folder: str, name: str) -> Path:
    """Where a corpus copy lives under ``data`` (gzip-compressed unless it is a transcript)."""
    path = data / "corpus" / folder / name
    return path if folder == "transcripts" else path.with_name(name + ".gz")


def write_bytes(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def gz(data: bytes) -> bytes:
    return gzip.compress(data, 9, mtime=0)  # mtime 0: the same input gives the same bytes


def copy_corpus(shared: Path, data: Path) -> None:
    for folder, name in CORPUS:
        raw = (shared / "corpus" / folder / name).read_bytes()
        out = corpus_file(data, folder, name)
        write_bytes(out, raw if folder == "transcripts" else gz(raw))
        print(f"corpus: {out} ({len(raw):,} bytes)")


def copy_gpt_oss(shared: Path, data: Path) -> None:
    src = shared / "tokenizers" / "gpt-oss"
    raw = (src / "tokenizer.json").read_bytes()
    if hashlib.sha256(raw).hexdigest() != GPT_OSS_SHA256:
        sys.exit(f"{src}/tokenizer.json is not the gpt-oss-120b file (sha256 {GPT_OSS_SHA256})")
    out = data / "tokenizers" / "gpt-oss"
    write_bytes(out / "tokenizer.json.gz", gz(raw))
    shutil.copyfile(src / "tokenizer_config.json", out / "tokenizer_config.json")
    print(f"gpt-oss: {out}/tokenizer.json.gz")


def training_text(data: Path) -> list[str]:
    """Public-domain prose and UDHR text from the corpus copies, in a fixed order."""
    texts = []
    for folder, name in CORPUS:
        if folder in ("prose", "multilingual"):
            raw = gzip.decompress(corpus_file(data, folder, name).read_bytes())
            texts.append(raw.decode("utf-8"))
    # lines, so the trainer sees many short sequences (it counts words per sequence)
    return [line for text in texts for line in text.splitlines(keepends=True)]


def new_ids(spec: dict, vocab_size: int) -> dict[int, int]:
    """Old id -> new id of every added token: ids inside the real vocabulary keep their place at
    the start of the new one (the trainer puts them first); the others keep their offset from the
    end of the vocabulary."""
    vocab = spec["model"]["vocab"]
    old_end = max(vocab.values()) + 1
    mapping = {}
    inside = [t for t in spec["added_tokens"] if vocab.get(t["content"]) == t["id"]]
    for i, t in enumerate(sorted(inside, key=lambda t: t["id"])):
        if t["id"] != i:
            sys.exit(f"added token {t['content']!r} sits inside the vocabulary at {t['id']}, "
                     "not at its start: the trainer cannot place it there")
        mapping[t["id"]] = i
    for t in spec["added_tokens"]:
        if t["id"] not in mapping:
            if t["id"] < old_end:
                sys.exit(f"added token {t['content']!r} has id {t['id']} inside the vocabulary")
            mapping[t["id"]] = vocab_size + t["id"] - old_end
    return mapping


def train_vocab(spec: dict, vocab_size: int, in_vocab: list[str], texts: list[str]) -> dict:
    """vocab and merges of a BPE trained through the real file's normalizer and pre-tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    model = spec["model"]
    shell = dict(spec, model={"type": "BPE", "vocab": {}, "merges": []}, added_tokens=[],
                 post_processor=None, decoder=None)
    tok = Tokenizer.from_str(json.dumps(shell))
    tok.model = models.BPE(ignore_merges=bool(model.get("ignore_merges")))
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                  special_tokens=in_vocab,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    trained = json.loads(tok.to_str())["model"]
    return {"vocab": trained["vocab"], "merges": trained["merges"]}


def shared_file(real: Path) -> tuple[dict, dict | None]:
    """A real file of ../shared: its tokenizer.json and tokenizer_config.json (or None)."""
    spec = json.loads((real / "tokenizer.json").read_bytes())
    config = None
    if (real / "tokenizer_config.json").is_file():
        config = json.loads((real / "tokenizer_config.json").read_bytes())
    return spec, config


def missing_source(name: str) -> str | None:
    """Why the real file ``name`` cannot be made here (None when it can)."""
    import importlib.util

    if name == "tekken" and not all(importlib.util.find_spec(m)
                                    for m in ("mistral_common", "transformers")):
        return "the tekken file needs mistral-common and transformers installed"
    return None


def tekken_file() -> tuple[dict, None]:
    """Mistral's Tekken file as ``transformers`` converts it (the way Ministral-3's
    tokenizer.json is made), from the installed mistral-common (the converter also reads its
    default control tokens there)."""
    import importlib.util
    import tempfile

    missing = missing_source("tekken")
    if missing:
        sys.exit(missing)
    spec = importlib.util.find_spec("mistral_common")
    raw = (Path(spec.origin).parent / "data" / TEKKEN_JSON).read_bytes()
    if hashlib.sha256(raw).hexdigest() != TEKKEN_SHA256:
        sys.exit(f"mistral-common's {TEKKEN_JSON} is not 1.13.1's (sha256 {TEKKEN_SHA256})")
    from transformers.integrations.mistral.tokenizer import MistralConverter

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / TEKKEN_JSON  # the converter reads a file by name
        path.write_bytes(raw)
        converted = MistralConverter(str(path)).converted()
    return json.loads(converted.to_str()), None


def kimi_file() -> tuple[dict, None]:
    """Kimi's pipeline as toktier 0.3.0 converts Kimi's tiktoken files
    (``toktier/artifacts/conversion.py``): no normalizer, the family's pattern in one isolated
    Split, byte-level BPE with ``ignore_merges``, byte-level post-processor and decoder. Its
    vocabulary is the 256 byte symbols (the trainer makes the small one) and its added tokens
    the reserved ids above it, spelled as toktier spells the ids Kimi's configuration does not
    name (the named ones are not at hand), with the ids they get in the small file."""
    sys.path.insert(0, str(ROOT))
    from tokenizers import pre_tokenizers

    from dtok.families import FAMILIES

    (pattern,) = FAMILIES["kimi"].splits
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    size = TINY["kimi"][1]
    spec = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [
            {"id": len(alphabet) + i, "content": f"<|reserved_token_{size + i}|>",
             "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
             "special": True}
            for i in range(KIMI_RESERVED_TOKENS)],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated",
             "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
             "use_regex": False}]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True,
                           "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": {ch: i for i, ch in enumerate(alphabet)}, "merges": []},
    }
    return spec, None


def real_file(shared: Path, name: str) -> tuple[dict, dict | None]:
    """The real file a small one is made from: from ../shared, or made here (``MADE``)."""
    if name == "tekken":
        return tekken_file()
    if name == "kimi":
        return kimi_file()
    return shared_file(shared / "tokenizers" / name)


def small_tokenizer(spec: dict, config: dict | None, texts: list[str], vocab_size: int
                    ) -> tuple[str, dict | None]:
    """The small file's tokenizer.json text and tokenizer_config.json (or None)."""
    from tokenizers import Tokenizer

    in_vocab = [t["content"] for t in sorted(spec["added_tokens"], key=lambda t: t["id"])
                if spec["model"]["vocab"].get(t["content"]) == t["id"]]
    trained = train_vocab(spec, vocab_size, in_vocab, texts)
    size = len(trained["vocab"])
    ids = new_ids(spec, size)
    out = dict(spec)
    out["model"] = {**spec["model"], **trained}  # every flag of the real model, new vocabulary
    out["added_tokens"] = [dict(t, id=ids[t["id"]]) for t in spec["added_tokens"]]
    out["post_processor"] = _renumber_post_processor(spec["post_processor"], ids)
    text = Tokenizer.from_str(json.dumps(out)).to_str(pretty=True)
    if config is not None:
        config = dict(config)
        config.pop("chat_template", None)  # not the tests' business, and not ours to copy
        if "added_tokens_decoder" in config:
            config["added_tokens_decoder"] = {
                str(ids[int(k)]): v for k, v in config["added_tokens_decoder"].items()}
    return text, config


def _renumber_post_processor(spec, ids: dict[int, int]):
    if spec is None:
        return None
    spec = json.loads(json.dumps(spec))
    for step in [spec] + spec.get("processors", []):
        for special in step.get("special_tokens", {}).values():
            special["ids"] = [ids[i] for i in special["ids"]]
    return spec


def build_tiny(shared: Path, data: Path, names: list[str]) -> list[Path]:
    texts = training_text(data)
    made = []
    for name in names:
        family, vocab_size = TINY[name]
        text, config = small_tokenizer(*real_file(shared, name), texts, vocab_size)
        out = data / "tokenizers" / f"{name}-tiny"
        write_bytes(out / "tokenizer.json", text.encode("utf-8"))
        if config is not None:
            write_bytes(out / "tokenizer_config.json",
                        (json.dumps(config, indent=2, ensure_ascii=False) + "\n").encode("utf-8"))
        _verify(out, family)
        sha = hashlib.sha256(text.encode("utf-8")).hexdigest()
        print(f"{out}: {len(text):,} bytes, sha256 {sha[:16]}, family {family}")
        made.append(out)
    return made


def _verify(path: Path, family: str) -> None:
    sys.path.insert(0, str(ROOT))
    import dtok

    a = dtok.Tokenizer.from_file(path, encoder="reference").admission
    if not a.admitted or a.family != family:
        sys.exit(f"{path}: not admitted as {family}: {a.reasons}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(os.environ.get("DTOK_SHARED", ROOT.parent / "shared"))
    ap.add_argument("--shared", type=Path, default=default)
    ap.add_argument("--out", type=Path, default=DATA, help="where to write (default tests/data)")
    ap.add_argument("--only", nargs="+", choices=list(TINY), metavar="NAME",
                    help=f"only the small files of these real files ({', '.join(TINY)})")
    ap.add_argument("--guards", action="store_true",
                    help="also build the fast encoder's guard tables of the small files")
    args = ap.parse_args()
    if not (args.shared / "tokenizers").is_dir():
        sys.exit(f"no shared test data at {args.shared}")
    copy_corpus(args.shared, args.out)
    if not args.only:
        copy_gpt_oss(args.shared, args.out)
    names = args.only or list(TINY)
    if not args.only:  # all of them: the ones whose source is missing are left as they are
        for name in [n for n in names if missing_source(n)]:
            print(f"{name}-tiny: not rebuilt ({missing_source(name)})")
            names.remove(name)
    made = build_tiny(args.shared, args.out, names)
    if args.guards:
        subprocess.run([sys.executable, str(ROOT / "tools" / "data" / "build_guards.py"),
                        *map(str, made)], check=True)


if __name__ == "__main__":
    main()
