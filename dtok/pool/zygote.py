"""The zygote: a fresh process that loads the tokenizer once and forks the pool's workers.

The front end may have threads (an event loop, encoder threads, fastokens' own pool); forking it
would copy locks held by them. The zygote is started fresh (a new interpreter that imports the
front end's own ``dtok``, see ``zygote_client``),
loads the tokenizer with every library single-threaded (``FASTOKENS_BPE_THREADS=1``,
``TOKENIZERS_PARALLELISM=false``, ``OPENBLAS_NUM_THREADS=1``, ...: see
``zygote_client.ZYGOTE_ENV``), encodes nothing, and forks workers on request, so they share its
pages copy-on-write. Before each fork it checks that it has no other thread.

The tokenizer arrives on stdin after the configuration line (the file's bytes, or the front
end's loaded reference serialized when there is no file), with the file's SHA-256, which keys
the guard tables: so a tokenizer built from bytes can be pooled too.

Control plane (not the hot path): JSON lines. The front end sends the configuration, then
``{"cmd": "fork", "index": i}`` (also to replace a dead worker), ``{"cmd": "take_guards"}`` (a
guard table the front end's probes wrote: the zygote takes the fast encoder, answering
``guards``) and ``{"cmd": "exit"}``; the zygote answers ``loaded``, ``started``, ``dead``,
``guards`` and ``error`` events, and wakes the front end's dispatcher on a
death. When its stdin closes or its stdout breaks (the front end exited or crashed, even while
the zygote was still loading) it kills the workers and unlinks every name of the pool.
"""
from __future__ import annotations

import json
import os
import select
import sys
import time

from dtok.pool.protocol import PipeReader


class FrontEndGone(Exception):
    pass


def _emit(event: dict) -> None:
    try:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()
    except (BrokenPipeError, OSError, ValueError):
        raise FrontEndGone() from None


def _threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


class _Stdin(PipeReader):
    """The front end's pipe (its end of file: the front end is gone)."""

    def __init__(self) -> None:
        super().__init__(sys.stdin.fileno())

    def more(self) -> None:
        if not self.fill():
            raise FrontEndGone()

    def line(self) -> bytes:
        while (line := self.take_line()) is None:
            self.more()
        return line

    def exactly(self, n: int) -> bytes:
        while (out := self.take(n)) is None:
            self.more()
        return out


def main() -> None:
    # The front end starts this process with every library single-threaded (ZYGOTE_ENV).
    stdin = _Stdin()
    try:
        config = json.loads(stdin.line())
        raw = stdin.exactly(config["tokenizer_bytes"])
    except FrontEndGone:
        return
    prefix, name = config["prefix"], config["name"]
    try:
        from setproctitle import setproctitle

        setproctitle(f"dtok-pool[{name}] zygote")
    except ImportError:
        pass
    from dtok.pool import shm

    lock_fd = shm.hold_owner_lock(prefix, create=False)  # noqa: F841 - held until exit
    children: dict[int, int] = {}  # pid -> worker index
    try:
        tok = _load(config, raw)
        del raw
        done_sem = shm.semaphore(config["done_sem"], create=False)
        _emit({"event": "loaded", "encoder": tok.encoder.name, "pid": os.getpid(),
               "threads": _threads()})
        _serve(tok, config, children, done_sem, stdin)
    except FrontEndGone:
        pass
    except Exception as exc:  # noqa: BLE001 - reported, then clean up and exit
        try:
            _emit({"event": "error", "error": f"{type(exc).__name__}: {exc}"})
        except FrontEndGone:
            pass
    finally:
        _stop(children)
        shm.unlink_prefix(prefix)


def _load(config: dict, raw: bytes):
    from pathlib import Path

    from dtok.admission import TokenizerFiles
    from dtok.tokenizer import Tokenizer

    files = TokenizerFiles(Path(config["path"]), raw, config["config"], None, config["sha256"])
    # the front end runs a new file's guard probes; a worker loads what they left in the cache
    return Tokenizer(files, **{**config["knobs"], "guard_probes": "off"})


def _serve(tok, config: dict, children: dict[int, int], done_sem, stdin: _Stdin) -> None:
    starts: dict[int, int] = {}
    hang = config.get("_hang_starts", {})  # private test hook: {index: starts that never come up}
    closing = False
    closing_deadline = float("inf")
    while True:
        while (line := stdin.take_line()) is not None:
            msg = json.loads(line)
            if msg["cmd"] == "fork":
                index = msg["index"]
                if _threads() != 1:  # never fork with another thread's locks held
                    _emit({"event": "error", "error": f"zygote has {_threads()} threads"})
                    return
                starts[index] = starts.get(index, 0) + 1
                pid = os.fork()
                if pid == 0:
                    _become_worker(tok, index, config,
                                   hang=starts[index] <= hang.get(str(index), 0))
                children[pid] = index
                _emit({"event": "started", "index": index, "pid": pid})
            elif msg["cmd"] == "take_guards":
                # the front end's probes wrote the file's guard table: workers forked from
                # now on encode with the fast encoder (the pool renews the running ones)
                _take_guards(tok)
            elif msg["cmd"] == "exit":
                closing = True
                closing_deadline = time.monotonic() + 5  # workers were sent OP_EXIT
        if select.select([stdin.fd], [], [], 0.25)[0]:
            stdin.more()  # FrontEndGone at end of file
            continue
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            index = children.pop(pid, None)
            if index is not None and not closing:
                _emit({"event": "dead", "index": index, "pid": pid, "status": status})
                done_sem.release()
        if closing and (not children or time.monotonic() > closing_deadline):
            return


def _take_guards(tok) -> None:
    try:
        tok.reload_guards()
    except Exception as exc:  # noqa: BLE001 - the reference goes on serving
        _emit({"event": "error", "error": f"guard table not taken: {type(exc).__name__}: {exc}"})
    _emit({"event": "guards", "encoder": tok.encoder.name, "threads": _threads()})


def _stop(children: dict[int, int]) -> None:
    """No worker outlives the pool."""
    from dtok.pool import shm

    for pid in list(children):
        shm.sigkill(pid)
    deadline = time.monotonic() + 5
    while children and time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, 0)
            children.pop(pid, None)
        except ChildProcessError:
            break


def _become_worker(tok, index: int, config: dict, hang: bool = False) -> None:
    """In the forked child: drop the zygote's pipes and run the worker loop."""
    code = 0
    try:
        if hang:  # the test hook: a worker that never comes up
            time.sleep(3600)
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        from dtok.pool import worker

        worker.main(tok, config["prefix"], index, f"dtok-pool[{config['name']}] worker {index}",
                    config["spin_us"], config["worker_nice"])
    except BaseException:  # noqa: BLE001 - a worker must never return into the zygote's loop
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


if __name__ == "__main__":
    main()
