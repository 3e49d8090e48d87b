"""Statements on ``scheduled_jobs``: insert, claim, complete/retry/fail, release, cancel.

The schema lives in ``migrations/``; the statements here are written against
its indexes: the claim and the next-due probe walk
``scheduled_jobs_claim_idx`` one priority level at a time, heartbeat, rescue
and release use ``scheduled_jobs_running_idx``. Time is always the database's
``now()``, never the worker's clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import asyncpg

from ..codec import encode_json
from ..enums import PRIORITY_DB_VALUES
from .names import CANCEL_CHANNEL, DEFAULT_SCHEMA, JOBS_CHANNEL, Executor, Qualifier
from .workers import (
    _FORGET_DEAD_WORKERS,
    _HEARTBEAT,
    _LIVE_WORKERS,
    _MISSING_PRIVILEGES,
    _RENEW_LEASE,
    _RESCUE,
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


@dataclass(frozen=True, slots=True)
class Completion:
    job_id: str
    attempt: int
    result: str | None


_INSERT_COLUMNS = """
    job_id, job_name, task_name, execution_time, status, task_data, priority,
    max_retries, misfire_grace_time, timeout, retry_policy
"""
_INSERT_FROM_ARRAYS = f"""
    INSERT INTO scheduled_jobs ({_INSERT_COLUMNS})
    SELECT d.job_id, d.job_name, d.task_name, d.execution_time, 'pending', d.task_data::jsonb,
           d.priority, d.max_retries, d.misfire_grace_time, d.timeout, d.retry_policy::jsonb
      FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::text[],
                  $6::int[], $7::int[], $8::int[], $9::float8[], $10::text[])
        AS d(job_id, job_name, task_name, execution_time, task_data, priority,
             max_retries, misfire_grace_time, timeout, retry_policy)
"""
# One row: plain VALUES plans and runs about 0.3 ms faster than unnest().
_INSERT_ONE = f"""
    INSERT INTO scheduled_jobs ({_INSERT_COLUMNS})
    VALUES ($1, $2, $3, $4, 'pending', $5::jsonb, $6, $7, $8, $9, $10::jsonb)
"""
# status is left to its default, pending.
_COPY_COLUMNS = list(NewJob._fields)
# REPLACE overwrites a pending or finished job and makes it pending with fresh
# counters; a running attempt is never touched (its lease stays valid).
_REPLACE_SET = """
    DO UPDATE SET job_name = EXCLUDED.job_name, task_name = EXCLUDED.task_name,
        execution_time = EXCLUDED.execution_time, task_data = EXCLUDED.task_data,
        priority = EXCLUDED.priority, max_retries = EXCLUDED.max_retries,
        misfire_grace_time = EXCLUDED.misfire_grace_time, timeout = EXCLUDED.timeout,
        retry_policy = EXCLUDED.retry_policy, status = 'pending', retry_count = 0,
        attempts = 0, rescue_count = 0, unstarted_rescues = 0, error_message = NULL,
        error_traceback = NULL,
        result = NULL, worker_id = NULL, last_heartbeat = NULL, lease_until = NULL,
        started_at = NULL, finished_at = NULL, created_at = now()
    WHERE scheduled_jobs.status <> 'running'
"""

# What the worker reads of a claimed row (the claim and the in-process start).
_CLAIMED_COLUMNS = """j.job_id, j.job_name, j.task_name, j.task_data::text AS task_data,
          j.priority, j.execution_time, j.status, j.attempts, j.retry_count,
          j.max_retries, j.timeout, j.retry_policy::text AS retry_policy, j.claimed_ahead"""
# Rows past the first $6 (in the order the worker starts them) wait in its
# local buffer: they are marked claimed_ahead until its heartbeat says they started.
_CLAIM = f"""
WITH picked AS (
    SELECT c.job_id, c.expired, p.priority, c.execution_time
      FROM unnest($1::int[]) AS p(priority)
     CROSS JOIN LATERAL (
        SELECT j.job_id, j.execution_time,
               (j.started_at IS NULL AND j.misfire_grace_time IS NOT NULL
                AND j.execution_time + make_interval(secs => j.misfire_grace_time) < now())
                   AS expired
          FROM scheduled_jobs j
         WHERE j.status = 'pending' AND j.priority = p.priority
           AND j.execution_time <= now() AND j.task_name = ANY($2::text[])
         ORDER BY j.execution_time
         LIMIT $3
           FOR UPDATE SKIP LOCKED
     ) c
     LIMIT $3
), placed AS (
    SELECT job_id, expired,
           row_number() OVER (PARTITION BY expired ORDER BY priority, execution_time) AS place
      FROM picked
)
UPDATE scheduled_jobs j
   SET status = CASE WHEN picked.expired THEN 'expired' ELSE 'running' END,
       worker_id = $4,
       attempts = j.attempts + CASE WHEN picked.expired THEN 0 ELSE 1 END,
       started_at = CASE WHEN picked.expired THEN j.started_at ELSE now() END,
       last_heartbeat = now(),
       lease_until = CASE WHEN picked.expired THEN NULL
                          ELSE now() + make_interval(secs => $5) END,
       finished_at = CASE WHEN picked.expired THEN now() END,
       claimed_ahead = NOT picked.expired AND picked.place > $6,
       error_message = CASE WHEN picked.expired
           THEN format('expired: not started within misfire_grace_time (%s s) of %s',
                       j.misfire_grace_time, j.execution_time)
           ELSE j.error_message END
  FROM placed AS picked
 WHERE j.job_id = picked.job_id
