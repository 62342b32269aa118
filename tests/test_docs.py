"""The documentation is true: README.md's and docs/*.md's examples run and print what they say,
their commands name scripts and options that exist, their links lead somewhere, and the
docstrings' examples run."""
from __future__ import annotations

import doctest
import functools
import importlib
import re
from pathlib import Path

import pytest

from conftest import ROOT

MODULES = ["dtok", "dtok.tokenizer", "dtok.reference", "dtok.knobs", "dtok.chunking",
           "dtok.repair", "dtok.planning", "dtok.allocator", "dtok.session_core", "dtok.testing",
           "dtok_ext.buffers", "dtok_ext.specials", "dtok_ext.utf8"]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The languages a fenced block may have, and how each is checked: python blocks run as doctests,
# sh blocks have their scripts and options checked, text blocks are listings.
LANGUAGES = {"python", "sh", "text"}
FENCE = re.compile(r"^```(\S*)\n(.*?)^```$", re.M | re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`([^`]+)`")  # may wrap onto the next line


@functools.lru_cache(maxsize=1)
def _bundled():
    import dtok
    from dtok.admission import bundled_files

    return dtok.Tokenizer(bundled_files())


@pytest.fixture
def one_default_load(monkeypatch):
    """``Tokenizer.default()`` in the examples: the bundled file loaded once for all of them,
    each call a tokenizer of its own (``with_knobs``: the loaded encoders shared, empty
    session state), not a load of ~1.7 s each."""
    import dtok

    monkeypatch.setattr(dtok.Tokenizer, "default",
                        classmethod(lambda cls, **knobs: _bundled().with_knobs(**knobs)))


def page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.name


def blocks(page: Path) -> list[tuple[str, str]]:
    return FENCE.findall(page.read_text(encoding="utf-8"))


def commands(page: Path) -> list[str]:
    """Command lines of a page: each line of its sh blocks, and each inline code span that runs
    a script (`python benches/X.py ...`, or `bench_fast.py --memory-only` in the prose)."""
    text = page.read_text(encoding="utf-8")
    lines = [line for lang, body in blocks(page) if lang == "sh" for line in body.splitlines()]
    spans = (" ".join(span.split()) for span in INLINE_CODE.findall(FENCE.sub("", text)))
    return lines + [span for span in spans if re.match(r"(python3? )?[\w/]+\.py( |$)", span)]


def scripts(line: str) -> list[tuple[str, list[str]]]:
    """The project scripts a command line runs, with the options it gives each."""
    out = []
    for part in re.split(r"&&|;|\|", line):
        words = [w for w in part.split() if not re.match(r"[A-Z_]+=", w)]  # VAR=value first
        if words[:1] in (["python"], ["python3"]):
            words = words[1:]
        if words and words[0].endswith(".py"):
            out.append((words[0], [w.split("=")[0] for w in words[1:] if w.startswith("--")]))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    return {slug(h) for h in re.findall(r"^#+ (.+)$", text, re.M)}


def test_every_topic_has_a_page():
    names = {p.name for p in PAGES}
    assert {"README.md", "sessions.md", "pool.md", "serving.md", "exactness.md", "encoders.md",
            "benchmarks.md", "knobs.md"} <= names


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text(encoding="utf-8").splitlines()) <= 300


@pytest.mark.usefixtures("one_default_load")
def test_readme_examples():
    result = doctest.testfile(str(ROOT / "README.md"), module_relative=False,
                              optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 5 and result.failed == 0  # the quick start's five-line example


@pytest.mark.usefixtures("one_default_load")
@pytest.mark.parametrize("page", PAGES[1:], ids=page_id)
def test_page_examples(page):
    """Every python block of a page runs as a doctest (each page on its own globals)."""
    result = doctest.testfile(str(page), module_relative=False, optionflags=doctest.ELLIPSIS)
    python = [body for lang, body in blocks(page) if lang == "python"]
    assert result.failed == 0
    assert result.attempted >= len(python)


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_code_blocks_are_checked(page):
    """A block is python (then it must hold examples, or the doctest would not test it), sh or
    text; an unfenced (indented) code block would escape every check."""
    for lang, body in blocks(page):
        assert lang in LANGUAGES, f"{page_id(page)}: a ```{lang} block"
        if lang == "python":
            assert ">>> " in body, f"{page_id(page)}: a python block without examples"
    prose = FENCE.sub("", page.read_text(encoding="utf-8"))
    assert not re.search(r"\n\n    [^ *\-\d]", prose), f"{page_id(page)}: an indented code block"


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_commands_name_scripts_and_options_that_exist(page):
    """`python benches/X.py --opt` and `python tools/X.py --opt`: the script exists and defines
    the option (its own source, or the benches' shared helpers)."""
    checked = 0
    for line in commands(page):
        for script, options in scripts(line):
            path = next((d / script for d in (ROOT, ROOT / "benches", ROOT / "tools", ROOT / "tests")
                         if (d / script).is_file()), ROOT / script)
            assert path.is_file(), f"{page_id(page)}: {script} does not exist"
            source = path.read_text(encoding="utf-8")
            if path.parent.name == "benches":
                source += (ROOT / "benches" / "common.py").read_text(encoding="utf-8")
            for option in options:
                assert f'"{option}' in source, f"{page_id(page)}: {script} has no {option}"
            checked += 1
    if page.name == "benchmarks.md":
        assert checked > 5


