"""The claim for limited tasks and queues (global ``max_running`` and ``rate_limit``).

The plain claim leaves limited tasks and queues alone; this one claims them
group by group, each group in one short transaction holding the limit rows
it is bound by (see :mod:`pg_scheduler.store.limits`). Which tasks and queues
are limited is read from the database at most every ``REFRESH`` seconds, so
a limit set from another process applies everywhere within about a second.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import cast

import asyncpg

from ..store.limits import LimitStore
from ..store.names import Executor

#: How stale the set of limited tasks and queues may get.
REFRESH = 1.0


@dataclass(frozen=True, slots=True)
class Group:
    """Jobs of ``tasks`` in ``queues``, bound by the limit rows ``keys``."""

    keys: tuple[tuple[str, str], ...]
    tasks: tuple[str, ...]
    queues: tuple[str, ...]


class LimitedClaims:
    """Knows which tasks and queues are limited; claims their jobs."""

    def __init__(self, store: LimitStore) -> None:
        self.store = store
        self.tasks: frozenset[str] = frozenset()
        self.queues: frozenset[str] = frozenset()
        self._loaded_at = float("-inf")

    @property
    def active(self) -> bool:
        return bool(self.tasks or self.queues)

    def forget(self) -> None:
        """Reload the limited set before the next claim (a limit just changed here)."""
        self._loaded_at = float("-inf")

    async def refresh(self, db: Executor) -> None:
        if time.monotonic() - self._loaded_at < REFRESH:
            return
        keys = await self.store.keys(db)
        self.tasks = frozenset(n for s, n in keys if s == "task")
        self.queues = frozenset(n for s, n in keys if s == "queue")
        self._loaded_at = time.monotonic()

    def unlimited(self, names: Iterable[str]) -> list[str]:
        """The tasks the plain claim may take (no task limit)."""
        return [n for n in names if n not in self.tasks]

    def is_limited(self, task: str, queue: str = "default") -> bool:
        return task in self.tasks or queue in self.queues

    def groups(self, names: Sequence[str], queues: Sequence[str]) -> list[Group]:
        """The limited claims a worker running ``names`` in ``queues`` makes."""
        plain_tasks = tuple(n for n in names if n not in self.tasks)
        limited_tasks = [n for n in names if n in self.tasks]
        plain_queues = tuple(q for q in queues if q not in self.queues)
        limited_queues = [q for q in queues if q in self.queues]
        groups = []
        for queue in limited_queues:
            if plain_tasks:
                groups.append(Group((("queue", queue),), plain_tasks, (queue,)))
        for task in limited_tasks:
            if plain_queues:
                groups.append(Group((("task", task),), (task,), plain_queues))
            for queue in limited_queues:
                groups.append(Group((("queue", queue), ("task", task)), (task,), (queue,)))
        return groups

    async def claim(
        self,
        db: Executor,
        names: Sequence[str],
        queues: Sequence[str],
        *,
        room: int,
        worker_id: str,
        lease_seconds: float,
    ) -> list[asyncpg.Record]:
        """Claim up to ``room`` jobs across the limited groups."""
        rows: list[asyncpg.Record] = []
        for group in self.groups(names, queues):
            if room - len(rows) <= 0:
                break
            rows += await self._claim_group(db, group, room - len(rows), worker_id, lease_seconds)
        return rows

    async def _claim_group(
        self, db: Executor, group: Group, room: int, worker_id: str, lease_seconds: float
    ) -> list[asyncpg.Record]:
        if isinstance(db, asyncpg.Pool):  # the transaction needs one connection
            async with db.acquire() as conn:
                return await self._claim_group(conn, group, room, worker_id, lease_seconds)
        return await self.store.claim(
            cast(asyncpg.Connection, db),
            group.keys,
            limit=room,
            tasks=group.tasks,
            queues=group.queues,
            worker_id=worker_id,
            lease_seconds=lease_seconds,
        )
