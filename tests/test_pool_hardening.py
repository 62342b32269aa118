"""The pool under failure: starts that never hang, workers replaced, no SIGBUS on a small
/dev/shm, never an encode on the caller's event loop, edits through the pool."""
from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import dtok
from dtok.tokenizer import parts_of
from conftest import ROOT, load_tokenizer, read_text, ref_ids, ref_ids_many, shared_path
from dtok import testing
from dtok.admission import TokenizerFiles
from dtok.chat import reasoning_chat, render_reasoning
from dtok.cli import demo_text
from dtok.pool import Pool
from dtok.pool.zygote_client import EventReader
from dtok.sessions import LOOP_CHARS, alignment_budget
from test_pool import pool_names, wait_until


def test_event_reader_sees_two_lines_that_arrive_together():
    """The hung start: the zygote's "started" events for two workers arrived in one read; a
    buffered readline() took both and select() then waited on an empty pipe until
    start_timeout. EventReader keeps its own buffer."""
    r, w = os.pipe()
    try:
        os.write(w, b'{"event": "started", "index": 0}\n{"event": "started", "index": 1}\n')
        reader = EventReader(r)
        deadline = time.monotonic() + 0.5
        assert reader.read(deadline)["index"] == 0
        assert reader.read(deadline)["index"] == 1
        with pytest.raises(TimeoutError):
            reader.read(time.monotonic() + 0.05)
        os.close(w)
        w = -1
        assert reader.read(time.monotonic() + 1) is None  # end of file
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_zygote_forks_with_no_other_thread():
    with Pool(load_tokenizer("qwen3"), workers=1, name="threads") as pool:
        assert len(os.listdir(f"/proc/{pool.zygote_pid}/task")) == 1


def test_a_worker_that_never_comes_up_is_replaced_within_seconds():
    t0 = time.monotonic()
    with testing.hooked(testing.ZYGOTE_CONFIG, lambda c: c.update(_hang_starts={"1": 1})), \
            Pool(load_tokenizer("llama3"), workers=2, name="hang", worker_start_timeout=2.0,
                 start_timeout=60) as pool:
        started = time.monotonic() - t0
        s = pool.stats()
        assert all(w["alive"] for w in s["workers"]) and s["replacements"] == 1, s
        assert [w["starts"] for w in s["workers"]] == [1, 2]
        text = "after a hung start " * 100
        assert list(pool.encode(text, session="x")) == ref_ids(pool.tokenizer, text)
    assert started < 30, f"start took {started:.1f} s"


@pytest.mark.slow
def test_start_many_times_under_load():
    """Consecutive starts with the CPUs busy: none hangs (the full campaign of 200 starts is
    tools/reliability/pool_start_campaign.py)."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        for i in range(4):
            t0 = time.monotonic()
            with Pool(load_tokenizer("qwen3"), workers=2, name=f"load{i}", start_timeout=60) as p:
                assert list(p.encode("x y")) == ref_ids(p.tokenizer, "x y")
            assert time.monotonic() - t0 < 45
    finally:
        for b in burners:
            b.kill()
            b.wait()


def test_front_end_killed_while_the_zygote_loads_leaves_nothing():
    script = textwrap.dedent(f"""
        import os, signal, threading
        import dtok
        from dtok.pool import zygote_client
        start = zygote_client.ZygoteClient.__init__
        def started(self, res, *a, **k):
            start(self, res, *a, **k)  # the zygote is now loading the tokenizer
            print(res.prefix, flush=True)
            threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        zygote_client.ZygoteClient.__init__ = started
        dtok.Pool({str(shared_path("tokenizers", "gpt-oss"))!r}, workers=2, name="killed")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    prefix = proc.stdout.split()[0]
    assert proc.returncode == -signal.SIGKILL
    assert wait_until(lambda: not pool_names(prefix), 60), pool_names(prefix)


