"""Tasks for multi-process tests: each run is recorded in ``job_runs``."""

from __future__ import annotations

import os

import asyncpg

from pg_scheduler import current_job, task

_pool: asyncpg.Pool | None = None


async def _get_pool() -> asyncpg.Pool:
    global _pool
    if _pool is None:  # one per worker process
        _pool = await asyncpg.create_pool(os.environ["PG_SCHEDULER_DSN"], min_size=1, max_size=4)
    return _pool


@task(name="mp.log_run")
async def log_run(n: int) -> int:
    pool = await _get_pool()
    job = current_job()
    await pool.execute(
        "INSERT INTO job_runs (n, pid, job_id, attempt) VALUES ($1, $2, $3, $4)",
        n,
        os.getpid(),
        job.job_id if job else None,
        job.attempt if job else None,
    )
    return n


SETTINGS = {
    "max_concurrent_jobs": 20,
    "batch_claim_limit": 20,
    "vacuum_enabled": False,
    # Stress knob: PG_SCHEDULER_MP_HEARTBEAT=0.005 makes the heartbeat collide
    # with completion batches: a few deadlocks per run (rare at the default 0.5).
    "heartbeat_interval": float(os.environ.get("PG_SCHEDULER_MP_HEARTBEAT", "0.5")),
}
