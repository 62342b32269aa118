"""The recipe "Adding a family" (docs/adding-a-family.md), walked for the existing families: its
command block, run into a temporary directory, rebuilds what the repository holds.

The commands are read from the page (its first ``sh`` block), not copied here, so the page and
this test cannot drift: a command this test does not know how to check fails it."""
from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import DATA, FAMILY_OF, HAVE_SHARED, MADE_FILES, REAL_FILES, REQUIRE_SHARED, ROOT
from dtok.families import FAMILIES, TABLES_DIR, TRANSITIONS_FILE

sys.path.insert(0, str(ROOT / "tools" / "data"))
from build_test_tokenizers import missing_source  # noqa: E402

RECIPE = ROOT / "docs" / "adding-a-family.md"
GUARDS_DIR = ROOT / "dtok" / "data" / "guards"
# family -> its real test file (in ../shared, or made by the build script)
REAL_OF = {FAMILY_OF[name]: name for name in REAL_FILES + MADE_FILES}
# what varies between two builds of one guard table: timings, provenance, measured speed
GUARD_VOLATILE = {("checked", "seconds"), ("checked", "reused_from"), ("nfc", "seconds")}

needs_shared = pytest.mark.skipif(
    not (HAVE_SHARED or REQUIRE_SHARED),
    reason="the small test tokenizers are built from the real files in ../shared (absent)")


def recipe_commands(family: str, real: str) -> list[list[str]]:
    """The command lines of the recipe's block for ``family`` (its real file ``real``), without
    the shell variable assignments the block starts with."""
    block = re.search(r"^```sh\n(.*?)^```", RECIPE.read_text(), re.S | re.M).group(1)
    commands = []
    for line in block.splitlines():
        argv = shlex.split(line, comments=True)
        if not argv or re.fullmatch(r"[A-Z_]+=\S*", argv[0]):
            continue
        commands.append([a.replace("$FAMILY", family).replace("$REAL", real) for a in argv])
    return commands


def tool_of(argv: list[str]) -> str | None:
    """``tools/data/NAME.py`` -> NAME; None for the recipe's test runs (``python -m pytest``)."""
    if argv[:3] == ["python", "-m", "pytest"]:
        return None
    assert argv[0] == "python" and argv[1].startswith("tools/data/"), argv
    return Path(argv[1]).stem


