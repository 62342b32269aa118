"""The pool's sessions, held by the front end: each session's text and anchors, and its IDs in a
shared-memory segment that callers see through read-only views without a copy.

A session is the session core's state (:mod:`dtok.session_core`) whose buffers are segments:
its current segment and its copy-on-write spare, chosen by the same rule as in process. A
worker writes a session's next IDs into its current segment only when the plan changes nothing
but the IDs after a kept prefix *and* no view of the segment is alive; otherwise into the spare
(a caller that holds the previous turn's result while asking for the next one holds a view of
the current segment, not of the spare), copying only the IDs that changed since it was current,
so no segment is created, sized, mapped or faulted in per turn. A spare that a caller still
views, or that is too small, is not written: the turn gets a fresh segment and the spare is
retired (unlinked at once, unmapped when its last view is released).
"""
from __future__ import annotations

from collections import OrderedDict, deque
from typing import Hashable, NamedTuple

from dtok.chunk_encoder import affixed_view
from dtok.pool import protocol
from dtok.pool import shm
from dtok.repair import Anchors, Plan
from dtok.session_core import IN_PLACE, SPARE, SessionState, capacity_for
from dtok_ext.shm import MappedIds, write_ids


class Target(NamedTuple):
    """Where a session task writes: segment generation ``gen`` (== ``old_gen``: in place), the
    generation holding the current IDs (0: none), its capacity in ints, and how many leading
    ints of ``gen`` already hold the current IDs (``valid``; the worker copies the rest of the
    kept prefix)."""
    gen: int
    old_gen: int
    capacity: int
    valid: int


class SessionSegment:
    """One generation of a session's IDs: its segment and the IDs mapped from it (a buffer of
    :class:`~dtok.session_core.SessionBuffers`)."""
    __slots__ = ("seg", "ids", "gen")

    def __init__(self, seg: shm.Segment, ids: MappedIds, gen: int) -> None:
        self.seg, self.ids, self.gen = seg, ids, gen

    @property
    def exports(self) -> int:
        return self.ids.exports

    @property
    def capacity(self) -> int:
        return self.ids.capacity

    def __len__(self) -> int:
        return self.ids.length


class PoolSession(SessionState):
    __slots__ = ("key", "sid", "n_body", "last_gen", "queue", "inflight", "known_by", "content")
    ACCOUNT_CAPACITY = False  # a segment holds room for the most IDs a turn could have

    def __init__(self, key: Hashable, sid: int) -> None:
        super().__init__()
        self.key, self.sid = key, sid
        self.n_body = 0
        self.last_gen = 0  # generations are never reused: a worker caches mappings by them
        self.queue: deque = deque()
        self.inflight = None  # the request whose task is queued or running
        self.known_by: int | None = None  # the worker that last mapped its segment
        self.content = False  # found by content lookup (no key of its own)

    @property
    def ids(self) -> MappedIds | None:
        """The session's IDs, mapped (what results are views of), or None."""
        current = self.buffers.current
        return current.ids if current is not None else None


