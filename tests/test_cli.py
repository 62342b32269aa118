"""The command line: every command runs, says what it found, and fails with one clear line."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, load_tokenizer, read_text, shared_path
from dtok import cli

COMMANDS = ["demo", "encode", "verify", "replay", "explain", "bench", "guards"]


def run(*args, input=None):
    return subprocess.run([sys.executable, "-m", "dtok", *args], capture_output=True, text=True,
                          input=input, cwd=ROOT, timeout=600)


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help(command):
    out = run(*([command] if command else []), "--help")
    assert out.returncode == 0 and "usage: dtok" in out.stdout


def test_version():
    """The installed package's version, which is the one dtok reports (dtok.__version__)."""
    from importlib.metadata import version

    out = run("--version")
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"dtok {version('dtok')}\n" == f"dtok {cli.dtok.__version__}\n"


def test_demo_small():
    out = run("demo", "--chars", "200000", "--turns", "4")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("yes") == 5 and "NO" not in out.stdout
    # 200K characters of prose: one piece on the default threads (docs/knobs.md#threads)
    assert "session repair" in out.stdout and "route whole (one piece" in out.stdout


def test_encode_and_npy(tmp_path):
    text = read_text("code", "shell__fzf__shell_key-bindings.zsh.txt")
    f = tmp_path / "in.txt"
    f.write_text(text, encoding="utf-8", newline="")
    tok = load_tokenizer("llama3")
    want = tok.reference.encode(text).ids
    out = run("encode", str(f), "--tokenizer", str(shared_path("tokenizers", "llama3")))
    assert out.returncode == 0 and list(map(int, out.stdout.split())) == want
    npy = tmp_path / "ids.npy"
    out = run("encode", "--tokenizer", str(shared_path("tokenizers", "llama3")),
              "--npy", str(npy), "--no-special", input=text)
    assert out.returncode == 0
    assert np.load(npy).tolist() == tok.reference.encode(text, add_special_tokens=False).ids


def test_verify_files_dirs_jsonl_transcripts(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("Hello\r\nworld e\u0301", encoding="utf-8", newline="")
    (tmp_path / "d" / "b.txt").write_text(read_text("prose", "gutenberg-2701_moby-dick.txt")
                                          [:300_000], encoding="utf-8", newline="")
    (tmp_path / "x.jsonl").write_text("\n".join(json.dumps(v) for v in [
        "plain", {"text": "dict text"}, {"messages": [{"role": "user", "content": "hi"}]}]))
    transcript = shared_path("corpus", "transcripts", "sweagent-demo-ctf-rev__rock.json")
    out = run("verify", str(tmp_path / "d"), str(tmp_path / "x.jsonl"), str(transcript))
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("identical: yes - 6 texts")


def test_verify_reports_first_difference(tmp_path, monkeypatch, capsys):
    f = tmp_path / "t.txt"
    f.write_text("one two three four")
    real = cli.dtok.Tokenizer.encode

    def broken(self, text, **kw):
        ids = list(real(self, text, **kw))
        ids[2] += 1
        return ids

    monkeypatch.setattr(cli.dtok.Tokenizer, "encode", broken)
    assert cli.main(["verify", str(f)]) == 1
    out = capsys.readouterr().out
    assert "DIFFERENT" in out and "first difference at token 2" in out


def test_replay_keyed_and_lookup():
    paths = [str(shared_path("corpus", "transcripts", n)) for n in
             ("sweagent-demo-ctf-rev__rock.json", "sweagent-demo-ctf-crypto__katy.json")]
    for mode in ("keyed", "lookup"):
        out = run("replay", *paths, "--mode", mode, "--tokenizer",
                  str(shared_path("tokenizers", "gpt-oss")))
        assert out.returncode == 0, out.stderr
        rows = [line for line in out.stdout.splitlines() if line.endswith(" yes")]
        assert len(rows) == 2, out.stdout
        assert " 0 fallbacks" in out.stdout


def test_explain_json(tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("слово " * 40000, encoding="utf-8")  # other text: chunks of chunk_target
    out = run("explain", str(f))
    info = json.loads(out.stdout)
    assert out.returncode == 0 and info["route"] == "chunked" and info["admitted"]


@pytest.mark.parametrize("args, message", [
    (["encode", "/no/such/file.txt"], "no such file"),
    (["verify", "/no/such/dir"], "no such file"),
    (["encode", "--tokenizer", "/no/such/tokenizer.json"], "no tokenizer file"),
    (["replay", "BADJSON"], "not valid JSON"),
    (["replay", "--tokenizer", "ROBERTA", "x.json"], "not admitted"),
])
def test_errors_are_one_line(tmp_path, args, message):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    args = [str(bad) if a == "BADJSON" else
            str(shared_path("tokenizers", "roberta-base")) if a == "ROBERTA" else a for a in args]
    out = run(*args)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("dtok: error:") and message in lines[0]


def test_long_commands_are_quiet_when_piped(tmp_path):
    """verify, bench and guards show progress on a terminal only: piped, stderr stays empty."""
    f = tmp_path / "a.txt"
    f.write_text(read_text("prose", "gutenberg-2701_moby-dick.txt")[:200_000], encoding="utf-8",
                 newline="")
    for args in (("verify", str(f)), ("bench", "--chars", "100000", "--repeats", "1",
                                       "--appends", "3")):
        out = run(*args)
        assert out.returncode == 0 and out.stdout and out.stderr == "", (args, out.stderr)


def test_progress_on_a_terminal_is_one_line_rewritten():
    class Tty:
        def __init__(self):
            self.text = ""

        def isatty(self):
            return True

        def write(self, s):
            self.text += s

        def flush(self):
            pass

    tty = Tty()
    p = cli.Progress(1000, "verify", stream=tty)
    p.update(500)
    p.note("probing")
    p.update(500)
    p.close()
    assert tty.text.count("\r") >= 2 and tty.text.endswith("\n") and tty.text.count("\n") == 1
    assert "verify [" in tty.text and "100.0%" in tty.text and "verify: probing" in tty.text
