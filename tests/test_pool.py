"""The shared-memory worker pool: exact on every path, failure-safe, leaves nothing behind."""
from __future__ import annotations

import asyncio
import heapq
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest

from battery import battery_texts
from conftest import (MAIN_FILES, ROOT, default_run_on, load_tokenizer, next_turn, read_text,
                      ref_ids, ref_ids_many, shared_path)
from dtok.chat import detect_style, render_turns

from dtok.pool import Pool, PoolError, shm
from dtok_ext.heap import TaskHeap


def pool_names(prefix: str | None = None) -> set[str]:
    """Names in /dev/shm of one pool, or (no prefix) of this process's pools (other processes on
    the machine may be running pools of their own)."""
    prefix = prefix or f"dtok-{os.getpid()}-"
    return {n for n in os.listdir("/dev/shm") if n.startswith((prefix, "sem." + prefix))}


@pytest.fixture(scope="module")
def pools():
    """One small pool per main file, shared by the tests of this module."""
    made = {}

    def get(name):
        if name not in made:
            made[name] = Pool(load_tokenizer(name), workers=2, name=f"test-{name}",
                              chunk_threshold=4096, chunk_target=2048)
        return made[name]

    yield get
    for p in made.values():
        p.close()


@pytest.mark.parametrize("name", default_run_on(MAIN_FILES))
def test_stateless_and_chunked_exact(pools, name):
    pool = pools(name)
    tok = pool.tokenizer
    texts = ["", "Hello, world!", "\r\n\t  x", read_text("code", "go__fzf__src_pattern.go.txt"),
             "".join(battery_texts(tok, n_random=60, n_windows=20, seed=5))]
    for special in (True, False):
        got = [pool.submit(t, add_special_tokens=special) for t in texts]
        for text, fut, want in zip(texts, got, ref_ids_many(tok, texts, special)):
            assert list(fut.result()) == want, text[:50]
    assert pool.stats()["chunked"] >= 2


@pytest.mark.parametrize("name", default_run_on(MAIN_FILES))
def test_session_replay_through_pool(pools, name):
    pool = pools(name)
    tok = pool.tokenizer
    msgs = json.loads(shared_path("corpus", "transcripts",
                                  "sweagent-demo-default-install-from-source__marshmallow-1867.json")
                      .read_bytes())[:24]
    turns = render_turns(msgs, detect_style(tok.admission.added_tokens))
    want = {s: ref_ids_many(tok, turns, s) for s in (True, False)}
    held = []
    for i, text in enumerate(turns):
        special = i % 4 != 3
        view = pool.encode(text, session=f"replay-{name}", add_special_tokens=special)
        assert list(view) == want[special][i], f"turn {i}"
        if i % 5 == 0:
            held.append((view, list(view)))  # views kept alive: the next splice must not touch them
    for view, snapshot in held:
        assert list(view) == snapshot
    s = pool.stats()
    assert s["session_repairs"] >= len(turns) - 2 and s["failovers"] == 0


def test_workers_are_renewed_after_their_characters_and_stay_exact():
    """A worker that has encoded ``worker_renew_chars`` characters is replaced, when idle, by a
    fresh fork of the zygote (its fast encoder's memo ends with it): sessions carry across the
    renewals and every answer is the reference's. Control: with 0 no worker is renewed."""
    tok = load_tokenizer("qwen3")
    src = read_text("prose", "gutenberg-2701_moby-dick.txt")
    rng = random.Random(3)
    texts = [src[i * 20_000:(i + 1) * 20_000] for i in range(12)]
    for renew, expect in ((30_000, True), (0, False)):
        with Pool(tok, workers=2, chunk_threshold=1 << 20, worker_renew_chars=renew) as pool:
            session = src[:5_000]
            for i, text in enumerate(texts):
                assert list(pool.encode(text)) == ref_ids(tok, text), (renew, i)
                session = next_turn(rng, src, session)
                assert list(pool.encode(session, session="s")) == ref_ids(tok, session), (renew, i)
                time.sleep(0.05)  # a renewal waits for its worker to be idle
            stats = pool.stats()
            assert stats["worker_deaths"] == 0 and stats["failovers"] == 0, stats
            assert (stats["worker_renewals"] >= 4) == expect, (renew, stats["worker_renewals"])
            assert stats["session_repairs"] + stats["session_edits"] >= 1


