"""Orphaned work: what waits for a process that is not there.

* **Orphaned jobs**: pending jobs already due whose task no live worker has
  registered (no row of ``scheduler_workers`` seen within the heartbeat
  threshold lists it in ``tasks``). Nothing will run them until a worker with
  that task starts: a stopped application, a renamed task, a typo.
* **Orphaned periodic jobs**: rows of ``periodic_jobs`` whose runner task
  (``periodic:<dedup key>``) no live worker lists: no live process declares
  them, so no window of theirs is enqueued or run.

:meth:`OrphanStore.read` is the one read (the CLI's ``status`` and
``orphans``, ``Scheduler.stats()``, the dashboard); :meth:`OrphanStore.delete`
removes what it finds, checking the same conditions again in the statement
itself, so work a worker took up meanwhile is left alone. Also here: the task
names live workers list (``schedule_job``'s check of a name) and the names
periodic jobs are shown by.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple

import asyncpg

from .fair_sql import FAIR_DUE_GROUPS
from .names import DEFAULT_SCHEMA, Executor, Qualifier
from .periodic import PERIODIC_TASK_PREFIX
from .queues import FAIR_GROUPS, GROUPS

# A live worker lists the task named by the SQL expression {task}.
_SERVED = """EXISTS (SELECT 1 FROM scheduler_workers w
                WHERE w.last_seen >= now() - make_interval(secs => $1)
                  AND {task} = ANY(w.tasks))"""

# One index descent per (queue, task, priority) group of pending rows (see
# queues.py); only the groups of tasks no live worker serves are counted.
# Groups of tasks no live worker serves (a condition on ``g.task_name``).
_ORPHAN_KEEP = f"""($2::text[] IS NULL OR g.task_name = ANY($2::text[]))
       AND NOT {_SERVED.format(task="g.task_name")}"""
_ORPHANED_JOBS = f"""
WITH RECURSIVE {GROUPS}, {FAIR_GROUPS}, {FAIR_DUE_GROUPS.format(keep=_ORPHAN_KEEP)},
due_groups AS (
    SELECT g.task_name, g.queue, c.n, c.oldest
      FROM groups g
     CROSS JOIN LATERAL (
        SELECT count(*) AS n, min(j.execution_time) AS oldest FROM scheduled_jobs j
         WHERE j.status = 'pending' AND j.concurrency_key IS NULL AND j.fair_share_key IS NULL
           AND j.queue = g.queue AND j.task_name = g.task_name
           AND j.priority = g.priority AND j.execution_time <= now()
     ) c
     WHERE g.execution_time <= now()
       AND {_ORPHAN_KEEP}
    UNION ALL
    -- Rows with a fair share key (migration 0018), from their own index.
    SELECT task_name, queue, n, oldest FROM fair_due_groups
)
SELECT d.task_name, d.queue, sum(d.n)::bigint AS due, min(d.oldest) AS oldest_due,
       min(p.job_name) AS periodic_name
  FROM due_groups d
  LEFT JOIN periodic_jobs p ON d.task_name = '{PERIODIC_TASK_PREFIX}' || p.dedup_key
 GROUP BY d.task_name, d.queue
 ORDER BY d.task_name, d.queue
"""
# The predicate of scheduled_jobs_periodic_pending_idx, word for word.
_ORPHANED_PERIODIC = f"""
SELECT p.dedup_key, p.job_name, p.task_name, p.schedule, p.enabled, p.next_run,
       (SELECT count(*) FROM scheduled_jobs j
         WHERE j.status = 'pending' AND starts_with(j.task_name, 'periodic:')
           AND j.task_name = p.task_name) AS pending
  FROM periodic_jobs p
 WHERE ($2::text[] IS NULL OR p.dedup_key = ANY($2::text[]) OR p.job_name = ANY($2::text[])
        OR p.task_name = ANY($2::text[]))
   AND NOT {_SERVED.format(task="p.task_name")}
 ORDER BY p.job_name, p.dedup_key
"""
_DELETE_ORPHANED_JOBS = f"""
DELETE FROM scheduled_jobs j
 WHERE j.status = 'pending' AND j.execution_time <= now()
   AND ($2::text[] IS NULL OR j.task_name = ANY($2::text[]))
   AND NOT {_SERVED.format(task="j.task_name")}
RETURNING j.job_id
"""
# The declaration and every pending window of it (due or not).
_DELETE_ORPHANED_PERIODIC = f"""
WITH gone AS (
    DELETE FROM periodic_jobs p
     WHERE ($2::text[] IS NULL OR p.dedup_key = ANY($2::text[]) OR p.job_name = ANY($2::text[])
            OR p.task_name = ANY($2::text[]))
       AND NOT {_SERVED.format(task="p.task_name")}
    RETURNING p.dedup_key, p.task_name
), windows AS (
    DELETE FROM scheduled_jobs j USING gone g
     WHERE j.status = 'pending' AND starts_with(j.task_name, 'periodic:')
       AND j.task_name = g.task_name
    RETURNING j.job_id
)
SELECT (SELECT array_agg(dedup_key ORDER BY dedup_key) FROM gone) AS keys,
       (SELECT count(*) FROM windows) AS windows
