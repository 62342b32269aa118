"""Shared-memory worker pool: see :class:`Pool`.

Modules, in the order a request meets them: ``api`` (Pool: the public API and the wiring of
the parts) and ``aio`` (its event-loop face), ``routing``, ``session_flow`` (a session's
turns), ``dispatch`` (tasks to workers, answers back), ``answers``, ``failover`` (typed
reasons, the in-process route), ``supervision`` (the workers' lives), ``stats``, over one
``state``; ``scheduler`` (queues and their keys), ``shared_sessions`` (sessions and their
segments), ``channel`` (the wire to one worker), ``zygote_client`` (starting and replacing
workers), ``protocol`` (operations and the wire form of a plan), ``shm`` (segments, budget,
owner lock, sweep); in the workers' processes: ``zygote`` and ``worker``.
"""
from dtok.pool.api import AGING, Pool, PoolError

__all__ = ["Pool", "PoolError", "AGING"]
