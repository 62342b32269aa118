"""RSS and peak of a loaded tokenizer per phase: loading, then encoding (the high-water mark is
reset in between through /proc/self/clear_refs), for dtok and for the encoders it loads, alone.

    python tools/reliability/memory_phases.py [--tokenizer qwen3] [--docs 3]

dtok is compiled to bytecode first. One process per row (Linux). Each row: VmRSS after
loading, VmHWM while loading, VmRSS after encoding ``--docs`` distinct 1M-character prose
documents, VmHWM while encoding, and PSS after loading and after encoding (MiB).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
MODES = ["reference", "reference+fastokens", "dtok threads=1", "dtok"]

_PROBE = r"""
import ctypes, json, sys
mode, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])

def status():
    out = {}
    for line in open("/proc/self/status"):
        if line.startswith(("VmRSS", "VmHWM")):
            key, value = line.split(":")
            out[key] = int(value.split()[0]) // 1024
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Pss:"):
            out["Pss"] = int(line.split()[1]) // 1024
    return out

src = open(sys.argv[4], encoding="utf-8", newline="").read()
while len(src) < 1_000_000 + n * 10_000:
    src += src
docs = [src[i * 10_000 : i * 10_000 + 1_000_000] for i in range(n)]
import tokenizers
if mode.startswith("dtok"):
    import dtok
    knobs = {"threads": 1} if mode == "dtok threads=1" else {}
    tok = dtok.Tokenizer.from_file(path, content_lookup=False, **knobs)
    encode = lambda d: tok.encode(d)
else:
    ref = tokenizers.Tokenizer.from_file(path + "/tokenizer.json")
    encode = lambda d: ref.encode_batch_fast([d])
    if mode == "reference+fastokens":
        import fastokens
        fast = fastokens.Tokenizer.from_file(path + "/tokenizer.json")
        fast.encode_batch_flat(["warm up the lazy state " * 20])
        encode = lambda d: fast.encode_batch_flat([d], add_special_tokens=False)
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # each alone at its best
loaded = status()
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM
for d in docs:
    encode(d)
warm = status()
print(json.dumps({"loaded": loaded["VmRSS"], "load_peak": loaded["VmHWM"],
                  "warm": warm["VmRSS"], "encode_peak": warm["VmHWM"],
                  "loaded_pss": loaded["Pss"], "warm_pss": warm["Pss"]}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokenizer", default="qwen3")
    ap.add_argument("--docs", type=int, default=3)
    args = ap.parse_args()
    path = SHARED / "tokenizers" / args.tokenizer
    prose = SHARED / "corpus" / "prose" / "gutenberg-2701_moby-dick.txt"
    # dtok's modules as bytecode, as an installed package has them (as tests/test_memory.py
    # does): with PYTHONDONTWRITEBYTECODE set, a checkout whose bytecode is stale compiles dtok
    # at every start, and the compiler's memory showed as +6 MiB loaded
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "dtok")], check=True,
                   capture_output=True)
    print(f"{args.tokenizer}: MiB | loaded | peak while loading | after {args.docs} x 1M | "
          "peak while encoding | PSS loaded | PSS after")
    for mode in MODES:
        out = subprocess.run([sys.executable, "-c", _PROBE, mode, str(path), str(args.docs),
                              str(prose)], check=True, capture_output=True, text=True).stdout
        r = json.loads(out.splitlines()[-1])
        print(f"{mode:22s} | {r['loaded']:6d} | {r['load_peak']:6d} | {r['warm']:6d} | "
              f"{r['encode_peak']:6d} | {r['loaded_pss']:6d} | {r['warm_pss']:6d}")


if __name__ == "__main__":
    main()