"""
_LIVE_TASKS = """
SELECT DISTINCT unnest(tasks) AS task_name FROM scheduler_workers
 WHERE last_seen >= now() - make_interval(secs => $1)
"""
_PERIODIC_NAMES = "SELECT task_name, job_name FROM periodic_jobs"
# Whether the database knows a task or queue name at all: a worker (live or
# not yet forgotten) lists the task, a job of any status carries it, a limit
# names it; a queue is configured, or a job of any status is in it.
_TASK_KNOWN = """
SELECT EXISTS (SELECT 1 FROM scheduler_workers WHERE $1 = ANY(tasks))
    OR EXISTS (SELECT 1 FROM scheduler_limits WHERE scope = 'task' AND name = $1)
    OR EXISTS (SELECT 1 FROM scheduled_jobs WHERE task_name = $1)
"""
_QUEUE_KNOWN = """
SELECT EXISTS (SELECT 1 FROM scheduler_queues WHERE name = $1)
    OR EXISTS (SELECT 1 FROM scheduler_limits WHERE scope = 'queue' AND name = $1)
    OR EXISTS (SELECT 1 FROM scheduled_jobs WHERE queue = $1)
"""


class OrphanedJobs(NamedTuple):
    """Due jobs of one task in one queue that no live worker runs."""

    task_name: str
    queue: str
    due: int
    oldest_due: datetime
    #: The periodic job's name when these are windows of one, else None.
    periodic_name: str | None


class OrphanedPeriodic(NamedTuple):
    """A stored periodic job no live process declares."""

    dedup_key: str
    job_name: str
    task_name: str
    schedule: str
    enabled: bool
    next_run: datetime | None
    #: Its windows waiting in scheduled_jobs (due or not).
    pending: int


class Orphans(NamedTuple):
    jobs: list[OrphanedJobs]
    periodic: list[OrphanedPeriodic]

    def __bool__(self) -> bool:
        return bool(self.jobs or self.periodic)


class Removed(NamedTuple):
    """What :meth:`OrphanStore.delete` removed."""

    jobs: int
    periodic: list[str]  # dedup keys
    windows: int  # their pending windows


class OrphanStore:
    """The statements about orphaned work in one schema."""

    def __init__(self, pool: asyncpg.Pool, schema: str = DEFAULT_SCHEMA) -> None:
        self.pool = pool
        q = Qualifier(schema)
        self.schema = q.schema
        self._jobs = q(_ORPHANED_JOBS)
        self._periodic = q(_ORPHANED_PERIODIC)
        self._delete_jobs = q(_DELETE_ORPHANED_JOBS)
        self._delete_periodic = q(_DELETE_ORPHANED_PERIODIC)
        self._live_tasks = q(_LIVE_TASKS)
        self._periodic_names = q(_PERIODIC_NAMES)
        self._task_known = q(_TASK_KNOWN)
        self._queue_known = q(_QUEUE_KNOWN)

    async def read(
        self,
        heartbeat_threshold: float,
        names: Sequence[str] | None = None,
        db: Executor | None = None,
    ) -> Orphans:
        """Orphaned jobs and periodic jobs; ``names``: only these tasks (a
        periodic job also by its dedup key or job name). ``db``: a connection
        (inside a snapshot) instead of the pool."""
        on = db or self.pool
        wanted = list(names) if names else None
        jobs = await on.fetch(self._jobs, float(heartbeat_threshold), wanted)
        periodic = await on.fetch(self._periodic, float(heartbeat_threshold), wanted)
        return Orphans(
            [OrphanedJobs(*r) for r in jobs],
            [OrphanedPeriodic(*r) for r in periodic],
        )

    async def delete(
        self, heartbeat_threshold: float, names: Sequence[str] | None = None
    ) -> Removed:
        """Delete orphaned due jobs, and orphaned periodic jobs with their pending
        windows, in one transaction; each statement checks again that no live
        worker serves what it deletes."""
        wanted = list(names) if names else None
        threshold = float(heartbeat_threshold)
        async with self.pool.acquire() as conn, conn.transaction():
            periodic = await conn.fetchrow(self._delete_periodic, threshold, wanted)
            jobs = await conn.fetch(self._delete_jobs, threshold, wanted)
        return Removed(len(jobs), list(periodic["keys"] or []), periodic["windows"])

    async def live_tasks(self, heartbeat_threshold: float) -> set[str]:
        """Every task name a live worker lists."""
        rows = await self.pool.fetch(self._live_tasks, float(heartbeat_threshold))
        return {r["task_name"] for r in rows}

    async def known(self, scope: str, name: str) -> bool:
        """Whether a task (``scope`` "task") or queue ("queue") named ``name`` is
        known to the database (the operators' commands refuse a typo). Reads
        the jobs table without an index: for operators, not a hot path."""
        statement = self._task_known if scope == "task" else self._queue_known
        return bool(await self.pool.fetchval(statement, name))

    async def periodic_names(self, db: Executor | None = None) -> dict[str, str]:
        """Each stored periodic job's runner task name -> its job name."""
        rows = await (db or self.pool).fetch(self._periodic_names)
        return {r["task_name"]: r["job_name"] for r in rows}
