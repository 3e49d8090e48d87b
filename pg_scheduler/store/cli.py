"""SQL of the command line and the demo: full job listings, vacuum previews, demo rows.

Read-mostly statements the operator's tools need beyond ``store.housekeeping``;
none of them runs on a worker's hot path.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg

from ..config import VacuumPolicy
from ..enums import VacuumTrigger
from .batches import in_batch, with_batches
from .job_sql import _JOB_COLUMNS
from .names import DEFAULT_SCHEMA, Qualifier

# The same filters and order as OpsStore.list_jobs, with every column a Job
# needs (the batch of each: migration 0020), so a listing and a detail view
# have one JSON shape. {batch}: the jobs of one batch ($6), found from its
# row (primary key lookups), or every job.
_LIST_FULL_JOBS = f"""
SELECT {_JOB_COLUMNS}
  FROM scheduled_jobs j
 WHERE ($1::text[] IS NULL OR status = ANY($1::text[]))
   AND ($2::text IS NULL OR task_name = $2 OR job_name = $2)
   AND ($3::timestamptz IS NULL OR COALESCE(finished_at, started_at, execution_time) >= $3)
   AND ($4::timestamptz IS NULL OR COALESCE(finished_at, started_at, execution_time) < $4)
   AND {{batch}}
 ORDER BY COALESCE(finished_at, started_at, execution_time) DESC, job_id
 LIMIT $5
"""
_LIST_ORDER = "COALESCE(p.finished_at, p.started_at, p.execution_time) DESC, p.job_id"
# What the vacuum's statements (store_housekeeping) would delete, counted.
_COUNT_OLDER_THAN = """
SELECT count(*) FROM scheduled_jobs
 WHERE status = $1 AND finished_at <= now() - make_interval(secs => $2)
"""
_COUNT_BEYOND_KEEP = """
SELECT count(*) FROM (
    SELECT row_number() OVER (PARTITION BY job_name
                              ORDER BY finished_at DESC, job_id DESC) AS rn
      FROM scheduled_jobs
     WHERE status = $1 AND finished_at IS NOT NULL) ranked
 WHERE rn > $2
"""
_DELETE_UNFINISHED = """
DELETE FROM scheduled_jobs WHERE status IN ('pending', 'running') AND task_name = ANY($1::text[])
"""
_FORGET_PERIODIC = "DELETE FROM periodic_jobs WHERE dedup_key = ANY($1::text[])"
# A job waiting to retry has no current error: show its last attempt's (job_attempts).
_DEMO_ROWS = """
SELECT job_id, job_name, status, attempts, result::text AS result,
       COALESCE(error_message,
                (SELECT a.error FROM job_attempts a
                  WHERE a.job_id = j.job_id AND j.status = 'pending'
                  ORDER BY a.attempt_id DESC LIMIT 1)) AS error_message,
       EXTRACT(EPOCH FROM finished_at - started_at)::float8 * 1000 AS duration_ms
  FROM scheduled_jobs j
 WHERE job_id = ANY($1::text[]) OR (job_name = $2 AND created_at >= $3)
 ORDER BY execution_time, job_id
"""


class CliStore:
    """The statements of ``pg-scheduler`` subcommands and ``pg-scheduler demo``."""

    def __init__(self, pool: asyncpg.Pool, schema: str = DEFAULT_SCHEMA) -> None:
        self.pool = pool
        q = Qualifier(schema)
        self._list_full_jobs = q(
            with_batches(_LIST_FULL_JOBS.format(batch="$6::uuid IS NULL"), _LIST_ORDER)
        )
        self._list_batch_jobs = q(
            with_batches(_LIST_FULL_JOBS.format(batch=in_batch("$6")), _LIST_ORDER)
        )
        self._count_older_than = q(_COUNT_OLDER_THAN)
        self._count_beyond_keep = q(_COUNT_BEYOND_KEEP)
        self._delete_unfinished = q(_DELETE_UNFINISHED)
        self._demo_rows = q(_DEMO_ROWS)
        self._forget_periodic = q(_FORGET_PERIODIC)

    async def list_jobs(
        self,
        statuses: Sequence[str] | None,
        task: str | None,
        since: datetime | None,
        until: datetime | None,
        limit: int,
        batch_id: str | None = None,
    ) -> list[asyncpg.Record]:
        """Whole job rows matching every given filter, most recently changed first."""
        return await self.pool.fetch(
            self._list_full_jobs if batch_id is None else self._list_batch_jobs,
            list(statuses) if statuses else None,
            task,
            since,
            until,
            limit,
            batch_id,
        )

    async def vacuum_preview(self, policies: dict[str, VacuumPolicy]) -> dict[str, int]:
        """Per status, how many rows the vacuum would delete now under ``policies``."""
        counts: dict[str, int] = {}
        for status, policy in policies.items():
            if policy.trigger is VacuumTrigger.NEVER:
                counts[status] = 0
            elif policy.trigger is VacuumTrigger.COUNT_BASED:
                counts[status] = await self.pool.fetchval(
                    self._count_beyond_keep, status, policy.keep_count
                )
            else:
                days = 0.0 if policy.trigger is VacuumTrigger.IMMEDIATE else policy.days
                assert days is not None  # TIME_BASED requires days
                seconds = days * 86400.0
                counts[status] = await self.pool.fetchval(self._count_older_than, status, seconds)
        return counts

    async def delete_unfinished(self, task_names: Sequence[str]) -> None:
        """Drop pending and running jobs of these tasks (the demo starts clean)."""
        await self.pool.execute(self._delete_unfinished, list(task_names))

    async def forget_periodic(self, dedup_keys: Sequence[str]) -> None:
        """Drop these periodic jobs' stored rows (the demo leaves none behind)."""
        await self.pool.execute(self._forget_periodic, list(dedup_keys))

    async def demo_rows(
        self, job_ids: Sequence[str], periodic_name: str, since: datetime
    ) -> list[asyncpg.Record]:
        """The demo's jobs, and the runs of its periodic job created since ``since``."""
        return await self.pool.fetch(self._demo_rows, list(job_ids), periodic_name, since)
