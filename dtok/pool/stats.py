"""A pool's report: its counters as they are, the gauges read from its parts when asked, and each
process's proportional set size read from ``/proc``."""
from __future__ import annotations

from typing import Any

from dtok.pool.state import PoolState

__all__ = ["pss_mb", "snapshot"]


def pss_mb(pid: int) -> float | None:
    """A process's proportional set size in MiB (its share of pages shared with others)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def snapshot(state: PoolState, header: dict[str, Any], shm_budget,
             zygote_pid: int | None) -> dict[str, Any]:
    """``Pool.stats()``: ``header`` (name, prefix, encoder), the workers, queues, sessions,
    shared memory in use, the counters and estimates, and the processes' PSS (read outside
    the lock: the kernel walks each process's pages)."""
    with state.lock:
        shared, local = state.queues.sizes()
        workers = [{"index": ch.index, "pid": ch.pid, "alive": ch.alive,
                    "starting": bool(ch.ready_by), "busy": ch.task is not None,
                    "tasks_done": ch.done, "starts": ch.starts,
                    "queued_local": local[ch.index]} for ch in state.channels]
        sessions, estimator = state.sessions, state.estimator
        out = {**header, "order": estimator.order, "aging": estimator.aging,
               "workers": workers, "queued_shared": shared,
               "sessions": len(sessions), "session_bytes": sessions.bytes_used,
               "session_segments_made": sessions.segments_made,
               "lists_made": sum(m.lists.made for m in sessions.values()),
               "shm_bytes": shm_budget.used, "shm_limit": shm_budget.limit,
               **state.counts, "per_char_ms": dict(estimator.b),
               "session_inits": state.counts["session_full_encodes"]}  # the old name, one release
    for w in out["workers"]:
        w["pss_mb"] = pss_mb(w["pid"]) if w["alive"] else None
    out["zygote_pss_mb"] = pss_mb(zygote_pid) if zygote_pid else None
    return out