def test_many_sessions_concurrently(pools):
    pool = pools("qwen3")
    tok = pool.tokenizer
    src = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")
    errors = []

    def client(k):
        text = src[k * 30000 : k * 30000 + 3000]
        for step in range(12):
            text += src[k * 30000 + 3000 + step * 300 : k * 30000 + 3300 + step * 300]
            if list(pool.encode(text, session=("c", k))) != ref_ids(tok, text):
                errors.append((k, step))

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert not errors


def test_async_api(pools):
    pool = pools("llama3")

    async def main():
        texts = ["one two", "three " * 2000, "four"]
        views = await asyncio.gather(*(pool.encode_async(t, session=None) for t in texts))
        return texts, views

    texts, views = asyncio.run(main())
    assert [list(v) for v in views] == [ref_ids(pool.tokenizer, t) for t in texts]


def test_bad_input_same_as_reference(pools):
    pool = pools("gpt-oss")
    for bad in (123, None, b"x"):
        with pytest.raises(TypeError):
            pool.encode(bad)
    for text in ("a\ud800b", "x" * 5000 + "\udfff"):
        with pytest.raises(TypeError):
            pool.encode(text)
        with pytest.raises(TypeError):
            pool.encode(text, session="bad")
    assert list(pool.encode("fine", session="bad")) == ref_ids(pool.tokenizer, "fine")


