"""SQL of the web dashboard: overview, keyset job pages, workers, queues.

Read-only except the queue pause switch; job and periodic actions go through
the statements the CLI uses (``housekeeping.OpsStore``, ``jobs.Store``).

The job list pages newest first on ``(created_at, job_id)`` through
``scheduled_jobs_dashboard_idx`` (status, created_at, job_id) of migration
0009: one index range per status, merged, so a page costs the same on the
first page and the ten-thousandth, on 1,000 rows or 1,000,000. The keyset and
time bounds are written without ``$n IS NULL OR ...`` so that a generic plan
still uses them as index conditions.

Named queues (a ``queue`` column and a ``scheduler_queues`` table) may or may
not exist in the schema: :meth:`DashboardStore.open` looks in the catalog once
and builds the statements for what it finds; without them every job is in
one queue, "default". Likewise the workflow columns (migration 0014): without
them a job row has no wait to show; the dependency table (0015): without
it no job is part of a graph; and the batch table (0020): without it no
job ran in a batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from ..enums import DEFAULT_QUEUE, FINAL_STATUSES, JobStatus
from .batches import in_batch, with_batches
from .fair import FairStore
from .keys import KeyStore
from .limits import LimitStore
from .names import DEFAULT_SCHEMA, Qualifier
from .queues import FAIR_GROUPS, GROUPS, HEADS, QueueStore
from .workflow_views import WorkflowViews

ALL_STATUSES = [s.value for s in JobStatus]
_FINAL = sorted(s.value for s in FINAL_STATUSES)

_DETECT = """
SELECT to_regclass($1) IS NOT NULL AS has_jobs,
       EXISTS (SELECT 1 FROM pg_attribute a
                WHERE a.attrelid = to_regclass($1) AND a.attname = 'queue'
                  AND NOT a.attisdropped) AS has_queue_column,
       to_regclass($2) IS NOT NULL AS has_queue_table,
       EXISTS (SELECT 1 FROM pg_attribute a
                WHERE a.attrelid = to_regclass($1) AND a.attname = 'wait_kind'
                  AND NOT a.attisdropped) AS has_workflows,
       to_regclass($3) IS NOT NULL AS has_dependencies,
       EXISTS (SELECT 1 FROM pg_attribute a
                WHERE a.attrelid = to_regclass($1) AND a.attname = 'concurrency_key'
                  AND NOT a.attisdropped) AS has_keys,
       to_regclass($4) IS NOT NULL AS has_fair_share,
       to_regclass($5) IS NOT NULL AS has_batches
"""
# One pass over the table: the overview's and the queues page's counts.
_COUNTS = """
SELECT {queue} AS queue, task_name, status, count(*)::bigint AS n,
       count(*) FILTER (WHERE status = 'pending' AND execution_time <= now())::bigint AS due
  FROM scheduled_jobs
 GROUP BY 1, 2, 3
"""
# Finished jobs per time bucket (scheduled_jobs_finished_idx: status, finished_at).
_SERIES = """
SELECT (floor(extract(epoch FROM finished_at) / $2) * $2)::float8 AS bucket, status,
       count(*)::bigint AS n
  FROM scheduled_jobs
 WHERE status = ANY($3::text[]) AND finished_at >= now() - make_interval(secs => $1)
 GROUP BY 1, 2
 ORDER BY 1
"""
_LIST_COLUMNS = """
    j.job_id, j.job_name, j.task_name, j.status, j.priority, {queue} AS queue,
    j.created_at, j.execution_time, j.started_at, j.finished_at, j.attempts,
    j.max_retries, j.worker_id, j.progress, left(j.task_data::text, 300) AS args,
    left(j.error_message, 300) AS error, {workflow}{batch}
