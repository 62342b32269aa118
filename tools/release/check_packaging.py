#!/usr/bin/env python3
"""Build dtok's sdist and wheel as a fresh clone would, install each into a fresh virtualenv, and
run ``dtok demo`` and the test suite against the installed package.

    python tools/release/check_packaging.py [--python PY ...] [--pytest-args ARGS] [--no-tests]
                                            [--keep]

For each interpreter (``--python``: a path or a version such as 3.12, looked up on PATH and in
pyenv; default: the one running this script):

1. copy the checkout's files (tracked, and untracked ones git does not ignore) to a scratch
   directory, as a fresh clone has them: no compiled extensions, no caches;
2. ``python -m build`` there: an sdist, then a wheel built *from the sdist* (so the sdist is
   proven complete); check what each holds (``check_sdist`` / ``check_wheel``);
3. for the wheel and for the sdist: a fresh virtualenv, ``pip install "ARTIFACT[test]"`` (from
   PyPI: needs the network), ``dtok demo``, then ``pytest`` on a copy of the tests that has no
   source packages beside it, with ``PYTHONSAFEPATH=1``, so every import of dtok, also in the
   tests' subprocesses, is the installed one; ``DTOK_CACHE_DIR`` points into the scratch
   directory, so nothing built earlier on this machine is reused.

Prints one line per step and a summary; exits 1 if anything failed. The tests use this
checkout's ``../shared`` (or ``$DTOK_SHARED``) when it exists, as usual (``tests/conftest.py``).
A whole run on one interpreter takes a few minutes plus two runs of the test suite.
"""
from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def extension_modules(setup_py: Path = ROOT / "setup.py") -> list[str]:
    """The Cython modules setup.py builds (its MODULES list)."""
    for node in ast.parse(setup_py.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "MODULES":
            return ast.literal_eval(node.value)
    raise ValueError(f"{setup_py} has no MODULES list")


def run(cmd: list[str], *, cwd: Path | None = None, env: dict | None = None,
        check: bool = True) -> subprocess.CompletedProcess:
    """Run a command, echoing it; its output is returned (and printed on failure)."""
    print("   $", " ".join(map(str, cmd)), flush=True)
    proc = subprocess.run(list(map(str, cmd)), cwd=cwd, env=env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        print(proc.stdout[-6000:], proc.stderr[-6000:], sep="\n", flush=True)
        raise RuntimeError(f"{cmd[0]} {cmd[1] if len(cmd) > 1 else ''} exited {proc.returncode}")
    return proc


def find_python(spec: str) -> Path:
    """A path, or a version looked up as pythonX.Y on PATH and in pyenv."""
    if os.sep in spec:
        return Path(spec)
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    for cand in sorted(pyenv.glob(f"{spec}*/bin/python3"), reverse=True):
        return cand
    found = shutil.which(f"python{spec}")
    if found:
        return Path(found)
    raise SystemExit(f"no interpreter for {spec!r} (PATH, {pyenv})")


def fresh_checkout(dest: Path) -> Path:
    """The files a fresh clone has: tracked ones, and untracked ones git does not ignore (outside
    a git checkout, e.g. an unpacked sdist: everything but build products and environments)."""
    listing = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                  cwd=ROOT, check=False)
    if listing.returncode != 0:
        shutil.copytree(ROOT, dest, ignore=shutil.ignore_patterns(
            ".venv*", ".ci-venv", "build", "dist", "*.egg-info", "__pycache__", "*.so", "*.c"))
        return dest
    for name in filter(None, listing.stdout.split("\0")):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


def venv(python: Path, where: Path) -> Path:
    run([python, "-m", "venv", where])
    py = where / "bin" / "python"
    run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"])
    return py


def check_sdist(path: Path) -> list[str]:
    """What an sdist must hold: the Cython sources, the build files, the data, the tests."""
    with tarfile.open(path) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    need = [f"dtok_ext/{m}.pyx" for m in extension_modules()] + [
        "dtok_ext/cuts.pxd", "dtok_ext/unicode_text.pxd", "setup.py", "pyproject.toml",
        "README.md", "dtok/data/qwen3/tokenizer.json.gz", "dtok/families/_transitions.py",
        "tests/conftest.py", "tests/data/tokenizers/qwen3-tiny/tokenizer.json",
        "tools/data/build_test_tokenizers.py"]
    problems = [f"sdist lacks {n}" for n in need if n not in names]
    if not any(n.startswith("dtok/families/tables/") and n.endswith(".bin.gz") for n in names):
        problems.append("sdist lacks the class tables (dtok/families/tables)")
    problems += [f"sdist holds a build product {n}" for n in names
                 if n.endswith((".so", ".c")) or "__pycache__" in n]
    return problems


def check_wheel(path: Path, checkout: Path) -> list[str]:
    """What a wheel must hold: the compiled extensions, every file of the package (modules and
    bundled data); and none of the tests or tools."""
    names = set(zipfile.ZipFile(path).namelist())
    modules = extension_modules(checkout / "setup.py")
    problems = [f"wheel lacks the compiled dtok_ext.{m}" for m in modules
                if not any(n.startswith(f"dtok_ext/{m}.") and n.endswith((".so", ".pyd"))
                           for n in names)]
    for rel in (checkout / "dtok").rglob("*"):
        if rel.is_file():
            name = rel.relative_to(checkout).as_posix()
            if name not in names:
                problems.append(f"wheel lacks {name}")
    problems += [f"wheel holds {n}" for n in names if n.startswith(("tests/", "tools/"))]
    if not any(n.endswith("entry_points.txt") for n in names):
        problems.append("wheel has no entry points (the dtok command)")
    return problems


def test_tree(checkout: Path, dest: Path) -> Path:
    """The checkout without its source packages: tests import the installed dtok only."""
    shutil.copytree(checkout, dest, ignore=shutil.ignore_patterns("dtok", "dtok_ext", "build",
                                                                  "dist", "*.egg-info"))
    return dest


def try_artifact(label: str, python: Path, artifact: Path, tree: Path, scratch: Path,
                 pytest_args: list[str], tests: bool) -> list[str]:
    print(f"-- {label}: install {artifact.name} into a fresh virtualenv", flush=True)
    env_dir = scratch / f"venv-{label}"
    py = venv(python, env_dir)
    run([py, "-m", "pip", "install", "-q", f"{artifact}[test]"])
    env = {**os.environ, "PYTHONSAFEPATH": "1", "DTOK_CACHE_DIR": str(scratch / f"cache-{label}"),
           "PATH": f"{env_dir / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    shared = Path(os.environ.get("DTOK_SHARED", ROOT.parent / "shared"))
    if shared.is_dir():  # the checkout's ../shared, wherever the copy of the tests lives
        env["DTOK_SHARED"] = str(shared)
    where = run([py, "-c", "import dtok, dtok_ext.cuts, tokenizers; "
                 "print(dtok.__file__, dtok_ext.cuts.__file__, tokenizers.__version__)"],
                cwd=tree, env=env).stdout.split()
    problems = [f"{label}: dtok imported from {p}" for p in where[:2] if str(env_dir) not in p]
    print(f"   dtok from {where[0]}, tokenizers {where[2]}", flush=True)
    demo = run([env_dir / "bin" / "dtok", "demo", "--chars", "200000", "--turns", "4"],
               cwd=tree, env=env, check=False)
    if demo.returncode != 0 or "identical: yes" not in demo.stdout or "NO" in demo.stdout:
        problems.append(f"{label}: dtok demo failed:\n{demo.stdout[-2000:]}{demo.stderr[-2000:]}")
    else:
        print("   dtok demo: identical: yes", flush=True)
    if tests:
        t0 = time.time()
        res = run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
                  cwd=tree, env=env, check=False)
        summary = (res.stdout.strip().splitlines() or ["(no output)"])[-1]
        print(f"   pytest ({time.time() - t0:.0f} s): {summary}", flush=True)
        if res.returncode != 0:
            problems.append(f"{label}: tests failed: {summary}\n{res.stdout[-4000:]}")
    return problems


def check(python: Path, scratch: Path, pytest_args: list[str], tests: bool) -> list[str]:
    version = run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
    version = version.stdout.strip()
    print(f"== Python {version} ({python})", flush=True)
    checkout = fresh_checkout(scratch / "checkout")
    builder = venv(python, scratch / "venv-build")
    run([builder, "-m", "pip", "install", "-q", "build"])
    dist = scratch / "dist"
    run([builder, "-m", "build", "--outdir", dist, checkout])
    sdist = next(dist.glob("*.tar.gz"))
    wheel = next(dist.glob("*.whl"))
    print(f"-- built {sdist.name} ({sdist.stat().st_size:,} B), {wheel.name} "
          f"({wheel.stat().st_size:,} B)", flush=True)
    problems = check_sdist(sdist) + check_wheel(wheel, checkout)
    tree = test_tree(checkout, scratch / "tests-tree")
    for label, artifact in (("wheel", wheel), ("sdist", sdist)):
        problems += try_artifact(label, python, artifact, tree, scratch, pytest_args, tests)
    return [f"Python {version}: {p}" for p in problems]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", action="append", default=[],
                    help="interpreter path or version (repeatable; default: this one)")
    ap.add_argument("--pytest-args", default="",
                    help="extra pytest arguments, e.g. '-x tests/test_exactness.py'")
    ap.add_argument("--no-tests", action="store_true", help="build, install and demo only")
    ap.add_argument("--keep", action="store_true", help="keep the scratch directories")
    args = ap.parse_args()
    pythons = [find_python(p) for p in args.python] or [Path(sys.executable)]
    problems = []
    for python in pythons:
        scratch = Path(tempfile.mkdtemp(prefix="dtok-packaging-"))
        try:
            problems += check(python, scratch, args.pytest_args.split(), not args.no_tests)
        except RuntimeError as exc:
            problems.append(f"{python}: {exc}")
        finally:
            if args.keep:
                print(f"   kept {scratch}")
            else:
                shutil.rmtree(scratch, ignore_errors=True)
    print("\n".join(["", "problems:", *problems] if problems else ["", "packaging: all good"]))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