RETURNING {_CLAIMED_COLUMNS}
"""

# One due job written already claimed by a worker of this process (``$11``),
# which starts it at once: no NOTIFY hop, no claim. Whether it is due is the
# database's call; a job that is not, or that is past its misfire grace (the
# claim expires those), comes back pending like any insert.
_INSERT_RUNNING = f"""
INSERT INTO scheduled_jobs AS j ({_INSERT_COLUMNS},
                                 worker_id, attempts, started_at, last_heartbeat, lease_until)
SELECT $1, $2, $3, $4, CASE WHEN d.due THEN 'running' ELSE 'pending' END, $5::jsonb,
       $6, $7, $8, $9, $10::jsonb,
       CASE WHEN d.due THEN $11 END, CASE WHEN d.due THEN 1 ELSE 0 END,
       CASE WHEN d.due THEN now() END, CASE WHEN d.due THEN now() END,
       CASE WHEN d.due THEN now() + make_interval(secs => $12) END
  FROM (SELECT $4::timestamptz <= now()
               AND ($8::int IS NULL OR $4::timestamptz + make_interval(secs => $8::int) >= now())
                   AS due) AS d
RETURNING {_CLAIMED_COLUMNS}
"""

_NEXT_DUE = """
SELECT EXTRACT(EPOCH FROM (min(n.execution_time) - now()))::float8
  FROM unnest($1::int[]) AS p(priority)
 CROSS JOIN LATERAL (
    SELECT j.execution_time FROM scheduled_jobs j
     WHERE j.status = 'pending' AND j.priority = p.priority
       AND j.task_name = ANY($2::text[])
     ORDER BY j.execution_time
     LIMIT 1
 ) n
"""

_LEASE_GUARD = "job_id = $1 AND worker_id = $2 AND attempts = $3 AND status = 'running'"

# Completions: one pkey probe per id, and no join. $2 maps each id to
# [attempt, result] in one jsonb object (its key lookup is a binary search);
# the guard is wrapped in IS TRUE so that scheduled_jobs_running_idx is not a
# candidate. The earlier form joined the rows to unnest() of the id list: its
# generic plan (a prepared statement) expected one running row and ten ids,
# chose a nested loop that rescanned the list for every row, and a batch of
# 750 completions took 377 ms, O(n^2) in the batch size.
_COMPLETE = """
UPDATE scheduled_jobs j
   SET status = 'completed', finished_at = now(), lease_until = NULL,
       result = NULLIF($2::jsonb -> j.job_id -> 1, 'null'::jsonb)
 WHERE j.job_id = ANY($1::text[])
   AND j.attempts = ($2::jsonb -> j.job_id ->> 0)::int
   AND (j.worker_id = $3 AND j.status = 'running') IS TRUE
RETURNING j.job_id
"""
_COMPLETE_AND_DELETE = """
DELETE FROM scheduled_jobs j
 WHERE j.job_id = ANY($1::text[])
   AND j.attempts = ($2::jsonb -> j.job_id ->> 0)::int
   AND (j.worker_id = $3 AND j.status = 'running') IS TRUE
