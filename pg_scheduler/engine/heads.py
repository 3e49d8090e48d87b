"""Where the plain claim starts reading each group of pending rows.

The plain claim finds each (queue, task, priority) group's head with an index
search from the group's start (store/queues.py), which walks every dead index
entry at the group's front: one per job claimed since VACUUM last passed.
Normally VACUUM removes them within seconds and the walk is short. While a
long transaction pins the xmin horizon (a session idle in transaction, a long
report, a replica's feedback), nothing can be removed, the front grows with
every job, and every claim and next-due probe walks all of it: throughput
collapses within minutes.

So, while the worker claims, it reads the group heads (the same walk, once)
about every second on a pool connection beside the claim loop, and times the
read. While reads are quick, claims are the plain ones. After two reads in a
row slower than :data:`SLOW`, the worker claims with floors until a read is
quick again: each group the last read found is searched from its head less
:data:`MARGIN` (an index bound: the walk covers the margin only), and each
claim moves its groups' floors up to the oldest row it took, less the margin.

What a floor costs: a pending row the last read did not see (its group had
no pending row then, or it is dated before its group's floor: a rescued job,
a job scheduled in the past, a row whose inserting transaction stayed open
longer than the margin) waits for the next read, at most
``max(INTERVAL, 4 x the last read's time)``; the floors are dropped when no
read succeeded for :data:`STALE` seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from ..store.queues import Floors
from .executor import log

#: A read of the group heads slower than this (seconds), twice in a row, turns the floors on.
SLOW = 0.02
#: A read quicker than this turns them off.
QUICK = 0.01
#: How often the heads are read while the worker claims (seconds, at least).
INTERVAL = 1.0
#: How far below a group's head its floor is (rows committed late, dated earlier).
MARGIN = timedelta(seconds=1)
#: Floors older than this (no read succeeded since) are not used (seconds).
STALE = 10.0

Group = tuple[str, str, int]
ReadHeads = Callable[[list[str], Sequence[str] | None], Awaitable[list[Any]]]


class ClaimHeads:
    """The floors of the plain claim's groups, and the reader that keeps them."""

    def __init__(self, read: ReadHeads) -> None:
        self._read = read
        self._floors: dict[Group, datetime] = {}
        self._read_at = float("-inf")
        self._slow_reads = 0
        self.on = False
        self.last_read_seconds = 0.0

    def floors(self) -> Floors | None:
        """The groups and floors for the next claim, or None: claim every group
        from its start."""
        if not self.on or time.monotonic() - self._read_at > STALE:
            return None
        groups = self._floors
        return Floors(
            [g[0] for g in groups],
            [g[1] for g in groups],
            [g[2] for g in groups],
            list(groups.values()),
        )

    def claimed(self, rows: Sequence[Any]) -> None:
        """Move the floors of the groups ``rows`` were claimed from up to their
        oldest row less the margin (a claim reads each group in execution_time
        order, so no unlocked pending row was left before it)."""
        if not self.on or not rows:
            return
        oldest: dict[Group, datetime] = {}
        for r in rows:
            group = (r["queue"], r["task_name"], r["priority"])
            when = r["execution_time"]
            if group not in oldest or when < oldest[group]:
                oldest[group] = when
        floors = self._floors
        for group, when in oldest.items():
            floor = floors.get(group)
            if floor is not None and when - MARGIN > floor:
                floors[group] = when - MARGIN

    async def read(self, names: list[str], queues: Sequence[str] | None) -> None:
        """Read the heads now, time the read, and turn the floors on or off."""
        started = time.monotonic()
        rows = await self._read(names, queues)
        took = self.last_read_seconds = time.monotonic() - started
        self._floors = {
            (r["queue"], r["task_name"], r["priority"]): r["execution_time"] - MARGIN for r in rows
        }
        self._read_at = time.monotonic()
        self._slow_reads = self._slow_reads + 1 if took > SLOW else 0
        was = self.on
        if self._slow_reads >= 2:
            self.on = True
        elif took < QUICK:
            self.on = False
        if self.on != was:
            log.info(
                "claim floors " + ("on" if self.on else "off"),
                read_ms=round(took * 1000, 1),
                groups=len(rows),
            )

    def next_read_in(self) -> float:
        return max(INTERVAL, 4 * self.last_read_seconds)

    async def keep(
        self,
        served: Callable[[], tuple[list[str], Sequence[str] | None]],
        claims_sent: Callable[[], int],
    ) -> None:
        """Read the heads every :meth:`next_read_in` seconds while claims are sent
        (``served``: the task names and queues the plain claim serves), or
        while the floors are on. Runs until cancelled."""
        seen = claims_sent()
        while True:
            await asyncio.sleep(self.next_read_in())
            sent = claims_sent()
            if sent == seen and not self.on:
                continue
            seen = sent
            try:
                await self.read(*served())
            except Exception as exc:
                # Without a read the floors go stale and the claim reads every group.
                log.debug("reading the group heads failed", error=repr(exc))