def test_every_script_the_docs_run_is_checked():
    """The script check above sees commands at all (a control for its pattern)."""
    found = {script for page in PAGES for line in commands(page)
             for script, _ in scripts(line)}
    assert {"benches/bench_ttft.py", "benches/figures.py", "tools/engines/vllm_check.py",
            "bench_fast.py"} <= found


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_relative_links_resolve(page):
    """Every relative link (and image) names a file that exists, and an anchor a heading of it."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        assert dest.exists(), f"{page_id(page)}: link to missing {target}"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page_id(page)}: no heading for {target}"


def test_every_figure_is_shown_and_small():
    shown = {(page.parent / t).resolve() for page in PAGES
             for t in LINK.findall(page.read_text(encoding="utf-8"))}
    for png in sorted((ROOT / "docs" / "figures").glob("*.png")):
        assert png.resolve() in shown, f"{png.name} is not shown on any page"
        assert png.stat().st_size < 150_000, f"{png.name} is {png.stat().st_size} bytes"


def test_environment_variables_exist():
    """Every DTOK_* variable the docs name is read somewhere in the project."""
    sources = "".join(p.read_text(encoding="utf-8") for d in ("dtok", "benches", "tools", "tests")
                      for p in (ROOT / d).rglob("*.py"))
    for page in PAGES:
        for name in set(re.findall(r"\bDTOK_[A-Z][A-Z0-9_]*[A-Z0-9]\b", page.read_text("utf-8"))):
            assert name in sources, f"{page_id(page)}: nothing reads {name}"


@pytest.mark.parametrize("check, page", [
    (test_page_examples, "```python\n>>> 1 + 1\n3\n\n```\n"),
    (test_code_blocks_are_checked, "```python\nx = 1\n```\n"),
    (test_code_blocks_are_checked, "```bash\nls\n```\n"),
    (test_code_blocks_are_checked, "text\n\n    python benches/bench_fast.py\n"),
    (test_commands_name_scripts_and_options_that_exist, "`python benches/bench_none.py`\n"),
    (test_commands_name_scripts_and_options_that_exist,
     "```sh\npython benches/bench_fast.py --no-such-option\n```\n"),
    (test_relative_links_resolve, "[gone](gone.md)\n"),
    (test_relative_links_resolve, "[sessions](sessions.md#no-such-heading)\n"),
], ids=["doctest", "python-block", "language", "indented", "script", "option", "link", "anchor"])
def test_the_checks_catch_a_wrong_page(tmp_path, check, page):
    """Each check fails on a page with that one thing wrong (a control for the checks)."""
    (tmp_path / "sessions.md").write_text("# Sessions\n")
    path = tmp_path / "wrong.md"
    path.write_text("# Wrong\n\n" + page)
    with pytest.raises(AssertionError):
        check(path)


@pytest.mark.usefixtures("one_default_load")
@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
