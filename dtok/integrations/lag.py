"""An event-loop lag probe for a serving process: how late the loop runs its callbacks, and the
stack of every stall.

With ``DTOK_LOOP_LAG=PATH`` (``{pid}`` expands to the process id) in the server's environment,
the engine hooks start it on the first request's event loop. A callback scheduled every
millisecond measures its own lateness (the lag: a request waiting on the loop waits that long);
a watchdog thread takes the loop thread's stack once a beat is more than ``STALL_MS`` late, so
each stall is named by what held the loop. Every second the probe writes PATH as JSON: beats,
a lag histogram (cumulative, 0.1 ms bins up to 20 ms, 1 ms above; a reader diffs two snapshots
for a window), the maximum, and the stalls (start time, duration, stack, whether its innermost frame is
dtok's code, whether the loop was in native code: waiting for the GIL or in a C extension, and
``on_cpu``: the share of the stall, from when the watchdog saw it to its end, that the loop's
thread spent on a CPU; near 0, the loop was waiting — for the GIL, or for a CPU the machine
gave to other threads — whatever its stack says it was doing).
"""
from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
import traceback

__all__ = ["STALL_MS", "LoopLagProbe", "start_on_running_loop", "percentile"]

STALL_MS = 5.0
INTERVAL_S = 0.001
_DTOK_FILES = 'File "' + os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_PROBE_FILE = 'File "' + os.path.abspath(__file__) + '"'
_PROBE: "LoopLagProbe | None" = None
_LOCK = threading.Lock()


def _innermost_file(stack: list[str]) -> str:
    files = [line for line in stack if line.lstrip().startswith("File ")]
    return files[-1] if files else ""


def _innermost_is_dtok(stack: list[str]) -> bool:
    """The loop was running dtok's code: its innermost Python frame is dtok's, and not this
    probe's own beat (a loop late inside that callback waited for the GIL)."""
    innermost = _innermost_file(stack)
    return _DTOK_FILES in innermost and _PROBE_FILE not in innermost


def _waited_natively(stack: list[str]) -> bool:
    """The loop waited in native code (for the GIL, in a C extension), not in a Python
    callback: its top frame is the loop itself, or this probe's own beat."""
    return bool(stack) and ("run_until_complete" in stack[-1]
                            or _PROBE_FILE in _innermost_file(stack))


def _bin(lag_ms: float) -> int:
    """Histogram bin: tenths of a millisecond below 20 ms, then whole milliseconds (200 + ms)."""
    return int(lag_ms * 10) if lag_ms < 20 else 200 + int(lag_ms)


def _bin_ms(b: int) -> float:
    """The upper edge of bin ``b`` in milliseconds."""
    return (b + 1) / 10 if b < 200 else float(b - 200 + 1)


def percentile(hist: dict, q: float) -> float:
    """The ``q`` quantile (0-1) of a histogram {bin: count} (as :class:`LoopLagProbe` writes
    it; keys may be strings), as its bin's upper edge in ms."""
    items = sorted((int(b), n) for b, n in hist.items() if n > 0)
    total = sum(n for _b, n in items)
    if not total:
        return 0.0
    seen = 0
    for b, n in items:
        seen += n
        if seen >= q * total:
            return _bin_ms(b)
    return _bin_ms(items[-1][0])


class LoopLagProbe:
    """The probe of one event loop (see the module docstring)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, path: str) -> None:
        self.loop = loop
        self.path = path.replace("{pid}", str(os.getpid()))
        self.thread_id = threading.get_ident()  # started from the loop's thread
        self.beats = 0
        self.hist: dict[int, int] = {}
        self.max_ms = 0.0
        self.stalls: list[dict] = []
        self._due = 0.0
        self._last_beat = time.perf_counter()
        self._pending: dict | None = None  # the stall being watched
        self._lock = threading.Lock()
        try:  # the loop thread's CPU time, readable from the watchdog's thread
            self._cpu_clock: int | None = time.pthread_getcpuclockid(self.thread_id)
        except (AttributeError, OSError):  # not on this platform
            self._cpu_clock = None

    def start(self) -> None:
        self._due = time.perf_counter() + INTERVAL_S
        self.loop.call_later(INTERVAL_S, self._beat)
        threading.Thread(target=self._watch, name="dtok-loop-lag", daemon=True).start()

    def _beat(self) -> None:
        now = time.perf_counter()
        lag_ms = max(0.0, (now - self._due) * 1000)
        with self._lock:
            self.beats += 1
            b = _bin(lag_ms)
            self.hist[b] = self.hist.get(b, 0) + 1
            self.max_ms = max(self.max_ms, lag_ms)
            if self._pending is not None:
                # the watchdog saw the loop silent; a stall only if this beat was late too
                # (not when the loop slept past its timer)
                if lag_ms >= STALL_MS:
                    self._pending["ms"] = round(lag_ms, 2)
                    cpu0, t0 = self._pending.pop("_cpu0", None), self._pending.pop("_t0")
                    if cpu0 is not None and now > t0:
                        self._pending["on_cpu"] = round(
                            min(1.0, (time.thread_time() - cpu0) / (now - t0)), 2)
                    self.stalls.append(self._pending)
                self._pending = None
            self._last_beat = now
        self._due = now + INTERVAL_S
        self.loop.call_later(INTERVAL_S, self._beat)

    def _watch(self) -> None:
        next_write = time.monotonic() + 1.0
        while not self.loop.is_closed():
            time.sleep(0.001)
            now = time.perf_counter()
            with self._lock:
                late_ms = (now - self._last_beat - INTERVAL_S) * 1000
                if late_ms > STALL_MS and self._pending is None:
                    frame = sys._current_frames().get(self.thread_id)
                    stack = traceback.format_stack(frame)[-14:] if frame is not None else []
                    self._pending = {
                        "t": round(time.time() - late_ms / 1000, 4),
                        "stack": [line.rstrip() for line in stack],
                        "dtok": _innermost_is_dtok(stack),
                        "native": _waited_natively(stack), "_t0": now,
                        "_cpu0": None if self._cpu_clock is None
                        else time.clock_gettime(self._cpu_clock)}
            if time.monotonic() >= next_write:
                self.write()
                next_write = time.monotonic() + 1.0

    def snapshot(self) -> dict:
        with self._lock:
            return {"pid": os.getpid(), "time": time.time(), "beats": self.beats,
                    "interval_ms": INTERVAL_S * 1000, "stall_ms": STALL_MS,
                    "max_ms": round(self.max_ms, 2), "hist": dict(self.hist),
                    "stalls": list(self.stalls)}

    def write(self) -> None:
        try:
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.snapshot(), f)
            os.replace(tmp, self.path)
        except OSError:
            pass  # never fail a server over its probe


def start_on_running_loop() -> "LoopLagProbe | None":
    """Start the probe on the running loop when ``DTOK_LOOP_LAG`` is set (once per process)."""
    global _PROBE
    path = os.environ.get("DTOK_LOOP_LAG")
    if not path or _PROBE is not None:
        return _PROBE
    with _LOCK:
        if _PROBE is None:
            _PROBE = LoopLagProbe(asyncio.get_running_loop(), path)
            _PROBE.start()
    return _PROBE
