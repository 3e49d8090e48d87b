"""The claim for limited tasks and queues (global ``max_running`` and ``rate_limit``).

The plain claim leaves limited tasks and queues alone, and while limits
exist it takes only work more urgent than the most urgent due limited work
whose limits have room (see :mod:`pg_scheduler.store.limits`), so that work
gets the next free slot. This claim first asks which limited groups have due
work and room, and the most urgent due unlimited head; then it claims the
groups in order of their most urgent due job, each in one short transaction
holding the limit rows it is bound by, taking only jobs at least as urgent
as that unlimited head. Which tasks and queues are limited is read from the
database at most every ``REFRESH`` seconds (it picks the plain claim's
statement), so a limit set from another process applies everywhere within
about a second.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import cast

import asyncpg

from ..store.bounded import BoundedPool
from ..store.limits import LimitStore
from ..store.names import Executor
from .rate_starts import RateStarts

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

    def __init__(self, store: LimitStore, rate_starts: RateStarts) -> None:
        self.store = store
        #: Where the claim's send time of each rate-limited row goes.
        self.rate_starts = rate_starts
        self.tasks: frozenset[str] = frozenset()
        self.queues: frozenset[str] = frozenset()
        self._loaded_at = float("-inf")
        #: Groups the last claim tried (due, with room as read before their locks).
        self.tried = 0
        #: Due limited groups the last claim saw, with room or not.
        self.seen = 0

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

    def applies(self, names: Sequence[str], served: Sequence[str] | None) -> bool:
        """Whether a limit (as last read) binds work that a worker running
        ``names`` in ``served`` (None: every queue) may claim."""
        if self.queues and (served is None or not self.queues.isdisjoint(served)):
            return True
        return not self.tasks.isdisjoint(names)

    def is_limited(self, task: str, queue: str) -> bool:
        return task in self.tasks or queue in self.queues

    @staticmethod
    def group(
        keys: tuple[tuple[str, str], ...],
        names: Sequence[str],
        served: Sequence[str] | None,
        caps: Sequence[int] | None,
    ) -> Group | None:
        """The claim of the jobs bound by exactly the limit rows ``keys`` (at
        most one queue and one task) that a worker running ``names`` in
        ``served`` (None: every queue; ``caps``: the room of each) makes."""
        cap_of = dict(zip(served, caps, strict=True)) if served is not None and caps else {}
        queues = [n for s, n in keys if s == "queue"]
        tasks = [n for s, n in keys if s == "task"]
        if len(queues) > 1 or len(tasks) > 1 or not keys:
            return None
        if queues:
            queue = queues[0]
            cap = (cap_of[queue],) if queue in cap_of else None
            return Group(keys, tuple(tasks or names), (queue,), cap)
        return Group(
            keys,
            tuple(tasks),
            None if served is None else tuple(served),
            None if caps is None else tuple(caps),
        )

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
        """Claim up to ``room`` jobs across the limited groups with due work
        and room, the most urgent group first, none less urgent than the most
        urgent due unlimited job."""
        best: dict[tuple[tuple[str, str], ...], tuple[int, datetime]] = {}
        cut: tuple[int, datetime] | None = None
        self.seen = 0
        for row in await self.store.due(db, names, served, caps):
            head = (row["priority"], row["head"])
            if row["scopes"] is None:
                cut = head
                continue
            self.seen += 1
            if row["full"]:
                continue
            keys = tuple(zip(row["scopes"], row["names"], strict=True))
            best[keys] = min(best.get(keys, head), head)
        rows: list[asyncpg.Record] = []
        self.tried = 0
        for keys in sorted(best, key=best.__getitem__):
            if cut is not None and best[keys] > cut:
                break
            group = self.group(keys, names, served, caps)
            if group is None:
                continue
            self.tried += 1
            rows += await self._claim_group(
                db, group, room - len(rows), worker_id, lease_seconds, cut
            )
            if room - len(rows) <= 0:
                break
        return rows

    async def _claim_group(
        self,
        db: Executor,
        group: Group,
        room: int,
        worker_id: str,
        lease_seconds: float,
        cut: tuple[int, datetime] | None,
    ) -> list[asyncpg.Record]:
        if isinstance(db, asyncpg.Pool | BoundedPool):  # the transaction needs one connection
            async with db.acquire() as conn:
                return await self._claim_group(conn, group, room, worker_id, lease_seconds, cut)
        sent = time.monotonic()
        rows = await self.store.claim(
            cast(asyncpg.Connection, db),
            group.keys,
            limit=room,
            tasks=group.tasks,
            queues=group.queues,
            caps=group.caps,
            worker_id=worker_id,
            lease_seconds=lease_seconds,
            cut=cut,
        )
        self.rate_starts.claimed_limited(rows, sent)
        return rows
