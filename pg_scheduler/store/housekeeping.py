"""SQL of housekeeping and operations: vacuum, statistics, job listing and retry.

Kept apart from ``jobs.py`` (the hot path) because none of it runs per job.
The vacuum statements find old finished rows through
``scheduled_jobs_finished_idx`` (status, finished_at) WHERE finished_at IS NOT
NULL (migration 0003); a condition ``finished_at < ...`` implies the index
predicate, so even generic plans may use it. Every delete is bounded by a
LIMIT and runs in its own short transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg

from ..enums import FINAL_STATUSES, JobStatus
from .batches import PRUNE_BATCHES
from .event_sql import events_cte
from .key_sql import PRUNE_KEY_STARTS
from .names import DEFAULT_SCHEMA, JOBS_CHANNEL, Qualifier, lock_key_for
from .queues import FAIR_GROUPS, GROUPS, HEADS
from .timing import PRUNE_THROTTLES

# The final statuses as the text the statements compare with.
_FINAL_STATUS_VALUES = sorted(s.value for s in FINAL_STATUSES)
# Every status but running (scheduled_jobs_dashboard_idx's rows).
_NOT_RUNNING = sorted(s.value for s in JobStatus if s is not JobStatus.RUNNING)
#: Statuses an operator may put back to pending with ``retry``.
RETRYABLE_STATUSES = ("failed", "cancelled", "expired")

# -- vacuum ------------------------------------------------------------------------

VACUUM_LOCK_KEY = 0x70675F7661637575  # "pg_vacuu": one vacuuming replica at a time

# immediate() is "finished at least 0 seconds ago": the same statement as after_days().
_VACUUM_OLDER_THAN = """
DELETE FROM scheduled_jobs WHERE job_id IN (
    SELECT job_id FROM scheduled_jobs
     WHERE status = $1 AND finished_at <= now() - make_interval(secs => $3)
     LIMIT $2 FOR UPDATE SKIP LOCKED)
"""
# keep_last(n): per job name, the (n+1)-th newest finished row is the cut-off;
# it and everything older goes. Computed once per round, then deleted in batches.
_KEEP_LAST_CUTOFFS = """
SELECT job_name, finished_at, job_id FROM (
    SELECT job_name, finished_at, job_id,
           row_number() OVER (PARTITION BY job_name
                              ORDER BY finished_at DESC, job_id DESC) AS rn
      FROM scheduled_jobs
     WHERE status = $1 AND finished_at IS NOT NULL) ranked
 WHERE rn = $2 + 1
"""
_VACUUM_UP_TO_CUTOFFS = """
DELETE FROM scheduled_jobs WHERE job_id IN (
    SELECT j.job_id
      FROM unnest($3::text[], $4::timestamptz[], $5::text[]) AS c(job_name, finished_at, job_id)
      JOIN scheduled_jobs j ON j.job_name = c.job_name
     WHERE j.status = $1 AND j.finished_at <= c.finished_at
       AND (j.finished_at, j.job_id) <= (c.finished_at, c.job_id)
     LIMIT $2 FOR UPDATE OF j SKIP LOCKED)
"""
_RECORD_VACUUM = """
INSERT INTO vacuum_stats (stat_date, deleted_completed, deleted_failed, deleted_cancelled,
                          deleted_expired, last_run, worker_id)
VALUES (CURRENT_DATE, $1, $2, $3, $4, now(), $5)
ON CONFLICT (stat_date) DO UPDATE SET
    deleted_completed = COALESCE(vacuum_stats.deleted_completed, 0) + EXCLUDED.deleted_completed,
    deleted_failed = COALESCE(vacuum_stats.deleted_failed, 0) + EXCLUDED.deleted_failed,
    deleted_cancelled = COALESCE(vacuum_stats.deleted_cancelled, 0) + EXCLUDED.deleted_cancelled,
    deleted_expired = COALESCE(vacuum_stats.deleted_expired, 0) + EXCLUDED.deleted_expired,
    last_run = now(), worker_id = EXCLUDED.worker_id
"""

_VACUUM_STATS = """
SELECT stat_date, COALESCE(deleted_completed, 0) AS deleted_completed,
       COALESCE(deleted_failed, 0) AS deleted_failed,
       COALESCE(deleted_cancelled, 0) AS deleted_cancelled,
       COALESCE(deleted_expired, 0) AS deleted_expired, last_run, worker_id
  FROM vacuum_stats
 WHERE stat_date > CURRENT_DATE - $1::int
 ORDER BY stat_date DESC
"""
_VACUUM_TOTALS = """
SELECT COALESCE(sum(deleted_completed), 0)::bigint AS total_deleted_completed,
       COALESCE(sum(deleted_failed), 0)::bigint AS total_deleted_failed,
       COALESCE(sum(deleted_cancelled), 0)::bigint AS total_deleted_cancelled,
       COALESCE(sum(deleted_expired), 0)::bigint AS total_deleted_expired,
       max(last_run) AS last_run,
       count(*) AS days_tracked
  FROM vacuum_stats
