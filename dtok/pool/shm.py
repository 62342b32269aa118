"""Named POSIX shared-memory segments and semaphores of one pool, and their cleanup.

Every name starts with the pool's prefix ``dtok-<pid>-<random>``, where pid is the front end's
process id: ``close()`` unlinks them all, the zygote unlinks them when the front end dies, and a
new pool sweeps the prefixes of front ends that no longer exist (a crash that also killed the
zygote). On Linux they appear under /dev/shm (semaphores as ``sem.<name>``).
"""
from __future__ import annotations

import mmap
import os
import re
import secrets
from pathlib import Path

import posix_ipc

SHM_DIR = Path("/dev/shm")
_PREFIX_RE = re.compile(r"^(?:sem\.)?(dtok-(\d+)-[0-9a-f]+)-")


def new_prefix() -> str:
    return f"dtok-{os.getpid()}-{secrets.token_hex(4)}"


class Segment:
    """A shared-memory segment mapped into this process."""

    __slots__ = ("name", "size", "map")

    def __init__(self, name: str, size: int, create: bool) -> None:
        flags = posix_ipc.O_CREX if create else 0
        shm = posix_ipc.SharedMemory("/" + name, flags, size=size if create else 0)
        try:
            self.size = shm.size
            self.map = mmap.mmap(shm.fd, self.size)
        finally:
            shm.close_fd()
        self.name = name

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:  # a view is still alive: the OS unmaps at exit
            pass

    def unlink(self) -> None:
        unlink_segment(self.name)


def unlink_segment(name: str) -> None:
    try:
        posix_ipc.unlink_shared_memory("/" + name)
    except posix_ipc.ExistentialError:
        pass


def semaphore(name: str, create: bool) -> posix_ipc.Semaphore:
    if create:
        return posix_ipc.Semaphore("/" + name, posix_ipc.O_CREX, initial_value=0)
    return posix_ipc.Semaphore("/" + name)


def unlink_semaphore(name: str) -> None:
    try:
        posix_ipc.unlink_semaphore("/" + name)
    except posix_ipc.ExistentialError:
        pass


def names_with_prefix(prefix: str) -> list[str]:
    """Segments and semaphores of one pool still present (Linux: listed in /dev/shm)."""
    if not SHM_DIR.is_dir():
        return []
    return [p.name for p in SHM_DIR.iterdir()
            if p.name.startswith(prefix + "-") or p.name.startswith("sem." + prefix + "-")]


def unlink_prefix(prefix: str) -> int:
    """Unlink every segment and semaphore of one pool; returns how many were removed."""
    removed = 0
    for name in names_with_prefix(prefix):
        if name.startswith("sem."):
            unlink_semaphore(name[4:])
        else:
            unlink_segment(name)
        removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale() -> int:
    """Unlink the segments and semaphores of pools whose front end no longer exists."""
    if not SHM_DIR.is_dir():
        return 0
    dead = set()
    for p in SHM_DIR.iterdir():
        m = _PREFIX_RE.match(p.name)
        if m and not _alive(int(m.group(2))):
            dead.add(m.group(1))
    return sum(unlink_prefix(prefix) for prefix in dead)
