"""SQL of results and events: event flags, progress writes, the eager claim of one job.

Qualified per schema like every store (see store.Qualifier). Events are sent
by the statements that make the transitions (see store.event_sql).
"""

from __future__ import annotations

import asyncpg

from .event_sql import events_cte
from .names import DEFAULT_SCHEMA, EVENTS_CHANNEL, Qualifier

# Keeps the high-volume kinds (scheduled, started) switched on while a
# subscriber wants them; statements stop sending them once ``until`` passes.
# The payload "!events" (never a queue name) tells workers (which cache the flags for the claim's
# started events) to read them again.
_WANT_KINDS = """
WITH wanted AS (
    INSERT INTO scheduler_event_flags (kind, until)
    SELECT k, now() + make_interval(secs => $2) FROM unnest($1::text[]) AS k
    ON CONFLICT (kind) DO UPDATE
       SET until = GREATEST(scheduler_event_flags.until, EXCLUDED.until)
)
SELECT pg_notify('pg_scheduler_jobs', '!events')
"""
# Progress of one attempt. No status guard: the last value, written after the
# job has finished, is still that attempt's progress.
_WRITE_PROGRESS = f"""
WITH written AS (
    UPDATE scheduled_jobs
       SET progress = $3, progress_message = $4, progress_at = now()
     WHERE job_id = $1 AND attempts = $2
    RETURNING job_id, task_name, attempts, worker_id, status, progress, queue
), {
    events_cte(
        "SELECT 'progress', job_id, task_name, attempts, worker_id, progress, queue"
        " FROM written WHERE status = 'running'"
    )
}
SELECT notified FROM sent
"""
# testing.run_job: one pending job, claimed by id whatever its due time.
_CLAIM_ONE = f"""
WITH claimed AS (
    UPDATE scheduled_jobs j
       SET status = 'running', worker_id = $2, attempts = j.attempts + 1, started_at = now(),
           last_heartbeat = now(), lease_until = now() + make_interval(secs => 300)
     WHERE j.job_id = $1 AND j.status = 'pending'
    RETURNING j.job_id, j.job_name, j.task_name, j.task_data::text AS task_data,
              j.priority, j.execution_time, j.status, j.attempts, j.retry_count,
              j.max_retries, j.timeout, j.retry_policy::text AS retry_policy, j.claimed_ahead,
              j.has_dependents, j.queue
), {
    events_cte(
        "SELECT 'started', job_id, task_name, attempts, $2::text, NULL::float8, queue FROM claimed"
    )
}
SELECT c.* FROM claimed c, sent
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
