"""Named POSIX shared-memory segments and semaphores of one pool: creation with the pages
allocated up front, the pool's byte budget, the owner lock, and cleanup.

Every name starts with the pool's prefix ``dtok-<pid>-<random>`` (pid: the front end's; 64
random bits, so that no other process can guess a pool's names and create one first). Segments,
semaphores and the lock file are created mode 0600: another uid can see the names, not open them.
``close()`` unlinks them all, the zygote unlinks them when the front end dies, and a new pool
sweeps the prefixes whose owners are all gone. On Linux they live in /dev/shm (semaphores as
``sem.<name>``).

* **No SIGBUS.** A segment's pages are allocated when it is created (``posix_fallocate``): on a
  full or small /dev/shm (containers often mount 64 MiB) creation fails with :class:`ShmFull`,
  which the pool answers in process, instead of a later write into an unbacked page killing the
  process with SIGBUS.
* **Owner lock.** Each pool creates ``<prefix>-lock`` first and holds a shared ``flock`` on it
  from the front end and the zygote (whose forked workers inherit it). A sweep unlinks a prefix
  only when it can take that lock exclusively, i.e. no process of the pool lives, whatever PID
  namespace it runs in (a PID check cannot tell that across namespaces sharing /dev/shm).
"""
from __future__ import annotations

import errno
import fcntl
import mmap
import os
import signal
import re
import secrets
import threading
import time
from pathlib import Path

import posix_ipc

from dtok.pool.protocol import lock_name

SHM_DIR = Path("/dev/shm")
_PREFIX_RE = re.compile(r"^(?:sem\.)?(dtok-(\d+)-[0-9a-f]+)-")
LEGACY_AGE_S = 3600  # a prefix without a lock file (an older dtok) is swept only when this old


class ShmFull(OSError):
    """A segment could not be created: /dev/shm is full, or the pool's byte budget is spent."""


def new_prefix() -> str:
    return f"dtok-{os.getpid()}-{secrets.token_hex(8)}"  # 64 random bits: not guessable


class Budget:
    """Bytes of shared memory one pool may hold (None: only what /dev/shm allows)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.used = 0
        self._lock = threading.Lock()

    def take(self, n: int) -> None:
        with self._lock:
            if self.limit is not None and self.used + n > self.limit:
                raise ShmFull(errno.ENOSPC, f"the pool's shared-memory budget ({self.limit} "
                                            f"bytes) is spent ({self.used} in use)")
            self.used += n

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


class Segment:
    """A shared-memory segment mapped into this process."""

    __slots__ = ("name", "size", "map", "_budget")

    def __init__(self, name: str, size: int, create: bool, budget: Budget | None = None) -> None:
        self._budget = None
        if not create:
            shm = posix_ipc.SharedMemory("/" + name)
            try:
                self.size = shm.size
                self.map = mmap.mmap(shm.fd, self.size)
            finally:
                shm.close_fd()
            self.name = name
            return
        if budget is not None:
            budget.take(size)
        try:
            shm = posix_ipc.SharedMemory("/" + name, posix_ipc.O_CREX, size=size)
        except BaseException:
            if budget is not None:
                budget.give(size)
            raise
        try:
            os.posix_fallocate(shm.fd, 0, size)  # the pages now, or ENOSPC now (never SIGBUS later)
            self.size = size
            self.map = mmap.mmap(shm.fd, size)
        except OSError as exc:
            unlink_segment(name)
            if budget is not None:
                budget.give(size)
            raise ShmFull(exc.errno or errno.ENOSPC,
                          f"cannot create a {size}-byte shared-memory segment: {exc}") from None
        finally:
            shm.close_fd()
        self.name = name
        self._budget = budget

    def close(self) -> None:
        try:
            self.map.close()
        except BufferError:  # a view is still alive: the OS unmaps at exit
            pass

    def unlink(self) -> None:
        unlink_segment(self.name)
        if self._budget is not None:
            self._budget.give(self.size)
            self._budget = None


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


def shm_capacity() -> int | None:
    """Total bytes of the /dev/shm file system, or None when there is none."""
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


# --- the owner lock ------------------------------------------------------------------------------


def hold_owner_lock(prefix: str, create: bool) -> int | None:
    """Take a shared flock on the pool's lock file (creating it first when asked, under a temporary
    name renamed once locked, so a sweep never sees it unlocked); returns the fd to keep open."""
    if not SHM_DIR.is_dir():
        return None
    path = SHM_DIR / lock_name(prefix)
    if create:
        tmp = SHM_DIR / f"{lock_name(prefix)}.{secrets.token_hex(4)}"
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        fcntl.flock(fd, fcntl.LOCK_SH)
        os.rename(tmp, path)
        return fd
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def names_with_prefix(prefix: str) -> list[str]:
    """Segments, semaphores and the lock file of one pool still present."""
    if not SHM_DIR.is_dir():
        return []
    return [p.name for p in SHM_DIR.iterdir()
            if p.name.startswith(prefix + "-") or p.name.startswith("sem." + prefix + "-")]


def unlink_prefix(prefix: str) -> int:
    """Unlink every segment and semaphore of one pool (the lock file last); how many."""
    removed = 0
    names = names_with_prefix(prefix)
    lock = lock_name(prefix)
    for name in sorted(names, key=lambda n: n == lock):
        if name.startswith("sem."):
            unlink_semaphore(name[4:])
        elif name.startswith(lock):
            try:
                (SHM_DIR / name).unlink()
            except FileNotFoundError:
                pass
        else:
            unlink_segment(name)
        removed += 1
    return removed


def sigkill(pid: int) -> None:
    """SIGKILL a process of the pool's (a worker past its deadline, one that outlives the
    pool); one already gone is not an error."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_gone(prefix: str, pid: int, names: list[str]) -> bool:
    lock = SHM_DIR / lock_name(prefix)
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:
        # No lock file: an older dtok, or a pool that failed before taking it. Only a dead PID
        # here *and* age say it is stale (the PID may belong to another namespace).
        try:
            newest = max((SHM_DIR / n).stat().st_mtime for n in names)
        except (OSError, ValueError):
            return False
        return not _alive(pid) and time.time() - newest > LEGACY_AGE_S
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # a process of that pool holds it
    finally:
        os.close(fd)
    return True


def sweep_stale() -> int:
    """Unlink the segments and semaphores of pools none of whose processes lives."""
    if not SHM_DIR.is_dir():
        return 0
    found: dict[str, tuple[int, list[str]]] = {}
    for p in SHM_DIR.iterdir():
        m = _PREFIX_RE.match(p.name)
        if m:
            found.setdefault(m.group(1), (int(m.group(2)), []))[1].append(p.name)
    return sum(unlink_prefix(prefix) for prefix, (pid, names) in found.items()
               if _owner_gone(prefix, pid, names))
