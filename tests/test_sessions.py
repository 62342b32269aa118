"""Sessions: keyed and content-lookup continuations, repaired at a safe cut, stable views."""
from __future__ import annotations

import json
import random
import threading

import pytest

import dtok
from dtok.tokenizer import parts_of
from conftest import (DEFAULT_RUN_FILES, MAIN_FILES, PER_FILE, load_tokenizer, next_turn, read_text, ref_ids,
                      ref_ids_many, shared_path)
from dtok.chat import detect_style, render_turns

TRANSCRIPTS = [
    "minisweagent-gemini3pro__django__django-15103.json",
    "minisweagent-deepseek-toolcalls__deepseek_chat_test_1-100__django__django-13660.json",
]


def transcript(name: str, messages: int = 40) -> list[dict]:
    """The first `messages` messages of a real agent transcript."""
    return json.loads(shared_path("corpus", "transcripts", name).read_bytes())[:messages]


def fresh(name: str, **knobs) -> dtok.Tokenizer:
    """A tokenizer with empty session state (the loaded reference is shared)."""
    return load_tokenizer(name).with_knobs(**knobs)


# the first transcript on every main file, the second on the default run's files (all: -m slow)
@pytest.mark.parametrize("transcript_name, name", [
    (TRANSCRIPTS[0], n) for n in MAIN_FILES] + [
    pytest.param(TRANSCRIPTS[1], n, marks=() if n in DEFAULT_RUN_FILES else pytest.mark.slow)
    for n in MAIN_FILES])
def test_replay_transcript_keyed(name, transcript_name):
    tok = fresh(name)
    style = detect_style(tok.admission.added_tokens)
    turns = render_turns(transcript(transcript_name), style)
    want = {True: ref_ids_many(tok, turns, True), False: ref_ids_many(tok, turns, False)}
    for i, text in enumerate(turns):
        special = i % 3 != 2
        got = tok.encode(text, session="s", add_special_tokens=special)
        assert list(got) == want[special][i], f"turn {i}"
    s = tok.sessions.stats()
    assert s["repairs"] >= len(turns) - 2 and s["fallbacks"] == 0, s


@pytest.mark.parametrize("name", PER_FILE)
def test_replay_transcript_content_lookup(name):
    tok = fresh(name)
    turns = render_turns(transcript(TRANSCRIPTS[0]), detect_style(tok.admission.added_tokens))
    for text, want in zip(turns, ref_ids_many(tok, turns)):
        assert list(tok.encode(text)) == want
    s = tok.sessions.stats()
    long_turns = sum(len(t.encode()) >= 4096 for t in turns)
    assert s["lookups"] == long_turns and s["repairs"] >= long_turns - 1, s
    assert s["content"] == 1  # each extension replaced the entry it extended


# Appends that split something across the turn boundary: (end of old text, start of append).
SPLITS = [
    ("word   ", "   next"),  # a whitespace run
    ("line\r", "\nnext"),  # CRLF
    ("it'", "s here"),  # a contraction
    ("don", "'t"),
    ("cafe", "\u0301 au lait"),  # a decomposed accent
    ("\U0001f469\u200d", "\U0001f469\u200d\U0001f467 family"),  # emoji ZWJ
    ("12", "345"),  # a digit run
    ("x \u0958", "/y"),
    ("\u1100", "\u1161\u11a8"),  # Hangul jamo
    ("a'l", "L"),  # o200k: a contraction inside a word
]


