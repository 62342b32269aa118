#!/usr/bin/env python3
"""RSS of one process encoding ~1 GB of distinct text through dtok (the memory bound of issue 19).

    python tools/reliability/rss_distinct_text.py [--file qwen3] [--gigabytes 1]
                                                  [--lane default|gigatoken] [--renew-chars N]
                                                  [--threads N] [--thread-renew-chars N]
                                                  [--words new|corpus]
                                                  [--encoders-alone] [--emulate-cpus N]
                                                  [--pool [--worker-renew-chars N]]

Documents of 1M characters are corpus text (prose, code, multilingual, adversarial in turn)
with the lowercase letters permuted by a fresh random permutation per document: every word is
new, so an encoder's pre-token cache sees mostly pre-tokens it has not seen (the worst case for
gigatoken 0.10.0's unbounded cache). ``--lane gigatoken`` makes gigatoken take every piece
first (the router's private lane, as the tests' ``with_giga``), ``default`` is dtok as loaded.
Every 50M characters: RSS (VmRSS), its peak (VmHWM), and gigatoken's renewals. IDs are not
compared here (the tests do that); this measures memory only. ``--threads N``: dtok's knob
(default: dtok's own); fastokens keeps its memo of words met per thread, so each encoding thread
may hold its own (memory does not need the cores: 8 threads on 2 CPUs hold what they hold on 8).
``--words corpus``: the same documents with their letters as written (words repeat, as in a
server's traffic) instead of ``new``. At the end dtok's encoding threads are stopped and the
heap trimmed: what is left shows what they held. ``--encoders-alone``: the same documents
through fastokens alone, with its own BPE threads (``FASTOKENS_BPE_THREADS`` as set, else one
per CPU), the reference loaded beside it as dtok loads it, the heap trimmed after loading: what
the memory goal compares with. ``--emulate-cpus N``: dtok's defaults as on N CPUs (dtok is told
N usable CPUs, and ``FASTOKENS_BPE_THREADS`` defaults to N, as fastokens' own default there);
memory only, the timings mean nothing. ``--pool``: the documents through a ``dtok.Pool`` of one
worker (each document whole, to that worker), and the worker's RSS instead of this process's
(the peak: the highest of the worker processes that held the slot); ``--worker-renew-chars``:
the pool's knob (default: dtok's; 0: never renewed).
"""
import argparse
import ctypes
import gc
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def status(key: str, pid: int | str = "self") -> int:
    """A memory field of /proc/PID/status in MiB (-1: no such field; OSError: no process)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) // 1024
    return -1


def trim_heap() -> None:
    """Give glibc's free heap back to the system, so that RSS shows what is held."""
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--file", default="qwen3")
    ap.add_argument("--gigabytes", type=float, default=1.0)
    ap.add_argument("--lane", choices=("default", "gigatoken"), default="default")
    ap.add_argument("--renew-chars", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--thread-renew-chars", type=int, default=None,
                    help="dtok's knob thread_renew_chars (default: dtok's; 0: never)")
    ap.add_argument("--words", choices=("new", "corpus"), default="new")
    ap.add_argument("--encoders-alone", action="store_true")
    ap.add_argument("--emulate-cpus", type=int, default=None)
    ap.add_argument("--pool", action="store_true", help="one pool worker's RSS")
    ap.add_argument("--worker-renew-chars", type=int, default=None)
    ap.add_argument("--report-every", type=int, default=50_000_000, help="characters")
    args = ap.parse_args()
    from conftest import load_tokenizer, read_text, tokenizer_path

    if args.encoders_alone:  # dtok not even imported
        _reference, fast = encoders_alone(tokenizer_path(args.file))
        encode = lambda text: fast.encode_batch_flat([text], add_special_tokens=False)  # noqa: E731
        print(f"the reference + fastokens alone, {args.file}: FASTOKENS_BPE_THREADS "
              f"{os.environ.get('FASTOKENS_BPE_THREADS', 'unset')}; loaded RSS "
              f"{status('VmRSS')} MiB", flush=True)
        run(encode, None, args, read_text)
        return
    if args.emulate_cpus:
        import dtok.encoders
        import dtok.chunk_encoder

        dtok.encoders.available_cpus = dtok.chunk_encoder.available_cpus = lambda: args.emulate_cpus
        os.environ.setdefault("FASTOKENS_BPE_THREADS", str(args.emulate_cpus))
    import dtok
    from dtok.tokenizer import parts_of

    knobs = {} if args.thread_renew_chars is None else {"thread_renew_chars": args.thread_renew_chars}
    tok = load_tokenizer(args.file, content_lookup=False, threads=args.threads, **knobs)
    if args.pool:
        pooled(tok, args, read_text)
        return
    if args.lane == "gigatoken":
        from test_fast import with_giga

        tok = with_giga(tok, renew_chars=args.renew_chars)
    st = tok.stats()
    renew, giga = None, None
    if st["second_encoder"] == "gigatoken":
        from dtok.encoders import GigaEncoder

        renew = args.renew_chars or GigaEncoder.RENEW_CHARS  # what with_giga gave it
        giga = parts_of(tok).chunk_encoder.specialist.encoder  # its renewals are printed
    print(f"dtok {dtok.__version__ if hasattr(dtok, '__version__') else ''} {args.file}: encoder "
          f"{st['encoder']}, second {st['second_encoder']} classes {st['second_classes']}"
          f" renew_chars {renew} threads {tok.threads}; loaded RSS {status('VmRSS')} MiB",
          flush=True)
    run(tok.encode, giga, args, read_text)
    print(f"encoding threads renewed {tok.stats()['thread_renewals']} times "
          f"(every {tok.knobs['thread_renew_chars']:,} characters)")
    tok.close()  # the encoding threads end, and with them their state
    gc.collect()
    trim_heap()
    print(f"encoding threads stopped, heap trimmed: RSS {status('VmRSS')} MiB")


