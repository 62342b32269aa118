#!/usr/bin/env python3
"""dtok against a ``tokenizers`` 1.x release (candidate), in a scratch virtualenv.

    python tools/release/check_tokenizers_rc.py [--tokenizers VERSION] [--python PY] [--keep]

1. copy the checkout as a fresh clone has it and ``pip install`` it (dtok's own pin brings
   ``tokenizers`` 0.2x), then ``pip install tokenizers==VERSION`` over it, as a user trying the
   release would (pip warns that dtok's pin is not met; that is the case checked);
2. print the release's public ``Tokenizer`` surface and run ``dtok demo`` with it;
3. run ``tests/test_tokenizers_1.py`` against the installed package (``PYTHONSAFEPATH=1``, on a
   copy of the tests without the source packages): on 1.x its tests of the real release run.

``VERSION`` defaults to the newest 1.x release PyPI lists, pre-releases included (needs PyPI).
Prints each step and a summary; exits 1 if anything failed. A few minutes (dtok's extensions are
compiled once).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from check_packaging import ROOT, find_python, fresh_checkout, run, test_tree, venv  # noqa: E402

SURFACE = ("import tokenizers; T = tokenizers.Tokenizer; print(tokenizers.__version__); "
           "print(' '.join(n for n in dir(T) if not n.startswith('_')))")


def newest_1x(python: Path) -> str:
    """The newest ``tokenizers`` 1.x version PyPI lists (pre-releases included)."""
    out = run([python, "-m", "pip", "index", "versions", "tokenizers", "--pre"]).stdout
    for line in out.splitlines():
        if line.strip().startswith("Available versions:"):
            versions = [v.strip() for v in line.split(":", 1)[1].split(",")]
            ones = [v for v in versions if v.split(".")[0] == "1"]
            if ones:
                return ones[0]  # pip lists the newest first
    raise SystemExit("PyPI lists no tokenizers 1.x release")


def check(python: Path, version: str | None, scratch: Path) -> list[str]:
    print(f"-- scratch virtualenv in {scratch}", flush=True)
    py = venv(python, scratch / "venv")
    version = version or newest_1x(py)
    checkout = fresh_checkout(scratch / "checkout")
    run([py, "-m", "pip", "install", "-q", str(checkout), "pytest"])
    print(f"-- tokenizers=={version} over it", flush=True)
    pip = run([py, "-m", "pip", "install", "-q", f"tokenizers=={version}"])
    for line in (pip.stdout + pip.stderr).splitlines():
        if "requires tokenizers" in line:
            print("   pip:", line.strip())
    env = {**os.environ, "PYTHONSAFEPATH": "1", "DTOK_CACHE_DIR": str(scratch / "cache"),
           "PATH": f"{scratch / 'venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    shared = Path(os.environ.get("DTOK_SHARED", ROOT.parent / "shared"))
    if shared.is_dir():
        env["DTOK_SHARED"] = str(shared)
    tree = test_tree(checkout, scratch / "tree")
    problems = []
    surface = run([py, "-c", SURFACE], cwd=tree, env=env).stdout.split("\n")
    print(f"-- tokenizers {surface[0]}: Tokenizer has {surface[1]}", flush=True)
    print("-- dtok demo --chars 200000 --turns 4", flush=True)
    demo = run([py, "-m", "dtok", "demo", "--chars", "200000", "--turns", "4"], cwd=tree,
               env=env, check=False)
    print("\n".join("   " + line for line in (demo.stdout + demo.stderr).splitlines()))
    if demo.returncode != 0:
        problems.append(f"dtok demo exited {demo.returncode}")
    print("-- pytest tests/test_tokenizers_1.py", flush=True)
    tests = run([py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                 "tests/test_tokenizers_1.py"], cwd=tree, env=env, check=False)
    print("\n".join("   " + line for line in tests.stdout.splitlines()[-25:]))
    if tests.returncode != 0:
        problems.append(f"tests/test_tokenizers_1.py exited {tests.returncode}")
    return problems


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--tokenizers", metavar="VERSION",
                    help="the release to try (default: the newest 1.x on PyPI)")
    ap.add_argument("--python", default=sys.executable, help="interpreter (path or version)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="dtok-tokenizers-rc-"))
    try:
        problems = check(find_python(args.python), args.tokenizers, scratch)
    except RuntimeError as exc:
        problems = [str(exc)]
    finally:
        if args.keep:
            print(f"kept {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    for p in problems:
        print("PROBLEM:", p)
    print("tokenizers rc: all good" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
