"""The claim for limited tasks and queues (global ``max_running`` and ``rate_limit``).

The plain claim leaves limited tasks and queues alone; this one claims them
group by group, each group in one short transaction holding the limit rows
it is bound by (see :mod:`pg_scheduler.store.limits`). Which tasks and queues
are limited is read from the database at most every ``REFRESH`` seconds, so
a limit set from another process applies everywhere within about a second.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import asyncpg

from ..store.bounded import BoundedPool
from ..store.limits import LimitStore
from ..store.names import Executor

#: How stale the set of limited tasks and queues may get.
REFRESH = 1.0


@dataclass(frozen=True, slots=True)
class Group:
    """Jobs of ``tasks`` in ``queues`` (None: every queue; ``caps``: the most
    per queue), bound by the limit rows ``keys``."""

    keys: tuple[tuple[str, str], ...]
    tasks: tuple[str, ...]
    queues: tuple[str, ...] | None
    caps: tuple[int, ...] | None = None


class LimitedClaims:
    """Knows which tasks and queues are limited; claims their jobs.

    Which groups of jobs a limit binds is the database's call at each claim
    (the plain claim skips them, the limited claim reads only groups whose
    every binding limit it holds), so a stale view here can delay a limited
    job by up to ``REFRESH`` but never start one past its limit."""

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

    def is_limited(self, task: str, queue: str) -> bool:
        return task in self.tasks or queue in self.queues

    def groups(
        self,
        names: Sequence[str],
        served: Sequence[str] | None,
        caps: Sequence[int] | None,
    ) -> list[Group]:
        """The limited claims a worker running ``names`` in ``served`` (None:
        every queue; ``caps``: the room of each) makes, one per set of limits."""
        cap_of = dict(zip(served, caps, strict=True)) if served is not None and caps else {}
        queues = [
            q for q in sorted(self.queues) if (served is None or q in served) and cap_of.get(q, 1)
        ]
        tasks = [t for t in names if t in self.tasks]
        all_tasks = tuple(names)
        groups = []
        for queue in queues:
            cap = (cap_of[queue],) if queue in cap_of else None
            groups.append(Group((("queue", queue),), all_tasks, (queue,), cap))
        for task in tasks:
            groups.append(
                Group(
                    (("task", task),),
                    (task,),
                    None if served is None else tuple(served),
                    None if caps is None else tuple(caps),
                )
            )
            for queue in queues:
                cap = (cap_of[queue],) if queue in cap_of else None
                groups.append(Group((("queue", queue), ("task", task)), (task,), (queue,), cap))
        return groups

    async def claim(
        self,
        db: Executor,
        names: Sequence[str],
        served: Sequence[str] | None,
        caps: Sequence[int] | None,
        *,
        room: int,
        worker_id: str,
        lease_seconds: float,
    ) -> list[asyncpg.Record]:
        """Claim up to ``room`` jobs across the limited groups."""
        rows: list[asyncpg.Record] = []
        for group in self.groups(names, served, caps):
            if room - len(rows) <= 0:
                break
            rows += await self._claim_group(db, group, room - len(rows), worker_id, lease_seconds)
        return rows

    async def _claim_group(
        self, db: Executor, group: Group, room: int, worker_id: str, lease_seconds: float
    ) -> list[asyncpg.Record]:
        if isinstance(db, asyncpg.Pool | BoundedPool):  # the transaction needs one connection
            async with db.acquire() as conn:
                return await self._claim_group(conn, group, room, worker_id, lease_seconds)
        return await self.store.claim(
            cast(asyncpg.Connection, db),
            group.keys,
            limit=room,
            tasks=group.tasks,
            queues=group.queues,
            caps=group.caps,
            worker_id=worker_id,
            lease_seconds=lease_seconds,
        )
