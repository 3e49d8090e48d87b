"""Every SQL statement the scheduler runs, one method per operation.

The schema lives in ``migrations/``; the statements here are written against
its indexes: the claim and the next-due probe walk
``scheduled_jobs_claim_idx`` one priority level at a time, heartbeat, rescue
and release use ``scheduled_jobs_running_idx``. Time is always the database's
``now()``, never the worker's clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

import asyncpg

from .codec import encode_json
from .enums import PRIORITY_DB_VALUES

JOBS_CHANNEL = "pg_scheduler_jobs"
CANCEL_CHANNEL = "pg_scheduler_cancel"

Executor = asyncpg.Pool | asyncpg.Connection


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
        attempts = 0, rescue_count = 0, error_message = NULL, error_traceback = NULL,
        result = NULL, worker_id = NULL, last_heartbeat = NULL, lease_until = NULL,
        started_at = NULL, finished_at = NULL, created_at = now()
    WHERE scheduled_jobs.status <> 'running'
"""

# What the worker reads of a claimed row (the claim and the in-process start).
_CLAIMED_COLUMNS = """j.job_id, j.job_name, j.task_name, j.task_data::text AS task_data,
          j.priority, j.execution_time, j.status, j.attempts, j.retry_count,
          j.max_retries, j.timeout, j.retry_policy::text AS retry_policy"""
_CLAIM = f"""
WITH picked AS (
    SELECT c.job_id, c.expired
      FROM unnest($1::int[]) AS p(priority)
     CROSS JOIN LATERAL (
        SELECT j.job_id,
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
       error_message = CASE WHEN picked.expired
           THEN format('expired: not started within misfire_grace_time (%s s) of %s',
                       j.misfire_grace_time, j.execution_time)
           ELSE j.error_message END
  FROM picked
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

_RETRY = f"""
UPDATE scheduled_jobs
   SET status = 'pending', retry_count = retry_count + 1, worker_id = NULL,
       lease_until = NULL, execution_time = now() + make_interval(secs => $4),
       error_message = $5, error_traceback = $6
 WHERE {_LEASE_GUARD}
RETURNING execution_time
"""
_FAIL = f"""
UPDATE scheduled_jobs
   SET status = 'failed', finished_at = now(), lease_until = NULL,
       error_message = $4, error_traceback = $5
 WHERE {_LEASE_GUARD}
RETURNING job_id
"""

# Hand running jobs back without consuming the attempt (graceful shutdown,
# or claims this worker holds in the database but never started).
_RELEASE = """
WITH released AS (
    UPDATE scheduled_jobs
       SET status = 'pending', worker_id = NULL, lease_until = NULL,
           attempts = GREATEST(attempts - 1, 0)
     WHERE job_id = ANY($1::text[]) AND worker_id = $2 AND status = 'running'
    RETURNING job_id
)
SELECT job_id, pg_notify('pg_scheduler_jobs', '') FROM released
"""

_HEARTBEAT = """
WITH me AS (
    INSERT INTO scheduler_workers (worker_id, hostname, pid, max_concurrent, tasks)
    VALUES ($1, $3, $4, $5, $6::text[])
    ON CONFLICT (worker_id) DO UPDATE SET last_seen = now(), tasks = EXCLUDED.tasks
)
UPDATE scheduled_jobs
   SET last_heartbeat = now(), lease_until = now() + make_interval(secs => $2)
 WHERE worker_id = $1 AND status = 'running'
