"""The Store: typed access to ``scheduled_jobs`` (insert, claim, the in-process
start, complete/retry/fail, release, cancel, read) through one asyncpg pool.
The statements themselves are in :mod:`pg_scheduler.store.job_sql`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import asyncpg

from ..enums import DEFAULT_QUEUE
from ..support.codec import encode_json
from .event_sql import _EMIT, _WANTED
from .fair import FairStore
from .job_sql import (
    _CANCEL,
    _CLAIM,
    _CLAIM_SEEDED,
    _COMPLETE,
    _COMPLETE_AND_DELETE,
    _COMPLETE_AND_DELETE_UNLOCKED,
    _COMPLETE_HANDING,
    _COMPLETE_UNLOCKED,
    _EXISTING_IDS,
    _FAIL,
    _GET_JOB,
    _GET_JOB_UNBATCHED,
    _INSERT_FROM_ARRAYS,
    _INSERT_ONE,
    _INSERT_RUNNING,
    _NEXT_DUE,
    _NEXT_DUE_SEEDED,
    _RELEASE,
    _RELEASE_GHOSTS,
    _RELEASE_LOCAL_START,
    _RELEASE_UNOWNED,
    _REPLACE_SET,
    _RETRY,
    _SET_STATUS,
)
from .keys import KeyStore
from .limits import LimitStore
from .names import CANCEL_CHANNEL, DEFAULT_SCHEMA, JOBS_CHANNEL, Executor, Qualifier
from .queues import GROUP_HEADS, Floors
from .workers import (
    _FORGET_DEAD_WORKERS,
    _HEARTBEAT,
    _LIVE_WORKERS,
    _MISSING_PRIVILEGES,
    _RENEW_LEASE,
    _RESCUE,
    _RESCUE_INTERRUPTED,
    _STALL_RENEW,
    _UNKNOWN_TASKS,
    _UNREGISTER,
    WorkerStatements,
)


class NewJob(NamedTuple):
    """A row to insert, already validated and serialized.

    A tuple in ``scheduled_jobs`` column order, so COPY takes it as it is.
    """

    job_id: str
    job_name: str
    task_name: str
    execution_time: datetime
    task_data: str
    priority: int
    max_retries: int
    misfire_grace_time: int | None
    timeout: float | None
    retry_policy: str | None
    dedupe_key: str | None = None
    dedupe_scope: str | None = None  # "active" or "pending" when dedupe_key is set
    queue: str = DEFAULT_QUEUE
    # Migration 0017 (see store/keys.py): the job's concurrency key and its per-key limits.
    concurrency_key: str | None = None
    max_running_per_key: int | None = None
    rate_count_per_key: int | None = None
    rate_period_per_key: float | None = None
    key_ordered: bool = False
    # Fair share (migration 0018): the job's key, and its weight (None: 1).
    fair_share_key: str | None = None
    fair_share_weight: float | None = None


#: The fields of a NewJob an in-process start writes (``_INSERT_RUNNING``): all
#: but the fair share ones (a fair share row never starts in-process).
_LOCAL_FIELDS = NewJob._fields.index("fair_share_key")


@dataclass(frozen=True, slots=True)
class HandOffRoom:
    """What a completion may take over of the dependents it releases: up to
    ``most`` rows of ``tasks`` in ``queues`` (None: every queue), the first
    ``start_now`` of them starting at once, under a lease of ``lease_seconds``."""

    tasks: Sequence[str]
    queues: Sequence[str] | None
    most: int
    start_now: int
    lease_seconds: float


@dataclass(frozen=True, slots=True)
class Completion:
    job_id: str
    attempt: int
    result: str | None
    #: Some job depends on this one (its claimed row said so).
    has_dependents: bool = False


def _completion_args(done: Sequence[Completion]) -> tuple[list[str], str]:
    """The ids, and {"<id>": [attempt, result], ...} (a result is JSON text already)."""
    by_id = ",".join(
        f"{encode_json(c.job_id)}:[{c.attempt},{'null' if c.result is None else c.result}]"
        for c in done
    )
    return [c.job_id for c in done], "{" + by_id + "}"


# COPY leaves status to its default, pending.
_COPY_COLUMNS = list(NewJob._fields)


class Store(WorkerStatements):
    """Typed access to the scheduler's tables through one asyncpg pool.

    Every statement is qualified for ``schema`` here, once.
    """

    def __init__(self, pool: asyncpg.Pool, schema: str = DEFAULT_SCHEMA) -> None:
        self.pool = pool
        q = self.qualify = Qualifier(schema)
        self.schema = q.schema
        self.jobs_channel = q.channel(JOBS_CHANNEL)
        self.cancel_channel = q.channel(CANCEL_CHANNEL)
        self._insert_arrays = q(_INSERT_FROM_ARRAYS)
        self._insert_one = q(_INSERT_ONE)
        self._replace_set = q(" ON CONFLICT (job_id) " + _REPLACE_SET)
        self._claim = q(_CLAIM)
        self._claim_seeded = q(_CLAIM_SEEDED)
        self._group_heads = q(GROUP_HEADS)
        self._insert_running = q(_INSERT_RUNNING)
        self._next_due = q(_NEXT_DUE)
        self._next_due_seeded = q(_NEXT_DUE_SEEDED)
        self._complete = q(_COMPLETE)
        self._complete_handing = q(_COMPLETE_HANDING)
        self._complete_and_delete = q(_COMPLETE_AND_DELETE)
        self._complete_unlocked = q(_COMPLETE_UNLOCKED)
        self._complete_and_delete_unlocked = q(_COMPLETE_AND_DELETE_UNLOCKED)
        self._retry = q(_RETRY)
        self._fail = q(_FAIL)
        self._release = q(_RELEASE)
        self._release_ghosts = q(_RELEASE_GHOSTS)
        self._release_unowned = q(_RELEASE_UNOWNED)
        self._release_local_start = q(_RELEASE_LOCAL_START)
        self._heartbeat = q(_HEARTBEAT)
        self._rescue = q(_RESCUE)
        self._rescue_interrupted = q(_RESCUE_INTERRUPTED)
        self._forget_dead_workers = q(_FORGET_DEAD_WORKERS)
        self._cancel = q(_CANCEL)
        self._unknown_tasks = q(_UNKNOWN_TASKS)
        self._existing_ids = q(_EXISTING_IDS)
        self._renew_lease = q(_RENEW_LEASE)
        self._stall_renew = q(_STALL_RENEW)
        self._unregister = q(_UNREGISTER)
        self._live_workers = q(_LIVE_WORKERS)
        self._get_job = q(_GET_JOB)
        self._get_job_unbatched = q(_GET_JOB_UNBATCHED)
        #: Whether this role may read scheduler_batches (get_job's batch).
        self._batches_readable = True
        self._set_status = q(_SET_STATUS)
        self._missing_privileges = q(_MISSING_PRIVILEGES)
        self.limits = LimitStore(pool, q)
        self.keys = KeyStore(q)
        self.fair = FairStore(pool, q)  # fair share (migration 0018)
        self._emit = q(_EMIT)
        self._wanted = q(_WANTED)

    # -- enqueue -----------------------------------------------------------

    async def _insert(self, db: Executor, jobs: Sequence[NewJob], suffix: str) -> set[str]:
        """INSERT ``jobs`` (VALUES for one, unnest() of column arrays for many)
        followed by ``suffix``; the ids it returns."""
        if len(jobs) == 1:
            rows = await db.fetch(self._insert_one + suffix + " RETURNING job_id", *jobs[0])
        else:
            arrays = [list(column) for column in zip(*jobs, strict=True)]
            rows = await db.fetch(self._insert_arrays + suffix + " RETURNING job_id", *arrays)
        return {r["job_id"] for r in rows}

    async def insert(self, db: Executor, jobs: Sequence[NewJob]) -> set[str]:
        """Insert; a duplicate id raises asyncpg.UniqueViolationError."""
        return await self._insert(db, jobs, "")

    async def insert_ignore(self, db: Executor, jobs: Sequence[NewJob]) -> set[str]:
        """Insert the new ids, skip existing ones and rows whose dedupe key is
        held (no conflict target: every unique index); returns the inserted ids."""
        return await self._insert(db, jobs, " ON CONFLICT DO NOTHING")

    async def copy_insert(self, db: Executor, jobs: Iterable[NewJob]) -> set[str]:
        """Bulk insert through COPY (see ``copy_rows``); the ids written."""
        ids: set[str] = set()

        def rows() -> Iterator[NewJob]:
            for job in jobs:
                ids.add(job.job_id)
                yield job

        await self.copy_rows(db, rows())
        return ids

    async def copy_rows(self, db: Executor, jobs: Iterable[tuple[Any, ...]]) -> None:
        """Bulk insert through COPY (binary): several times faster than INSERT for
        large batches. Only for ids that cannot collide (generated); a duplicate
        still raises asyncpg.UniqueViolationError and writes nothing. COPY fires
        the statement-level INSERT trigger, so workers are woken once. ``jobs``
        may be a generator: asyncpg streams the rows as it produces them;
        plain tuples in NewJob's column order do as well."""
        await db.copy_records_to_table(
            "scheduled_jobs", records=jobs, columns=_COPY_COLUMNS, schema_name=self.schema
        )

    async def insert_replace(self, db: Executor, jobs: Sequence[NewJob]) -> set[str]:
        """Insert or overwrite non-running rows; returns the ids written."""
        return await self._insert(db, jobs, self._replace_set)

    async def existing_ids(self, db: Executor, job_ids: Sequence[str]) -> list[str]:
        rows = await db.fetch(self._existing_ids, list(job_ids))
        return [r["job_id"] for r in rows]

    # -- claim and finish ----------------------------------------------------

    async def claim(
        self,
        worker_id: str,
        task_names: list[str],
        limit: int,
        lease_seconds: float,
        db: Executor | None = None,
        *,
        start_now: int | None = None,
        queues: Sequence[str] | None = None,
        caps: Sequence[int | None] | None = None,
        floors: Floors | None = None,
    ) -> list[asyncpg.Record]:
        """Claim up to ``limit`` due jobs of ``task_names`` in ``queues`` (None:
        every queue; paused ones never); past the first ``start_now`` (default:
        all) they are marked claimed ahead (see migration 0005). ``caps``, one
        per queue: the most rows of that queue this claim may take.
        ``floors``: only from these groups, each read from its floor (see
        queues.SEEDED_GROUPS)."""
        args = (
            task_names,
            limit,
            worker_id,
            lease_seconds,
            limit if start_now is None else start_now,
            None if queues is None else list(queues),
            None if caps is None else list(caps),
        )
        if floors is None:
            return await (db or self.pool).fetch(self._claim, *args)
        return await (db or self.pool).fetch(self._claim_seeded, *args, *floors)

    async def group_heads(
        self, db: Executor, task_names: list[str], queues: Sequence[str] | None
    ) -> list[asyncpg.Record]:
        """Every (queue, task_name, priority) group of pending rows of
        ``task_names`` in ``queues`` (None: all), with its earliest
        execution_time: one index descent per group, and a walk over the dead
        entries at each group's front."""
        return await db.fetch(
            self._group_heads, task_names, None if queues is None else list(queues)
        )

    async def insert_running(
        self, db: Executor, job: NewJob, worker_id: str, lease_seconds: float
    ) -> asyncpg.Record:
        """Insert ``job`` claimed by ``worker_id`` if it is due and its queue is
        not paused (status says which)."""
        # Never a fair share row (engine/local.py): its last two fields are not written.
        return await db.fetchrow(
            self._insert_running, *job[:_LOCAL_FIELDS], worker_id, lease_seconds
        )

    async def seconds_until_next_due(
        self,
        task_names: list[str],
        db: Executor | None = None,
        *,
        queues: Sequence[str] | None = None,
        floors: Floors | None = None,
    ) -> float | None:
        """Seconds until the earliest pending job this worker can run (<= 0: due
        now); paused queues are left out. ``floors``: as for :meth:`claim`."""
        served = None if queues is None else list(queues)
        if floors is None:
            return await (db or self.pool).fetchval(self._next_due, task_names, served)
        return await (db or self.pool).fetchval(self._next_due_seeded, task_names, served, *floors)

    async def complete(
        self,
        worker_id: str,
        done: Sequence[Completion],
        delete: bool,
        db: Executor | None = None,
    ) -> set[str]:
        """Mark finished jobs completed (or delete them); only rows this attempt still holds."""
        statement = self._complete_and_delete if delete else self._complete
        rows = await (db or self.pool).fetch(statement, *_completion_args(done), worker_id)
        return {r["job_id"] for r in rows}

    async def complete_handing(
        self,
        worker_id: str,
        done: Sequence[Completion],
        room: HandOffRoom,
        db: Executor | None = None,
    ) -> tuple[set[str], list[asyncpg.Record]]:
        """As :meth:`complete` (never deleting), and the dependents the
        completions release that ``worker_id`` may run, up to ``room.most``,
        written running for it: (the ids written, those dependents' claimed rows)."""
        rows = await (db or self.pool).fetch(
            self._complete_handing,
            *_completion_args(done),
            worker_id,
            room.lease_seconds,
            list(room.tasks),
            None if room.queues is None else list(room.queues),
            room.most,
            room.start_now,
        )
        return {r["job_id"] for r in rows if not r["handed"]}, [r for r in rows if r["handed"]]

    async def complete_unlocked(
        self,
        worker_id: str,
        done: Sequence[Completion],
        delete: bool,
        db: Executor | None = None,
    ) -> tuple[set[str], set[str]]:
        """As :meth:`complete`, but never waiting for a row lock: (the ids
        written, the ids this attempt still holds whose rows another session
        has locked). An id in neither is no longer held by this attempt."""
        statement = self._complete_and_delete_unlocked if delete else self._complete_unlocked
        rows = await (db or self.pool).fetch(statement, *_completion_args(done), worker_id)
        written = {r["job_id"] for r in rows if r["written"]}
        return written, {r["job_id"] for r in rows if not r["written"]}

    async def retry(
        self,
        job_id: str,
        worker_id: str,
        attempt: int,
        delay_seconds: float,
        error: str,
        traceback: str | None,
    ) -> datetime | None:
        """Put a failed attempt back to pending after a delay; None if the lease was lost."""
        return await self.pool.fetchval(
            self._retry, job_id, worker_id, attempt, delay_seconds, error, traceback
        )

    async def fail(
        self, job_id: str, worker_id: str, attempt: int, error: str, traceback: str | None
    ) -> bool:
        row = await self.pool.fetchval(self._fail, job_id, worker_id, attempt, error, traceback)
        return row is not None

    async def release(self, worker_id: str, job_ids: Sequence[str]) -> list[str]:
        rows = await self.pool.fetch(self._release, list(job_ids), worker_id)
        return [r["job_id"] for r in rows]

    async def release_ghosts(self, worker_id: str, claims: Mapping[str, Any]) -> list[str]:
        """Release rows the heartbeat saw held here and unowned: job id -> the
        ``started_at`` it saw (a later claim of the same row is not touched)."""
        rows = await self.pool.fetch(
            self._release_ghosts, list(claims), worker_id, list(claims.values())
        )
        return [r["job_id"] for r in rows]

    async def release_unowned(self, worker_id: str, owned: Sequence[str]) -> list[str]:
        """Hand back every row held running by ``worker_id`` except ``owned``,
        as never started (attempt not counted, none recorded); the ids."""
        rows = await self.pool.fetch(self._release_unowned, list(owned), worker_id)
        return [r["job_id"] for r in rows]

    async def release_local_start(self, worker_id: str, job_id: str) -> bool:
        """Hand back the row an in-process start wrote for ``job_id``, if it
        landed and is still as that insert wrote it (never started)."""
        rows = await self.pool.fetch(self._release_local_start, job_id, worker_id)
        return bool(rows)

    # -- events the statements do not send (the claim's) -------------------------

    async def emit_events(
        self, db: Executor, kind: str, rows: Sequence[Mapping[str, Any]], worker_id: str
    ) -> None:
        """Notify ``kind`` for claimed rows (job_id, task_name, attempts); a
        flagged kind only while a subscriber wants it."""
        await db.execute(
            self._emit,
            kind,
            [r["job_id"] for r in rows],
            [r["task_name"] for r in rows],
            [r["attempts"] for r in rows],
            worker_id,
            [r["queue"] for r in rows],
        )

    async def wanted_kinds(self, db: Executor) -> dict[str, float]:
        """The flagged event kinds some subscriber wants, with the seconds left."""
        return {r["kind"]: r["seconds"] for r in await db.fetch(self._wanted)}

    # -- workers, heartbeats, rescue -------------------------------------------

    async def cancel(self, job_id: str) -> bool:
        """Cancel a pending or running job; the running worker hears it via NOTIFY."""
        return await self.pool.fetchval(self._cancel, job_id) is not None

    async def get_job(self, job_id: str) -> asyncpg.Record | None:
        if self._batches_readable:
            try:
                return await self.pool.fetchrow(self._get_job, job_id)
            except asyncpg.InsufficientPrivilegeError:
                # No SELECT on scheduler_batches: the job without its batch
                # from now on (a role that may not read the job either gets
                # the same error again, below).
                self._batches_readable = False
        return await self.pool.fetchrow(self._get_job_unbatched, job_id)

    async def set_status(self, job_id: str, status: str) -> bool:
        """Force a status (the 0.2.x ``update_job_status``); final states get finished_at."""
        value = await self.pool.fetchval(
            self._set_status,
            job_id,
            status,
        )
        return value is not None
