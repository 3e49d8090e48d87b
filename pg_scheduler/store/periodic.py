"""Every SQL statement of periodic jobs (schema: ``migrations/0002_periodic.sql``).

``periodic_jobs`` holds one row per dedup key: the schedule the replicas agree
on, ``enabled``, the cursor ``next_run`` (the first window not yet enqueued)
and the last run. A window is enqueued by whoever holds that row's lock while
advancing the cursor, in the same transaction, so each window is written once
whatever the number of replicas and even after its job row is vacuumed.

Window rows live in ``scheduled_jobs`` with ``task_name = 'periodic:<key>'``
and ``job_id = 'periodic:<key>:<fire time>'`` (manual runs:
``manual_periodic:<key>:<uuid>``). The statements that look for a job's
pending windows repeat the predicate of ``scheduled_jobs_periodic_pending_idx``
word for word so that the planner uses that small partial index.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg

from .event_sql import events_cte
from .names import DEFAULT_SCHEMA, Qualifier, lock_key_for

PERIODIC_TASK_PREFIX = "periodic:"
WINDOW_ID_PREFIX = "periodic:"
MANUAL_ID_PREFIX = "manual_periodic:"

_STATE_COLUMNS = """
    p.dedup_key, p.enabled, p.schedule, p.next_run, p.last_window, p.last_run,
    p.last_finished_at, p.last_job_id, p.last_error,
    CASE WHEN p.last_outcome = 'running' AND j.status IS NOT NULL AND j.status <> 'running'
         THEN j.status ELSE p.last_outcome END AS last_outcome
"""

_REGISTER = """
WITH before AS (
    SELECT dedup_key, schedule FROM periodic_jobs WHERE dedup_key = ANY($1::text[])
)
INSERT INTO periodic_jobs AS p (dedup_key, job_name, task_name, schedule, enabled, code_enabled)
SELECT d.dedup_key, d.job_name, d.task_name, d.schedule, d.enabled, d.enabled
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bool[])
    AS d(dedup_key, job_name, task_name, schedule, enabled)
ON CONFLICT (dedup_key) DO UPDATE SET
    job_name = EXCLUDED.job_name,
    task_name = EXCLUDED.task_name,
    schedule = EXCLUDED.schedule,
    -- A new schedule restarts from the next window; old windows mean nothing to it.
    next_run = CASE WHEN p.schedule = EXCLUDED.schedule THEN p.next_run END,
    -- enabled= in code is the default: it wins only when the code changes it, so a
    -- runtime enable/disable survives restarts of the same code.
    enabled = CASE WHEN p.code_enabled = EXCLUDED.code_enabled THEN p.enabled
                   ELSE EXCLUDED.enabled END,
    code_enabled = EXCLUDED.code_enabled,
    updated_at = now()
 WHERE (p.job_name, p.task_name, p.schedule, p.code_enabled)
       IS DISTINCT FROM (EXCLUDED.job_name, EXCLUDED.task_name, EXCLUDED.schedule,
                         EXCLUDED.code_enabled)
RETURNING p.dedup_key, p.task_name, p.enabled,
          p.schedule IS DISTINCT FROM (SELECT b.schedule FROM before b
                                        WHERE b.dedup_key = p.dedup_key) AS rescheduled
"""

# One row even when no job is stored yet, so the caller always learns the
# database clock.
_LOAD = f"""
SELECT n.db_now, {_STATE_COLUMNS}
  FROM (SELECT now() AS db_now) n
  LEFT JOIN (periodic_jobs p LEFT JOIN scheduled_jobs j ON j.job_id = p.last_job_id)
    ON p.dedup_key = ANY($1::text[])
"""

_LOCK_FOR_ENQUEUE = """
SELECT enabled, schedule, next_run, last_window, last_run, now() AS db_now
  FROM periodic_jobs WHERE dedup_key = $1
   FOR UPDATE SKIP LOCKED