def test_encode_async_plans_off_the_event_loop_in_order():
    """Planning a request (comparing a long text with the stored one, cutting a document) takes
    milliseconds: the async calls do it on the pool's submit thread, in the order of the calls,
    so a session's turns sent from one loop stay in order; only an idle session's next turn,
    with no earlier call waiting there, is planned on the loop, within the loop's budget."""
    tok = load_tokenizer("qwen3")
    text = read_text("prose", "gutenberg-2701_moby-dick.txt")[:60_000]
    with Pool(tok, workers=1, name="offloop") as pool:
        planned = []
        plan = parts_of(pool.tokenizer).planner.plan

        def spy(old, anchors, new, edit_budget=None):
            planned.append((threading.get_ident(), len(new), edit_budget))
            return plan(old, anchors, new, edit_budget)

        parts_of(pool.tokenizer).planner.plan = spy  # a seam: which thread plans, and in which order

        async def main():
            turns = [text[: 40_000 + 1000 * i] for i in range(6)]
            futs = [pool.encode_async(t, session="s") for t in turns]
            futs.append(pool.encode_list_async(turns[-1] + " end", session="s"))
            return threading.get_ident(), turns, await asyncio.gather(*futs)

        loop_thread, turns, results = asyncio.run(main())
        for t, ids in zip(turns + [turns[-1] + " end"], results):
            assert list(ids) == ref_ids(tok, t)
        assert planned[0][0] != loop_thread  # the first turn: nothing stored
        assert all(budget == alignment_budget(LOOP_CHARS)
                   for tid, _, budget in planned if tid == loop_thread)
        assert [n for _, n, _ in planned] == [len(t) for t in turns] + [len(turns[-1]) + 4]


def test_a_sessions_next_turn_is_planned_on_the_loop():
    """Awaited one at a time and spaced out, a session's next turns are planned on the event
    loop (no hop to the submit thread and back); a call while an earlier one still waits in the
    submit thread goes there too, behind it (the control: it is planned off the loop), and so
    does a call whose loop budget is 0 (``DTOK_LOOP_CHARS=0``)."""
    tok = load_tokenizer("qwen3")
    text = read_text("prose", "gutenberg-2701_moby-dick.txt")[:120_000]
    with Pool(tok, workers=1, name="onloop") as pool:
        threads = []
        plan = parts_of(pool.tokenizer).planner.plan

        def spy(*args, **kwargs):
            threads.append(threading.get_ident())
            return plan(*args, **kwargs)

        parts_of(pool.tokenizer).planner.plan = spy

        async def main():
            out = []
            for i in range(4):
                t = text[: 100_000 + 500 * i]
                out.append((t, await pool.encode_list_async(t, session="s")))
                await asyncio.sleep(0.02)  # the next turn comes later (the model answers)
            t = text[:110_000]
            pool._submitting.append(None)  # as if an earlier call waited in the submit thread
            call = asyncio.ensure_future(pool.encode_list_async(t, session="s"))
            await asyncio.sleep(0)  # the call has chosen its route
            pool._submitting.popleft()
            out.append((t, await call))
            t = text[:110_500]
            out.append((t, await pool.encode_list_async(t, session="s", loop_chars=0)))
            return threading.get_ident(), out

        loop_thread, out = asyncio.run(main())
        for t, ids in out:
            assert ids == ref_ids(tok, t)
        on_loop = [tid == loop_thread for tid in threads]
        assert on_loop[0] is False and on_loop[1:4] == [True, True, True], on_loop
        assert on_loop[-2:] == [False, False], on_loop


