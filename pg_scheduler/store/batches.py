"""The statement of batch tasks: which queues have a batch ready.

A batch task's jobs are claimed by the ordinary claim (``Store.claim``, one
task's names and one queue, up to the batch size), once this probe says a
batch is ready there: ``batch_size`` jobs due, or the earliest due job has
waited ``batch_timeout``. It reads ``scheduled_jobs_claim_idx`` the way the
claim does (the served groups' skip scan, then each group from its head, at
most ``$3`` index entries per group). Time is the database's ``now()``.

As a batch starts, one statement records it (migration 0020): one row of
``scheduler_batches`` with the batch's id, how many jobs the handler was given
and their ids. A job's batch is the latest row naming it (the GIN index on
job_ids); the operator's reads (``get_job``, the CLI's and the dashboard's
job lists) find it with the fragments below: one index probe per job read,
or one per page of jobs. Nothing is written to ``scheduled_jobs``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import asyncpg

from .names import Executor, Qualifier
from .queues import served_groups

# $1 the task's names, $2 queues served (NULL: all), $3 the batch size.
# Per queue: how many jobs are due (at most $3) and how far its earliest
# pending job is from now (negative: due that long ago).
_READY = f"""
{served_groups("$1", "$2", "NULL", "0", limits="none")},
per_group AS (
    SELECT s.queue, s.head,
           (SELECT count(*) FROM (
               SELECT 1 FROM scheduled_jobs j
                WHERE j.status = 'pending' AND j.queue = s.queue
                  AND j.task_name = s.task_name AND j.priority = s.priority
                  AND j.execution_time >= s.head AND j.execution_time <= now()
                LIMIT $3) d) AS due
      FROM served s
)
SELECT queue, LEAST(sum(due), $3)::int AS due,
       EXTRACT(EPOCH FROM (min(head) - now()))::float8 AS head_in
  FROM per_group
 GROUP BY queue
"""


# $1 the batch's id, $2 its task, $3 its queue, $4 the worker, $5 its size
# (the jobs the handler is given), $6 their ids, $7 the first job's attempt.
# Fenced on the lease: written only while the batch's first job is still
# this worker's attempt, so a worker that lost its jobs (their leases expired
# while it stalled; claimed anew elsewhere) cannot write a late row that would
# become their latest batch. One job stands for all: a batch's jobs are
# claimed in one statement and their leases renewed together. One primary key
# lookup (checking every job costs 100: more than the insert itself); no job
# row is written. A job cancelled since stays named: the handler was given it.
_MARK = """
INSERT INTO scheduler_batches (batch_id, task_name, queue, worker_id, batch_size, job_ids)
SELECT $1::uuid, $2, $3, $4, $5, $6::text[]
  FROM scheduled_jobs j
 WHERE j.job_id = ($6::text[])[1] AND j.attempts = $7 AND j.worker_id = $4
RETURNING cardinality(job_ids)
"""


# A job's batch: the latest batch naming it, as batch_id and batch_size. To
# follow ``FROM scheduled_jobs j``. An aggregate over the batches naming the
# job (one or a few: the GIN index on job_ids), not ORDER BY started_at LIMIT
# 1, which a plan could serve by walking scheduler_batches_started_idx back
# from the newest batch to the job's.
def batch_of(job: str) -> str:
    """The lateral join to follow ``FROM scheduled_jobs {job}`` (or a page of
    job rows aliased ``job``): its batch_id and batch_size (``bm``)."""
    return f"""
  LEFT JOIN LATERAL (
      SELECT (array_agg(b.batch_id::text ORDER BY b.started_at DESC))[1] AS batch_id,
             (array_agg(b.batch_size ORDER BY b.started_at DESC))[1] AS batch_size
        FROM scheduler_batches b
       WHERE b.job_ids @> ARRAY[{job}.job_id]) bm ON true"""


BATCH_OF_JOB = batch_of("j")


def in_batch(batch: str) -> str:
    """The condition on job ``j`` of the "jobs of a batch" filters, for the
    batch id parameter ``batch``: among the batch's job ids (read by the
    primary key), and that batch is its latest (a job retried in a later
    batch is that batch's)."""
    return f"""j.job_id = ANY((SELECT b.job_ids FROM scheduler_batches b
                           WHERE b.batch_id = {batch}::uuid)::text[])
       AND (SELECT (array_agg(b.batch_id ORDER BY b.started_at DESC))[1]
              FROM scheduler_batches b
             WHERE b.job_ids @> ARRAY[j.job_id]) = {batch}::uuid"""


def with_batches(page: str, order: str) -> str:
    """``page`` (a statement returning job rows, ``job_id`` among them) with each
    row's batch_id and batch_size (one probe of the GIN index per row of the
    page); ordered by ``order`` (over the page's columns, as ``p``)."""
    return f"""
WITH page AS ({page})
SELECT p.*, bm.batch_id, bm.batch_size FROM page p{batch_of("p")}
 ORDER BY {order}
"""


# Batches that started before the oldest job still in scheduled_jobs name
# none of its jobs (a job is created before it runs): dropped by the vacuum,
# oldest first, at most $1 rows a statement. The oldest job: one descent of
# scheduled_jobs_dashboard_idx (status, created_at) per status, and the
# running rows (scheduled_jobs_running_idx, at most the workers' concurrency).
PRUNE_BATCHES = """
DELETE FROM scheduler_batches WHERE batch_id IN (
    SELECT b.batch_id FROM scheduler_batches b
     WHERE b.started_at < COALESCE(
               (SELECT min(m.created_at) FROM (
                    SELECT (SELECT min(j.created_at) FROM scheduled_jobs j
                             WHERE j.status = s.status AND j.status <> 'running') AS created_at
                      FROM unnest($2::text[]) AS s(status)
                    UNION ALL
                    SELECT min(j.created_at) FROM scheduled_jobs j
                     WHERE j.status = 'running') m),
               'infinity')
     ORDER BY b.started_at
     LIMIT $1)
"""


class BatchQueue(NamedTuple):
    """One queue's pending jobs of a batch task: ``due`` now (at most the batch
    size), and ``head_in`` seconds until its earliest pending job is due
    (negative: due that long ago)."""

    queue: str
    due: int
    head_in: float


class BatchStore:
    """The batch probe, qualified for one schema."""

    def __init__(self, pool: asyncpg.Pool, qualify: Qualifier) -> None:
        self.pool = pool
        self._ready = qualify(_READY)
        self._mark = qualify(_MARK)

    async def queues(
        self,
        task_names: Sequence[str],
        size: int,
        queues: Sequence[str] | None = None,
        db: Executor | None = None,
    ) -> list[BatchQueue]:
        """Every served, unpaused queue with pending jobs of ``task_names``."""
        rows = await (db or self.pool).fetch(
            self._ready, list(task_names), None if queues is None else list(queues), size
        )
        return [BatchQueue(r["queue"], r["due"], r["head_in"]) for r in rows]

    async def mark(
        self,
        batch_id: str,
        task_name: str,
        queue: str,
        jobs: Sequence[tuple[str, int]],
        worker_id: str,
        db: Executor | None = None,
    ) -> int:
        """Record batch ``batch_id`` of ``task_name`` in ``queue``, given ``jobs``
        (job id, attempt; not empty); how many it names (0: not written, the
        first job no longer this worker's attempt)."""
        marked = await (db or self.pool).fetchval(
            self._mark,
            batch_id,
            task_name,
            queue,
            worker_id,
            len(jobs),
            [job_id for job_id, _ in jobs],
            jobs[0][1],
        )
        return int(marked or 0)