RETURNING job_id, attempts, EXTRACT(EPOCH FROM now() - started_at)::float8 AS running_for
"""

_RESCUE = """
WITH orphans AS (
    SELECT j.job_id, j.worker_id AS old_worker,
           CASE WHEN j.lease_until < now() THEN 'lease expired'
                ELSE 'worker heartbeat older than threshold' END AS reason
      FROM scheduled_jobs j
      LEFT JOIN scheduler_workers w ON w.worker_id = j.worker_id
     WHERE j.status = 'running'
       AND (j.lease_until < now() OR w.last_seen < now() - make_interval(secs => $1))
       FOR UPDATE OF j SKIP LOCKED
), rescued AS (
    UPDATE scheduled_jobs j
       SET status = CASE WHEN j.rescue_count + 1 > $2 THEN 'failed' ELSE 'pending' END,
           rescue_count = j.rescue_count + 1,
           finished_at = CASE WHEN j.rescue_count + 1 > $2 THEN now() END,
           error_message = CASE WHEN j.rescue_count + 1 > $2
               THEN format('gave up: the workers running this job died %s times (max_rescues=%s);'
                           ' last: %s (%s)', j.rescue_count + 1, $2, o.old_worker, o.reason)
               ELSE format('rescued from worker %s (%s) during attempt %s',
                           o.old_worker, o.reason, j.attempts) END,
           worker_id = CASE WHEN j.rescue_count + 1 > $2 THEN j.worker_id END,
           lease_until = NULL
      FROM orphans o
     WHERE j.job_id = o.job_id
    RETURNING j.job_id, j.task_name, j.status, j.attempts, o.old_worker, o.reason
)
SELECT r.*, pg_notify('pg_scheduler_jobs', '') FROM rescued r
"""

_FORGET_DEAD_WORKERS = """
DELETE FROM scheduler_workers w
 WHERE w.last_seen < now() - make_interval(secs => $1)
   AND NOT EXISTS (SELECT 1 FROM scheduled_jobs j
                    WHERE j.worker_id = w.worker_id AND j.status = 'running')