def run_tool(argv: list[str], out: Path) -> None:
    """One command of the recipe with this interpreter, writing into ``out``."""
    cmd = [sys.executable, *argv[1:], "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3 * 3600)
    assert proc.returncode == 0, f"{shlex.join(argv)}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"


def same_files(made: Path, repo: Path) -> None:
    """Every file under ``made`` is in ``repo`` with the same bytes (gzip members compared
    decompressed, as test_test_data.py does: the compressed bytes may depend on zlib)."""
    files = sorted(p.relative_to(made) for p in made.rglob("*") if p.is_file())
    assert files, f"nothing written under {made}"
    for rel in files:
        new, old = (made / rel).read_bytes(), (repo / rel).read_bytes()
        if rel.suffix == ".gz":
            new, old = gzip.decompress(new), gzip.decompress(old)
        assert new == old, f"{rel} differs from the repository's"


def guard_content(path: Path) -> dict:
    """A guard table without what varies between builds (``speed`` is checked apart)."""
    table = json.loads(path.read_text())
    for section, key in GUARD_VOLATILE:
        table.get(section, {}).pop(key, None)
    table.pop("speed", None)
    return table


def check_step(tool: str, argv: list[str], out: Path, real: str) -> None:
    """Run one step into ``out`` and compare what it wrote with the repository."""
    if tool == "derive_transitions":
        run_tool(argv, out / "_transitions.py")
        assert (out / "_transitions.py").read_bytes() == TRANSITIONS_FILE.read_bytes()
    elif tool == "build_tables":
        run_tool(argv, out / "tables")
        same_files(out / "tables", TABLES_DIR)
    elif tool == "build_test_tokenizers":
        run_tool(argv, out / "testdata")
        assert (out / "testdata" / "tokenizers" / f"{real}-tiny" / "tokenizer.json").is_file()
        same_files(out / "testdata", DATA)
    elif tool == "build_guards":
        encoder = argv[argv.index("--encoder") + 1] if "--encoder" in argv else "fastokens"
        if importlib.util.find_spec(encoder) is None:
            pytest.skip(f"{encoder} is not installed: no guard tables to build")
        run_tool(argv, out / "guards")
        made = sorted((out / "guards").glob("*.json"))
        if not made:  # the encoder does not load the file (the tool says so): none shipped
            sha = hashlib.sha256((ROOT / argv[2] / "tokenizer.json").read_bytes()).hexdigest()
            assert not list(GUARDS_DIR.glob(f"{sha[:16]}-*-{encoder}*.json")), argv
            return
        for path in made:
            assert guard_content(path) == guard_content(GUARDS_DIR / path.name), path.name
        if "--speed" in argv:  # measured figures: the same text classes measured
            for path in made:
                new, old = (json.loads(p.read_text()).get("speed", {}).get("ratio", {})
                            for p in (path, GUARDS_DIR / path.name))
                assert sorted(new) == sorted(old), path.name
    else:
        pytest.fail(f"the recipe runs {tool}, which this test does not know how to check")


def test_recipe_names_existing_tools_and_tests():
    """Every command of the page is a data tool that exists or a test run of existing files."""
    commands = recipe_commands("qwen2", "qwen3")
    tools = [tool_of(argv) for argv in commands]
    assert {t for t in tools if t} == {"derive_transitions", "build_tables",
                                       "build_test_tokenizers", "build_guards"}
    for argv, tool in zip(commands, tools):
        if tool is None:
            tests = [a for a in argv[3:] if not a.startswith("-")]
            assert tests and all((ROOT / t).is_file() for t in tests), argv
        else:
            assert (ROOT / argv[1]).is_file(), argv
    assert any("tests/test_family_recipe.py" in argv for argv in commands)


def test_comparisons_see_one_difference(tmp_path):
    """The control: one changed byte inside a gzip member, or one more guard code point, is
    seen."""
    made, repo = tmp_path / "made", tmp_path / "repo"
    for where, last in ((made, 1), (repo, 2)):
        where.mkdir()
        (where / "t.bin.gz").write_bytes(gzip.compress(bytes([0, 7, last]), 9, mtime=0))
    with pytest.raises(AssertionError, match="t.bin.gz differs"):
        same_files(made, repo)
    (made / "t.bin.gz").write_bytes((repo / "t.bin.gz").read_bytes())
    same_files(made, repo)
    stored = next(GUARDS_DIR.glob("*-gigatoken*.json"))
    table = json.loads(stored.read_text())
    slower = dict(table, checked={**table["checked"], "seconds": 1}, speed={})
    (tmp_path / "slower.json").write_text(json.dumps(slower))
    (tmp_path / "wider.json").write_text(json.dumps(dict(table, disagree=[*table["disagree"], 65])))
    assert guard_content(tmp_path / "slower.json") == guard_content(stored)
    assert guard_content(tmp_path / "wider.json") != guard_content(stored)


@pytest.mark.slow
def test_recipe_rebuilds_the_table(tmp_path):
    """The recipe's table step for qwen2: the shipped table's bytes (about 15 s)."""
    for argv in recipe_commands("qwen2", "qwen3"):
        if tool_of(argv) == "build_tables":
            check_step("build_tables", argv, tmp_path, "qwen3")
            return
    pytest.fail("the recipe has no build_tables step")


@needs_shared
def test_recipe_rebuilds_the_test_tokenizer(tmp_path):
    """The recipe's test-tokenizer step for qwen3: qwen3-tiny's bytes (about 10 s)."""
    for argv in recipe_commands("qwen2", "qwen3"):
        if tool_of(argv) == "build_test_tokenizers":
            check_step("build_test_tokenizers", argv, tmp_path, "qwen3")
            return
    pytest.fail("the recipe has no build_test_tokenizers step")


@pytest.mark.slow
@pytest.mark.parametrize("family", list(FAMILIES))
def test_recipe_rebuilds_the_family(family, tmp_path):
    """Every step of the recipe for ``family``, in order: transitions (1 to 10 minutes), table,
    small test tokenizer, guard tables (minutes each)."""
    real = REAL_OF[family]
    for argv in recipe_commands(family, real):
        tool = tool_of(argv)
        if tool == "build_test_tokenizers" and not (HAVE_SHARED or REQUIRE_SHARED):
            continue  # its guard tables are still rebuilt from the repository's small file
        if tool == "build_test_tokenizers" and real in MADE_FILES and missing_source(real):
            continue  # what the script makes the real file from is not installed
        if tool is not None:
            check_step(tool, argv, tmp_path, real)