def test_a_sessions_short_turns_are_answered_on_the_loop():
    """A keyed session's next turn whose encoding fits the loop's budget is written on the
    event loop by this process's encoders, as a worker would write it (no round trip); a longer
    one goes to a worker. The two interleave on one session, with edits and with earlier
    results held (views and lists, which never change), and every turn is the reference's IDs.
    A turn the encoders refuse on the loop (a lone surrogate) ends as the reference ends.
    Control: with ``loop_chars=0`` no turn is answered on the loop."""
    tok = load_tokenizer("qwen3")
    src = read_text("prose", "gutenberg-2701_moby-dick.txt")
    with pytest.raises(Exception) as refused:
        tok.reference.encode(src[:1000] + "\ud800")
    with Pool(tok, workers=1, name="loopturns") as pool:
        async def main(loop_chars, turns):
            rng = random.Random(loop_chars)
            call = dict(session=f"s{loop_chars}", loop_chars=loop_chars)
            text = src[:30_000]
            out, held = [], []
            out.append((text, await pool.encode_list_async(text, **call)))
            for i in range(turns):
                if i % 6 == 5:  # more than the loop's budget to encode: a worker's turn
                    text += src[100_000 + 34_000 * i : 134_000 + 34_000 * i]
                elif i % 6 == 2:  # an earlier turn rewritten (a reasoning template's)
                    p = rng.randrange(len(text) - 3000, len(text) - 100)
                    text = text[:p] + " <|im_end|>\n<think>\n" + text[p + 40 :]
                else:
                    text += f"\n\nturn {i}: " + src[997 * i : 997 * i + rng.randrange(50, 1300)]
                if i % 4 == 1:  # a view held while the next turns are encoded
                    held.append((text, await pool.encode_async(text, **call)))
                else:
                    ids = await pool.encode_list_async(text, **call)
                    out.append((text, ids))
                    if i % 3 == 0:
                        held.append((text, ids))  # a list held: updated only where unheld
                await asyncio.sleep(0.01)  # the next turn comes later
            with pytest.raises(type(refused.value)):
                await pool.encode_list_async(text + "\ud800", **call)
            text += " after the refusal"
            out.append((text, await pool.encode_list_async(text, **call)))
            return out, held

        def loop_turns():
            return pool.stats()["loop_turns"]

        def worker_turns():
            s = pool.stats()
            return s["session_repairs"] + s["session_edits"] - s["loop_turns"]

        on_loop, by_worker = loop_turns(), worker_turns()
        out, held = asyncio.run(main(LOOP_CHARS, 24))
        answers = out + held
        for (t, ids), want in zip(answers, ref_ids_many(tok, [t for t, _ in answers])):
            assert list(ids) == want, len(t)
        assert loop_turns() - on_loop >= 12, pool.stats()
        assert worker_turns() - by_worker >= 3, pool.stats()
        on_loop = loop_turns()
        control, _ = asyncio.run(main(0, 6))
        assert loop_turns() == on_loop  # the control: none on the loop
        for (t, ids), want in zip(control, ref_ids_many(tok, [t for t, _ in control])):
            assert list(ids) == want, len(t)


def test_unkeyed_short_turns_are_answered_on_the_loop():
    """Without a key, an awaited transcript's next turn continues the pool session content
    lookup finds and is answered on the loop as a keyed one is; another conversation sharing
    only a short prefix is not (it starts a session of its own on a worker); exact every turn."""
    tok = load_tokenizer("qwen3")
    src = read_text("prose", "gutenberg-2701_moby-dick.txt")
    with Pool(tok, workers=1, name="unkeyedloop") as pool:
        async def main():
            text = src[:40_000]
            out = [(text, await pool.encode_list_async(text))]
            for i in range(8):
                # the next turn comes later (the model answers): the dispatcher that answered
                # the last worker's turn has let the pool's lock go (a loop never waits for it)
                await asyncio.sleep(0.02)
                text += f" turn {i} " + src[60_000 + i * 700 : 60_500 + i * 700]
                out.append((text, await pool.encode_list_async(text)))
            counts = pool.stats()
            fork = src[:5_000] + src[300_000:340_000]
            out.append((fork, await pool.encode_list_async(fork)))
            return out, counts

        out, counts = asyncio.run(main())
        s = pool.stats()
    for (t, ids), want in zip(out, ref_ids_many(tok, [t for t, _ in out])):
        assert ids == want, len(t)
    # (a turn that found the lock held went to a worker: exact too)
    assert counts["lookup_hits"] == 8 and counts["loop_turns"] >= 6, counts
    assert s["loop_turns"] == counts["loop_turns"] and s["session_full_encodes"] == 2, s