"""

_CANCEL = """
WITH cancelled AS (
    UPDATE scheduled_jobs
       SET status = 'cancelled', finished_at = now(), lease_until = NULL
     WHERE job_id = $1 AND status IN ('pending', 'running')
    RETURNING job_id
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

_UNKNOWN_TASKS = """
SELECT j.task_name, count(*) AS pending
  FROM scheduled_jobs j
 WHERE j.status = 'pending' AND j.execution_time <= now()
   AND NOT (j.task_name = ANY($1::text[]))
   AND NOT EXISTS (
       SELECT 1 FROM scheduler_workers w
        WHERE w.last_seen >= now() - make_interval(secs => $2)
          AND j.task_name = ANY(w.tasks))
 GROUP BY j.task_name
 ORDER BY j.task_name
"""


class Store:
    """Typed access to the scheduler's tables through one asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    # -- enqueue -----------------------------------------------------------

    @staticmethod
    async def _insert(db: Executor, jobs: Sequence[NewJob], suffix: str) -> set[str]:
        """INSERT ``jobs`` (VALUES for one, unnest() of column arrays for many)
        followed by ``suffix``; the ids it returns."""
        if len(jobs) == 1:
            rows = await db.fetch(_INSERT_ONE + suffix + " RETURNING job_id", *jobs[0])
        else:
            arrays = [list(column) for column in zip(*jobs, strict=True)]
            rows = await db.fetch(_INSERT_FROM_ARRAYS + suffix + " RETURNING job_id", *arrays)
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
        await db.copy_records_to_table("scheduled_jobs", records=jobs, columns=_COPY_COLUMNS)
        return {j.job_id for j in jobs}

    async def insert_replace(self, db: Executor, jobs: Sequence[NewJob]) -> set[str]:
        """Insert or overwrite non-running rows; returns the ids written."""
        return await self._insert(db, jobs, " ON CONFLICT (job_id) " + _REPLACE_SET)

    async def existing_ids(self, db: Executor, job_ids: Sequence[str]) -> list[str]:
        rows = await db.fetch(
            "SELECT job_id FROM scheduled_jobs WHERE job_id = ANY($1::text[])", list(job_ids)
        )
        return [r["job_id"] for r in rows]

    # -- claim and finish ----------------------------------------------------

    async def claim(
        self,
        worker_id: str,
        task_names: list[str],
        limit: int,
        lease_seconds: float,
        db: Executor | None = None,
    ) -> list[asyncpg.Record]:
        return await (db or self.pool).fetch(
            _CLAIM, PRIORITY_DB_VALUES, task_names, limit, worker_id, lease_seconds
        )

    async def insert_running(
        self, db: Executor, job: NewJob, worker_id: str, lease_seconds: float
    ) -> asyncpg.Record:
        """Insert ``job`` claimed by ``worker_id`` if it is due (status says which)."""
        return await db.fetchrow(_INSERT_RUNNING, *job, worker_id, lease_seconds)

    async def seconds_until_next_due(
        self, task_names: list[str], db: Executor | None = None
    ) -> float | None:
        """Seconds until the earliest pending job this worker can run (<= 0: due now)."""
        return await (db or self.pool).fetchval(_NEXT_DUE, PRIORITY_DB_VALUES, task_names)

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
        statement = _COMPLETE_AND_DELETE if delete else _COMPLETE
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
            _RETRY, job_id, worker_id, attempt, delay_seconds, error, traceback
        )

    async def fail(
        self, job_id: str, worker_id: str, attempt: int, error: str, traceback: str | None
    ) -> bool:
        row = await self.pool.fetchval(_FAIL, job_id, worker_id, attempt, error, traceback)
        return row is not None

    async def release(self, worker_id: str, job_ids: Sequence[str]) -> list[str]:
        rows = await self.pool.fetch(_RELEASE, list(job_ids), worker_id)
        return [r["job_id"] for r in rows]

    # -- workers, heartbeats, rescue -------------------------------------------

    async def heartbeat(
        self,
        worker_id: str,
        lease_seconds: float,
        hostname: str,
        pid: int,
        max_concurrent: int,
        tasks: list[str],
    ) -> list[asyncpg.Record]:
        """Renew this worker's row and every lease it holds, in one statement."""
        return await self.pool.fetch(
            _HEARTBEAT, worker_id, lease_seconds, hostname, pid, max_concurrent, tasks
        )

    async def renew_lease(self, job_id: str, worker_id: str, lease_seconds: float) -> bool:
        value = await self.pool.fetchval(
            """
            UPDATE scheduled_jobs
               SET last_heartbeat = now(), lease_until = now() + make_interval(secs => $3)
             WHERE job_id = $1 AND worker_id = $2 AND status = 'running'
            RETURNING job_id
            """,
            job_id,
            worker_id,
            lease_seconds,
        )
        return value is not None

    async def unregister_worker(self, worker_id: str) -> None:
        await self.pool.execute("DELETE FROM scheduler_workers WHERE worker_id = $1", worker_id)

    async def rescue_orphans(
        self, heartbeat_threshold: float, max_rescues: int
    ) -> list[asyncpg.Record]:
        """Return jobs of dead workers (stale heartbeat or expired lease) to pending."""
        rows = await self.pool.fetch(_RESCUE, heartbeat_threshold, max_rescues)
        await self.pool.execute(_FORGET_DEAD_WORKERS, heartbeat_threshold * 10)
        return rows

    async def live_workers(self, heartbeat_threshold: float) -> list[asyncpg.Record]:
        return await self.pool.fetch(
            """
            SELECT worker_id, hostname, pid, started_at, last_seen, max_concurrent, tasks
              FROM scheduler_workers
             WHERE last_seen >= now() - make_interval(secs => $1)
             ORDER BY started_at
            """,
            heartbeat_threshold,
        )

    async def unknown_tasks(
        self, local_tasks: list[str], heartbeat_threshold: float
    ) -> dict[str, int]:
        """Due pending jobs whose task no live worker has registered, by task name."""
        rows = await self.pool.fetch(_UNKNOWN_TASKS, local_tasks, heartbeat_threshold)
        return {r["task_name"]: r["pending"] for r in rows}

    # -- single-job operations -----------------------------------------------

    async def cancel(self, job_id: str) -> bool:
        """Cancel a pending or running job; the running worker hears it via NOTIFY."""
        return await self.pool.fetchval(_CANCEL, job_id) is not None

    async def get_job(self, job_id: str) -> asyncpg.Record | None:
        return await self.pool.fetchrow(
            f"SELECT {_JOB_COLUMNS} FROM scheduled_jobs WHERE job_id = $1", job_id
        )

    async def set_status(self, job_id: str, status: str) -> bool:
        """Force a status (the 0.2.x ``update_job_status``); final states get finished_at."""
        value = await self.pool.fetchval(
            """
            UPDATE scheduled_jobs
               SET status = $2,
                   finished_at = CASE WHEN $2 IN ('completed', 'failed', 'cancelled', 'expired')
                                      THEN now() END,
                   lease_until = CASE WHEN $2 = 'running' THEN lease_until END,
                   worker_id = CASE WHEN $2 = 'pending' THEN NULL ELSE worker_id END
             WHERE job_id = $1
            RETURNING job_id
            """,
            job_id,
            status,
        )
        return value is not None
