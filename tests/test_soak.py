"""A few minutes of tools/reliability/soak.py: mixed load on a pool and a tokenizer in one front
end while workers, the zygote and the front end itself are killed and /dev/shm fills up; every
checked answer exact, every request answered once, nothing left in /dev/shm (slow: the full run is
``python tools/reliability/soak.py --minutes 30``)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow
SOAK = str(ROOT / "tools" / "reliability" / "soak.py")


def run_soak(tmp_path, *args: str) -> tuple[str, dict]:
    out = tmp_path / "soak"
    proc = subprocess.run([sys.executable, SOAK, "--out", str(out), *args], capture_output=True,
                          text=True, timeout=1200, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip().splitlines()[-1], json.loads((out / "report.json").read_text())


def test_soak_under_faults(tmp_path):
    last, report = run_soak(tmp_path, "--minutes", "3", "--fault-every", "4", "--seed", "5")
    assert last == "soak: 0 differences, 0 unanswered, 0 leaked", json.dumps(report, indent=1)
    assert report["answered_twice"] == 0 and report["internal_errors"] == 0
    assert report["chunked_answers"] > 0 and sum(report["checked_by_reference"].values()) > 100
    kinds = {"worker_kill", "worker_stop", "zygote_kill", "front_end_kill", "front_end_kill_all"}
    if report["private_shm"]:
        kinds.add("shm_fill")
    assert kinds <= set(report["faults"]), report["faults"]


def test_control_a_wrong_answer_is_counted(tmp_path):
    """The soak sees a wrong ID: its front end flips one in every 7th answer's digest (a private
    test hook)."""
    last, report = run_soak(tmp_path, "--minutes", "0.6", "--fault-every", "1000",
                            "--check", "1", "--_corrupt-every", "7")
    assert report["reference_differences"] > 0
    assert last.startswith(f"soak: {report['differences']} differences") and report["differences"]
