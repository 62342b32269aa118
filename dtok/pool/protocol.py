"""What the front end and the workers say to each other: operations, statuses, segment names, and
the wire form of a continuation plan.

The hot path carries no pickles: a request is a few integers in the worker's control block plus,
in its payload segment, an int64 table and one raw string; a reply is a few integers, int64
counts and int32 IDs in shared memory.

Payload layout: ``[n_drops x u64 session ids to forget][plan table, int64][texts, joined, raw
PEP 393]``. Plan table: ``n_texts, len_0 .. len_{n-1}, n_ops, op records``; a REUSE record is
``1, start_anchor_token, start_snippet, start_forward, end_anchor_token, end_snippet,
end_forward``, a FRESH record ``2, first_text, n_pieces``. Report (result segment, int64):
``n_reused, (t0, t1) x n_reused, n_texts, count_0 .. count_{n-1}``.
"""
from __future__ import annotations

import os
import select
from array import array

from dtok.repair import Fresh, Outcome, Plan, Reuse, Seam

# operations (control block ``op``)
OP_ENCODE = 1  # stateless text or a chunk: body IDs into the result segment
OP_SESSION = 2  # a session's plan: prefix + body + suffix into the session segment
OP_EXIT = 4

# statuses (control block ``status``)
ST_OK = 0
ST_ERROR = 1
ST_PLAN_FAILED = 2  # the stored IDs did not hold what the plan says: resend as a full encode

# flags
FL_WAKE_CALLER = 1  # a caller waits on this worker's response semaphore: post it, not "done"

PAYLOAD_MIN = 1 << 20  # bytes
RESULT_MIN = 1 << 20

_REUSE, _FRESH = 1, 2


def lock_name(prefix: str) -> str:
    """The pool's owner lock file in /dev/shm, held (flock) while any of its processes lives."""
    return f"{prefix}-lock"


def control_name(prefix: str, index: int) -> str:
    return f"{prefix}-w{index}-ctl"


def request_sem_name(prefix: str, index: int) -> str:
    return f"{prefix}-w{index}-req"


def response_sem_name(prefix: str, index: int) -> str:
    return f"{prefix}-w{index}-resp"


def done_sem_name(prefix: str) -> str:
    return f"{prefix}-done"


def payload_name(prefix: str, index: int, gen: int) -> str:
    return f"{prefix}-w{index}-in{gen}"


def result_name(prefix: str, index: int, gen: int) -> str:
    return f"{prefix}-w{index}-out{gen}"


def session_name(prefix: str, sid: int, gen: int) -> str:
    return f"{prefix}-s{sid}-g{gen}"


def max_ids(utf8_bytes_bound: int, affixes: int) -> int:
    """Upper bound on the IDs of a text: a byte-level BPE token covers at least one byte."""
    return utf8_bytes_bound + affixes


def plan_table(plan: Plan) -> tuple[array, str]:
    """The plan's int64 table and its texts joined (see the module docstring)."""
    t = array("q", [len(plan.texts)])
    t.extend(len(s) for s in plan.texts)
    t.append(len(plan.ops))
    for op in plan.ops:
        if isinstance(op, Reuse):
            t.extend((_REUSE, op.start.anchor_token, op.start.snippet, op.start.forward,
                      op.end.anchor_token, op.end.snippet, op.end.forward))
        else:
            t.extend((_FRESH, op.first_text, len(op.cuts) + 1))
    return t, "".join(plan.texts)


def read_plan(table, joined: str) -> Plan:
    """The plan a worker executes: ops and texts (positions in the texts are not needed)."""
    t = table.tolist() if hasattr(table, "tolist") else list(table)
    n_texts = t[0]
    texts, pos = [], 0
    for length in t[1 : 1 + n_texts]:
        texts.append(joined[pos : pos + length])
        pos += length
    i = 1 + n_texts
    n_ops = t[i]
    i += 1
    plan = Plan("wire", 0, 0, texts=texts)
    for _ in range(n_ops):
        if t[i] == _REUSE:
            start, end = Seam(t[i + 1], t[i + 2], bool(t[i + 3])), Seam(t[i + 4], t[i + 5], bool(t[i + 6]))
            plan.ops.append(Reuse(0, 0, 0, 0, start, end, (0, 0, 0)))
            i += 7
        elif t[i] == _FRESH:
            plan.ops.append(Fresh(0, 0, [0] * (t[i + 2] - 1), t[i + 1]))
            i += 3
        else:
            raise ValueError(f"bad plan record {t[i]}")
    return plan


def report(outcome: Outcome) -> array:
    r = array("q", [len(outcome.resolved)])
    for t0, t1 in outcome.resolved:
        r.extend((t0, t1))
    r.append(len(outcome.counts))
    r.extend(outcome.counts)
    return r


def read_report(words) -> tuple[list[tuple[int, int]], list[int]]:
    w = words.tolist() if hasattr(words, "tolist") else list(words)
    n = w[0]
    resolved = [(w[1 + 2 * k], w[2 + 2 * k]) for k in range(n)]
    i = 1 + 2 * n
    return resolved, w[i + 1 : i + 1 + w[i]]


# --- the control plane: JSON lines over the zygote's pipes ----------------------------------------


class PipeReader:
    """Lines and byte runs from a pipe, read without a buffered file object: ``select()`` on the
    descriptor must see everything not yet taken (a buffered reader once kept a second line out
    of sight until the start timed out). Used on both ends of the zygote's pipes."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = b""

    def fill(self, timeout: float | None = None) -> bool:
        """Read what the pipe holds, waiting at most ``timeout`` seconds for it (None: until
        something comes); False at end of file."""
        if timeout is not None and not select.select([self.fd], [], [], timeout)[0]:
            return True
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            return False
        self.buf += chunk
        return True

    def take_line(self) -> bytes | None:
        """The next complete line already read (without its newline), or None."""
        if b"\n" not in self.buf:
            return None
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def take(self, n: int) -> bytes | None:
        """The next n bytes already read, or None."""
        if len(self.buf) < n:
            return None
        out, self.buf = self.buf[:n], self.buf[n:]
        return out
