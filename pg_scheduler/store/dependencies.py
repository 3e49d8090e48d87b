"""Declared dependencies between jobs (migration 0015): writing a graph of jobs
and its edges, and a dependent reading its dependencies' results.

A job with dependencies not all completed is written ``waiting`` with
``wait_kind = 'dependencies'`` and ``dependencies_unmet`` > 0: outside the
claim index, so the claim never reads it. What makes it pending is the
trigger of 0015 (``pg_scheduler_dependency_ended``), in the transaction of its
last dependency's completion; nothing here polls.

The write of a graph, in one transaction (see ``enqueue/dependencies.py``):
:meth:`DependencyStore.lock_dependencies` (the existing jobs depended on,
locked in job_id order and marked ``has_dependents``, their status read
after the lock: one completing meanwhile is seen completed, and one
completing after sees the new edges), the rows (:meth:`insert_jobs` or
:meth:`copy_jobs`), the edges (:meth:`insert_edges`), then
:meth:`apply_ended` for existing dependencies that had already ended
without completing (each new dependent's policy applies at once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg

from .job_sql import _FAIR_COLUMNS, _INSERT_COLUMNS
from .jobs import NewJob
from .names import DEFAULT_SCHEMA, Executor, Qualifier

#: The wait kind of a job held back by its dependencies.
WAIT_KIND = "dependencies"

# The existing jobs a graph depends on, locked in job_id order (two graphs on
# the same jobs never deadlock), marked as depended on (the trigger of 0015
# then fires when they end), with their status after the lock.
_LOCK_DEPENDENCIES = """
WITH target AS (
    SELECT job_id, status, has_dependents FROM scheduled_jobs
     WHERE job_id = ANY($1::text[])
     ORDER BY job_id
       FOR NO KEY UPDATE
), marked AS (
    UPDATE scheduled_jobs j SET has_dependents = true
      FROM target t
     WHERE j.job_id = t.job_id AND NOT t.has_dependents
    RETURNING j.job_id
)
SELECT t.job_id, t.status FROM target t
"""

# The dependent rows: waiting on their dependencies (or pending when all of
# them had completed), the count of those not met, whether some job of the
# graph depends on them. The wake-up trigger of 0012 notifies only for the
# pending ones.
_DEPENDENT_COLUMNS = (
    _INSERT_COLUMNS.replace("status,", "status, wait_kind, dependencies_unmet, has_dependents,")
    + ", "
    + _FAIR_COLUMNS
)
_INSERT_DEPENDENTS = f"""
INSERT INTO scheduled_jobs ({_DEPENDENT_COLUMNS})
SELECT d.job_id, d.job_name, d.task_name, d.execution_time,
       CASE WHEN d.unmet > 0 THEN 'waiting' ELSE 'pending' END,
       CASE WHEN d.unmet > 0 THEN '{WAIT_KIND}' END, d.unmet, d.has_dependents,
       d.task_data::jsonb, d.priority, d.max_retries, d.misfire_grace_time, d.timeout,
       d.retry_policy::jsonb, d.dedupe_key, d.dedupe_scope, d.queue, d.concurrency_key,
       d.max_running_per_key, d.rate_count_per_key, d.rate_period_per_key, d.key_ordered,
       d.fair_share_key, d.fair_share_weight
  FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::text[],
              $6::int[], $7::int[], $8::int[], $9::float8[], $10::text[],
              $11::text[], $12::text[], $13::text[], $14::text[], $15::int[],
              $16::int[], $17::float8[], $18::bool[], $19::text[], $20::float8[],
              $21::int[], $22::bool[])
    AS d(job_id, job_name, task_name, execution_time, task_data, priority,
         max_retries, misfire_grace_time, timeout, retry_policy, dedupe_key, dedupe_scope,
         queue, concurrency_key, max_running_per_key, rate_count_per_key,
         rate_period_per_key, key_ordered, fair_share_key, fair_share_weight, unmet,
         has_dependents)
