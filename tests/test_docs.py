"""The examples in README.md and in the docstrings run and print what they say."""
from __future__ import annotations

import doctest
import importlib

import pytest

from conftest import ROOT

MODULES = ["dtok", "dtok.tokenizer", "dtok.knobs", "dtok.chunking", "dtok.repair", "dtok_ext.buffers",
           "dtok_ext.specials"]


def test_readme_examples():
    result = doctest.testfile(str(ROOT / "README.md"), module_relative=False,
                              optionflags=doctest.ELLIPSIS)
    assert result.attempted > 5 and result.failed == 0


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
