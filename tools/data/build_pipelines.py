#!/usr/bin/env python3
"""Build the pipelines' guard tables and the list of equivalent files, into dtok/data/guards.

    python tools/data/build_pipelines.py PATH [PATH ...] [--out DIR] [--equivalents]
                                         [--file-tables]

For each tokenizer file: the guard table of its pipeline (normalizer and pre-tokenizer, probed on
the vocabulary-free probe file of :mod:`dtok.probes`) for the installed ``tokenizers`` and
``fastokens``, into ``DIR/pipelines`` unless one is there (a few minutes each on two cores). A
new file of that pipeline then needs only its own part probed (10–30 s).

``--equivalents``: also record each file's content digest (:func:`dtok.probes.content_sha256`)
in ``DIR/equivalents.json``, mapped to the file's SHA-256, so that a file with the same content
serialised otherwise uses this file's shipped guard tables. Only for files whose tables ship.

``--file-tables``: also build each file's own guard table (its part of the probes, joined with
the pipeline's: what a user's first load does in the background) into ``DIR``, so that the
file is fast from its first request. 10–30 s a file.
"""
import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dtok import guards, probes  # noqa: E402
from dtok.admission import read_files  # noqa: E402
from dtok.encoders import fastokens_version  # noqa: E402
from dtok.loading import load  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, default=guards.BUNDLED_DIR)
    ap.add_argument("--equivalents", action="store_true")
    ap.add_argument("--file-tables", action="store_true")
    args = ap.parse_args()
    version = fastokens_version()
    if version is None:
        sys.exit("fastokens is not installed")
    equivalents_path = args.out / probes.EQUIVALENTS_FILE.name
    equivalents = json.loads(equivalents_path.read_text()) if equivalents_path.exists() else {}
    for path in args.paths:
        files = read_files(path)
        admission = load(files, "reference", guard_probes="off").admission
        if not admission.admitted:
            print(f"{path}: not admitted ({'; '.join(admission.reasons)})")
            continue
        spec = files.outline()
        key = probes.pipeline_key(spec)
        name = guards.file_name(key, version)
        out = args.out / probes.PIPELINES
        if guards.load(key, version, folder=probes.PIPELINES) is not None:
            print(f"{path}: pipeline {key[:16]} already built ({out / name})")
        else:
            t0 = time.time()
            table = probes.build_pipeline(
                spec, admission.family, admission.nfc,
                lambda msg: print(f"  {time.time() - t0:4.0f} s {msg}", flush=True), out)
            print(f"{path}: pipeline {key[:16]}: {len(table.disagree)} disagreeing code points "
                  f"({time.time() - t0:.0f} s) -> {table.source}")
        if args.file_tables:
            from dtok.encoders import FastEncoder

            reference = load(files, "reference", guard_probes="off").reference
            pipeline = guards.load(key, version, folder=probes.PIPELINES)
            t0 = time.time()
            table = probes.build_file(reference, FastEncoder(files.raw, reference), files.sha256,
                                      pipeline, out_dir=args.out)
            print(f"{path}: file table: {len(table.disagree)} disagreeing code points "
                  f"({time.time() - t0:.0f} s) -> {table.source}")
        if args.equivalents:
            if guards.load(files.sha256, version) is None:
                print(f"{path}: no shipped guard table for it: not recorded as equivalent")
                continue
            equivalents[probes.content_sha256(files.raw)] = files.sha256
            equivalents_path.write_text(json.dumps(equivalents, indent=1, sort_keys=True) + "\n")
            print(f"{path}: content {probes.content_sha256(files.raw)[:16]} -> {files.sha256[:16]}")


if __name__ == "__main__":
    main()
