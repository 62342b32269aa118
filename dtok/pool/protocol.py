"""What the front end and the workers say to each other: operations, statuses, segment names.

The hot path carries no pickles: a request is a few integers in the worker's control block and a
raw string in its payload segment; a reply is a few integers and int32 IDs in shared memory.
"""
from __future__ import annotations

# operations (control block ``op``)
OP_ENCODE = 1  # stateless text or a chunk: body IDs into the result segment
OP_INIT = 2  # a session's whole text: prefix + body + suffix into the session segment
OP_APPEND = 3  # a session's appended text: repair into the session segment
OP_EXIT = 4

# statuses (control block ``status``)
ST_OK = 0
ST_ERROR = 1
ST_NEED_TAIL = 2  # the worker does not hold this session's tail: resend with it
ST_NO_CUT = 3  # no safe cut near the end of the old text: resend as OP_INIT

# flags
FL_HAS_TAIL = 1  # the payload holds the old tail before the appended text

PAYLOAD_MIN = 1 << 20  # bytes
RESULT_MIN = 1 << 20


def control_name(prefix: str, index: int) -> str:
    return f"{prefix}-w{index}-ctl"


def request_sem_name(prefix: str, index: int) -> str:
    return f"{prefix}-w{index}-req"


def done_sem_name(prefix: str) -> str:
    return f"{prefix}-done"


def payload_name(prefix: str, index: int, gen: int) -> str:
    return f"{prefix}-w{index}-in{gen}"


def result_name(prefix: str, index: int, gen: int) -> str:
    return f"{prefix}-w{index}-out{gen}"


def session_name(prefix: str, sid: int, gen: int) -> str:
    return f"{prefix}-s{sid}-g{gen}"


def tail_window(scan_budget: int, max_special_len: int) -> int:
    """Characters of old text a worker keeps per session: enough that every check of a repair
    cut (backward scan, NFC anchors 256 either side, added-token occurrences) stays inside, and
    the window's start is never mistaken for the text's start."""
    return scan_budget + 2 * max_special_len + 1024


def max_ids(utf8_bytes_bound: int, affixes: int) -> int:
    """Upper bound on the IDs of a text: a byte-level BPE token covers at least one byte."""
    return utf8_bytes_bound + affixes
