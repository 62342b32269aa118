"""Packaging: a non-editable install carries every subpackage and data file."""
from __future__ import annotations

import tomllib

from setuptools import find_packages

from conftest import ROOT


def test_every_package_is_found():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    include = cfg["tool"]["setuptools"]["packages"]["find"]["include"]
    found = set(find_packages(where=ROOT, include=include))
    expected = {".".join(p.relative_to(ROOT).parent.parts)
                for p in ROOT.glob("dtok*/**/__init__.py")}
    assert expected <= found, expected - found


def test_data_files_are_declared():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = cfg["tool"]["setuptools"]["package-data"]["dtok"]
    data = [p.relative_to(ROOT / "dtok") for p in (ROOT / "dtok" / "data").rglob("*") if p.is_file()]
    assert data and all(any(p.match(pat) for pat in patterns) for p in data)
