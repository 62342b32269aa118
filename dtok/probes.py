"""Guard tables for files dtok has never seen: found by content, or probed in the background.

A fast encoder serves a file only behind its guard table (:mod:`dtok.guards`). For a file with no
shipped or cached table, loading goes on with the reference and this module finds one:

1. **The same tokenizer, serialised otherwise.** A file whose parsed content equals a known
   file's (formatting, key order, merges written ``"a b"`` or ``["a", "b"]``, a final newline)
   is the same tokenizer: :func:`content_sha256` digests the parsed JSON in one canonical form,
   and ``data/guards/equivalents.json`` maps such digests to the SHA-256 whose tables ship.
2. **Probes, split by what they depend on.** A byte-level BPE encode is
   ``BPE(vocabulary, piece)`` over the pieces of ``pre_tokenize(normalize(text))``. The
   normalizer and the pre-tokenizer (the *pipeline*) do not read the vocabulary, so whether a fast
   encoder splits and normalizes as the reference does is a property of the pipeline and the two
   libraries' versions, shared by every file with that pipeline. It is probed once, on a
   *probe file* (:func:`probe_file_json`): the pipeline with a vocabulary-free model whose IDs
   are the text's bytes, each marked when it ends a piece (BPE's ``end_of_word_suffix``), so
   the IDs say exactly which pieces were made. The code points, the eight contexts and the NFC
   proof of :func:`dtok.guards.build` run through both encoders on that file and are kept as
   the pipeline's table (``guards/pipelines/``; the known pipelines' tables ship). What is left
   is the file's own part, the vocabulary: every vocabulary entry's text and every code point
   doubled (``{c}{c}``) through both encoders on the real file (:func:`build_file`). The file's
   guard table is the union of both parts' disagreements, with the pipeline's NFC proof.
3. **In the background.** :class:`ProbeJob` runs the missing parts in a child process at the
   lowest CPU priority (``python -m dtok.probes``), writes the table into the cache (the next
   process starts fast at once) and then hands the fast encoder to the loaded tokenizer, which
   switches between two requests: both encoders give the reference's IDs, so a request is exact
   whichever it meets. Another ``fastokens`` or ``tokenizers`` version is just another key: the
   same job probes it.
"""
from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from dtok import guards, tables
from dtok.digests import sha256 as _sha256

__all__ = ["content_sha256", "equivalent_sha", "pipeline_key", "probe_file_json",
           "build_pipeline", "build_file", "ProbeJob", "EQUIVALENTS_FILE", "PIPELINES"]

EQUIVALENTS_FILE = guards.BUNDLED_DIR / "equivalents.json"
PIPELINES = "pipelines"  # the subfolder of the pipelines' guard tables (shipped and cached)
FILE_CONTEXTS = ("{c}{c}",)  # the file's own code-point probes (its vocabulary's BPE on them)
PIECE_END = "</w>"  # the probe file's end-of-piece mark
PROBE_SEPARATOR = "<|dtok_probe_separator|>"


# --- the same tokenizer, serialised otherwise ----------------------------------------------


# A BPE model's fields that a file may leave out, with the value the reference then takes.
_BPE_DEFAULTS = {"dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                 "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                 "ignore_merges": False}