"""

_PENDING_DUE_WINDOWS = """
SELECT job_id, execution_time
  FROM scheduled_jobs
 WHERE task_name = $1 AND status = 'pending' AND starts_with(task_name, 'periodic:')
   AND starts_with(job_id, 'periodic:') AND execution_time <= now()
 ORDER BY execution_time
   FOR UPDATE SKIP LOCKED
"""

_CANCELLED_EVENTS = events_cte(
    "SELECT 'cancelled', job_id, task_name, attempts, NULL::text, NULL::float8, queue"
    " FROM cancelled"
)
_CANCEL_JOBS = f"""
WITH cancelled AS (
    UPDATE scheduled_jobs
       SET status = 'cancelled', finished_at = now(), error_message = $2
     WHERE job_id = ANY($1::text[]) AND status = 'pending'
    RETURNING job_id, task_name, attempts, queue
), {_CANCELLED_EVENTS}
SELECT c.job_id FROM cancelled c, sent
"""

_CANCEL_PENDING_WINDOWS = f"""
WITH cancelled AS (
    UPDATE scheduled_jobs
       SET status = 'cancelled', finished_at = now(), error_message = $2
     WHERE task_name = $1 AND status = 'pending' AND starts_with(task_name, 'periodic:')
       AND starts_with(job_id, 'periodic:')
    RETURNING job_id, task_name, attempts, queue
), {_CANCELLED_EVENTS}
SELECT c.job_id FROM cancelled c, sent
"""

# coalesce="earliest": is an older window of this job due and not started, or
# started late (at or after window $2)? Then that one serves the backlog.
_OLDER_WINDOW_SERVING = """
SELECT EXISTS (
           SELECT 1 FROM scheduled_jobs
            WHERE task_name = $1 AND status = 'pending' AND starts_with(task_name, 'periodic:')
              AND starts_with(job_id, 'periodic:') AND execution_time < $2
              AND execution_time <= now())
    OR EXISTS (
           SELECT 1 FROM scheduled_jobs
            WHERE status = 'running' AND task_name = $1 AND starts_with(job_id, 'periodic:')
              AND execution_time < $2 AND started_at >= $2)
"""

_ADVANCE = "UPDATE periodic_jobs SET next_run = $2 WHERE dedup_key = $1"

_SET_ENABLED = """
UPDATE periodic_jobs
   SET enabled = $2,
       -- Re-enabled jobs start at the next window: no catch-up for the time off.
       next_run = CASE WHEN enabled = $2 THEN next_run END,
       updated_at = now()
 WHERE dedup_key = $1
RETURNING task_name
"""

# Returns the run before this one and the database clock: the runner decides
# from them whether its window was coalesced away.
_RUN_STARTED = """
WITH previous AS (
    SELECT last_window, last_run FROM periodic_jobs WHERE dedup_key = $1 FOR UPDATE
)
UPDATE periodic_jobs p
   SET last_job_id = $2, last_window = $3, last_run = now(), last_outcome = 'running',
       last_finished_at = NULL, last_error = NULL
  FROM previous
 WHERE p.dedup_key = $1
RETURNING previous.last_window, previous.last_run, now() AS db_now
"""

# Only the run that is still the last one may write its outcome: an older run
# finishing late must not hide a newer one.
_RUN_FINISHED = """
UPDATE periodic_jobs
   SET last_outcome = $3, last_error = $4, last_finished_at = now()
 WHERE dedup_key = $1 AND last_job_id = $2