"""
# What a parked workflow waits for (for children: how many have not ended,
# its count, 0016), and a child's parent (0014).
_WORKFLOW_COLUMNS = """j.wait_kind, j.wait_for, j.wake_at, j.parent_job_id,
    CASE WHEN j.wait_kind = 'children' THEN (
        SELECT w.wait_left::bigint FROM workflow_waits w WHERE w.job_id = j.job_id)
    END AS children_waiting"""
_NO_WORKFLOW_COLUMNS = (
    "NULL::text AS wait_kind, NULL::text AS wait_for, NULL::timestamptz AS wake_at, "
    "NULL::text AS parent_job_id, NULL::bigint AS children_waiting"
)
# The batch a batch task's job last ran in (0020): added to a page by
# store.batches.with_batches; none before 0020.
_NO_BATCH_COLUMNS = ", NULL::text AS batch_id, NULL::int AS batch_size"
# $1 statuses, ($2, $3) the keyset cursor (exclusive; an "until" time is
# folded into it), $4 task or job name, $5 created_at lower bound, $6 search
# text (a job id, or text in the arguments), $7 page size, $8 queue. One
# upper bound only: a row comparison and a scalar bound on the same column
# would leave the index scan starting at the looser one.
# The filters a page applies, per candidate row.
_LIST_FILTERS = """
       AND (j.created_at, j.job_id)
           < (COALESCE($2::timestamptz, 'infinity'), COALESCE($3::text, ''))
       AND j.created_at >= COALESCE($5::timestamptz, '-infinity')
       AND ($4::text IS NULL OR j.task_name = $4 OR j.job_name = $4)
       AND ($6::text IS NULL OR j.job_id = $6
            OR strpos(lower(j.task_data::text), lower($6)) > 0)
       AND {queue_filter}"""
# One short range of scheduled_jobs_dashboard_idx per status (migration 0009),
# which leaves running rows out so that a claim does not write to it: those,
# at most the workers' concurrency, come from scheduled_jobs_running_idx.
_LIST = """
SELECT y.* FROM (
    SELECT x.* FROM unnest($1::text[]) AS s(status)
     CROSS JOIN LATERAL (
        SELECT {columns}
          FROM scheduled_jobs j
         WHERE j.status = s.status AND j.status <> 'running' {filters}
         ORDER BY j.created_at DESC, j.job_id DESC
         LIMIT $7
     ) x
    UNION ALL
    (SELECT {columns}
       FROM scheduled_jobs j
      WHERE j.status = 'running' AND 'running' = ANY($1::text[]) {filters}
      ORDER BY j.created_at DESC, j.job_id DESC
      LIMIT $7)
) y
 ORDER BY y.created_at DESC, y.job_id DESC
 LIMIT $7
"""
# The jobs of one batch ($9, migration 0020): its job ids from its row, each
# read by the primary key (at most the batch's size), with the same filters.
_LIST_BATCH = """
SELECT {columns}
  FROM scheduled_jobs j
 WHERE {in_batch} AND j.status = ANY($1::text[]) {filters}
 ORDER BY j.created_at DESC, j.job_id DESC
 LIMIT $7
"""
_LIST_ORDER = "p.created_at DESC, p.job_id DESC"
# The oldest due job's wait, leaving out the tasks given ($1: the orphaned
# ones, which no live worker runs): one index descent per (queue, task,
# priority) group of pending rows, as the statistics' oldest due wait.
_SERVED_OLDEST_DUE = f"""
WITH RECURSIVE {GROUPS}, {FAIR_GROUPS}
SELECT EXTRACT(EPOCH FROM now() - LEAST(min(g.execution_time), {{keyed}}))::float8
  FROM {HEADS} g WHERE g.execution_time <= now() AND g.task_name <> ALL($1::text[])