"""


def _count(status_line: str) -> int:
    return int(status_line.split()[-1])


class VacuumStore:
    """Bounded-batch deletes of finished rows, under an advisory lock (one per schema)."""

    def __init__(self, pool: asyncpg.Pool, schema: str = DEFAULT_SCHEMA) -> None:
        self.pool = pool
        q = Qualifier(schema)
        self.lock_key = lock_key_for(VACUUM_LOCK_KEY, q.schema)
        self._older_than = q(_VACUUM_OLDER_THAN)
        self._keep_last_cutoffs = q(_KEEP_LAST_CUTOFFS)
        self._up_to_cutoffs = q(_VACUUM_UP_TO_CUTOFFS)
        self._record = q(_RECORD_VACUUM)
        self._stats = q(_VACUUM_STATS)
        self._totals = q(_VACUUM_TOTALS)
        self._prune_key_starts = q(PRUNE_KEY_STARTS)
        self._prune_throttles = q(PRUNE_THROTTLES)
        self._prune_batches = q(PRUNE_BATCHES)

    async def try_lock(self, conn: asyncpg.Connection) -> bool:
        """The session lock: held across the round's transactions (direct connections)."""
        return await conn.fetchval("SELECT pg_try_advisory_lock($1)", self.lock_key)

    async def unlock(self, conn: asyncpg.Connection) -> None:
        await conn.execute("SELECT pg_advisory_unlock($1)", self.lock_key)

    async def try_xact_lock(self, conn: asyncpg.Connection) -> bool:
        """The same lock for one transaction: safe behind a transaction pooler."""
        return await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", self.lock_key)

    async def prune_key_starts(self, conn: asyncpg.Connection) -> int:
        """Drop starts of rate-limited keys older than any rate window (migration 0017)."""
        return _count(await conn.execute(self._prune_key_starts))

    async def prune_throttles(self, conn: asyncpg.Connection) -> int:
        """Drop throttle periods that ended over a minute ago (migration 0019)."""
        return _count(await conn.execute(self._prune_throttles))

    async def prune_batches(self, conn: asyncpg.Connection, batch_size: int) -> int:
        """Drop at most ``batch_size`` rows of batches that started before the
        oldest job left (migration 0020): they name no job that still exists."""
        return _count(await conn.execute(self._prune_batches, batch_size, _NOT_RUNNING))

    async def delete_older_than(
        self, conn: asyncpg.Connection, status: str, batch_size: int, seconds: float
    ) -> int:
        """Delete at most ``batch_size`` rows of ``status`` finished ``seconds`` ago or more."""
        return _count(await conn.execute(self._older_than, status, batch_size, seconds))

    async def keep_last_cutoffs(
        self, conn: asyncpg.Connection, status: str, keep: int
    ) -> list[asyncpg.Record]:
        """Per job name with more than ``keep`` rows of ``status``: the newest row to delete."""
        return await conn.fetch(self._keep_last_cutoffs, status, keep)

    async def delete_up_to_cutoffs(
        self,
        conn: asyncpg.Connection,
        status: str,
        batch_size: int,
        cutoffs: Sequence[asyncpg.Record],
    ) -> int:
        """Delete at most ``batch_size`` rows at or before their job name's cut-off."""
        result = await conn.execute(
            self._up_to_cutoffs,
            status,
            batch_size,
            [c["job_name"] for c in cutoffs],
            [c["finished_at"] for c in cutoffs],
            [c["job_id"] for c in cutoffs],
        )
        return _count(result)

    async def record(
        self, conn: asyncpg.Connection, counts: dict[str, int], worker_id: str
    ) -> None:
        await conn.execute(
            self._record,
            counts.get("completed", 0),
            counts.get("failed", 0),
            counts.get("cancelled", 0),
            counts.get("expired", 0),
            worker_id,
        )

    async def stats(self, days: int) -> list[asyncpg.Record]:
        """Rows of ``vacuum_stats`` for the last ``days`` days, today included, newest first."""
        return await self.pool.fetch(self._stats, days)

    async def totals(self) -> asyncpg.Record:
        return await self.pool.fetchrow(self._totals)


# -- statistics --------------------------------------------------------------------

_COUNTS = """
SELECT task_name, status, count(*)::bigint AS n,
       count(*) FILTER (WHERE execution_time <= now())::bigint AS due
  FROM scheduled_jobs
 GROUP BY task_name, status
"""
_RUNNING_BY_WORKER = """
SELECT worker_id, count(*)::bigint AS n
  FROM scheduled_jobs WHERE status = 'running'
 GROUP BY worker_id
"""
# One claim-index probe per priority level, like the claim itself.
# From the heads of the (queue, task, priority) groups (see queues.py): one
# index descent per group, whatever the backlog.
# Keyed rows (migration 0017) are outside the groups: their earliest pending row.
_OLDEST_DUE = f"""
WITH RECURSIVE {GROUPS}, {FAIR_GROUPS}
SELECT EXTRACT(EPOCH FROM now() - LEAST(min(g.execution_time), (
           SELECT min(k.execution_time) FROM scheduled_jobs k
            WHERE k.status = 'pending' AND k.concurrency_key IS NOT NULL
              AND k.execution_time <= now())))::float8
  FROM {HEADS} g WHERE g.execution_time <= now()
"""
_FINISHED_IN_WINDOWS = """
SELECT w.secs, j.status, count(*)::bigint AS n
  FROM unnest($1::float8[]) AS w(secs)
  JOIN scheduled_jobs j
    ON j.status = ANY($2::text[]) AND j.finished_at >= now() - make_interval(secs => w.secs)
 GROUP BY w.secs, j.status
"""
_WORKERS = """
SELECT worker_id, hostname, pid, started_at, last_seen, max_concurrent, tasks,
       EXTRACT(EPOCH FROM now() - last_seen)::float8 AS seen_seconds_ago
  FROM scheduler_workers
 ORDER BY started_at, worker_id
"""