RETURNING job_id
"""
#: COPY's columns for the same rows (NewJob's, then the four above).
COPY_COLUMNS = [*NewJob._fields, "status", "wait_kind", "dependencies_unmet", "has_dependents"]

# The edges, in each dependent's declared order. An edge to a job that had
# completed is met at once and carries its result.
_INSERT_EDGES = """
INSERT INTO job_dependencies (depends_on, job_id, ordinal, on_failure, met, status, result)
SELECT d.depends_on, d.job_id, d.ordinal, d.on_failure, d.completed,
       CASE WHEN d.completed THEN 'completed' END,
       CASE WHEN d.completed
            THEN (SELECT s.result FROM scheduled_jobs s WHERE s.job_id = d.depends_on) END
  FROM unnest($1::text[], $2::text[], $3::int[], $4::text[], $5::bool[])
    AS d(depends_on, job_id, ordinal, on_failure, completed)
"""
EDGE_COLUMNS = ["depends_on", "job_id", "ordinal", "on_failure"]

# Existing dependencies that had ended without completing: the new
# dependents' policies apply now (already-applied edges are left as they are).
_APPLY_ENDED = """
SELECT count(pg_scheduler_dependency_ended(d.job_id, d.status, NULL))
  FROM unnest($1::text[], $2::text[]) AS d(job_id, status)
"""

_RESULTS = """
SELECT depends_on, status, result::text AS result FROM job_dependencies
 WHERE job_id = $1 ORDER BY ordinal, depends_on
"""


class DependencyStore:
    """The dependency statements of one schema."""

    def __init__(self, pool: asyncpg.Pool | None, schema: str = DEFAULT_SCHEMA) -> None:
        self.pool = pool
        q = Qualifier(schema)
        self.schema = q.schema
        self._lock = q(_LOCK_DEPENDENCIES)
        self._insert_jobs = q(_INSERT_DEPENDENTS)
        self._insert_edges = q(_INSERT_EDGES)
        self._apply_ended = q(_APPLY_ENDED)
        self._results = q(_RESULTS)

    async def lock_dependencies(self, db: Executor, job_ids: Sequence[str]) -> dict[str, str]:
        """job id -> status of each existing job of ``job_ids``, locked until the
        transaction ends and marked as depended on."""
        rows = await db.fetch(self._lock, list(job_ids))
        return {r["job_id"]: r["status"] for r in rows}

    async def insert_jobs(
        self,
        db: Executor,
        rows: Sequence[NewJob],
        unmet: Sequence[int | None],
        has_dependents: Sequence[bool],
    ) -> set[str]:
        """Insert ``rows`` with their unmet counts (None: no dependencies) and
        flags; a duplicate id raises asyncpg.UniqueViolationError."""
        arrays: list[list[Any]] = [list(column) for column in zip(*rows, strict=True)]
        arrays += [list(unmet), list(has_dependents)]
        return {r["job_id"] for r in await db.fetch(self._insert_jobs, *arrays)}

    async def copy_jobs(self, db: asyncpg.Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        """The same rows through COPY (generated ids only): tuples of NewJob's
        columns followed by status, wait_kind, dependencies_unmet, has_dependents."""
        await db.copy_records_to_table(
            "scheduled_jobs", records=rows, columns=COPY_COLUMNS, schema_name=self.schema
        )

    async def insert_edges(
        self, db: Executor, edges: Sequence[tuple[str, str, int, str, bool]]
    ) -> None:
        """Edges as (depends_on, job_id, ordinal, on_failure, completed: the
        dependency had completed)."""
        await db.execute(self._insert_edges, *(list(column) for column in zip(*edges, strict=True)))

    async def copy_edges(self, db: asyncpg.Connection, edges: Sequence[tuple[Any, ...]]) -> None:
        """Edges to jobs of the same graph (none has ended): tuples of
        (depends_on, job_id, ordinal, on_failure), through COPY."""
        await db.copy_records_to_table(
            "job_dependencies", records=edges, columns=EDGE_COLUMNS, schema_name=self.schema
        )

    async def apply_ended(self, db: Executor, ended: dict[str, str]) -> None:
        """Apply the policies of new dependents of jobs that had ended without
        completing (job id -> its status)."""
        await db.fetchval(self._apply_ended, list(ended), list(ended.values()))

    async def results(self, job_id: str) -> list[asyncpg.Record]:
        """(depends_on, status, result as JSON text) of each dependency of
        ``job_id``, in declared order; status None while it has not ended."""
        assert self.pool is not None
        return list(await self.pool.fetch(self._results, job_id))
