"""Helpers shared by the benchmark scripts: machine description, timing statistics, text sources.

Benchmarks print ratios against the reference measured side by side in the same run; absolute
times on a shared machine are only indicative.
"""
from __future__ import annotations

import json
import os
import platform
import random
import statistics
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DTOK_SHARED", ROOT.parent / "shared"))
RESULTS = ROOT / "bench-results"


def machine() -> dict:
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import tokenizers

    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count()
    return {
        "cpu": cpu,
        "cpus_usable": cpus,
        "loadavg_at_start": os.getloadavg(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "tokenizers": tokenizers.__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


SMAPS_FIELDS = ("Rss", "Pss", "Private_Clean", "Private_Dirty", "Shared_Clean", "Shared_Dirty")


def smaps(pid: int | str = "self") -> dict:
    """Memory of a process from /proc/PID/smaps_rollup, in MiB (Rss, Pss, private and shared
    pages): PSS counts a page shared by n processes 1/n in each (seed 004's method)."""
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            key = line.split(":")[0]
            if key in SMAPS_FIELDS:
                out[key] = round(int(line.split()[1]) / 1024, 1)
    return out


def header(info: dict) -> str:
    """The line each benchmark prints first: where and when it ran."""
    return (f"# {info['cpu']}, {info['cpus_usable']} usable CPUs, load "
            f"{info['loadavg_at_start']}, tokenizers {info['tokenizers']}, {info['date']}")


def summary(samples_s: list[float]) -> dict:
    ms = sorted(x * 1e3 for x in samples_s)
    p99 = ms[min(len(ms) - 1, int(round(0.99 * (len(ms) - 1))))]
    return {"median_ms": statistics.median(ms), "p99_ms": p99, "min_ms": ms[0], "n": len(ms)}


def balanced_order(labels: list, i: int) -> list:
    """Row ``i`` of a Williams design over ``labels``: over :func:`balanced_period` rows every
    label takes every place equally often and runs right after every other label equally
    often. What ran just before a call matters (a word the encoder before just met, glibc's
    heap), so no encoder may be favoured by its place in a rotation.

    >>> [balanced_order("ab", i) for i in range(2)]
    [['a', 'b'], ['b', 'a']]
    >>> [''.join(balanced_order("abcd", i)) for i in range(4)]
    ['abdc', 'bcad', 'cdba', 'dacb']
    """
    n = len(labels)
    first, lo, hi = [0], 1, n - 1
    while len(first) < n:
        first.append(lo)
        lo += 1
        if len(first) < n:
            first.append(hi)
            hi -= 1
    row = [labels[(f + i) % n] for f in first]
    if n % 2 and (i // n) % 2:  # an odd count needs the mirrored square too
        row.reverse()
    return row


def balanced_period(n: int) -> int:
    """Rows after which :func:`balanced_order` over ``n`` labels is balanced."""
    return n if n % 2 == 0 else 2 * n


def corpus(*parts: str) -> str:
    with open(SHARED.joinpath("corpus", *parts), encoding="utf-8", newline="") as f:
        return f.read()


def stdlib_sources(limit: int) -> str:
    """Python standard library sources, concatenated (real code, present on every machine)."""
    out, total = [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        out.append(text)
        total += len(text)
        if total >= limit:
            break
    return "".join(out)


def documents(kind: str, size: int, count: int) -> list[str]:
    """`count` distinct documents of `size` characters (so that no document cache is measured)."""
    if kind == "code":
        src = stdlib_sources(size * count + size)
    elif kind == "prose":
        src = "".join(corpus("prose", p.name) for p in sorted((SHARED / "corpus" / "prose").iterdir()))
    elif kind == "multilingual":
        src = corpus("multilingual", "udhr_all-languages_concatenated.txt")
    elif kind == "adversarial":  # NFD text, odd whitespace and line ends, invisible characters
        src = "".join(corpus("adversarial", p.name)
                      for p in sorted((SHARED / "corpus" / "adversarial").iterdir()))
    else:
        raise ValueError(kind)
    while len(src) < size * count:
        src += src
    step = max(1, (len(src) - size) // max(1, count - 1)) if count > 1 else 0
    return [src[i * step : i * step + size] for i in range(count)]


LETTERS = "abcdefghijklmnopqrstuvwxyz"


def permuted_letters(text: str, rng: random.Random) -> str:
    """``text`` with its lowercase letters permuted by a fresh permutation drawn from ``rng``:
    words new to an encoder, the layout the same."""
    order = list(LETTERS)
    rng.shuffle(order)
    return text.translate(str.maketrans(LETTERS, "".join(order)))


def transcript_windows(size: int) -> list[str]:
    """The coding-agent transcripts (raw JSON, as a stateless request holds them; line ends as
    written), joined in name order and cut into windows of ``size`` characters."""
    folder = SHARED / "corpus" / "transcripts"
    joined = ""
    for f in sorted(os.listdir(folder)):
        if f.endswith(".json"):
            with open(folder / f, encoding="utf-8", newline="") as fh:
                joined += fh.read()
    return [joined[i:i + size] for i in range(0, len(joined) - size, size)]


def write_json(name: str, payload: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / name
    path.write_text(json.dumps(payload, indent=2))
    return path
