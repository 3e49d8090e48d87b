"""Tasks for the global-limit tests: each run records its own start and end stamps."""

from __future__ import annotations

import asyncio
import os
import time

import asyncpg

from pg_scheduler import task

_pool: asyncpg.Pool | None = None


async def _record(n: int, started: float, hold: float) -> None:
    global _pool
    await asyncio.sleep(hold)
    ended = time.time()
    if _pool is None:  # one per worker process
        _pool = await asyncpg.create_pool(os.environ["PG_SCHEDULER_DSN"], min_size=1, max_size=4)
    await _pool.execute(
        "INSERT INTO limit_runs (n, pid, started, ended) VALUES ($1, $2, $3, $4)",
        n,
        os.getpid(),
        started,
        ended,
    )


@task(name="limits.capped", max_running=3)
async def capped(n: int) -> int:
    await _record(n, time.time(), 0.01)
    return n


@task(name="limits.rated")
async def rated(n: int) -> int:
    await _record(n, time.time(), 0.0)
    return n


SETTINGS = {
    "max_concurrent_jobs": 10,
    "batch_claim_limit": 10,
    "vacuum_enabled": False,
    "heartbeat_interval": 0.5,
}