def test_encode_async_raises_what_the_call_raises_and_survives_cancellation():
    """The loop's future is settled from the submit thread: an error the request ends with
    (the reference's, for a non-str) or the submit raises (a closed pool) reaches the caller
    as its own exception; a caller that gave up is left alone when the answer comes."""
    tok = load_tokenizer("qwen3")
    with pytest.raises(Exception) as want:
        tok.reference.encode(12345)
    text = read_text("prose", "gutenberg-2701_moby-dick.txt")[:200_000]
    with Pool(tok, workers=1, name="asyncerr") as pool:
        async def main():
            with pytest.raises(want.type):
                await pool.encode_async(12345)
            slow = asyncio.ensure_future(pool.encode_async(text))
            await asyncio.sleep(0)
            slow.cancel()
            with pytest.raises(asyncio.CancelledError):
                await slow
            return list(await pool.encode_async(text, session="s"))

        assert asyncio.run(main()) == ref_ids(tok, text)

        async def after_close():
            with pytest.raises(Exception):
                await pool.encode_async("closed")

    asyncio.run(after_close())


def test_encode_async_never_encodes_on_the_event_loop_thread():
    tok = load_tokenizer("llama3")
    with Pool(tok, workers=1, name="noworkers") as pool:
        os.kill(pool.zygote_pid, signal.SIGKILL)  # the zygote and its workers are gone
        assert wait_until(lambda: not any(w["alive"] for w in pool.stats()["workers"]), 20)
        threads = []
        text = read_text("prose", "gutenberg-2701_moby-dick.txt")[:50_000]

        async def main():
            return threading.get_ident(), await pool.encode_async(text, session="s")

        with testing.hooked(testing.IN_PROCESS_ENCODE,
                            lambda _text: threads.append(threading.get_ident())):
            loop_thread, ids = asyncio.run(main())
        assert list(ids) == ref_ids(tok, text)
        assert threads and loop_thread not in threads
        assert pool.stats()["in_process"] >= 1


def test_requests_queued_when_the_last_worker_dies_are_answered():
    """The zygote and every worker die while requests wait in the shared queue: none can be
    replaced, so each queued request is answered in process (exactly), none waits forever."""
    tok = load_tokenizer("llama3")
    prose = read_text("prose", "gutenberg-2701_moby-dick.txt")
    texts = [prose[i * 20_000 : i * 20_000 + 300_000] for i in range(6)]
    with Pool(tok, workers=1, name="lastdeath") as pool:
        futures = [pool.submit(t) for t in texts]  # one at the worker, the rest queued
        pids = [pool.zygote_pid] + [w["pid"] for w in pool.stats()["workers"]]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        got = [list(f.result(timeout=120)) for f in futures]
    assert got == ref_ids_many(tok, texts)


def test_pool_from_a_tokenizer_built_from_bytes():
    raw = shared_path("tokenizers", "deepseek-v3", "tokenizer.json").read_bytes()
    tok = dtok.Tokenizer(TokenizerFiles(Path("<bytes>"), raw, None, None))
    with Pool(tok, workers=1, name="bytes") as pool:
        text = "<｜User｜>hello<｜Assistant｜>hi there" * 100
        assert list(pool.encode(text, session="b")) == ref_ids(tok, text)
        assert pool.stats()["encoder"] == tok.encoder.name