"""
# Keyed rows (migration 0017) are outside the groups: their earliest due one.
_KEYED_OLDEST_DUE = """(SELECT min(k.execution_time) FROM scheduled_jobs k
            WHERE k.status = 'pending' AND k.concurrency_key IS NOT NULL
              AND k.execution_time <= now() AND k.task_name <> ALL($1::text[]))"""
# A schema before 0017 has no keys: its groups are every pending row's.
_NO_KEYS = " AND j.concurrency_key IS NULL"
_JOB_QUEUE = "SELECT queue FROM scheduled_jobs WHERE job_id = $1"
# A hot standby (a streaming replica) answers true: it serves reads only, and
# refuses LISTEN and every write.
_IN_RECOVERY = "SELECT pg_is_in_recovery()"
# Whether a job is part of a graph: it has an edge either way (each side indexed).
_IN_GRAPH = """
SELECT EXISTS (SELECT 1 FROM job_dependencies e WHERE e.job_id = $1)
    OR EXISTS (SELECT 1 FROM job_dependencies e WHERE e.depends_on = $1)
"""
_RUNNING = """
SELECT worker_id, job_id, task_name, started_at, progress
  FROM scheduled_jobs WHERE status = 'running'
 ORDER BY started_at, job_id
 LIMIT $1
"""
_QUEUE_SETTINGS = "SELECT name, paused, to_jsonb(q)::text AS settings FROM {table} q ORDER BY name"


@dataclass(frozen=True, slots=True)
class Catalog:
    """What this schema has, read once: the job table, named queues, workflows,
    dependencies."""

    has_jobs: bool
    has_queue_column: bool
    has_queue_table: bool
    has_workflows: bool = False
    has_dependencies: bool = False
    has_keys: bool = False
    has_fair_share: bool = False
    has_batches: bool = False


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a job page ends: the last row's (created_at, job_id)."""

    created_at: datetime
    job_id: str