@pytest.mark.parametrize("name", PER_FILE)
def test_appends_split_tricky_boundaries(name):
    tok = fresh(name)
    base = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[:3000]
    specials = [t for t in tok.admission.added_tokens if len(t) > 2][:5]
    splits = SPLITS + [(t[: len(t) // 2], t[len(t) // 2:] + " after") for t in specials]
    for i, (left, right) in enumerate(splits):
        old = base + left
        new = old + right + " and more text."
        for text in (old, new, new + left, new + left + right):
            assert list(tok.encode(text, session=i)) == ref_ids(tok, text), (left, right)


def test_decomposed_accent_in_history_keeps_repairing_cheaply():
    tok = fresh("qwen3")
    text = "Re\u0301sume\u0301 of the first turn.\n" + read_text("prose", "gutenberg-2701_moby-dick.txt")[:20000]
    assert list(tok.encode(text, session="k")) == ref_ids(tok, text)
    appends = read_text("prose", "gutenberg-972_devils-dictionary.txt")[5000:25000]
    for i in range(50):
        text += appends[i * 400 : (i + 1) * 400]
        assert list(tok.encode(text, session="k")) == ref_ids(tok, text)
    s = tok.sessions.stats()
    assert s["repairs"] == 50 and s["fallbacks"] == 0 and s["full_encodes"] == 1, s


def test_views_never_change_under_the_caller():
    tok = fresh("llama3")
    text = read_text("prose", "gutenberg-2701_moby-dick.txt")[:10000]
    v1 = tok.encode(text, session="v")
    snapshot = list(v1)
    entry = tok.sessions._keyed["v"]
    buf1 = entry.buffers.current
    v2 = tok.encode(text + " more words", session="v")  # v1 alive: copy on write
    assert list(v1) == snapshot and entry.buffers.current is not buf1
    assert v1.readonly and v2.readonly
    buf2 = entry.buffers.current
    del v2
    tok.encode(text + " more words and more", session="v")  # nothing alive: in place
    assert entry.buffers.current is buf2
    w = tok.encode(text, session="v")  # not a prefix of the stored text: full encode
    assert list(w) == snapshot


def test_special_tokens_views_share_one_buffer():
    tok = fresh("llama3")
    text = "<|start_header_id|>user<|end_header_id|>\n\nhello" * 50
    a = tok.encode(text, session="s")
    b = tok.encode(text, session="s", add_special_tokens=False)
    assert list(a) == ref_ids(tok, text, True) and list(b) == ref_ids(tok, text, False)
    assert a.obj is b.obj and list(a)[0] == tok.reference.token_to_id("<|begin_of_text|>")
    assert tok.sessions.stats()["hits"] == 1


def test_stats_bytes_is_what_session_bytes_bounds():
    """stats()["bytes"] (what a soak compares with the front end's RSS) counts the lists that
    encode_list keeps as well as text, IDs and anchors, and never exceeds session_bytes."""
    limit = 600_000
    tok = fresh("qwen3", session_bytes=limit, max_sessions=8)
    src = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")
    seen = 0
    for step in range(30):
        key = step % 5
        text = src[key * 30000 : key * 30000 + 4000 + 600 * step]
        tok.encode_list(text, session=key)
        s = tok.sessions.stats()
        assert s["bytes"] <= limit, s
        assert s["bytes"] > s["text_bytes"] + s["id_bytes"] + s["anchor_bytes"], s  # + lists
        seen = max(seen, s["bytes"])
    assert seen > limit // 2 and tok.sessions.stats()["evictions"] > 0
    tok.sessions.clear()
    assert tok.sessions.stats()["bytes"] == 0


def test_concurrent_sessions_and_eviction_in_flight():
    tok = fresh("qwen3", session_bytes=400_000, max_sessions=6)
    src = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")
    errors = []

    def client(worker: int) -> None:
        rng = random.Random(worker)
        try:
            for step in range(25):
                key = rng.randrange(10)  # several threads share keys: serialized per session
                start = key * 20000
                end = start + 5000 + step * rng.randrange(50, 500)
                text = src[start:end]
                got = tok.encode(text, session=key, add_special_tokens=bool(step % 2))
                if list(got) != ref_ids(tok, text, bool(step % 2)):
                    errors.append((worker, key, step))
        except Exception as exc:  # noqa: BLE001
            errors.append(repr(exc))

    threads = [threading.Thread(target=client, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    s = tok.sessions.stats()
    assert s["evictions"] > 0 and s["keyed"] <= 6
    assert s["text_bytes"] + s["id_bytes"] <= 400_000 + 200_000  # one in-flight entry may exceed


def test_lookup_confirms_bytes_before_reuse(monkeypatch):
    """A fingerprint collision may waste work but never changes IDs: with every fingerprint
    equal, every stored text is a candidate for every request."""
    tok = fresh("gpt-oss")
    import dtok.session_core as session_core

    monkeypatch.setattr(session_core, "fingerprints", lambda text, offsets, key: [0] * len(offsets))
    a = read_text("code", "go__fzf__src_pattern.go.txt")
    b = read_text("code", "shell__fzf__shell_key-bindings.zsh.txt")
    for text in (a, b, b + a[:100], a + b[:100], a[:3000] + b):
        assert list(tok.encode(text)) == ref_ids(tok, text)
    assert tok.sessions.stats()["lookups"] == 5


def test_short_texts_are_not_stored():
    tok = fresh("qwen3")
    tok.encode("short text " * 100)
    assert len(tok.sessions) == 0
    tok.encode("x" * 5000)
    assert len(tok.sessions) == 1
    off = fresh("qwen3", content_lookup=False)
    off.encode("x" * 5000)
    assert len(off.sessions) == 0


def test_store_bounds_and_management():
    tok = fresh("qwen3", max_sessions=3, lookup_entries=2)
    base = read_text("prose", "gutenberg-972_devils-dictionary.txt")
    for k in range(5):
        tok.encode(base[k * 100 : k * 100 + 6000], session=f"k{k}")
    for k in range(4):
        tok.encode(base[50000 + k * 7000 : 50000 + k * 7000 + 6000])
    s = tok.sessions.stats()
    assert s["keyed"] == 3 and s["content"] == 2 and s["evictions"] == 4
    assert "k4" in tok.sessions and "k0" not in tok.sessions
    assert tok.sessions.drop("k4") and not tok.sessions.drop("k4")
    tok.sessions.clear()
    assert len(tok.sessions) == 0 and tok.sessions.stats()["id_bytes"] == 0


def test_state_per_session_is_ids_plus_small_constant():
    tok = fresh("llama3")
    text = read_text("prose", "gutenberg-2701_moby-dick.txt")[:400_000]
    tok.encode(text, session="m")
    for i in range(20):
        text += " appended words number %d." % i
        tok.encode(text, session="m")
    n = len(ref_ids(tok, text))
    assert tok.sessions.stats()["id_bytes"] <= 4 * n * 1.07 + 8192


def test_bad_input_leaves_session_intact():
    tok = fresh("qwen3")
    text = "hello world " * 500
    tok.encode(text, session="b")
    with pytest.raises(TypeError):
        tok.encode(text + "\ud800", session="b")
    with pytest.raises(TypeError):
        tok.encode("\udfff" * 10, session="new")
    assert "new" not in tok.sessions
    assert list(tok.encode(text + "!", session="b")) == ref_ids(tok, text + "!")
    assert tok.sessions.stats()["repairs"] == 1


def test_explain_session_route():
    tok = fresh("qwen3")
    text = "Some words. " * 1000
    tok.encode(text, session="e")
    assert tok.explain(text, session="e")["route"] == "session hit"
    ex = tok.explain(text + "More.", session="e")
    assert ex["route"] == "session repair" and ex["cuts"][0] <= len(text)


def _mixed_result_turns(text: str, rng: random.Random) -> list[tuple[str, bool, bool]]:
    """Turns of one conversation — appends and edits anywhere — each asked as a view or a list,
    with or without special tokens, in random order (what the soak found: a list brought up to
    date from the last request's change point only, when an earlier request of the other kind
    had changed IDs before it)."""
    turns, cur = [], text[:3000]
    for i in range(40):
        if rng.random() < 0.6:
            cur += text[3000 + 200 * i : 3200 + 200 * i]
        else:
            pos = rng.randrange(len(cur))
            cur = cur[:pos] + rng.choice(["X", " the", "\n\n", "é"]) + cur[pos + rng.randint(0, 9):]
        turns.append((cur, rng.random() < 0.5, rng.random() < 0.5))
    return turns


@pytest.mark.parametrize("name", ["qwen3", "llama3-tiny"])
def test_lists_stay_exact_between_views_and_other_flavours(name):
    tok = load_tokenizer(name).with_knobs()
    text = read_text("prose", "gutenberg-2701_moby-dick.txt")[:20_000]
    turns = _mixed_result_turns(text, random.Random(3))
    got = [tok.encode_list(t, session="c", add_special_tokens=sp) if as_list
           else list(tok.encode(t, session="c", add_special_tokens=sp)) for t, sp, as_list in turns]
    assert got == [ref_ids(tok, t, sp) for t, sp, _ in turns]


def test_scopes_never_share_sessions():
    """Tenants (scopes: a serving engine's cache_salt and model) never continue each other's
    text: with the same session id in two scopes nothing is reused, in one scope it is. A scope
    whose values contain what would be a separator in a joined string is still another scope."""
    tok = load_tokenizer("qwen3").with_knobs()
    turns = _tenant_turns()
    scopes = [("a:b", None), ("a", "b:"), ("a", "b"), None]
    for scope in scopes:  # the first turn of the same session id in each scope: a full encode
        assert list(tok.encode(turns[0], session="conv", scope=scope)) == ref_ids(tok, turns[0])
    s = tok.sessions.stats()
    assert (s["full_encodes"], _reused(s), s["keyed"]) == (4, 0, 4), s
    for scope in scopes:  # the next turn in each scope continues its own session
        assert list(tok.encode(turns[1], session="conv", scope=scope)) == ref_ids(tok, turns[1])
    assert tok.sessions.stats()["repairs"] == 4
    # a plain key that looks like a scoped one is not the scoped session
    assert list(tok.encode(turns[2], session=(("a", "b"), "conv"))) == ref_ids(tok, turns[2])
    assert tok.sessions.stats()["full_encodes"] == 5


def test_scopes_never_share_content():
    """Content lookup inside a scope: a text is never continued from another tenant's, while a
    salted request without a session id continues its own tenant's conversation."""
    look = load_tokenizer("qwen3").with_knobs()
    turns = _tenant_turns()
    assert list(look.encode(turns[0], scope=("A", None))) == ref_ids(look, turns[0])
    assert list(look.encode(turns[1], scope=("B", None))) == ref_ids(look, turns[1])
    s = look.sessions.stats()
    assert (s["lookups"], s["lookup_hits"], _reused(s), s["full_encodes"]) == (2, 0, 0, 2), s
    assert list(look.encode(turns[1], scope=("A", None))) == ref_ids(look, turns[1])
    assert list(look.encode(turns[2], scope=("A", None))) == ref_ids(look, turns[2])
    s = look.sessions.stats()
    assert (s["repairs"], s["full_encodes"]) == (2, 2), s
    assert look.explain(turns[2] + "x", scope=("C", None)).get("route") != "session repair"
    assert look.explain(turns[2] + "x", scope=("A", None))["route"] == "session repair"


@pytest.mark.parametrize("check", [test_scopes_never_share_sessions,
                                   test_scopes_never_share_content])
def test_scope_checks_find_tenants_that_share(check, monkeypatch):
    """Control: with the scope ignored (sessions stored under the key alone, content
    fingerprinted without the scope's key) each check above fails on its counters."""
    import dtok.tokenizer
    from dtok.session_core import ContentIndex

    unscoped = ContentIndex._scope_key
    monkeypatch.setattr(dtok.tokenizer, "scoped_key", lambda key, scope: key)
    monkeypatch.setattr(ContentIndex, "_scope_key", lambda self, scope: unscoped(self, None))
    with pytest.raises(AssertionError, match=r"assert \(\d"):  # a counters tuple, not the IDs
        check()


def _tenant_turns() -> list[str]:
    base = read_text("prose", "gutenberg-2701_moby-dick.txt")[:30_000]
    return [base + "".join(f" turn {j}." for j in range(i + 1)) for i in range(3)]


def _reused(stats: dict) -> int:
    return stats["repairs"] + stats["edits"] + stats["hits"]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_held_views_go_to_the_spare_buffer_and_never_change(seed):
    """A caller holding the previous turn's view: the next turn is written into the buffer
    that was current before (the spare), copying only what changed since; appends, truncations
    and edits mixed with turns written in place (no view held) keep the spare's valid prefix
    right, every result equals the reference, no held view changes, and the session's buffers
    stop being reallocated."""
    tok = fresh("qwen3")
    rng = random.Random(seed)
    src = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")
    text = src[:20000]
    held, snapshots, buffers = None, [], []  # the buffers themselves: ids are not reused
    for turn in range(40):
        text = next_turn(rng, src, text)
        view = tok.encode(text, session="s")
        assert list(view) == ref_ids(tok, text), f"turn {turn}"
        if not any(b is view.obj for b in buffers):
            buffers.append(view.obj)
        if rng.random() < 0.7:
            held = view
            if turn % 8 == 0:
                snapshots.append((view, list(view)))
        else:
            held = None  # noqa: F841 - held only to keep a view alive into the next turn
        del view
    for view, snapshot in snapshots:
        assert list(view) == snapshot
    # two buffers take turns (plus one per snapshot still alive, and a few that outgrew)
    assert len(buffers) <= 2 + len(snapshots) + 6, len(buffers)


# --- answers within a budget (an event loop's) ------------------------------------------------


def test_try_encode_list_answers_only_within_its_budget():
    """``try_encode_list`` answers (the reference's IDs) where the answer encodes at most
    ``max_chars`` characters, and otherwise returns None and changes nothing: no session made,
    none advanced, nothing counted; the ordinary route then serves the request as before."""
    tok = fresh("qwen3")
    prose = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")
    first, second = prose[:60_000], prose[:61_000]
    assert tok.try_encode_list(first, max_chars=8192, session="a") is None  # 60K to encode
    assert "a" not in tok.sessions and tok.sessions.stats()["full_encodes"] == 0
    assert tok.encode_list(first, session="a") == ref_ids(tok, first)
    def state() -> dict:  # "bytes" left out: it is recounted at each request, and the
        # reference's encode in ref_ids above left the stored text's UTF-8 on it
        entry = tok.sessions._keyed["a"]
        return {**tok.sessions.stats(), "bytes": None, "text": entry.text, "buf": entry.buffers.current}

    before = state()
    assert tok.try_encode_list(second, max_chars=64, session="a") is None  # ~1K + the seam's
    assert state() == before
    got = tok.try_encode_list(second, max_chars=8192, session="a")
    assert got == ref_ids(tok, second) and tok.sessions.stats()["repairs"] == 1
    assert tok.try_encode_list(second, max_chars=0, session="a") == got  # a hit encodes nothing
    # unkeyed: content lookup continues a stored text within the budget, else None
    other = prose[100_000:160_000]
    assert tok.try_encode_list(other, max_chars=8192) is None
    assert tok.sessions.stats()["lookups"] == 0
    tok.encode_list(other)
    assert tok.try_encode_list(other + "The end.", max_chars=8192) == ref_ids(
        tok, other + "The end.")
    assert tok.sessions.stats()["lookup_hits"] == 1
    # short stateless text: its length is the work; without special tokens too
    assert tok.try_encode_list("Hello, world!", max_chars=13, add_special_tokens=False) == \
        ref_ids(tok, "Hello, world!", False)
    assert tok.try_encode_list("Hello, world!", max_chars=12) is None
    # what the reference must judge (not a str, a lone surrogate) is left to the ordinary route
    assert tok.try_encode_list(b"bytes", max_chars=1 << 20) is None
    with pytest.raises(Exception) as raised:
        tok.try_encode_list("bad \ud800", max_chars=1 << 20)
    with pytest.raises(type(raised.value)):
        tok.reference.encode("bad \ud800")


def test_try_encode_list_waits_for_no_one():
    """A session busy with another request (its lock held) is not waited for: None, and the
    session is served by the ordinary route once free."""
    tok = fresh("llama3")
    text = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[:20_000]
    tok.encode_list(text, session="busy")
    entry = tok.sessions._keyed["busy"]
    with entry.lock:  # another request in flight
        assert tok.try_encode_list(text + " More.", max_chars=1 << 20, session="busy") is None
    assert tok.try_encode_list(text + " More.", max_chars=1 << 20, session="busy") == ref_ids(
        tok, text + " More.")


def test_try_encode_list_counts_the_reference_as_slower():
    """On the reference encoder a character costs REFERENCE_WEIGHT fast-encoder characters of
    the budget (the reference takes ~100x the time)."""
    from dtok.chunk_encoder import REFERENCE_WEIGHT

    tok = fresh("qwen3", encoder="reference")
    text = "Hello there. " * 100  # 1,300 characters
    assert tok.try_encode_list(text, max_chars=len(text)) is None
    assert tok.try_encode_list(text, max_chars=len(text) * REFERENCE_WEIGHT) == ref_ids(tok, text)


@pytest.mark.parametrize("name", PER_FILE)
def test_one_pass_append_is_the_general_plan(name):
    """A pure append's one pass (Planner.append) gives the IDs and anchors that planning,
    executing and anchoring the general plan give, at splits that move the seam."""
    from dtok.repair import execute

    tok = fresh(name, anchor_spacing=256)
    planner, encode = parts_of(tok).planner, parts_of(tok).chunk_encoder.encode_texts
    base = read_text("prose", "gutenberg-1342_pride-and-prejudice.txt")[:5000]
    rng = random.Random(7)
    specials = [t for t in tok.admission.added_tokens if len(t) > 2][:3]
    for left, right in SPLITS + [(t[:3], t[3:] + " x") for t in specials] + [("", "")]:
        old = base[: rng.randrange(500, 5000)] + left
        first = planner.plan(None, None, old)
        done = execute(first, encode, None)
        anchors = planner.anchors_after(first, done.resolved, done.counts, None)
        whole = parts_of(tok).chunk_encoder.encode_whole(old)
        body = whole.view(len(parts_of(tok).chunk_encoder.prefix), len(whole) - len(parts_of(tok).chunk_encoder.suffix))
        for new in (old + right + " and more text.", old + right + base[:3000], old + "\n"):
            plan = planner.plan(old, anchors, new)
            general = execute(plan, encode, body)
            want_anchors = planner.anchors_after(plan, general.resolved, general.counts, anchors)
            one = planner.append(old, anchors, new, encode, body)
            assert plan.kind == "append" and one is not None, (left, right)
            assert one.keep == general.keep and one.reused == plan.reused_chars
            assert [list(p) for p in one.tail] == [list(p) for p in general.tail]
            assert list(one.anchors.offsets) == list(want_anchors.offsets)
            assert list(one.anchors.tokens) == list(want_anchors.tokens)
            ids = list(body[: one.keep]) + [i for p in one.tail for i in p]
            assert ids == ref_ids(tok, new, False)


def test_anchor_writer_and_nearest_anchor():
    """The anchors' compiled helpers: the nearest anchor (the earlier of two as near), a kept
    range copied as it is and one out of range refused, an anchor closer than the gap dropped,
    the end always written."""
    from array import array

    from dtok_ext.cuts import AnchorWriter, nearest_anchor

    offsets = array("q", [0, 10, 20, 40])
    got = [nearest_anchor(offsets, pos) for pos in (0, 4, 5, 6, 15, 29, 30, 31, 40, 99)]
    assert got == [0, 0, 0, 1, 1, 2, 2, 3, 3, 3]
    out = AnchorWriter(16)  # gap 8
    out.keep(offsets, array("q", [0, 3, 6, 9]), 1, 3)
    out.add(22, 7)  # closer than the gap to 20: dropped
    out.add(30, 8)
    with pytest.raises(IndexError):
        out.keep(offsets, offsets, 2, 5)
    out.finish(31, 9)  # closer than gap // 4 to 30: 30 gives way to the end
    assert list(zip(out.offsets, out.tokens)) == [(0, 0), (10, 3), (20, 6), (31, 9)]