RETURNING j.job_id
"""

# An attempt that did not complete goes to job_attempts (migration 0006); the
# job row keeps only the error of its current state, so a pending job has none.
_ATTEMPT_OUTCOME = "CASE WHEN {0}::text LIKE 'timed out after %' THEN 'timed_out' ELSE 'failed' END"
_RETRY = f"""
WITH retried AS (
    UPDATE scheduled_jobs
       SET status = 'pending', retry_count = retry_count + 1, worker_id = NULL,
           lease_until = NULL, execution_time = now() + make_interval(secs => $4),
           error_message = NULL, error_traceback = NULL
     WHERE {_LEASE_GUARD}
    RETURNING job_id, attempts, started_at, execution_time
), kept AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error, traceback)
    SELECT job_id, attempts, $2, started_at, {_ATTEMPT_OUTCOME.format("$5")}, $5, $6 FROM retried
)
SELECT execution_time FROM retried
"""
_FAIL = f"""
WITH failed AS (
    UPDATE scheduled_jobs
       SET status = 'failed', finished_at = now(), lease_until = NULL,
           error_message = $4, error_traceback = $5
     WHERE {_LEASE_GUARD}
    RETURNING job_id, attempts, started_at
), kept AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error, traceback)
    SELECT job_id, attempts, $2, started_at, {_ATTEMPT_OUTCOME.format("$4")}, $4, $5 FROM failed
)
SELECT job_id FROM failed
"""


def _release_where(where: str) -> str:
    """Hand running jobs back without consuming the attempt (graceful shutdown,
    or claims this worker holds in the database but never started)."""
    return """
WITH released AS (
    UPDATE scheduled_jobs
       SET status = 'pending', worker_id = NULL, lease_until = NULL,
           attempts = GREATEST(attempts - 1, 0)
     WHERE {where} AND worker_id = $2 AND status = 'running'
    RETURNING job_id, attempts, started_at, claimed_ahead
), kept AS (
    -- Only attempts that had started: a claimed-ahead row handed back never ran.
    INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error)
    SELECT job_id, attempts + 1, $2, started_at, 'handed_back', 'handed back by worker ' || $2
      FROM released WHERE NOT claimed_ahead
)
SELECT job_id, pg_notify('pg_scheduler_jobs', '') FROM released
""".replace("{where}", where)


_RELEASE = _release_where("job_id = ANY($1::text[])")
# Ghosts the heartbeat saw: only the very claim it saw ($3: its started_at). A row
# handed back since and claimed again here has a new started_at and is kept.
_RELEASE_GHOSTS = _release_where(
    "(job_id, started_at) IN (SELECT * FROM unnest($1::text[], $3::timestamptz[]))"
)

# A running attempt cancelled goes to job_attempts; ``target`` is the row
# before the update (locked, so the status read is the one replaced).
_CANCEL = """
WITH target AS (
    SELECT job_id, status, attempts, worker_id, started_at FROM scheduled_jobs
     WHERE job_id = $1 AND status IN ('pending', 'running')
       FOR UPDATE
), cancelled AS (
    UPDATE scheduled_jobs j
       SET status = 'cancelled', finished_at = now(), lease_until = NULL
      FROM target t
     WHERE j.job_id = t.job_id AND j.status IN ('pending', 'running')
    RETURNING j.job_id
), kept AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error)
    SELECT t.job_id, t.attempts, t.worker_id, t.started_at, 'cancelled', 'cancelled by cancel_job()'
      FROM target t JOIN cancelled c ON c.job_id = t.job_id
     WHERE t.status = 'running'
)
SELECT job_id, pg_notify('pg_scheduler_cancel', job_id) FROM cancelled
"""

_JOB_COLUMNS = """
    job_id, job_name, task_name, status, priority, execution_time, created_at,
    started_at, finished_at, last_heartbeat, lease_until, attempts, retry_count,
    max_retries, rescue_count, worker_id, misfire_grace_time, timeout,
    retry_policy::text AS retry_policy, task_data::text AS task_data,
    result::text AS result, error_message, error_traceback
"""

_EXISTING_IDS = "SELECT job_id FROM scheduled_jobs WHERE job_id = ANY($1::text[])"
# With its progress and the attempts that did not complete (job_attempts), in one read.
_GET_JOB = f"""
SELECT {_JOB_COLUMNS}, progress, progress_message, progress_at,
       (SELECT json_agg(json_build_object(
                   'attempt', a.attempt, 'worker_id', a.worker_id, 'started_at', a.started_at,
                   'finished_at', a.finished_at, 'outcome', a.outcome, 'error', a.error,
                   'traceback', a.traceback) ORDER BY a.attempt_id)::text
          FROM job_attempts a WHERE a.job_id = j.job_id) AS attempt_history
  FROM scheduled_jobs j WHERE j.job_id = $1