class DashboardStore:
    """The dashboard's statements for one schema; build it with :meth:`open`."""

    def __init__(
        self, pool: asyncpg.Pool, schema: str = DEFAULT_SCHEMA, catalog: Catalog | None = None
    ) -> None:
        self.pool = pool
        self.catalog = catalog or Catalog(True, False, False)
        q = Qualifier(schema)
        self.qualify = q
        queue = "j.queue" if self.catalog.has_queue_column else f"'{DEFAULT_QUEUE}'::text"
        self._counts = q(_COUNTS.format(queue=queue.removeprefix("j.")))
        self._series = q(_SERIES)
        queue_filter = (
            "($8::text IS NULL OR j.queue = $8)"
            if self.catalog.has_queue_column
            else f"($8::text IS NULL OR $8 = '{DEFAULT_QUEUE}')"
        )
        columns = _LIST_COLUMNS.format(
            queue=queue,
            workflow=_WORKFLOW_COLUMNS if self.catalog.has_workflows else _NO_WORKFLOW_COLUMNS,
            batch="" if self.catalog.has_batches else _NO_BATCH_COLUMNS,
        )
        filters = _LIST_FILTERS.format(queue_filter=queue_filter)
        listed = _LIST.format(columns=columns, filters=filters)
        self._list = q(with_batches(listed, _LIST_ORDER) if self.catalog.has_batches else listed)
        self._list_batch = (
            q(
                with_batches(
                    _LIST_BATCH.format(columns=columns, in_batch=in_batch("$9"), filters=filters),
                    _LIST_ORDER,
                )
            )
            if self.catalog.has_batches
            else None
        )
        self._job_queue = q(_JOB_QUEUE) if self.catalog.has_queue_column else None
        self._running = q(_RUNNING)
        self._in_graph = q(_IN_GRAPH) if self.catalog.has_dependencies else None
        keys = self.catalog.has_keys
        oldest = _SERVED_OLDEST_DUE.format(keyed=_KEYED_OLDEST_DUE if keys else "NULL")
        self._served_oldest_due = q(oldest if keys else oldest.replace(_NO_KEYS, ""))
        self.keys = KeyStore(q) if keys else None
        self.fair = FairStore(pool, q) if self.catalog.has_fair_share else None
        queues_table = q.table("scheduler_queues")
        self._queue_settings = _QUEUE_SETTINGS.format(table=queues_table)
        self._queues = QueueStore(pool, schema)
        self.limits = LimitStore(pool, q)
        self.workflows = WorkflowViews(pool, schema)

    @classmethod
    async def open(cls, pool: asyncpg.Pool, schema: str = DEFAULT_SCHEMA) -> DashboardStore:
        """Read the catalog once and build the statements for what this schema has."""
        q = Qualifier(schema)
        row = await pool.fetchrow(
            _DETECT,
            q.table("scheduled_jobs"),
            q.table("scheduler_queues"),
            q.table("job_dependencies"),
            q.table("scheduler_fair_share_starts"),
            q.table("scheduler_batches"),
        )
        return cls(pool, schema, Catalog(**dict(row)))

    async def in_recovery(self) -> bool:
        """Whether the server is a standby in recovery (a read replica)."""
        return bool(await self.pool.fetchval(_IN_RECOVERY))

    async def counts(self) -> list[asyncpg.Record]:
        """(queue, task_name, status, n, due) for every combination with rows."""
        return await self.pool.fetch(self._counts)

    async def finished_series(
        self, seconds: float, bucket: float, statuses: Sequence[str] = _FINAL
    ) -> list[asyncpg.Record]:
        """Jobs finished in the last ``seconds``, per ``bucket``-second bucket and status."""
        return await self.pool.fetch(self._series, seconds, bucket, list(statuses))

    async def list_jobs(
        self,
        *,
        statuses: Sequence[str] | None = None,
        task: str | None = None,
        queue: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        search: str | None = None,
        after: Cursor | None = None,
        limit: int = 50,
        batch_id: str | None = None,
    ) -> list[asyncpg.Record]:
        """One page of jobs, newest first, strictly after ``after`` when given;
        created in [``since``, ``until``); of batch ``batch_id`` when given."""
        if until is not None and (after is None or until <= after.created_at):
            after = Cursor(until, "")  # (created_at, job_id) < (until, '') is created_at < until
        args = (
            list(statuses) if statuses else ALL_STATUSES,
            after.created_at if after else None,
            after.job_id if after else None,
            task,
            since,
            search,
            limit,
            queue,
        )
        if batch_id is None:
            return await self.pool.fetch(self._list, *args)
        if self._list_batch is None:  # before 0020: no job ran in a batch
            return []
        return await self.pool.fetch(self._list_batch, *args, batch_id)

    async def served_oldest_due_seconds(
        self, conn: asyncpg.Connection, orphaned_tasks: Sequence[str]
    ) -> float | None:
        """Seconds the oldest due job of a task not in ``orphaned_tasks`` has waited."""
        return await conn.fetchval(self._served_oldest_due, list(orphaned_tasks))

    async def job_queue(self, job_id: str) -> str:
        if self._job_queue is None:
            return DEFAULT_QUEUE
        return await self.pool.fetchval(self._job_queue, job_id) or DEFAULT_QUEUE

    async def in_graph(self, job_id: str) -> bool:
        """Whether the job depends on another or another on it (False before 0015)."""
        if self._in_graph is None:
            return False
        return bool(await self.pool.fetchval(self._in_graph, job_id))

    async def running_jobs(self, limit: int = 1000) -> list[asyncpg.Record]:
        return await self.pool.fetch(self._running, limit)

    async def queue_settings(self) -> list[asyncpg.Record]:
        """Rows of ``scheduler_queues`` (name, paused, the whole row as JSON); [] without it."""
        if not self.catalog.has_queue_table:
            return []
        return await self.pool.fetch(self._queue_settings)

    async def set_queue_paused(self, name: str, paused: bool) -> bool:
        """Pause or resume a queue; a resume wakes the workers. False without queues."""
        if not self.catalog.has_queue_table:
            return False
        # As pause_queue/resume_queue: stored, announced to every worker (a pause
        # hands back claimed-ahead rows of the queue), a resume wakes its workers.
        await self._queues.set_paused(name, paused)
        return True