class StatsStore:
    """The read-only queries behind :func:`pg_scheduler.observe.stats.collect_stats`."""

    def __init__(self, pool: asyncpg.Pool, schema: str = DEFAULT_SCHEMA) -> None:
        self.pool = pool
        q = Qualifier(schema)
        self._counts = q(_COUNTS)
        self._running_by_worker = q(_RUNNING_BY_WORKER)
        self._oldest_due = q(_OLDEST_DUE)
        self._finished_in_windows = q(_FINISHED_IN_WINDOWS)
        self._workers = q(_WORKERS)

    @staticmethod
    async def now(conn: asyncpg.Connection) -> datetime:
        return await conn.fetchval("SELECT now()")

    async def counts(self, conn: asyncpg.Connection) -> list[asyncpg.Record]:
        return await conn.fetch(self._counts)

    async def running_by_worker(self, conn: asyncpg.Connection) -> list[asyncpg.Record]:
        return await conn.fetch(self._running_by_worker)

    async def oldest_due_seconds(self, conn: asyncpg.Connection) -> float | None:
        return await conn.fetchval(self._oldest_due)

    async def finished_in_windows(
        self, conn: asyncpg.Connection, windows: Sequence[float]
    ) -> list[asyncpg.Record]:
        return await conn.fetch(self._finished_in_windows, list(windows), _FINAL_STATUS_VALUES)

    async def workers(self, conn: asyncpg.Connection) -> list[asyncpg.Record]:
        return await conn.fetch(self._workers)


# -- operations (the CLI) --------------------------------------------------------------

# An operator's retry: run once more, now. attempts keeps counting, so the job
# gets exactly one new attempt (more if max_retries still allows). A job that
# was ever claimed does not take a "pending" dedupe key back (0013).
_RETRY_JOBS = f"""
WITH retried AS (
    UPDATE scheduled_jobs
       SET status = 'pending', execution_time = now(), finished_at = NULL, worker_id = NULL,
           lease_until = NULL, result = NULL, error_message = NULL, error_traceback = NULL,
           started_before = started_before OR started_at IS NOT NULL
     WHERE job_id = ANY($1::text[]) AND status = ANY($2::text[])
    RETURNING job_id, task_name, attempts, queue
), {
    events_cte(
        "SELECT 'scheduled', job_id, task_name, attempts, NULL::text, NULL::float8, queue"
        " FROM retried"
    )
}
SELECT r.job_id, pg_notify('{JOBS_CHANNEL}', '*') FROM retried r, sent
"""
_FAILED_IDS = """
SELECT job_id FROM scheduled_jobs
 WHERE status = 'failed' AND ($1::text IS NULL OR task_name = $1 OR job_name = $1)
 ORDER BY finished_at, job_id
"""

_PERIODIC_JOBS = """
SELECT dedup_key, job_name, task_name, schedule, enabled, next_run, last_run,
       last_finished_at, last_outcome, last_error, last_job_id
  FROM periodic_jobs
 WHERE $1::text IS NULL OR dedup_key = $1 OR job_name = $1
 ORDER BY job_name, dedup_key
"""


class OpsStore:
    """Operator actions: inspect and retry jobs, list periodic jobs."""

    def __init__(self, pool: asyncpg.Pool, schema: str = DEFAULT_SCHEMA) -> None:
        self.pool = pool
        q = Qualifier(schema)
        self._retry_jobs = q(_RETRY_JOBS)
        self._failed_ids = q(_FAILED_IDS)
        self._periodic_jobs = q(_PERIODIC_JOBS)

    async def retry(self, job_ids: Sequence[str]) -> list[str]:
        """Put failed, cancelled or expired jobs back to pending, due now; the ids changed."""
        rows = await self.pool.fetch(self._retry_jobs, list(job_ids), list(RETRYABLE_STATUSES))
        return [r["job_id"] for r in rows]

    async def failed_ids(self, task: str | None) -> list[str]:
        rows = await self.pool.fetch(self._failed_ids, task)
        return [r["job_id"] for r in rows]

    async def periodic_jobs(self, key: str | None = None) -> list[asyncpg.Record]:
        """Rows of ``periodic_jobs`` (migration 0002): all, or those whose dedup key
        or job name is ``key``."""
        return await self.pool.fetch(self._periodic_jobs, key)