def pooled(tok, args, read_text) -> None:
    """The documents through a pool of one worker; the worker's RSS reported."""
    import dtok

    renew = {} if args.worker_renew_chars is None else {"worker_renew_chars": args.worker_renew_chars}
    with dtok.Pool(tok, workers=1, chunk_threshold=1 << 30, **renew) as pool:
        peak = {}

        def worker_rss() -> str:
            pid = pool.stats()["workers"][0]["pid"]
            try:
                rss = status("VmRSS", pid)
                peak[pid] = status("VmHWM", pid)
            except OSError:  # between a renewal's exit and the fork that replaces it
                return "-"
            return f"worker RSS {rss} MiB, peak {max(peak.values())}"

        print(f"a pool of one worker, {args.file}: worker_renew_chars "
              f"{pool.knobs['worker_renew_chars']:,}; {worker_rss()}", flush=True)
        run(pool.encode, None, args, read_text, worker_rss)
        print(f"workers renewed {pool.stats()['worker_renewals']} times; {worker_rss()}")


def encoders_alone(path) -> tuple:
    """The reference and fastokens loaded from the file (no dtok), the heap trimmed after
    loading as dtok's is."""
    import fastokens
    import tokenizers

    reference = tokenizers.Tokenizer.from_file(str(path / "tokenizer.json"))
    fast = fastokens.Tokenizer.from_file(str(path / "tokenizer.json"))
    trim_heap()
    return reference, fast


def run(encode, giga, args, read_text, report=None) -> None:
    """``--gigabytes`` of documents through ``encode``, RSS every 50M characters."""
    sources = [read_text("prose", "gutenberg-2701_moby-dick.txt"),
               read_text("code", "javascript__lodash__lodash.js.txt"),
               read_text("multilingual", "udhr_all-languages_concatenated.txt"),
               read_text("adversarial", "ws_unicode-spaces_moby-dick.txt") * 8]
    rng = random.Random(19)
    letters = "abcdefghijklmnopqrstuvwxyz"
    total, target, doc_chars, next_report = 0, int(args.gigabytes * 1e9), 1_000_000, 0
    t0 = time.time()
    i = 0
    while total < target:
        src = sources[i % len(sources)]
        start = rng.randrange(max(1, len(src) - doc_chars))
        perm = list(letters)
        rng.shuffle(perm)  # drawn with --words corpus too: the same documents either way
        doc = src[start:start + doc_chars]
        if args.words == "new":
            doc = doc.translate(str.maketrans(letters, "".join(perm)))
        else:
            doc = (doc + " ")[:-1]  # a fresh str, as a request's
        encode(doc)
        total += len(doc)
        i += 1
        if total >= next_report:
            if report is not None:
                print(f"{total / 1e6:7.0f}M chars  {report()}  {time.time() - t0:.0f} s", flush=True)
            else:
                print(f"{total / 1e6:7.0f}M chars  RSS {status('VmRSS'):5d} MiB  peak "
                      f"{status('VmHWM'):5d} MiB  renewals {giga.renewals if giga else '-'}  "
                      f"{time.time() - t0:.0f} s", flush=True)
            next_report += args.report_every
    print(f"done: {total / 1e6:.0f}M chars in {i} documents, {time.time() - t0:.0f} s, load "
          f"{os.getloadavg()[0]:.2f}; RSS {status('VmRSS')} MiB, peak {status('VmHWM')} MiB")


if __name__ == "__main__":
    main()
