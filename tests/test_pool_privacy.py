"""The pool's shared memory is private: every segment, semaphore and the lock file is mode 0600
and owned by this uid, names carry 64 random bits besides the pid, and a process of another uid
cannot open any of them (where this test may switch uid)."""
from __future__ import annotations

import os
import re
import stat

import posix_ipc
import pytest

from conftest import load_tokenizer, read_text, ref_ids
from dtok.pool import Pool, shm
from test_pool import pool_names


@pytest.fixture(scope="module")
def busy_pool():
    """A pool with every kind of name present: control blocks, semaphores, payload and result
    segments (grown by a chunked text), session segments, the lock file."""
    tok = load_tokenizer("qwen3")
    text = read_text("prose", "gutenberg-2701_moby-dick.txt")[:60_000]
    with Pool(tok, workers=2, name="private", chunk_threshold=8192, chunk_target=4096) as pool:
        assert list(pool.encode(text)) == ref_ids(tok, text)
        for i in range(3):
            t = text[: 10_000 * (i + 1)]
            assert list(pool.encode(t, session=f"s{i}")) == ref_ids(tok, t)
        yield pool


def _not_private(names: set[str]) -> list[str]:
    """Names in /dev/shm not mode 0600 or not owned by this uid."""
    bad = []
    for n in sorted(names):
        st = os.stat(shm.SHM_DIR / n)
        if stat.S_IMODE(st.st_mode) != 0o600 or st.st_uid != os.getuid():
            bad.append(f"{n} {oct(st.st_mode)} uid {st.st_uid}")
    return bad


def _kinds(prefix: str, names: set[str]) -> set[str]:
    return {re.sub(r"\d+", "N", n.replace("sem.", "", 1)[len(prefix):]) for n in names}


def test_every_name_is_mode_0600_and_ours(busy_pool):
    names = pool_names(busy_pool.prefix)
    assert _kinds(busy_pool.prefix, names) >= {
        "-lock", "-done", "-wN-ctl", "-wN-req", "-wN-resp", "-wN-inN", "-wN-outN", "-sN-gN"}, names
    assert _not_private(names) == []


def test_control_a_readable_segment_is_caught(busy_pool):
    name = busy_pool.prefix + "-control"
    seg = posix_ipc.SharedMemory("/" + name, posix_ipc.O_CREX, mode=0o644, size=4096)
    try:
        assert _not_private({name}) == [f"{name} 0o100644 uid {os.getuid()}"]
    finally:
        seg.close_fd()
        seg.unlink()


def test_names_are_not_guessable_from_the_pid():
    prefixes = {shm.new_prefix() for _ in range(100)}
    assert len(prefixes) == 100
    for p in prefixes:
        pid, token = re.fullmatch(r"dtok-(\d+)-([0-9a-f]+)", p).groups()
        assert int(pid) == os.getpid() and len(token) == 16  # 64 random bits
        assert shm._PREFIX_RE.match(p + "-lock")  # the sweep still recognises it


@pytest.mark.skipif(os.getuid() != 0, reason="switching uid needs root")
def test_another_uid_cannot_open_any_name(busy_pool):
    names = sorted(pool_names(busy_pool.prefix))
    control = busy_pool.prefix + "-readable"  # a control the other uid must be able to open
    seg = posix_ipc.SharedMemory("/" + control, posix_ipc.O_CREX, mode=0o644, size=4096)
    seg.close_fd()
    names.append(control)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child becomes nobody and tries every name
        os.close(r)
        opened = []
        try:
            os.setgid(65534)
            os.setgroups([])
            os.setuid(65534)
            for n in names:
                try:
                    if n.startswith("sem."):
                        posix_ipc.Semaphore("/" + n[4:])
                    elif n.endswith("-lock"):
                        os.close(os.open(shm.SHM_DIR / n, os.O_RDONLY))
                    else:
                        posix_ipc.SharedMemory("/" + n, read_only=True)
                    opened.append(n)
                except (posix_ipc.PermissionsError, PermissionError):
                    pass
            os.write(w, ("\n".join(["ok", *opened])).encode())
        except BaseException as exc:  # noqa: BLE001 - report, never return into pytest
            os.write(w, f"error {exc!r}".encode())
        finally:
            os._exit(0)
    os.close(w)
    out = b""
    while chunk := os.read(r, 65536):
        out += chunk
    os.close(r)
    os.waitpid(pid, 0)
    seg.unlink()
    lines = out.decode().split("\n")
    assert lines[0] == "ok", lines
    assert len(names) > 10 and lines[1:] == [control], f"opened as another uid: {lines[1:]}"
