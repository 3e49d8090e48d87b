"""Reads and writes for weighted fair share (migration 0018; the SQL is in
``fair_sql.py``): the fair claim, whether keyed work is pending, its next
due time, the weights set per key, and the busiest keys for operators."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from .fair_sql import (
    BUSIEST,
    CLEAR_WEIGHT,
    FAIR_CLAIM,
    FAIR_NEXT_DUE,
    FAIR_PENDING,
    FORGET_OLD_STARTS,
    SET_WEIGHT,
)
from .names import Executor, Qualifier


class FairStore:
    """The fair share statements of one schema."""

    def __init__(self, pool: asyncpg.Pool, qualify: Qualifier) -> None:
        self.pool = pool
        self._claim = qualify(FAIR_CLAIM)
        self._pending = qualify(FAIR_PENDING)
        self._next_due = qualify(FAIR_NEXT_DUE)
        self._forget = qualify(FORGET_OLD_STARTS)
        self._set_weight = qualify(SET_WEIGHT)
        self._clear_weight = qualify(CLEAR_WEIGHT)
        self._busiest = qualify(BUSIEST)

    async def claim(
        self,
        worker_id: str,
        task_names: list[str],
        limit: int,
        lease_seconds: float,
        db: Executor | None = None,
        *,
        start_now: int,
        queues: Sequence[str] | None,
        caps: Sequence[int | None] | None,
    ) -> list[asyncpg.Record]:
        """The plain claim's rows and keyed rows together, shared between keys
        by weight (see fair_sql.py); the arguments as for :meth:`Store.claim`."""
        return await (db or self.pool).fetch(
            self._claim,
            task_names,
            limit,
            worker_id,
            lease_seconds,
            start_now,
            None if queues is None else list(queues),
            None if caps is None else list(caps),
        )

    async def pending(self, db: Executor | None = None) -> bool:
        """Whether any row with a fair share key is pending."""
        return bool(await (db or self.pool).fetchval(self._pending))

    async def seconds_until_next_due(
        self, db: Executor, task_names: Sequence[str], queues: Sequence[str] | None
    ) -> float | None:
        """Seconds until the earliest keyed job this worker may claim (<= 0: due)."""
        value = await db.fetchval(
            self._next_due, list(task_names), None if queues is None else list(queues)
        )
        return None if value is None else float(value)

    async def forget_old_starts(self, db: Executor | None = None) -> None:
        """Delete record rows that have decayed to nothing."""
        await (db or self.pool).execute(self._forget)

    async def set_weight(self, key: str, weight: float | None) -> bool:
        """Set key ``key``'s weight (None: remove it); whether a row was written or removed."""
        if weight is None:
            return await self.pool.fetchval(self._clear_weight, key) is not None
        await self.pool.execute(self._set_weight, key, weight)
        return True

    async def busiest(self, limit: int, db: Executor | None = None) -> list[asyncpg.Record]:
        """The ``limit`` busiest keys: fair_share_key, waiting, due, running,
        recent_starts (decayed), weight (set per key, or None)."""
        return await (db or self.pool).fetch(self._busiest, limit)
