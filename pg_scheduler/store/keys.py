"""The keyed claim: jobs with a ``concurrency_key`` (migration 0017).

The plain claim never reads keyed rows (its index leaves them out). A keyed
claim runs in one transaction of two statements:

1. ``_LOCK_KEYS`` finds the keys with a due head this worker may run whose
   room (read without a lock: an estimate) is not gone, the most urgent
   first, and takes ``pg_try_advisory_xact_lock`` on each one's hash (a key
   another claim holds is skipped: that claim serves it now). With many
   keys, ``_LOCK_LISTED`` instead: the worker passes the next stretch of a
   list of the keys (``_KEY_LIST``, read about once a second, each key with
   its head's limits), and the statement locks the first keys of it whose
   room, estimated from those limits, is not gone, without reading a head.
2. ``_CLAIM_KEYS`` (a fresh snapshot under READ COMMITTED, so it sees every
   start committed before the lock was granted: the holder commits before it
   lets go) counts, per locked key, the rows running and the starts in the
   rate window, and starts at most what each key has room for, each key
   from its head by priority then time; an ordered key only its oldest
   unfinished job (by ``key_seq``), and only if that one is pending and due.
   The starts of rate-limited keys are appended to ``scheduler_key_starts``
   and the key's starts that left the window are dropped, under the same lock.

No row is shared by every claim: two claims on different keys never wait
for each other. The counts come from the job rows themselves, so an expired
lease (the rescuer puts the row back to pending) frees its key's slot, and
nothing survives a crash that could drift. Each job is held to its own
limits (jobs of one key should agree on them).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple

import asyncpg

from .key_sql import _BUSIEST, _CLAIM_KEYS, _KEY_LIST, _LOCK_KEYS, _LOCK_LISTED, _RESTAMP
from .limits import LimitStore
from .names import Executor, Qualifier


class ListedKey(NamedTuple):
    """A key of the list a worker's keyed claims visit, with its head's limits."""

    key: str
    most: int | None
    rate_count: int | None
    rate_period: float | None
    #: Whether it had unfinished ordered jobs.
    ordered: bool
    #: The task and queue of its most urgent pending job (None: an ordered key's).
    task: str | None
    queue: str | None


class KeyedClaim(NamedTuple):
    """What a keyed claim took and saw."""

    #: The rows claimed.
    rows: list[asyncpg.Record]
    #: The keys with due work and room seen, in the order visited (with a
    #: list: the keys taken from, then those another claim held).
    seen: list[str]
    #: The most urgent head this claim could not lock (None with a list).
    held: tuple[int, datetime] | None
    #: With a list: how many of its keys the claim went through.
    reach: int


def lock_class(schema: str) -> int:
    """The advisory lock class (an int4) of one schema's key locks."""
    return zlib.crc32(f"pg_scheduler_keys:{schema}".encode()) - 2**31