def content_sha256(raw: bytes) -> str:
    """SHA-256 of a tokenizer.json's parsed content in one canonical form: keys sorted, no
    whitespace, a BPE model's merges as pairs (``"a b"`` is the pair ``a``, ``b`` to the
    reference) and its optional fields at their defaults where left out. Two files with the
    same digest load the same tokenizer."""
    doc = json.loads(raw)
    model = doc.get("model")
    if isinstance(model, dict) and model.get("type", "BPE") == "BPE" and "merges" in model:
        model["merges"] = [m.split(" ") if isinstance(m, str) else m for m in model["merges"]]
        for key, value in _BPE_DEFAULTS.items():
            model.setdefault(key, value)
    canonical = json.dumps(doc, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return _sha256(canonical.encode("utf-8")).hexdigest()


def equivalent_sha(raw: bytes) -> str | None:
    """The SHA-256 of the known file whose content equals this file's, or None."""
    try:
        known = json.loads(EQUIVALENTS_FILE.read_bytes())
    except FileNotFoundError:
        return None
    return known.get(content_sha256(raw))


# --- the pipeline's part -------------------------------------------------------------------


def pipeline_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """What the pipeline's probes depend on: the normalizer and the pre-tokenizer
    (``trim_offsets`` set to false: it changes offsets, never IDs)."""
    def strip(node):
        if isinstance(node, dict):
            return {k: False if k == "trim_offsets" else strip(v) for k, v in node.items()}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node
    return {"normalizer": strip(spec.get("normalizer")),
            "pre_tokenizer": strip(spec.get("pre_tokenizer"))}


def pipeline_key(spec: dict[str, Any]) -> str:
    """The key of the pipeline's guard tables (a SHA-256 of :func:`pipeline_spec`)."""
    blob = json.dumps(pipeline_spec(spec), sort_keys=True, ensure_ascii=False)
    return _sha256(blob.encode("utf-8")).hexdigest()


def probe_file_json(spec: dict[str, Any]) -> str:
    """A tokenizer.json with this pipeline and a model that tells the pieces: 256 byte tokens
    and the same 256 marked as ending a piece, no merges; one special separator token."""
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = sorted(ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    vocab.update({ch + PIECE_END: 256 + i for i, ch in enumerate(alphabet)})
    decoder = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": PIECE_END}, "content": ""},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
         "use_regex": False}]}
    pipeline = pipeline_spec(spec)
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": len(vocab), "content": PROBE_SEPARATOR, "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True}],
        "normalizer": pipeline["normalizer"], "pre_tokenizer": pipeline["pre_tokenizer"],
        "post_processor": None, "decoder": decoder,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": PIECE_END,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []}})


def load_pipeline(spec: dict[str, Any], fast_version: str) -> guards.GuardTable | None:
    """The pipeline's guard table for the installed versions, shipped or cached, if built."""
    return guards.load(pipeline_key(spec), fast_version, folder=PIPELINES)


def build_pipeline(spec: dict[str, Any], family: str | None, nfc: bool,
                   say: Callable[[str], None] = lambda msg: None,
                   out_dir: Path | None = None) -> guards.GuardTable:
    """Probe the pipeline on its probe file (every code point in every context, and for NFC the
    NFC proof on ``family``'s table) and write its table."""
    from tokenizers import Tokenizer as Reference

    from dtok.encoders import FastEncoder

    text = probe_file_json(spec)
    reference = Reference.from_str(text)
    fast = FastEncoder(text.encode("utf-8"), reference)
    return guards.build(reference, fast, pipeline_key(spec),
                        out_dir or tables.cache_dir() / "guards" / PIPELINES, say,
                        nfc_family=family if nfc else None)


# --- the file's part -----------------------------------------------------------------------


def build_file(reference, fast, sha256: str, pipeline: guards.GuardTable,
               say: Callable[[str], None] = lambda msg: None,
               out_dir: Path | None = None, code_points: list[int] | None = None
               ) -> guards.GuardTable:
    """The file's guard table: its vocabulary and :data:`FILE_CONTEXTS` probed through both
    encoders on the real file (every code point but the surrogates, or ``code_points``),
    joined with the pipeline's table."""
    t0 = time.time()
    checked: dict[str, Any] = {"vocab_strings": guards.check_vocabulary(reference, fast)}
    say(f"vocabulary: {checked['vocab_strings']} entries agree")
    disagree = {c: ["pipeline"] for c in pipeline.disagree}
    sep = guards.separator(reference)
    cps = code_points if code_points is not None else tables.code_points()
    for ctx in FILE_CONTEXTS:
        for cp, _ in guards.probe_context(reference, fast, ctx, cps, sep):
            disagree.setdefault(cp, []).append(ctx)
        say(f"context {ctx!r}: {len(disagree)} code points disagree so far")
    checked.update(code_points=len(cps), contexts=list(FILE_CONTEXTS),
                   pipeline=Path(pipeline.source).name, seconds=round(time.time() - t0))
    return guards.save(sha256, fast, disagree, checked, dict(pipeline.nfc),
                       out_dir or tables.cache_dir() / "guards")


def probe(path: str, sha256: str, say: Callable[[str], None], same_file: bool = True
          ) -> guards.GuardTable:
    """Every missing part for the file at ``path``, whose guard tables are keyed ``sha256``
    (``same_file``: its bytes must have that SHA-256; else it holds the same tokenizer as the
    file of that SHA-256, serialised by the reference)."""
    from dtok.admission import read_files
    from dtok.encoders import fastokens_version

    files = read_files(path)
    if same_file and files.sha256 != sha256:
        raise ValueError(f"{path} changed since it was loaded (SHA-256 {files.sha256[:16]})")
    lock_path = tables.cache_dir() / "probes" / f"{sha256[:16]}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a") as lock:
        # several processes loading the same file (an engine's API servers) probe it once: the
        # others wait here for the first one's table
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = guards.load(sha256, fastokens_version() or "")
        if found is not None:
            say(f"probed by another process: {found.source}")
            return found
        return _probe_unlocked(files, sha256, say)


