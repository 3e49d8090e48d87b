"""The statement of batch tasks: which queues have a batch ready.

A batch task's jobs are claimed by the ordinary claim (``Store.claim``, one
task's names and one queue, up to the batch size), once this probe says a
batch is ready there: ``batch_size`` jobs due, or the earliest due job has
waited ``batch_timeout``. It reads ``scheduled_jobs_claim_idx`` the way the
claim does (the served groups' skip scan, then each group from its head, at
most ``$3`` index entries per group). Time is the database's ``now()``.

As a batch starts, one statement marks its jobs with the batch (migration
0020): the batch's id and how many jobs the handler was given.
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


# $1 the batch's id, $2 its size, $3 its jobs' ids, $4 their attempts, $5 the
# worker. Fenced on the lease as a completion is: a row that is no longer this
# attempt's (cancelled, rescued, claimed anew) is left as it is. The columns
# are in no index.
_MARK = """
UPDATE scheduled_jobs j
   SET batch_id = $1::uuid, batch_size = $2
  FROM unnest($3::text[], $4::int[]) AS b(job_id, attempts)
 WHERE j.job_id = b.job_id AND j.attempts = b.attempts
   AND (j.worker_id = $5 AND j.status = 'running') IS TRUE
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
        size: int,
        jobs: Sequence[tuple[str, int]],
        worker_id: str,
        db: Executor | None = None,
    ) -> int:
        """Mark ``jobs`` (job id, attempt) as running in batch ``batch_id`` of
        ``size`` jobs; how many rows were marked (those still this worker's)."""
        status = await (db or self.pool).execute(
            self._mark,
            batch_id,
            size,
            [job_id for job_id, _ in jobs],
            [attempt for _, attempt in jobs],
            worker_id,
        )
        return int(status.rsplit(" ", 1)[-1])
