"""Shared-memory worker pool: see :class:`Pool`."""
from dtok.pool.frontend import Pool, PoolError

__all__ = ["Pool", "PoolError"]
