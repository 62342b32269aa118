"""dtok's encoding threads (``dtok.encode_threads``): work handed out beside the calling thread
runs off the caller's CPU, and each thread takes back the caller's CPUs when its job ends."""
from __future__ import annotations

import doctest
import os
import threading

import pytest

from dtok import encode_threads
from dtok.tokenizer import parts_of
from dtok.encode_threads import EncodeThreads
from dtok_ext import cpus

two_cpus = pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2
    or cpus.current_cpu() < 0, reason="placing needs Linux and two CPUs")


def test_module_examples():
    assert doctest.testmod(encode_threads).failed == 0
    assert doctest.testmod(cpus).failed == 0


def where() -> tuple[int, set[int], int]:
    """This thread's CPU, the CPUs it may use, its native ID."""
    return cpus.current_cpu(), os.sched_getaffinity(0), threading.get_native_id()


def hand_out(threads: EncodeThreads, monkeypatch, jobs: int = 1) -> tuple[int, list]:
    """``where`` of ``jobs`` jobs handed out beside this thread, and the CPU this thread was on
    as they were handed out (as the placement read it)."""
    seen: list[int] = []

    def read_cpu() -> int:
        seen.append(cpus.current_cpu())
        return seen[-1]

    monkeypatch.setattr(encode_threads, "current_cpu", read_cpu)
    out = [f.result() for f in threads.beside([where] * jobs)]
    monkeypatch.undo()
    return (seen[0] if seen else -1), out


@two_cpus
def test_work_beside_the_caller_runs_off_its_cpu(monkeypatch):
    allowed = os.sched_getaffinity(0)
    threads = EncodeThreads(2)
    try:
        for _ in range(10):  # a thread started by the call, then threads woken by it
            caller, out = hand_out(threads, monkeypatch)
            (cpu, during, tid), = out
            assert during == allowed - {caller} and cpu != caller, (caller, cpu, during)
            assert os.sched_getaffinity(tid) == allowed  # given back when the job ended
        # the control: with placing off, the job may run on every CPU the caller may use
        threads._placement.placing = False
        caller, ((_, during, _),) = hand_out(threads, monkeypatch)
        assert during == allowed
    finally:
        threads.shutdown()


@two_cpus
def test_a_thread_narrowed_for_no_job_takes_the_cpus_back_for_the_next(monkeypatch):
    """Handing out one job narrows every pool thread (any may be the one woken): the one left
    without a job takes the caller's CPUs back when it next works for a waiting caller."""
    allowed = os.sched_getaffinity(0)
    threads = EncodeThreads(2)
    both = threading.Barrier(2)
    try:
        tids = {f.result()[2] for f in threads.beside([lambda: (both.wait(), where())[1]] * 2)}
        assert len(tids) == 2
        caller, _ = hand_out(threads, monkeypatch)
        assert any(os.sched_getaffinity(t) == allowed - {caller} for t in tids)
        mapped = list(threads.map(lambda _: (both.wait(), where())[1], range(2)))
        assert {m[2] for m in mapped} == tids and all(m[1] == allowed for m in mapped)
    finally:
        threads.shutdown()


def test_collected_threads_stop():
    threads = EncodeThreads(1)
    (tid,) = {f.result()[2] for f in threads.beside([where])}
    names = {t.native_id: t for t in threading.enumerate()}
    worker = names[tid]
    del threads
    import gc
    gc.collect()
    worker.join(10)
    assert not worker.is_alive()


# fastokens' own BPE threads (dtok.encoders.hold_fastokens_threads): each case in a fresh
# process, since fastokens reads FASTOKENS_BPE_THREADS once per process
CHILD = """
import json, os, sys
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
import dtok
from dtok import encoders
encoders.FASTOKENS_OWN_THREADS_MAX_CPUS = int(sys.argv[1])
tok = dtok.Tokenizer.default(threads=1)
text = "The quick brown fox jumps over the lazy dog. " * 30000  # one long fastokens call
assert list(tok.encode(text, add_special_tokens=False)) == \\
    tok.reference.encode(text, add_special_tokens=False).ids
print(json.dumps({"env": os.environ.get("FASTOKENS_BPE_THREADS"),
                  "tasks": len(os.listdir("/proc/self/task")),
                  "note": any("one BPE thread" in n for n in tok.stats()["notes"])}))
"""


def fastokens_threads_child(max_cpus: int, env_value: str | None) -> dict:
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "FASTOKENS_BPE_THREADS"}
    if env_value is not None:
        env["FASTOKENS_BPE_THREADS"] = env_value
    out = subprocess.run([sys.executable, "-c", CHILD, str(max_cpus)], env=env, check=True,
                         capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout.splitlines()[-1])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux")
def test_fastokens_is_held_to_one_thread_on_few_cpus_unless_the_operator_chose():
    """On two CPUs (the process is narrowed to two at most) with the variable unset, dtok sets
    FASTOKENS_BPE_THREADS=1 before fastokens' first call, and fastokens starts no thread of its
    own for a long call. Control: with the bound below the CPUs, the variable stays unset and,
    where the process has two CPUs, fastokens starts its own. The operator's setting is kept."""
    held = fastokens_threads_child(2, None)
    assert held == {"env": "1", "tasks": 1, "note": True}
    control = fastokens_threads_child(0, None)
    assert control["env"] is None and not control["note"]
    if len(os.sched_getaffinity(0)) >= 2:
        assert control["tasks"] > 1  # fastokens' own BPE threads, what the hold prevents
    chosen = fastokens_threads_child(2, "2")
    assert chosen["env"] == "2" and not chosen["note"]


def test_threads_are_renewed_after_their_characters():
    """With ``renew_chars``, the threads that took that many characters end (a native encoder's
    per-thread memo with them) and fresh ones take the next work; without it, the same threads
    live on (the control)."""
    def tids(threads: EncodeThreads, chars: int) -> set[int]:
        return {f.result()[2] for f in threads.beside([where] * 2, chars=chars)}

    threads = EncodeThreads(2, renew_chars=1000)
    never = EncodeThreads(2)
    try:
        before = tids(threads, 600) | tids(threads, 300)  # 900 characters: the same threads
        assert threads.renewals == 0 and len(before) <= 2
        old = [t for t in threading.enumerate() if t.native_id in before]
        renewed = tids(threads, 600)  # 1,500 in all: fresh threads
        assert threads.renewals == 1 and not renewed & before
        for t in old:
            t.join(10)
            assert not t.is_alive()
        kept = set().union(*(tids(never, 10**9) for _ in range(5)))
        assert never.renewals == 0 and len(kept) <= 2
    finally:
        threads.shutdown()
        never.shutdown()


def test_default_threads_leave_a_many_core_host_to_the_engine(monkeypatch):
    """``threads=None`` takes the usable CPUs up to ``DEFAULT_THREADS_MAX`` (each encoding
    thread holds fastokens' per-thread state); an explicit number is taken as given."""
    import dtok
    from dtok import chunk_encoder
    from dtok.knobs import DEFAULT_THREADS_MAX

    tok = dtok.Tokenizer.default(guard_probes="off")
    for cpus, want in ((1, 1), (2, 2), (64, DEFAULT_THREADS_MAX)):
        monkeypatch.setattr(chunk_encoder, "available_cpus", lambda: cpus)
        assert parts_of(tok.with_knobs()).chunk_encoder.threads == want
    assert parts_of(tok.with_knobs(threads=16)).chunk_encoder.threads == 16
