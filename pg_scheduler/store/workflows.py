"""Typed access to the workflow statements of ``workflow_sql`` (migration 0014)
through one pool, qualified for one schema: :class:`WorkflowStore`.

See ``workflow_sql`` for what each statement does and why no wake-up is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

import asyncpg

from .names import DEFAULT_SCHEMA, Executor, Qualifier
from .signal_sql import _SIGNAL, _SIGNAL_CHECK, _SIGNAL_KEPT, _SIGNAL_MANY
from .workflow_sql import (
    _CHECKPOINT,
    _FINISH_WAIT,
    _LOAD_MANY,
    _LOCK_FAMILY,
    _LOCK_RUN,
    _PARK,
    _PARK_SLEEP,
    _RECORD,
    _SET_DEADLINE,
    _SPAWN,
    _SPAWNED_ENDED,
    _TAKE_SIGNAL,
    _WAKE_DUE,
)


class Lease(NamedTuple):
    """Which run may write: the job, the worker running it, the attempt."""

    job_id: str
    worker_id: str
    attempt: int


#: A step as read: (seq, kind, name, key, status, result (JSON text), error,
#: attempts, spawned_id, spawned_detached, child_status, child_result (JSON
#: text), child_error). A spawn step still waiting has no result but its
#: child's id and detached flag, and the child's end when its row is final.
StepRow = tuple[Any, ...]


class Loaded(NamedTuple):
    incarnation: int
    deadline: datetime | None
    db_now: datetime
    steps: list[StepRow]


class Spawned(NamedTuple):
    """A child to write: its row's fields and its spawn step's."""

    job_id: str
    job_name: str
    task_name: str
    task_data: str
    priority: int
    max_retries: int
    timeout: float | None
    retry_policy: str | None
    queue: str
    seq: int
    name: str
    key: str
    record: str  # the spawn step's result: {"job_id": ..., "detached": ...}
    # The child's key columns (store/jobs.py NewJob's, in its order).
    concurrency_key: str | None
    max_running_per_key: int | None
    rate_count_per_key: int | None
    rate_period_per_key: float | None
    key_ordered: bool
    fair_share_key: str | None
    fair_share_weight: float | None


class WorkflowStore:
    """The workflow statements of one schema, through one pool."""

    def __init__(self, pool: asyncpg.Pool, schema: str = DEFAULT_SCHEMA) -> None:
        self.pool = pool
        #: The application's own pool (statements of ``ctx.transaction()``
        #: bodies are the application's, not bounded by the scheduler).
        self.raw_pool: asyncpg.Pool = getattr(pool, "raw", pool)
        self.timeout: float | None = getattr(pool, "statement_timeout", None)
        q = Qualifier(schema)
        self._load_many = q(_LOAD_MANY)
        self._set_deadline = q(_SET_DEADLINE)
        self._checkpoint = q(_CHECKPOINT)
        self._record = q(_RECORD)
        self._park_sleep = q(_PARK_SLEEP)
        self._lock_run = q(_LOCK_RUN)
        self._lock_family = q(_LOCK_FAMILY)
        self._take_signal = q(_TAKE_SIGNAL)
        self._spawned_ended = q(_SPAWNED_ENDED)
        self._finish_wait = q(_FINISH_WAIT)
        self._park = q(_PARK)
        self._spawn = q(_SPAWN)
        self._signal = q(_SIGNAL)
        self._signal_check = q(_SIGNAL_CHECK)
        self._signal_many = q(_SIGNAL_MANY)
        self._signal_kept = q(_SIGNAL_KEPT)
        self._wake_due = q(_WAKE_DUE)

    async def load_many(self, db: Executor, job_ids: Sequence[str]) -> dict[str, Loaded]:
        """The starts of several runs, by job id (a job that is gone: absent)."""
        found: dict[str, Loaded] = {}
        for row in await db.fetch(self._load_many, list(job_ids), timeout=self.timeout):
            loaded = found.get(row[0])
            if loaded is None:
                loaded = found[row[0]] = Loaded(row[1], row[2], row[3], [])
            if row[4] is not None:
                loaded.steps.append(tuple(row)[4:])
        return found

    async def set_deadline(self, db: Executor, lease: Lease, seconds: float) -> datetime | None:
        return await db.fetchval(self._set_deadline, *lease, seconds, timeout=self.timeout)

    async def checkpoint(
        self,
        db: Executor,
        lease: Lease,
        seq: int,
        kind: str,
        name: str,
        key: str,
        status: str,
        result: str | None,
        error: str | None,
        attempts: int,
        started_at: datetime | None,
    ) -> tuple[bool, bool]:
        """(the run still holds the job, the record was written)."""
        row = await db.fetchrow(
            self._checkpoint,
            *lease,
            seq,
            kind,
            name,
            key,
            status,
            result,
            error,
            attempts,
            started_at,
            timeout=self.timeout,
        )
        return bool(row["held"]), bool(row["written"])

    async def record(self, db: Executor, job_id: str, seq: int) -> asyncpg.Record | None:
        return await db.fetchrow(self._record, job_id, seq, timeout=self.timeout)

    async def park_sleep(
        self,
        db: Executor,
        lease: Lease,
        seq: int,
        name: str,
        key: str,
        until: datetime | None,
        delay: float,
        lookahead: float,
        started_at: datetime | None,
    ) -> asyncpg.Record | None:
        """(how, until, wake, ...); None: the run no longer holds the job."""
        return await db.fetchrow(
            self._park_sleep,
            *lease,
            seq,
            name,
            key,
            until,
            delay,
            lookahead,
            started_at,
            timeout=self.timeout,
        )

    async def lock_run(self, conn: asyncpg.Connection, lease: Lease) -> asyncpg.Record | None:
        return await conn.fetchrow(self._lock_run, *lease, timeout=self.timeout)

    async def take_signal(
        self, conn: asyncpg.Connection, job_id: str, seq: int, name: str
    ) -> asyncpg.Record | None:
        return await conn.fetchrow(self._take_signal, job_id, seq, name, timeout=self.timeout)

    async def lock_family(self, conn: asyncpg.Connection, job_id: str) -> bool:
        """Lock ``job_id``'s count of children (False: it never spawned)."""
        found = await conn.fetchval(self._lock_family, job_id, timeout=self.timeout)
        return found is not None

    async def spawned_ended(self, db: Executor, job_id: str, seqs: Sequence[int]) -> list[StepRow]:
        """The spawn steps at ``seqs`` whose child has ended, read afresh (as
        :class:`StepRow`); a step whose child has not ended is not returned."""
        rows = await db.fetch(self._spawned_ended, job_id, list(seqs), timeout=self.timeout)
        return [tuple(row) for row in rows]

    async def finish_wait(
        self,
        db: Executor,
        lease: Lease,
        seq: int,
        kind: str,
        name: str,
        key: str,
        result: str,
        started_at: datetime | None,
    ) -> tuple[bool, bool]:
        row = await db.fetchrow(
            self._finish_wait,
            *lease,
            seq,
            kind,
            name,
            key,
            result,
            started_at,
            timeout=self.timeout,
        )
        return bool(row["held"]), bool(row["written"])

    async def park(
        self,
        conn: asyncpg.Connection,
        lease: Lease,
        seq: int,
        kind: str,
        name: str,
        key: str,
        result: str,
        wait_kind: str,
        wait_for: str | None,
        wake_at: datetime | None,
        soon: bool,
        children: tuple[int, int] | None,
        started_at: datetime | None,
        children_left: int | None = None,
    ) -> str | None:
        """The row's new status (waiting, or pending when due soon); None: lost.
        Parked on children: ``children`` the spawn steps waited on (a half-open
        range), ``children_left`` how many of them had not ended."""
        span = None if children is None else asyncpg.Range(children[0], children[1])
        row = await conn.fetchrow(
            self._park,
            *lease,
            seq,
            kind,
            name,
            key,
            result,
            wait_kind,
            wait_for,
            wake_at,
            soon,
            started_at,
            span,
            children_left,
            timeout=self.timeout,
        )
        return None if row is None else str(row["status"])

    async def spawn(
        self,
        db: Executor,
        lease: Lease,
        children: Sequence[Spawned],
        started_at: datetime | None,
    ) -> tuple[bool, int]:
        """(the run still holds the job, how many spawn steps were new)."""
        columns = list(zip(*children, strict=True))
        row = await db.fetchrow(
            self._spawn,
            *lease,
            *(list(c) for c in columns[:10]),
            list(columns[10]),
            list(columns[11]),
            list(columns[12]),
            started_at,
            *(list(c) for c in columns[13:20]),
            timeout=self.timeout,
        )
        return bool(row["held"]), int(row["recorded"])

    async def signal(
        self, db: Executor, job_id: str, name: str, payload: str | None, key: str | None = None
    ) -> asyncpg.Record | None:
        """(status, signal_id, woken); None: no such job. ``signal_id`` is None
        when the job is final, or has a signal of idempotency key ``key``
        already (nothing written either way)."""
        return await db.fetchrow(self._signal, job_id, name, payload, key, timeout=self.timeout)

    async def signal_check(
        self, conn: asyncpg.Connection, job_ids: Sequence[str]
    ) -> list[asyncpg.Record]:
        """Lock the rows of ``job_ids``; (job_id, status) of each unknown (status
        None) or finished one. Inside the caller's transaction."""
        return await conn.fetch(self._signal_check, list(job_ids), timeout=self.timeout)

    async def signal_many(
        self,
        conn: asyncpg.Connection,
        job_ids: Sequence[str],
        names: Sequence[str],
        payloads: Sequence[str | None],
        keys: Sequence[str | None],
    ) -> asyncpg.Record:
        """(sent, woken, notified), after :meth:`signal_check` in the same
        transaction; a signal whose idempotency key its job has is not sent."""
        return await conn.fetchrow(
            self._signal_many,
            list(job_ids),
            list(names),
            list(payloads),
            list(keys),
            timeout=self.timeout,
        )

    async def signal_kept(
        self, db: Executor, job_ids: Sequence[str], keys: Sequence[str]
    ) -> set[tuple[str, str]]:
        """Those of the (job_id, idempotency key) pairs that are stored."""
        rows = await db.fetch(self._signal_kept, list(job_ids), list(keys), timeout=self.timeout)
        return {(row["job_id"], row["idempotency_key"]) for row in rows}

    async def wake_due(self, lookahead: float, limit: int) -> int:
        row = await self.pool.fetchrow(self._wake_due, lookahead, limit)
        return int(row["woken"])