def test_shm_budget_answers_in_process_exactly():
    """With the pool's shared-memory budget spent, requests are answered in process (and idle
    sessions make room); IDs never change."""
    tok = load_tokenizer("qwen3")
    src = read_text("prose", "gutenberg-2701_moby-dick.txt")
    with Pool(tok, workers=1, name="budget", shm_bytes=9 << 20) as pool:
        for k in range(6):
            text = src[k * 100_000 : k * 100_000 + 300_000]
            assert list(pool.encode(text, session=k)) == ref_ids(tok, text)
            text += " more"
            assert list(pool.encode(text, session=k)) == ref_ids(tok, text)
        s = pool.stats()
        assert s["shm_bytes"] <= 9 << 20 and (s["shm_full"] > 0 or s["sessions"] < 6), s


SMALL_SHM_SCRIPT = textwrap.dedent("""
    import json, sys
    import dtok
    from dtok.pool import Pool
    tok = dtok.Tokenizer.from_file(sys.argv[1])
    text = open(sys.argv[2], encoding="utf-8", newline="").read() * 2
    bad = 0
    with Pool(tok, workers=2, name="tiny") as pool:
        for k, size in enumerate((1_000_000, 2_000_000)):
            t = text[k * 1000 : k * 1000 + size]
            for extra in ("", " one more turn"):
                ids = list(pool.encode(t + extra, session=k))
                bad += ids != tok.reference.encode(t + extra).ids
        s = pool.stats()
    print(json.dumps({"bad": bad, "shm_full": s["shm_full"], "in_process": s["in_process"],
                      "failovers": s["failovers"], "limit": s["shm_limit"]}))
""")


def test_small_dev_shm_never_kills_the_process():
    """A 16 MiB tmpfs on /dev/shm (a container's): sessions of 1-2M characters do not fit; the
    requests are answered in process, exactly, and nothing dies of SIGBUS."""
    if shutil.which("unshare") is None:
        pytest.skip("unshare is not available")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip("cannot make a mount namespace here (needs CAP_SYS_ADMIN)")
    cmd = ("mount -t tmpfs -o size=16m tmpfs /dev/shm && exec " + sys.executable
           + " -c \"$0\" \"$1\" \"$2\"")
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", cmd, SMALL_SHM_SCRIPT,
         str(shared_path("tokenizers", "qwen3")),
         str(shared_path("corpus", "prose", "gutenberg-2701_moby-dick.txt"))],
        capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bad"] == 0 and out["shm_full"] > 0, out


def test_edits_through_the_pool_keep_views():
    """Reasoning-chat edits through the pool: exact every turn, earlier views unchanged, the
    session's turns continue (no full encode after the first)."""
    tok = load_tokenizer("deepseek-v3")
    requests = reasoning_chat(demo_text(), demo_text("ripgrep-walk.rs"), turns=24, seed=4)
    prompts = [render_reasoning(r, "r1:deepseek") for r in requests]
    wants = ref_ids_many(tok, prompts)
    held = []
    with Pool(tok, workers=2, name="edits") as pool:
        for i, (text, want) in enumerate(zip(prompts, wants)):
            view = pool.encode(text, session="chat")
            assert list(view) == want, f"turn {i}"
            if i % 3 == 0:
                held.append((view, want))
        s = pool.stats()
        assert s["session_full_encodes"] == 1 and s["session_edits"] >= 4, s
        assert s["failovers"] == 0 and s["plan_failures"] == 0
    for view, want in held:
        assert list(view) == want


def test_random_edits_through_the_pool():
    tok = load_tokenizer("qwen3")
    rng = random.Random(7)
    src = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")
    with Pool(tok, workers=2, name="fuzz") as pool:
        for trial in range(8):
            text = src[trial * 20_000 : trial * 20_000 + 15_000]
            for step in range(5):
                p = rng.randrange(len(text))
                text = text[:p] + rng.choice(["", "e\u0301", " <|im_end|>", "\r\n", "x"]) \
                    + text[p + rng.choice([0, 3, 300, 3000]):] + rng.choice(["", " more", "ab"])
                special = bool(step % 2)
                got = pool.encode(text, session=trial, add_special_tokens=special)
                assert list(got) == ref_ids(tok, text, special), (trial, step)
        assert pool.stats()["session_edits"] >= 20