"""
_SET_STATUS = """
UPDATE scheduled_jobs
   SET status = $2,
       finished_at = CASE WHEN $2 IN ('completed', 'failed', 'cancelled', 'expired')
                          THEN now() END,
       lease_until = CASE WHEN $2 = 'running' THEN lease_until END,
       worker_id = CASE WHEN $2 = 'pending' THEN NULL ELSE worker_id END
 WHERE job_id = $1
RETURNING job_id
"""


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
        self._insert_running = q(_INSERT_RUNNING)
        self._next_due = q(_NEXT_DUE)
        self._complete = q(_COMPLETE)
        self._complete_and_delete = q(_COMPLETE_AND_DELETE)
        self._retry = q(_RETRY)
        self._fail = q(_FAIL)
        self._release = q(_RELEASE)
        self._release_ghosts = q(_RELEASE_GHOSTS)
        self._heartbeat = q(_HEARTBEAT)
        self._rescue = q(_RESCUE)
        self._forget_dead_workers = q(_FORGET_DEAD_WORKERS)
        self._cancel = q(_CANCEL)
        self._unknown_tasks = q(_UNKNOWN_TASKS)
        self._existing_ids = q(_EXISTING_IDS)
        self._renew_lease = q(_RENEW_LEASE)
        self._unregister = q(_UNREGISTER)
        self._live_workers = q(_LIVE_WORKERS)
        self._get_job = q(_GET_JOB)
        self._set_status = q(_SET_STATUS)
        self._missing_privileges = q(_MISSING_PRIVILEGES)

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
        """Insert the new ids, skip existing ones; returns the inserted ids."""
        return await self._insert(db, jobs, " ON CONFLICT (job_id) DO NOTHING")

    async def copy_insert(self, db: Executor, jobs: Sequence[NewJob]) -> set[str]:
        """Bulk insert through COPY (binary): several times faster than INSERT for
        large batches. Only for ids that cannot collide (generated); a duplicate
        still raises asyncpg.UniqueViolationError and writes nothing. COPY fires
        the statement-level INSERT trigger, so workers are woken once."""
        await db.copy_records_to_table(
            "scheduled_jobs", records=jobs, columns=_COPY_COLUMNS, schema_name=self.schema
        )
        return {j.job_id for j in jobs}

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
    ) -> list[asyncpg.Record]:
        """Claim up to ``limit`` due jobs; past the first ``start_now`` (default:
        all) they are marked claimed ahead (see migration 0005)."""
        return await (db or self.pool).fetch(
            self._claim,
            PRIORITY_DB_VALUES,
            task_names,
            limit,
            worker_id,
            lease_seconds,
            limit if start_now is None else start_now,
        )

    async def insert_running(
        self, db: Executor, job: NewJob, worker_id: str, lease_seconds: float
    ) -> asyncpg.Record:
        """Insert ``job`` claimed by ``worker_id`` if it is due (status says which)."""
        return await db.fetchrow(self._insert_running, *job, worker_id, lease_seconds)

    async def seconds_until_next_due(
        self, task_names: list[str], db: Executor | None = None
    ) -> float | None:
        """Seconds until the earliest pending job this worker can run (<= 0: due now)."""
        return await (db or self.pool).fetchval(self._next_due, PRIORITY_DB_VALUES, task_names)

    async def complete(
        self,
        worker_id: str,
        done: Sequence[Completion],
        delete: bool,
        db: Executor | None = None,
    ) -> set[str]:
        """Mark finished jobs completed (or delete them); only rows this attempt still holds."""
        ids = [c.job_id for c in done]
        # {"<id>": [attempt, result], ...}; a result is JSON text already.
        by_id = ",".join(
            f"{encode_json(c.job_id)}:[{c.attempt},{'null' if c.result is None else c.result}]"
            for c in done
        )
        statement = self._complete_and_delete if delete else self._complete
        rows = await (db or self.pool).fetch(statement, ids, "{" + by_id + "}", worker_id)
        return {r["job_id"] for r in rows}

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

    # -- workers, heartbeats, rescue -------------------------------------------

    async def cancel(self, job_id: str) -> bool:
        """Cancel a pending or running job; the running worker hears it via NOTIFY."""
        return await self.pool.fetchval(self._cancel, job_id) is not None

    async def get_job(self, job_id: str) -> asyncpg.Record | None:
        return await self.pool.fetchrow(self._get_job, job_id)

    async def set_status(self, job_id: str, status: str) -> bool:
        """Force a status (the 0.2.x ``update_job_status``); final states get finished_at."""
        value = await self.pool.fetchval(
            self._set_status,
            job_id,
            status,
        )
        return value is not None