class SessionTable:
    """Sessions by key, least recently used first; bounded by ``max_sessions`` and
    ``session_bytes`` (text, IDs, anchors and lists)."""

    def __init__(self, prefix: str, budget: shm.Budget, prefix_ids: tuple, suffix_ids: tuple,
                 max_sessions: int, session_bytes: int) -> None:
        self.prefix = prefix
        self.budget = budget
        self.prefix_ids, self.suffix_ids = prefix_ids, suffix_ids
        self.n_prefix, self.n_suffix = len(prefix_ids), len(suffix_ids)
        self.max_sessions = max_sessions
        self.session_bytes = session_bytes
        self.bytes_used = 0
        self._by_key: OrderedDict[Hashable, PoolSession] = OrderedDict()
        self._next_sid = 1
        self._clock = 0
        self.n_content = 0  # sessions made for content lookup
        self.segments_made = 0  # session segments created (a spare reused is not one)
        self._pending: dict[tuple[int, int], shm.Segment] = {}  # (sid, gen) -> segment in flight
        self._retired: list[tuple[shm.Segment, MappedIds | None]] = []

    def __len__(self) -> int:
        return len(self._by_key)

    def find(self, key: Hashable) -> PoolSession | None:
        """The session kept under ``key``, or None (none is made)."""
        return self._by_key.get(key)

    def get(self, key: Hashable) -> PoolSession:
        session = self._by_key.get(key)
        if session is None:
            session = self._by_key[key] = PoolSession(key, self._next_sid)
            self._next_sid += 1
        return session

    def holds(self, session: PoolSession) -> bool:
        """Whether ``session`` is still in the table (not dropped since it was looked up)."""
        return self._by_key.get(session.key) is session

    def new_content(self) -> PoolSession:
        """A session for an unkeyed text that content lookup did not place."""
        session = self.get(("dtok-content", self._next_sid))
        session.content = True
        self.n_content += 1
        return session

    def values(self):
        return list(self._by_key.values())

    # --- segments -------------------------------------------------------------------------

    def target(self, session: PoolSession, plan: Plan, bound: int) -> Target:
        """Where a task whose new IDs are at most ``bound`` writes: the current segment when the
        plan may be done in place, nothing holds a view and it fits; else the spare when no view
        of it is alive and it fits; else a fresh segment (ShmFull if it cannot be made)."""
        held = session.buffers
        current = held.current
        old = current.gen if current is not None and session.text is not None else 0
        where = held.where(bound, may_write_in_place=bool(old) and plan.kind != "encode"
                           and plan.in_place)
        if where == IN_PLACE:
            return Target(old, old, current.capacity, 0)
        old = old if plan.kind != "encode" else 0
        if where == SPARE:
            valid = held.spare_valid if old else 0
            spare = held.take_spare()  # in flight: a task that does not complete drops it
            self._pending[(session.sid, spare.gen)] = spare.seg
            spare.ids.release()
            return Target(spare.gen, old, spare.capacity, valid)
        capacity = capacity_for(bound)
        self._new_segment(session, 4 * capacity)
        return Target(session.last_gen, old, capacity, 0)

    def _new_segment(self, session: PoolSession, nbytes: int) -> shm.Segment:
        """A fresh segment for the session's next generation, pending until accepted. When
        shared memory is short, the spares of idle sessions are given back first."""
        name = protocol.session_name(self.prefix, session.sid, session.last_gen + 1)
        try:
            seg = shm.Segment(name, nbytes, True, self.budget)
        except shm.ShmFull:
            if not self.drop_spares():
                raise
            seg = shm.Segment(name, nbytes, True, self.budget)
        session.last_gen += 1
        self.segments_made += 1
        self._pending[(session.sid, session.last_gen)] = seg
        return seg

    def segment_map(self, session: PoolSession, gen: int):
        """The mapping of a session's segment ``gen``: its current one, or one a turn is
        being written into (:meth:`target`)."""
        current = session.buffers.current
        if current is not None and gen == current.gen:
            return current.seg.map
        return self._pending[(session.sid, gen)].map

    def drop_spares(self) -> int:
        """Retire every session's spare (shared memory ran short); how many there were."""
        n = 0
        for session in self._by_key.values():
            if session.buffers.spare is not None:
                self._retire_spare(session)
                n += 1
        return n

    def accept(self, session: PoolSession, gen: int, capacity: int, text: str, n_body: int,
               anchors: Anchors, worker: int | None, keep: int) -> None:
        """A task's result becomes the session's state (``keep``: its leading IDs, prefix
        included, that equal the previous state's)."""
        held = session.buffers
        current = held.current
        if current is None or gen != current.gen:
            seg = self._pending.pop((session.sid, gen))
            written = SessionSegment(seg, MappedIds(seg.map, capacity), gen)
            # the current segment becomes the spare; the spare before it is retired
            self._retire(held.replace(written, keep))
            current = written
        else:
            held.written_in_place(keep)
        session.text, session.n_body, session.anchors = text, n_body, anchors
        session.known_by = worker
        current.ids.length = self.n_prefix + n_body + self.n_suffix
        self._clock += 1
        session.used = self._clock
        self._account(session)
        self._by_key.move_to_end(session.key)

    def adopt(self, session: PoolSession, text: str, parts: list, anchors: Anchors) -> bool:
        """A stateless result (body IDs in ``parts``) becomes a session's state: written into a
        new segment, as a worker would have. False when shared memory cannot be had."""
        n_body = sum(len(p) for p in parts)
        capacity = capacity_for(self.n_prefix + n_body + self.n_suffix)
        try:
            seg = self._new_segment(session, 4 * capacity)
        except shm.ShmFull:
            return False
        write_ids(seg.map, 0, [self.prefix_ids, *parts, self.suffix_ids])
        self.accept(session, session.last_gen, capacity, text, n_body, anchors, None, 0)
        return True

    def drop_pending(self, session: PoolSession, gen: int) -> None:
        """A task that will not complete: release the segment made for it."""
        seg = self._pending.pop((session.sid, gen), None)
        if seg is not None:
            seg.close()
            seg.unlink()

    def view(self, session: PoolSession, add_special_tokens: bool, keep: int) -> memoryview:
        """The session's IDs for a request that left ``keep`` leading IDs (prefix included) as
        they were."""
        session.lists.note(keep)
        return affixed_view(session.ids, add_special_tokens, self.n_prefix, self.n_suffix)

    def as_list(self, session: PoolSession, add_special_tokens: bool, keep: int) -> list:
        """The session's IDs as a list, updated in O(changed) (``keep``: as for :meth:`view`)."""
        out = session.lists.get(add_special_tokens, self.view(session, add_special_tokens, keep),
                                self.n_prefix)
        self._account(session)
        return out

    def reset(self, session: PoolSession) -> None:
        """Forget a session's state (its IDs may be half written)."""
        self.retire(session)
        session.text, session.anchors, session.n_body, session.known_by = None, None, 0, None
        session.lists.clear()

    def retire(self, session: PoolSession) -> None:
        """Let go of the session's segments (each unmapped once no view of it is alive)."""
        for segment in session.buffers.restart(None):
            self._retire(segment)
        self.reap()

    def _retire_spare(self, session: PoolSession) -> None:
        self._retire(session.buffers.take_spare())

    def _retire(self, segment: SessionSegment | None) -> None:
        if segment is not None:
            segment.seg.unlink()
            self._retired.append((segment.seg, segment.ids))

    def reap(self, force: bool = False) -> None:
        keep = []
        for seg, ids in self._retired:
            if ids is not None and ids.exports:
                if not force:
                    keep.append((seg, ids))
                continue  # a caller still holds a view: the mapping lives as long as it does
            if ids is not None:
                ids.release()
            seg.close()
        self._retired = keep

    # --- bounds ---------------------------------------------------------------------------

    def _account(self, session: PoolSession) -> None:
        self.bytes_used += session.recount()

    def drop(self, session: PoolSession) -> None:
        if self._by_key.pop(session.key, None) is not None and session.content:
            self.n_content -= 1
        self.bytes_used -= session.nbytes
        session.nbytes = 0
        self.reset(session)

    def victims(self, force: bool = False, content_limit: int | None = None) -> list[PoolSession]:
        """Idle sessions to drop, least recently used first: while over the bounds (or, with
        ``force``, one, to make room in shared memory; content sessions beyond
        ``content_limit``)."""
        out = []
        over_n = len(self._by_key) - self.max_sessions
        over_b = self.bytes_used - self.session_bytes
        over_c = self.n_content - content_limit if content_limit is not None else 0
        for session in self._by_key.values():
            if not (over_n > 0 or over_b > 0 or over_c > 0 or (force and not out)):
                break
            if over_c > 0 and not (over_n > 0 or over_b > 0 or force) and not session.content:
                continue
            if session.inflight is not None or session.queue:
                continue
            out.append(session)
            over_n -= 1
            over_b -= session.nbytes
            over_c -= session.content
        return out

    def close(self) -> None:
        for session in self.values():
            self.drop(session)
        for seg in self._pending.values():
            seg.close()
            seg.unlink()
        self._pending.clear()
        self.reap(force=True)