def test_encode_list_is_updated_in_place_and_never_under_a_holder():
    tok = load_tokenizer("llama3")
    base = read_text("prose", "gutenberg-2701_moby-dick.txt")[:100_000]
    for make in (lambda: tok.with_knobs(), lambda: Pool(tok, workers=1, name="lists")):
        enc = make()
        try:
            a = enc.encode_list(base, session="l")
            assert a == ref_ids(tok, base) and type(a) is list
            held = a
            b = enc.encode_list(base + " one", session="l")  # `a` is held: a new list
            assert b is not a and a == ref_ids(tok, base) and b == ref_ids(tok, base + " one")
            kept = id(b)  # the store still holds b, so no new list can take its address
            del a, held, b
            c = enc.encode_list(base + " one two", session="l")
            assert id(c) == kept and c == ref_ids(tok, base + " one two")  # updated in place
            c.append(7)  # a holder that changed the list and let go
            del c
            d = enc.encode_list(base + " one two three", session="l")
            assert d == ref_ids(tok, base + " one two three")
            e = enc.encode_list(base[:50_000] + base[51_000:], session="l", add_special_tokens=False)
            assert e == ref_ids(tok, base[:50_000] + base[51_000:], False)
        finally:
            if isinstance(enc, Pool):
                enc.close()


