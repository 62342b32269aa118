"""dtok/ type-checks clean under mypy (its configuration: pyproject.toml's [tool.mypy]), and ships
its ``py.typed`` marker so that checkers read its annotations in a user's code."""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

# Modules mypy still reports errors in, each being rewritten in another branch as this is
# written (the pool's split of dtok/pool/api.py, the merge of the two session stores); every
# other module of dtok/ must stay clean. Remove an entry once its module checks clean.
NOT_YET_CLEAN = ("dtok/pool/", "dtok/sessions.py")


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy (the test extra) is not installed")
@pytest.mark.skipif(not (ROOT / "dtok").is_dir(),
                    reason="no source tree here (testing an installed package)")
def test_dtok_type_checks_clean(tmp_path):
    out = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path / "cache")],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    errors = [line for line in out.stdout.splitlines() if re.match(r"\S+\.pyi?:\d+: error:", line)]
    assert out.returncode in (0, 1) and (errors or out.returncode == 0), out.stdout + out.stderr
    assert "checked" in out.stdout, out.stdout  # it checked the files, not only the config
    unclean = [e for e in errors if not e.startswith(NOT_YET_CLEAN)]
    assert not unclean, "\n".join(unclean)


def test_package_is_marked_typed():
    """In the checkout and in an installed wheel (package data: tests/test_packaging.py)."""
    import dtok

    assert Path(dtok.__file__).with_name("py.typed").is_file()