def _probe_unlocked(files, sha256: str, say: Callable[[str], None]) -> guards.GuardTable:
    from dtok.admission import admit
    from dtok.encoders import FastEncoder, fastokens_version
    from dtok.reference import load as load_reference

    # the reference and its admission alone (not dtok.loading, which imports this module)
    reference = load_reference(files.raw)
    a = admit(files, files.outline(), reference)
    if not a.admitted:
        raise ValueError("not admitted: " + "; ".join(a.reasons))
    spec = files.outline()
    pipeline = load_pipeline(spec, fastokens_version() or "")
    if pipeline is None:
        say("pipeline: probing (new pipeline or versions)")
        pipeline = build_pipeline(spec, a.family, a.nfc, say)
    else:
        say(f"pipeline: {Path(pipeline.source).name}")
    fast = FastEncoder(files.raw, reference)
    return build_file(reference, fast, sha256, pipeline, say)


# --- in the background ----------------------------------------------------------------------


class ProbeJob:
    """The child process that probes a file's missing guard parts, and the thread that waits
    for it. ``state``: "running" (``progress``: its last line), "done" or "failed" (``error``);
    ``on_done(table)`` runs in that thread once the table is written."""

    def __init__(self, path: str | os.PathLike, sha256: str,
                 on_done: Callable[[guards.GuardTable], None], same_file: bool = True) -> None:
        self.sha256 = sha256
        self.state = "running"
        self.progress = "starting"
        self.error = ""
        self.started = time.monotonic()
        self.seconds: float | None = None
        self._on_done = on_done
        # a copy of the JSON written for the child (not the user's file) goes when it ends
        self._copy = None if same_file else Path(path)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "dtok.probes", str(path), sha256,
             *(["--same-file"] if same_file else [])],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        self._thread = threading.Thread(target=self._wait, name="dtok-probes", daemon=True)
        self._thread.start()

    def _wait(self) -> None:
        lines = []
        for line in self._proc.stdout or ():  # a pipe (stdout=PIPE)
            lines.append(line.rstrip())
            self.progress = lines[-1]
        rc = self._proc.wait()
        self.seconds = round(time.monotonic() - self.started, 1)
        if self._copy is not None:
            self._copy.unlink(missing_ok=True)
        table = None
        if rc == 0:
            from dtok.encoders import fastokens_version

            table = guards.load(self.sha256, fastokens_version() or "")
        if table is None:
            self.state, self.error = "failed", (lines[-1] if lines else f"exit status {rc}")
            return
        try:
            self._on_done(table)
        except Exception as exc:  # the reference goes on serving
            self.state, self.error = "failed", f"{type(exc).__name__}: {exc}"
            return
        self.state = "done"

    def wait(self, timeout: float | None = None) -> str:
        """Wait for the job (tests, tools); its state."""
        self._thread.join(timeout)
        return self.state

    def status(self) -> dict[str, Any]:
        """What ``stats()`` and ``explain`` report."""
        out: dict[str, Any] = {"state": self.state, "progress": self.progress}
        if self.seconds is not None:
            out["seconds"] = self.seconds
        if self.error:
            out["error"] = self.error
        return out


def main(argv: list[str] | None = None) -> int:
    """``python -m dtok.probes PATH SHA256``: probe the file, one progress line at a time."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m dtok.probes", description=main.__doc__)
    ap.add_argument("path")
    ap.add_argument("sha256")
    ap.add_argument("--same-file", action="store_true", help="PATH's bytes have that SHA-256")
    args = ap.parse_args(argv)
    # the lowest CPU priority, set here rather than between fork and exec (the parent has
    # threads, which a preexec_fn could deadlock)
    os.nice(19)
    t0 = time.time()
    parent = os.getppid()

    def say(msg: str) -> None:
        if os.getppid() != parent:  # the process that asked is gone: nobody takes the table
            raise SystemExit(1)
        print(f"{time.time() - t0:.0f} s: {msg}", flush=True)
    try:
        table = probe(args.path, args.sha256, say, args.same_file)
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", flush=True)
        return 1
    say(f"{len(table.disagree)} disagreeing code points; guard table {table.source}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