def wait_until(cond, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return False


def test_worker_kill_mid_request_fails_over_and_is_replaced():
    tok = load_tokenizer("llama3")
    with Pool(tok, workers=2, name="kill", chunk_threshold=10**9) as pool:
        text = read_text("multilingual", "udhr_all-languages_concatenated.txt")[:3_000_000]
        session_text = read_text("prose", "gutenberg-2701_moby-dick.txt")[:40000]
        assert list(pool.encode(session_text, session="k")) == ref_ids(tok, session_text)
        fut = pool.submit(text)  # one long task: a worker is busy with it for a while
        busy = []
        assert wait_until(lambda: busy.extend(w for w in pool.stats()["workers"] if w["busy"])
                          or busy, 10), "no worker picked the task up"
        os.kill(busy[0]["pid"], signal.SIGKILL)
        assert list(fut.result(timeout=60)) == ref_ids(tok, text)
        s = pool.stats()
        assert s["worker_deaths"] == 1 and s["failovers"] == 1 and s["replacements"] == 1
        # never drained: a new worker takes the dead one's place within seconds
        assert wait_until(lambda: sum(w["alive"] for w in pool.stats()["workers"]) == 2, 20)
        new_pids = {w["pid"] for w in pool.stats()["workers"]}
        assert busy[0]["pid"] not in new_pids
        # the session keeps continuing exactly (workers hold no session state)
        for i in range(5):
            session_text += f" and then turn {i}."
            assert list(pool.encode(session_text, session="k")) == ref_ids(tok, session_text)
        assert pool.stats()["in_process"] == 0


def test_request_timeout_kills_replaces_and_fails_over():
    tok = load_tokenizer("qwen3")
    with Pool(tok, workers=1, name="timeout", request_timeout=0.001,
              chunk_threshold=10**9) as pool:
        text = read_text("prose", "gutenberg-2701_moby-dick.txt")
        assert list(pool.encode(text)) == ref_ids(tok, text)
        s = pool.stats()
        assert s["timeouts"] == 1 and s["failovers"] == 1
        assert wait_until(lambda: pool.stats()["workers"][0]["alive"], 20)
        pool.request_timeout = 60.0
        assert list(pool.encode("after")) == ref_ids(tok, "after")
        assert pool.stats()["in_process"] == 0 and pool.stats()["replacements"] == 1


def test_start_timeout_cleans_up():
    before = pool_names()
    with pytest.raises(PoolError, match="start_timeout|did not start"):
        Pool(load_tokenizer("llama3"), workers=2, name="slow", start_timeout=0.01)
    time.sleep(0.2)
    assert pool_names() <= before


def test_names_and_cleanup_after_close():
    before = pool_names()
    pool = Pool(load_tokenizer("qwen3"), workers=2, name="names")
    try:
        assert pool_names(pool.prefix), "segments and semaphores live under /dev/shm"
        assert all(n.split("sem.")[-1].startswith(pool.prefix) for n in pool_names(pool.prefix))
        for w in pool.stats()["workers"]:
            cmd = open(f"/proc/{w['pid']}/cmdline", "rb").read().decode(errors="replace")
            assert f"dtok-pool[names] worker {w['index']}" in cmd
        view = pool.encode("x " * 3000, session="v")
    finally:
        pool.close()
    assert pool_names(pool.prefix) == set() and pool_names() <= before
    assert list(view)[:3] == ref_ids(pool.tokenizer, "x " * 3000)[:3]  # still valid after close


def test_front_end_crash_leaves_nothing():
    script = (
        "import os, signal, sys, dtok\n"
        "pool = dtok.Pool(sys.argv[1], workers=2, name='crash')\n"
        "pool.encode('hello ' * 1000, session='s')\n"
        "print(pool.prefix, pool.zygote_pid, *[w['pid'] for w in pool.stats()['workers']],"
        " flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(shared_path("tokenizers", "llama3"))],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    prefix, *pids = proc.stdout.split()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (pool_names(prefix) or any(_alive(int(p)) for p in pids)):
        time.sleep(0.05)
    assert pool_names(prefix) == set()
    assert not any(_alive(int(p)) for p in pids)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_stale_segments_are_swept_at_start():
    """A crashed pool's names (its owner lock free) are swept; a prefix without a lock file (an
    older dtok) only when its PID is gone and its files are old."""
    dead_pid = int(open("/proc/sys/kernel/pid_max").read()) + 1  # never a live process
    crashed, legacy_new, legacy_old = (f"dtok-{dead_pid}-{tag}" for tag in ("dead0001", "dead0002",
                                                                             "dead0003"))
    tok = load_tokenizer("llama3")
    for prefix in (crashed, legacy_new, legacy_old):
        shm.unlink_prefix(prefix)  # what an interrupted run of this test may have left
        shm.Segment(f"{prefix}-w0-ctl", 4096, create=True).close()
    try:
        os.close(shm.hold_owner_lock(crashed, create=True))  # the lock file, its holder gone
        hour_ago = time.time() - 2 * shm.LEGACY_AGE_S
        os.utime(f"/dev/shm/{legacy_old}-w0-ctl", (hour_ago, hour_ago))
        with Pool(tok, workers=1, name="sweep"):
            names = set(os.listdir("/dev/shm"))
            assert not any(n.startswith((crashed, legacy_old)) for n in names)
            assert f"{legacy_new}-w0-ctl" in names
    finally:
        for prefix in (crashed, legacy_new, legacy_old):
            shm.unlink_prefix(prefix)


def test_sweep_never_unlinks_a_live_pool_in_another_pid_namespace():
    """A pool whose front end's PID means nothing here (another PID namespace sharing /dev/shm)
    is alive as long as one of its processes holds the owner lock."""
    dead_pid = int(open("/proc/sys/kernel/pid_max").read()) + 1
    prefix = f"dtok-{dead_pid}-feed0001"
    shm.Segment(f"{prefix}-s1-g1", 4096, create=True).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from dtok.pool import shm; "
         f"fd = shm.hold_owner_lock({prefix!r}, create=True); print('ok', flush=True); "
         "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == b"ok"
        shm.sweep_stale()
        assert f"{prefix}-s1-g1" in pool_names(prefix), "a live pool's segment was swept"
    finally:
        holder.stdin.close()
        holder.wait(10)
    shm.sweep_stale()  # its last process is gone now
    assert not pool_names(prefix)


def test_not_admitted_goes_in_process():
    tok = load_tokenizer("roberta-base")
    with Pool(tok, workers=2, name="na") as pool:
        assert pool.stats()["workers"] == []
        assert list(pool.encode("hello <mask>")) == ref_ids(tok, "hello <mask>")


@pytest.mark.parametrize("order", ["sjf", "fifo"])
def test_scheduling_order(order):
    """One worker, busy; queued: a long task then short ones. SJF runs the short ones first."""
    tok = load_tokenizer("llama3")
    with Pool(tok, workers=1, name=f"order-{order}", order=order,
              chunk_threshold=10**9) as pool:
        blocker = read_text("prose", "gutenberg-2701_moby-dick.txt")
        done = []
        futs = [pool.submit(blocker)]  # dispatched at once: the only worker is now busy
        jobs = [("long", blocker[:600_000] + "!"), ("short1", "a b c"), ("short2", "d e f")]
        for label, text in jobs:
            fut = pool.submit(text)
            fut.add_done_callback(lambda f, label=label: done.append(label))
            futs.append(fut)
        for f in futs:
            f.result(timeout=120)
        expected = ["short1", "short2", "long"] if order == "sjf" else ["long", "short1", "short2"]
        assert done == expected


def test_estimates_start_from_the_encoder_and_rekey_when_they_move():
    from dtok.pool.scheduler import Estimator

    fast, ref = Estimator("sjf", 1.0, "fastokens"), Estimator("sjf", 1.0, "reference")
    assert ref.estimate_ms("chunk", 65536) > 20 * fast.estimate_ms("chunk", 65536)
    # chunks measured 50x slower than guessed: the queued keys are stale after a few tasks
    moves = [fast.observe("chunk", 65536, 100.0) for _ in range(40)]
    assert any(moves) and fast.estimate_ms("chunk", 65536) > 50
    assert not any(Estimator("fifo", 1.0).observe("chunk", 65536, 100.0) for _ in range(40))


def test_append_overtakes_a_queued_burst():
    """Shortest first: a session append that arrives while a burst of chunks is queued runs
    before the burst's remaining chunks (reference encoder: the burst takes seconds)."""
    tok = load_tokenizer("llama3", encoder="reference")
    text = read_text("prose", "gutenberg-2701_moby-dick.txt")
    with Pool(tok, workers=2, name="overtake", order="sjf", aging=0.1, chunk_threshold=65536,
              chunk_target=32768, chunks_per_worker=8) as pool:
        context = text[:20_000]
        pool.encode(context, session="s")
        docs = [pool.submit(text[i * 300_000:(i + 1) * 300_000 + 200_000]) for i in range(3)]
        time.sleep(0.1)
        ids = pool.encode(context + " and one more turn", session="s")
        pending = sum(not d.done() for d in docs)
        for d in docs:
            d.result(timeout=120)
        assert list(ids) == ref_ids(tok, context + " and one more turn")
        assert pending >= 2, "the append waited behind the burst"


def test_task_heap_matches_heapq():
    rng = random.Random(0)
    h, ref = TaskHeap(), []
    for step in range(5000):
        if ref and rng.random() < 0.45:
            assert h.peek_key() == ref[0][0]
            assert h.pop() == heapq.heappop(ref)[2]
        else:
            key = rng.choice([rng.random(), 0.5])
            heapq.heappush(ref, (key, step, f"t{step}"))
            h.push(key, step, f"t{step}")
        assert len(h) == len(ref)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_copy_on_write_reuses_the_spare_and_never_changes_a_held_view(pools, seed):
    """A caller holding the previous turn's view (as ``ids = pool.encode(...)`` in a loop does)
    gets its next turn written into the session's spare segment, not a new one; appends,
    truncations and edits mixed with turns written in place (no view held) keep the spare's
    valid prefix right, every result equals the reference and no held view ever changes."""
    pool = pools("qwen3")
    tok = pool.tokenizer
    rng = random.Random(seed)
    src = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")
    text = src[:20000]
    key = f"spare-{seed}"
    made = pool.stats()["session_segments_made"]
    held, snapshots, held_turns = None, [], 0
    for turn in range(40):
        held_turns += held is not None
        text = next_turn(rng, src, text)
        view = pool.encode(text, session=key)
        assert list(view) == ref_ids(tok, text), f"turn {turn}"
        if rng.random() < 0.7:
            held = view  # the previous view stays alive while the next turn is encoded
            if turn % 8 == 0:
                snapshots.append((view, list(view)))
        else:
            held = None
        del view
    for view, snapshot in snapshots:
        assert list(view) == snapshot
    # without the spare, every turn with a view held made a segment; now only the first ones,
    # those with an older view (a snapshot) still alive and those that outgrew the capacity
    assert pool.stats()["session_segments_made"] - made <= held_turns // 2


def test_pool_knobs_left_unset_are_the_tokenizers():
    """``Pool(tok)`` chunks, bounds and keeps sessions by ``tok``'s knobs; a knob passed to the
    pool wins."""
    tok = load_tokenizer("qwen3").with_knobs(chunk_threshold=50_000, chunk_target=20_000,
                                              max_chunks=3, max_sessions=7, session_bytes=1 << 20)
    with Pool(tok, workers=2, name="knobs") as pool:
        assert (pool.chunk_threshold, pool.chunk_target, pool.max_chunks) == (50_000, 20_000, 3)
        assert (pool.knobs["max_sessions"], pool.knobs["session_bytes"]) == (7, 1 << 20)
        text = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[:60_000]
        assert list(pool.encode(text)) == ref_ids(tok, text)
        assert pool.stats()["chunked"] == 1  # 60,000 >= 50,000 (the global default: 131,072)
    with Pool(tok, workers=1, name="knobs2", chunk_threshold=70_000) as pool:
        assert (pool.chunk_threshold, pool.chunk_target) == (70_000, 20_000)


def test_pool_lists_stay_exact_between_views_and_other_flavours(pools):
    from test_sessions import _mixed_result_turns

    pool = pools("qwen3")
    text = read_text("prose", "gutenberg-2701_moby-dick.txt")[:20_000]
    turns = _mixed_result_turns(text, random.Random(4))
    got = [pool.encode_list(t, session="mixed", add_special_tokens=sp) if as_list
           else list(pool.encode(t, session="mixed", add_special_tokens=sp))
           for t, sp, as_list in turns]
    assert got == [ref_ids(pool.tokenizer, t, sp) for t, sp, _ in turns]


def test_pool_scopes_never_share_sessions_or_content(pools):
    """As in-process (test_sessions): the same session id in two scopes (tenants) reuses
    nothing, in one scope it does; unkeyed texts continue only texts of their own scope."""
    pool = pools("qwen3")
    tok = pool.tokenizer
    base = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[:30_000]
    turns = [base + "".join(f" turn {j}." for j in range(i + 1)) for i in range(3)]
    before = pool.stats()
    delta = lambda k: pool.stats()[k] - before[k]  # noqa: E731
    for scope in [("a:b", None), ("a", "b:")]:
        assert list(pool.encode(turns[0], session="tenancy", scope=scope)) == ref_ids(tok, turns[0])
    assert (delta("session_full_encodes"), delta("session_repairs"), delta("session_edits"),
            delta("session_hits")) == (2, 0, 0, 0)
    assert pool.stats()["session_inits"] == pool.stats()["session_full_encodes"]  # the old name
    assert pool.encode_list(turns[1], session="tenancy", scope=("a:b", None)) == \
        ref_ids(tok, turns[1])
    assert delta("session_repairs") == 1
    # content lookup: tenant B's unkeyed text finds nothing of tenant A's
    other = read_text("prose", "gutenberg-2701_moby-dick.txt")[:20_000]
    assert list(pool.encode(other, scope=("A", None))) == ref_ids(tok, other)
    assert list(pool.encode(other + " more", scope=("B", None))) == ref_ids(tok, other + " more")
    assert (delta("lookups"), delta("lookup_hits")) == (2, 0)
    # within tenant A, a salted request without a session id continues its conversation
    assert list(pool.encode(other + " more", scope=("A", None))) == ref_ids(tok, other + " more")
    assert delta("lookup_hits") == 1 and delta("session_repairs") == 2
