"""The front end's side of the zygote: start it with the tokenizer's bytes (on its stdin), read its events, ask
it to fork (or replace) workers, and clean up whatever happens to the front end.

Events are JSON lines read from the zygote's stdout through :class:`EventReader`, which keeps
its own buffer: a buffered file object may swallow two lines in one read, after which ``select``
on the pipe waits for data that has already arrived (that is how a pool start once hung until
``start_timeout``).
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from dtok.digests import sha256
from dtok.encoders import FASTOKENS_CACHE_VARS
from dtok.pool import protocol
from dtok.pool import shm


#: The zygote must hold no thread but its own when it forks (a thread's locks would be copied
#: held): every library it loads is kept single-threaded, from the start of the process (numpy's
#: OpenBLAS starts a thread when it is imported).
ZYGOTE_ENV = {"FASTOKENS_BPE_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
              "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
              "RAYON_NUM_THREADS": "1"}


# The zygote runs the dtok this process imported (not whatever ``dtok`` the working directory
# holds, which is what ``python -m`` would find first).
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
_ZYGOTE_MAIN = "import sys; sys.path.insert(0, sys.argv[1]); from dtok.pool.zygote import main; main()"


class EventReader(protocol.PipeReader):
    """The zygote's events: JSON lines, with a deadline per event."""

    def read(self, deadline: float = float("inf")) -> dict | None:
        """The next event; None at end of file; TimeoutError past the deadline."""
        while (line := self.take_line()) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no event from the zygote before the deadline")
            if not self.fill(min(left, 1.0)):
                return None
        return json.loads(line)


class Resources:
    """What must be cleaned up even if the Pool object is never closed (atexit, GC)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.zygote: subprocess.Popen | None = None
        self.loaded = False  # the zygote has workers to stop only once it has loaded
        self.lock_fd: int | None = None

    def release(self) -> None:
        z = self.zygote
        if z is not None and z.poll() is None:
            try:
                if not self.loaded:
                    z.kill()  # still loading the tokenizer: nothing of its own to clean up
                else:
                    z.stdin.close()  # the zygote kills the workers and unlinks everything
                z.wait(10)
            except Exception:  # noqa: BLE001
                z.kill()
                z.wait()
        if z is not None:
            for pipe in (z.stdin, z.stdout):
                if pipe is not None:
                    pipe.close()
        shm.unlink_prefix(self.prefix)
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None


class ZygoteClient:
    """Start the zygote and talk to it."""

    def __init__(self, res: Resources, config: dict, tokenizer_json: bytes) -> None:
        self.res = res
        config = {**config, "tokenizer_bytes": len(tokenizer_json),
                  "done_sem": protocol.done_sem_name(res.prefix)}
        env = {**os.environ, **ZYGOTE_ENV}
        for var in FASTOKENS_CACHE_VARS:
            env.pop(var, None)
        z = subprocess.Popen([sys.executable, "-c", _ZYGOTE_MAIN, _PACKAGE_ROOT],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env,
                             close_fds=True, bufsize=0)
        res.zygote = z
        self.events = EventReader(z.stdout.fileno())
        try:  # the configuration line, then the tokenizer's bytes (not /dev/shm: it may be small)
            z.stdin.write((json.dumps(config) + "\n").encode())
            z.stdin.write(tokenizer_json)
            z.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # the zygote died: wait_loaded says so

    def wait_loaded(self, deadline: float) -> dict:
        """The zygote's "loaded" event (its encoder and pid)."""
        event = self.events.read(deadline)
        if event is None:
            raise RuntimeError("the pool's zygote exited while loading the tokenizer")
        if event.get("event") != "loaded":
            raise RuntimeError(f"pool workers could not load the tokenizer: {event.get('error')}")
        self.res.loaded = True
        return event

    def send(self, msg: dict) -> None:
        z = self.res.zygote
        if z is not None and z.poll() is None:
            try:
                z.stdin.write((json.dumps(msg) + "\n").encode())
                z.stdin.flush()
            except (BrokenPipeError, ValueError, OSError):
                pass

    def fork(self, index: int) -> None:
        self.send({"cmd": "fork", "index": index})

    def take_guards(self) -> None:
        """The file's guard table is in the cache now: the zygote takes the fast encoder."""
        self.send({"cmd": "take_guards"})

    def exit(self) -> None:
        self.send({"cmd": "exit"})

    def wait(self, timeout: float) -> None:
        z = self.res.zygote
        if z is None:
            return
        try:
            z.wait(timeout)
        except subprocess.TimeoutExpired:
            z.kill()
            z.wait()

    @property
    def pid(self) -> int | None:
        z = self.res.zygote
        return z.pid if z is not None else None


def tokenizer_bytes(tok) -> bytes:
    """The tokenizer for the zygote: the file's own bytes while they are unchanged on disk (or
    bundled), else the loaded reference serialized (``admission.sha256`` still names the file,
    as in ``Tokenizer.with_knobs``)."""
    path = Path(tok.files.path)
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        if sha256(raw).hexdigest() == tok.admission.sha256:
            return raw
    except OSError:  # not a file: a tokenizer built from bytes
        pass
    return tok.tokenizer_json()