"""


class PeriodicStore:
    """Typed access to ``periodic_jobs`` (and the window rows of ``scheduled_jobs``)."""

    def __init__(self, pool: asyncpg.Pool, schema: str = DEFAULT_SCHEMA) -> None:
        self.pool = pool
        q = Qualifier(schema)
        self.schema = q.schema
        self._register = q(_REGISTER)
        self._load = q(_LOAD)
        self._lock_for_enqueue = q(_LOCK_FOR_ENQUEUE)
        self._pending_due_windows = q(_PENDING_DUE_WINDOWS)
        self._cancel_jobs = q(_CANCEL_JOBS)
        self._cancel_pending_windows = q(_CANCEL_PENDING_WINDOWS)
        self._older_window_serving = q(_OLDER_WINDOW_SERVING)
        self._advance = q(_ADVANCE)
        self._set_enabled = q(_SET_ENABLED)
        self._run_started = q(_RUN_STARTED)
        self._run_finished = q(_RUN_FINISHED)

    async def register(
        self,
        keys: Sequence[str],
        job_names: Sequence[str],
        task_names: Sequence[str],
        schedules: Sequence[str],
        enabled: Sequence[bool],
    ) -> list[asyncpg.Record]:
        """Create or update the rows; returns those written (changed or new)."""
        return await self.pool.fetch(
            self._register,
            list(keys),
            list(job_names),
            list(task_names),
            list(schedules),
            list(enabled),
        )

    async def load(self, keys: Sequence[str]) -> tuple[datetime, list[asyncpg.Record]]:
        """The database clock and the stored state of ``keys`` (absent keys: no row)."""
        rows = await self.pool.fetch(self._load, list(keys))
        return rows[0]["db_now"], [r for r in rows if r["dedup_key"] is not None]

    async def lock_for_enqueue(self, conn: asyncpg.Connection, key: str) -> asyncpg.Record | None:
        """Lock the job's row for this transaction; None if another replica holds it."""
        return await conn.fetchrow(self._lock_for_enqueue, key)

    async def pending_due_windows(
        self, conn: asyncpg.Connection, task_name: str
    ) -> list[asyncpg.Record]:
        """Window rows of one job that are due and not started (those being
        claimed right now are skipped: they count as started)."""
        return await conn.fetch(self._pending_due_windows, task_name)

    async def cancel_jobs(
        self, conn: asyncpg.Connection, job_ids: Sequence[str], reason: str
    ) -> list[str]:
        rows = await conn.fetch(self._cancel_jobs, list(job_ids), reason)
        return [r["job_id"] for r in rows]

    async def advance(self, conn: asyncpg.Connection, key: str, next_run: datetime | None) -> None:
        await conn.execute(self._advance, key, next_run)

    async def set_enabled(self, key: str, enabled: bool, reason: str) -> bool:
        """Store ``enabled``; disabling also cancels the job's pending windows.
        False if no row has this key."""
        async with self.pool.acquire() as conn, conn.transaction():
            task_name = await conn.fetchval(self._set_enabled, key, enabled)
            if task_name is None:
                return False
            if not enabled:
                await conn.execute(self._cancel_pending_windows, task_name, reason)
            return True

    async def cancel_pending_windows(self, task_name: str, reason: str) -> list[str]:
        """Cancel the job's enqueued windows that have not started."""
        rows = await self.pool.fetch(self._cancel_pending_windows, task_name, reason)
        return [r["job_id"] for r in rows]

    async def run_started(
        self, key: str, job_id: str, window: datetime | None
    ) -> asyncpg.Record | None:
        """Record a run as the last one; returns the previous run's window and
        start, and the database clock (None if the job has no row)."""
        return await self.pool.fetchrow(self._run_started, key, job_id, window)

    async def run_finished(self, key: str, job_id: str, outcome: str, error: str | None) -> None:
        await self.pool.execute(self._run_finished, key, job_id, outcome, error)

    async def older_window_serving(self, task_name: str, window: datetime) -> bool:
        return await self.pool.fetchval(self._older_window_serving, task_name, window)

    async def try_xact_lock(self, conn: asyncpg.Connection, lock_key: int) -> bool:
        """A transaction-level advisory lock: released at commit, rollback or when the
        session ends, and pinned to one server connection even behind a
        transaction-pooling proxy."""
        return await conn.fetchval(
            "SELECT pg_try_advisory_xact_lock($1)", lock_key_for(lock_key, self.schema)
        )
