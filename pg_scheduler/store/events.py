"""SQL of results and events: event flags, progress writes, the eager claim of one job.

Qualified per schema like every store (see store.Qualifier). Events
themselves are sent by the triggers of migration 0006, never from here.
"""

from __future__ import annotations

import asyncpg

from .names import DEFAULT_SCHEMA, Qualifier

EVENTS_CHANNEL = "pg_scheduler_events"

# Keeps the high-volume kinds (scheduled, started) switched on while a
# subscriber wants them; the trigger stops sending them once ``until`` passes.
_WANT_KINDS = """
INSERT INTO scheduler_event_flags (kind, until)
SELECT k, now() + make_interval(secs => $2) FROM unnest($1::text[]) AS k
ON CONFLICT (kind) DO UPDATE SET until = GREATEST(scheduler_event_flags.until, EXCLUDED.until)
"""
# Progress of one attempt. No status guard: the last value, written after the
# job has finished, is still that attempt's progress.
_WRITE_PROGRESS = """
UPDATE scheduled_jobs
   SET progress = $3, progress_message = $4, progress_at = now()
 WHERE job_id = $1 AND attempts = $2
"""
# testing.run_job: one pending job, claimed by id whatever its due time.
_CLAIM_ONE = """
UPDATE scheduled_jobs j
   SET status = 'running', worker_id = $2, attempts = j.attempts + 1, started_at = now(),
       last_heartbeat = now(), lease_until = now() + make_interval(secs => 300)
 WHERE j.job_id = $1 AND j.status = 'pending'
RETURNING j.job_id, j.job_name, j.task_name, j.task_data::text AS task_data,
          j.priority, j.execution_time, j.status, j.attempts, j.retry_count,
          j.max_retries, j.timeout, j.retry_policy::text AS retry_policy, j.claimed_ahead
"""


class EventStore:
    def __init__(self, pool: asyncpg.Pool, schema: str = DEFAULT_SCHEMA) -> None:
        self.pool = pool
        q = Qualifier(schema)
        self.channel = q.channel(EVENTS_CHANNEL)
        self._want_kinds = q(_WANT_KINDS)
        self._write_progress = q(_WRITE_PROGRESS)
        self._claim_one = q(_CLAIM_ONE)

    async def want_kinds(self, kinds: list[str], seconds: float) -> None:
        await self.pool.execute(self._want_kinds, kinds, seconds)

    async def write_progress(
        self, job_id: str, attempt: int, fraction: float, message: str | None
    ) -> None:
        await self.pool.execute(self._write_progress, job_id, attempt, fraction, message)

    async def claim_one(self, job_id: str, worker_id: str) -> asyncpg.Record | None:
        return await self.pool.fetchrow(self._claim_one, job_id, worker_id)
