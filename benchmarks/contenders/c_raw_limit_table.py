"""The raw limit's two statements on pg_scheduler's own table: what the table costs.

The worker loop of ``c_raw_limit`` (claim a batch with ``FOR UPDATE SKIP
LOCKED``, acknowledge it in one UPDATE on a second connection while the next
claim runs, no per-job Python work), run against ``scheduled_jobs`` as this
repository's migrations create it (the 0.2.x columns and the indexes of
queues, dedupe keys, periodic windows, the dashboard and the vacuum), filled
by this library's ``schedule_bulk``. So its drain is the ceiling this table
sets for any claim and completion, and ``pg_scheduler / raw_limit_table`` is
the share of it the library's own statements and Python keep.

The claim names the one (queue, task, priority) group the drain has, so it
reads ``scheduled_jobs_claim_idx`` from its head as the library's claim does;
the claim sets the columns the library's claim sets, and the
acknowledgement those its completion sets.
"""

from __future__ import annotations

from c_pg_scheduler import Contender as _Library
from c_raw_limit import Contender as _RawLimit

from pg_scheduler import Scheduler

_TAKE = """
UPDATE scheduled_jobs j
   SET status = 'running', worker_id = 'raw', attempts = j.attempts + 1, started_at = now(),
       last_heartbeat = now(), lease_until = now() + interval '60 seconds', claimed_ahead = false
  FROM (SELECT ctid AS tid FROM scheduled_jobs
         WHERE status = 'pending' AND queue = 'default' AND task_name = 'bench.job'
           AND priority = 5 AND execution_time <= now()
         ORDER BY execution_time LIMIT $1 FOR UPDATE SKIP LOCKED) t
 WHERE j.ctid = t.tid
RETURNING j.job_id, (j.task_data -> 'args' ->> 0)::bigint"""
_DONE = """
UPDATE scheduled_jobs SET status = 'completed', finished_at = now(), lease_until = NULL
 WHERE job_id = ANY($1::text[])"""


class Contender(_RawLimit):
    version = "raw limit's statements on pg_scheduler's scheduled_jobs (this repo's schema)"
    take_sql = _TAKE
    done_sql = _DONE
    wake_channel = "pg_scheduler_jobs"
    producer: Scheduler | None = None

    # The table's side is the library contender's: its schema, its bulk
    # enqueue of the same task, its counts.
    setup = _Library.setup
    _copy = _Library._bulk
    analyze = _Library.analyze
    count_jobs = _Library.count_jobs
    remaining = _Library.remaining

    async def enqueue_one(self, i: int, future: bool = False) -> None:
        raise NotImplementedError("raw_limit_table runs the drain scenarios only")