class KeyStore:
    """The keyed claim and the per-key listing of one schema."""

    #: Slack on the rate window: the global limits' (LimitStore.RATE_MARGIN).
    RATE_MARGIN = LimitStore.RATE_MARGIN

    def __init__(self, q: Qualifier) -> None:
        self._lock = q(_LOCK_KEYS)
        self._lock_listed = q(_LOCK_LISTED)
        self._key_list = q(_KEY_LIST)
        self._claim = q(_CLAIM_KEYS)
        self._busiest = q(_BUSIEST)
        self._restamp = q(_RESTAMP)
        self._class = lock_class(q.schema)

    async def restamp(
        self,
        conn: asyncpg.Connection,
        *,
        key: str,
        job_id: str,
        worker_id: str,
        attempt: int,
        most: int,
        period: float,
    ) -> bool | None:
        """Move the start stamp of ``job_id`` (this worker's ``attempt``) to now,
        if the key's other starts in the window (at most ``most`` per
        ``period`` seconds) leave room: True; no room:
        False, and its stamp is dropped (the caller hands the job back); None:
        the job is no longer this attempt's (nothing written)."""
        async with conn.transaction():
            await conn.execute(
                "SELECT pg_advisory_xact_lock($1::int, hashtext($2::text))", self._class, key
            )
            return await conn.fetchval(
                self._restamp, key, job_id, worker_id, attempt, most, period, self.RATE_MARGIN
            )

    async def claim(
        self,
        conn: asyncpg.Connection,
        *,
        limit: int,
        tasks: Sequence[str],
        queues: Sequence[str] | None,
        worker_id: str,
        lease_seconds: float,
        cut: bool,
        start_now: int | None = None,
        listed: Sequence[ListedKey] | None = None,
        visit: int = 0,
    ) -> KeyedClaim:
        """Start up to ``limit`` due keyed jobs of ``tasks`` in ``queues``
        (None: every queue), within their keys' limits; ``cut``: only work at
        least as urgent as the most urgent due plain job. Past the first
        ``start_now`` (default: all) rows are claimed ahead, but for
        rate-limited keys, whose rows are taken only as many as start now.

        The keys visited: every key, the most urgent first; or, with
        ``listed`` (a stretch of :meth:`key_list`), the first ``visit`` of
        those whose room (estimated from the limits listed) is not gone."""
        task_list = list(tasks)
        queue_list = None if queues is None else list(queues)
        cut_at: tuple[int | None, datetime | None] = (None, None)
        hints: list[int | None] | None = None
        ordered: list[bool] | None = None
        reach = 0
        async with conn.transaction():
            if listed is None:
                heads = await conn.fetch(
                    self._lock, task_list, queue_list, limit, cut, self.RATE_MARGIN, self._class
                )
                seen = [h["k"] for h in heads]
                locked = [h["k"] for h in heads if h["locked"]]
                held = min(
                    ((h["priority"], h["head"]) for h in heads if not h["locked"]), default=None
                )
            else:
                heads = await conn.fetch(
                    self._lock_listed,
                    task_list,
                    queue_list,
                    [k.key for k in listed],
                    cut,
                    self._class,
                    [k.most for k in listed],
                    [k.rate_count for k in listed],
                    [k.rate_period for k in listed],
                    visit,
                    self.RATE_MARGIN,
                    [k.ordered for k in listed],
                    [k.task for k in listed],
                    [k.queue for k in listed],
                )
                # The keys the statement went through: all, unless it found
                # ``visit`` with room before the end.
                reach = heads[-1]["n"] if len(heads) >= visit else len(listed)
                known = {k.key: k for k in listed}
                locked = [h["k"] for h in heads if h["locked"]]
                hints = [known[k].most for k in locked]
                ordered = [known[k].ordered for k in locked]
                seen = [h["k"] for h in heads if not h["locked"]]
                held = None
                if heads:
                    cut_at = (heads[0]["cut_priority"], heads[0]["cut_head"])
            if not locked:
                return KeyedClaim([], seen, held, reach)
            rows = await conn.fetch(
                self._claim,
                locked,
                task_list,
                queue_list,
                limit,
                worker_id,
                lease_seconds,
                *cut_at,
                self.RATE_MARGIN,
                limit if start_now is None else start_now,
                hints,
                ordered,
            )
        if listed is not None:
            taken = {r["claimed_key"] for r in rows}
            seen = [k for k in locked if k in taken] + seen
        return KeyedClaim(rows, seen, held, reach)

    async def key_list(self, db: Executor, limit: int) -> list[ListedKey]:
        """Up to ``limit`` keys with pending keyed work, the most urgent first
        (the order a keyed claim visits them in), each with the limits of its
        most urgent pending job (None: none, or an ordered key)."""
        return [ListedKey(*r) for r in await db.fetch(self._key_list, limit)]

    async def busiest(self, db: Executor, limit: int = 20) -> list[asyncpg.Record]:
        """The busiest keys (running, then waiting): key, running, waiting, the
        limits, and starts in the rate window."""
        return await db.fetch(self._busiest, limit)
