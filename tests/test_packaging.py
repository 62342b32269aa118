"""Packaging: the sdist holds the sources and the tests, the wheel the compiled extensions and the
bundled data, and both install and work in a fresh virtualenv (tools/release/check_packaging.py)."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import tarfile
import zipfile

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools" / "release"))
import check_packaging  # noqa: E402

source_tree = pytest.mark.skipif(not (ROOT / "dtok").is_dir(),
                                 reason="no source tree here (testing an installed package)")
needs_build = pytest.mark.skipif(
    not all(importlib.util.find_spec(m) for m in ("build", "Cython", "setuptools", "wheel")),
    reason="build, setuptools, wheel and Cython (the test extra) are not installed")


@source_tree
def test_every_package_is_found():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is new in Python 3.11")
    from setuptools import find_packages

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = cfg["tool"]["setuptools"]["packages"]["find"]["include"]
    found = set(find_packages(where=ROOT, include=include))
    expected = {".".join(p.relative_to(ROOT).parent.parts)
                for p in ROOT.glob("dtok*/**/__init__.py")}
    assert expected <= found, expected - found


@source_tree
def test_data_files_are_declared():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is new in Python 3.11")
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = cfg["tool"]["setuptools"]["package-data"]["dtok"]
    data = [p.relative_to(ROOT / "dtok") for p in (ROOT / "dtok").rglob("*")
            if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts]
    assert any(p.parts[0] == "families" for p in data), "the class tables are package data"
    undeclared = [p for p in data if not any(p.match(pat) for pat in patterns)]
    assert data and not undeclared, undeclared


def _build(tmp_path, *what: str):
    """`python -m build` without isolation (offline) from a copy of what a fresh clone holds."""
    checkout = check_packaging.fresh_checkout(tmp_path / "checkout")
    subprocess.run([sys.executable, "-m", "build", "--no-isolation", *what, "--outdir",
                    str(tmp_path / "dist"), str(checkout)], check=True, capture_output=True)
    return checkout, tmp_path / "dist"


@source_tree
@needs_build
@pytest.mark.slow
def test_sdist_holds_sources_data_and_tests(tmp_path):
    _checkout, dist = _build(tmp_path, "--sdist")
    (sdist,) = dist.glob("*.tar.gz")
    assert check_packaging.check_sdist(sdist) == []
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
    assert any(n.endswith("tests/data/tokenizers/gpt-oss/tokenizer.json.gz") for n in names)


@source_tree
@needs_build
@pytest.mark.slow
def test_wheel_built_from_the_sdist_holds_extensions_and_data(tmp_path):
    """Compiles the extensions (about a minute)."""
    checkout, dist = _build(tmp_path)  # sdist, then the wheel from the sdist
    (wheel,) = dist.glob("*.whl")
    assert check_packaging.check_wheel(wheel, checkout) == []
    assert not any(n.startswith("tests/") for n in zipfile.ZipFile(wheel).namelist())


@source_tree
@pytest.mark.slow
def test_fresh_virtualenv_installs_run_demo_and_tests():
    """tools/release/check_packaging.py on this interpreter, with a few test files (needs PyPI;
    minutes)."""
    run = subprocess.run([sys.executable, str(ROOT / "tools" / "release" / "check_packaging.py"),
                          "--pytest-args", "-x tests/test_admission.py tests/test_exactness.py "
                          "tests/test_docs.py"], capture_output=True, text=True, timeout=3600)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "packaging: all good" in run.stdout
