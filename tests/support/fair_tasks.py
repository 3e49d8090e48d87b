"""Tasks for the fair share tests across worker processes: each run records
its tenant, its number, its process and its start (the database's clock)."""

from __future__ import annotations

import asyncio
import os

import asyncpg

from pg_scheduler import task

_pool: asyncpg.Pool | None = None


@task(name="fair.record")
async def record(tenant: str, n: int, hold: float = 0.0) -> None:
    global _pool
    if _pool is None:  # one per worker process
        _pool = await asyncpg.create_pool(os.environ["PG_SCHEDULER_DSN"], min_size=1, max_size=4)
    await _pool.execute(
        "INSERT INTO fair_runs (tenant, n, pid, started) VALUES ($1, $2, $3, clock_timestamp())",
        tenant,
        n,
        os.getpid(),
    )
    if hold:
        await asyncio.sleep(hold)


SETTINGS = {
    "max_concurrent_jobs": 8,
    "batch_claim_limit": 8,
    "vacuum_enabled": False,
    "run_periodic_jobs": False,
    "heartbeat_interval": 0.3,
    "heartbeat_threshold": 2.0,
    "lease_duration": 3.0,
    "rescue_interval": 0.5,
}
