"""The zygote: a fresh process that loads the tokenizer once and forks the pool's workers.

The front end may have threads (an event loop, encoder threads, fastokens' own pool); forking it
would copy locks held by them. The zygote is started fresh (``python -m dtok.pool.zygote``),
loads the tokenizer with every encoder single-threaded (``FASTOKENS_BPE_THREADS=1``,
``TOKENIZERS_PARALLELISM=false``), encodes nothing, and forks workers on request, so they share
its pages copy-on-write.

Control plane (not the hot path): JSON lines. The front end sends the configuration, then
``{"cmd": "fork", "index": i}`` and ``{"cmd": "exit"}``; the zygote answers ``loaded``,
``started``, ``dead`` events, and wakes the front end's dispatcher on a death. When its stdin
closes (the front end exited or crashed) it kills the workers and unlinks every segment and
semaphore of the pool.
"""
from __future__ import annotations

import json
import os
import select
import signal
import sys
import time


def _emit(event: dict) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def main() -> None:
    os.environ["FASTOKENS_BPE_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    config = json.loads(sys.stdin.readline())
    prefix, name = config["prefix"], config["name"]
    try:
        from setproctitle import setproctitle

        setproctitle(f"dtok-pool[{name}] zygote")
    except ImportError:
        pass
    from dtok.admission import bundled_files, read_files
    from dtok.pool import shm
    from dtok.pool.protocol import done_sem_name
    from dtok.tokenizer import Tokenizer

    try:
        files = bundled_files() if config["bundled"] else read_files(config["path"])
        tok = Tokenizer(files, **config["knobs"])
        if tok.admission.sha256 != config["sha256"]:
            raise RuntimeError("the tokenizer file changed on disk since the front end loaded it")
    except Exception as exc:  # reported, then exit
        _emit({"event": "error", "error": f"{type(exc).__name__}: {exc}"})
        return
    done_sem = shm.semaphore(done_sem_name(prefix), create=False)
    _emit({"event": "loaded", "encoder": tok.encoder.name, "pid": os.getpid()})

    children: dict[int, int] = {}  # pid -> worker index
    stdin = sys.stdin.fileno()
    buf = b""
    closing = False
    closing_deadline = float("inf")
    while True:
        ready, _, _ = select.select([stdin], [], [], 0.05)
        if ready:
            chunk = os.read(stdin, 65536)
            if not chunk:  # the front end is gone
                break
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                msg = json.loads(line)
                if msg["cmd"] == "fork":
                    index = msg["index"]
                    pid = os.fork()
                    if pid == 0:
                        _become_worker(tok, prefix, index, config, name)
                    children[pid] = index
                    _emit({"event": "started", "index": index, "pid": pid})
                elif msg["cmd"] == "exit":
                    closing = True
                    closing_deadline = time.monotonic() + 5  # workers were sent OP_EXIT
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
            break
    # Front end gone (or closing): no worker outlives the pool, no segment outlives it either.
    for pid in list(children):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while children and time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, 0)
            children.pop(pid, None)
        except ChildProcessError:
            break
    shm.unlink_prefix(prefix)


def _become_worker(tok, prefix: str, index: int, config: dict, name: str) -> None:
    """In the forked child: drop the zygote's pipes and run the worker loop."""
    code = 0
    try:
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        from dtok.pool import worker

        worker.main(tok, prefix, index, config["worker_sessions"],
                    f"dtok-pool[{name}] worker {index}", config.get("spin_us", 0))
    except BaseException:  # noqa: BLE001 - a worker must never return into the zygote's loop
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


if __name__ == "__main__":
    main()