def test_encode_list_in_a_loop_takes_turns_between_two_lists():
    """``ids = encode_list(...)`` in a loop holds the last list while asking for the next: the
    one before it (released) is brought up to date from where it last agreed; a snapshot holder
    keeps its list unchanged, and one that changed the list it let go is caught."""
    tok = load_tokenizer("qwen3")
    src = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")
    rng = random.Random(4)
    for make in (lambda: tok.with_knobs(), lambda: Pool(tok, workers=1, name="lists2")):
        enc = make()
        try:
            text, ids, snapshots = src[:30_000], None, []
            for turn in range(24):
                start = rng.randrange(0, len(src) - 1000)
                if turn % 5 == 4:  # an edit: an earlier stretch removed
                    a = rng.randint(len(text) // 2, len(text) - 2000)
                    text = text[:a] + text[a + 1500:] + src[start : start + 200]
                else:
                    text += src[start : start + rng.randint(1, 500)]
                ids = enc.encode_list(text, session="loop")
                assert ids == ref_ids(tok, text), f"turn {turn}"
                if turn == 7:
                    snapshots.append((ids, list(ids)))
                if turn == 13:
                    ids.append(-1)  # changed by its holder, then let go at the next turn
            for lst, copy in snapshots:
                assert lst == copy
            stats = enc.stats() if isinstance(enc, Pool) else enc.sessions.stats()
            # two lists take turns; one more for the snapshot's and one for the changed list
            assert stats["lists_made"] <= 4, stats["lists_made"]
        finally:
            if isinstance(enc, Pool):
                enc.close()


def test_session_lists_share_their_int_objects():
    """Every session's list holds the process's shared int object of each ID (8 bytes a token,
    not 40), in process and through the pool, and stays exact; the session budget counts it so."""
    from dtok_ext.buffers import SHARED_INTS

    tok = load_tokenizer("qwen3")
    src = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")
    for make in (lambda: tok.with_knobs(), lambda: Pool(tok, workers=1, name="sharedints")):
        enc = make()
        try:
            a = enc.encode_list(src[:20_000], session="a")
            b = enc.encode_list(src[10_000:30_000] + src[:100], session="b")
            a2 = enc.encode_list(src[:20_000] + " more", session="a")
            assert a == ref_ids(tok, src[:20_000]) and a2 == ref_ids(tok, src[:20_000] + " more")
            assert b == ref_ids(tok, src[10_000:30_000] + src[:100])
            common = set(a) & set(b)
            assert len(common) > 500
            first_a = {x: x for x in a}
            assert all(x is first_a[x] for x in b if x in first_a)  # the same objects
            assert all(x is first_a[x] for x in a2 if x in first_a)
            assert max(a + b) < SHARED_INTS
        finally:
            if isinstance(enc, Pool):
                enc.close()
    entry = tok.with_knobs()
    ids = entry.encode_list(src[:40_000], session="s")
    lists = entry.sessions.stats()
    assert 0 < lists["bytes"] - lists["text_bytes"] - lists["id_bytes"] - lists["anchor_bytes"] \
        <= 3 * 8 * len(ids), lists  # 8 bytes an item of truth, out and spare; no int objects


@pytest.mark.slow
def test_two_hundred_starts_without_a_hang():
    campaign = ROOT / "tools" / "reliability" / "pool_start_campaign.py"
    proc = subprocess.run([sys.executable, str(campaign), "--starts", "200"],
                          capture_output=True, text=True, cwd=ROOT, timeout=6 * 3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "200 starts, 0 hangs, 0 differences" in proc.stdout


def _cpu_seconds(pid: int, tid: int | None = None) -> float:
    path = f"/proc/{pid}/task/{tid}/stat" if tid else f"/proc/{pid}/stat"
    fields = open(path).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_an_idle_pool_uses_no_cpu():
    """Between requests nothing spins: workers sleep on their semaphores, the dispatcher wakes
    once a second, the zygote four times."""
    with Pool(load_tokenizer("qwen3"), workers=2, name="idle") as pool:
        text = read_text("prose", "gutenberg-2701_moby-dick.txt")[:100_000]
        for i in range(20):  # back to back: the workers' adaptive spin is on
            pool.encode(text + " x" * i, session="busy")
        for i in range(10):  # spaced: no spin, and no wake-up is left over
            pool.encode(text + " x" * (20 + i), session="busy")
            time.sleep(0.01)
        time.sleep(0.5)
        pids = [pool.zygote_pid] + [w["pid"] for w in pool.stats()["workers"]]
        dispatcher = next(t for t in threading.enumerate() if t.name == "dtok-pool-dispatch")
        before = [_cpu_seconds(p) for p in pids] + [_cpu_seconds(os.getpid(), dispatcher.native_id)]
        time.sleep(3.0)
        after = [_cpu_seconds(p) for p in pids] + [_cpu_seconds(os.getpid(), dispatcher.native_id)]
    used = sum(b - a for a, b in zip(before, after))
    assert used <= 0.05, f"{used:.2f} CPU seconds in 3 s of idling"


def test_unkeyed_requests_continue_by_content_lookup_in_the_pool():
    """Without a key, a growing (and edited) transcript continues the pool session whose text
    it shares at least half of as a prefix; another conversation with the same start gets a
    session of its own."""
    tok = load_tokenizer("llama3")
    src = read_text("prose", "gutenberg-2701_moby-dick.txt")
    with Pool(tok, workers=2, name="lookup") as pool:
        text = src[:50_000]
        turns = []
        for i in range(8):
            text += f" turn {i} " + src[60_000 + i * 700 : 60_500 + i * 700]
            if i == 5:  # a think block dropped near the end
                text = text[:-2000] + text[-1500:]
            turns.append(text)
        other = src[:10_000] + src[200_000:260_000]
        for t, want in zip([*turns, other], ref_ids_many(tok, [*turns, other])):
            assert list(pool.encode(t)) == want
        s = pool.stats()
        assert s["lookups"] == 9 and s["lookup_hits"] == 7, s
        assert s["session_full_encodes"] == 2 and s["session_edits"] == 1 and s["sessions"] == 2, s
