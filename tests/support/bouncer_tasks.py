"""Tasks for the pgbouncer tests: each execution is recorded in ``bouncer_runs``."""

from __future__ import annotations

import asyncio
import os

import asyncpg

from pg_scheduler import task

_pool: asyncpg.Pool | None = None


@task(name="bouncer.record")
async def record(n: int) -> int:
    global _pool
    if _pool is None:  # one per worker process, through pgbouncer like the worker
        _pool = await asyncpg.create_pool(
            os.environ["PG_SCHEDULER_DSN"], min_size=1, max_size=4, statement_cache_size=0
        )
    await _pool.execute("INSERT INTO bouncer_runs (n, pid) VALUES ($1, $2)", n, os.getpid())
    # Long enough that one worker alone needs over a second for the test's 1,000 jobs
    # (20 at a time), so the other polling worker always gets a share.
    await asyncio.sleep(0.03)
    return n


SETTINGS = {
    "max_concurrent_jobs": 20,
    "batch_claim_limit": 20,
    "vacuum_enabled": False,
    "heartbeat_interval": 0.5,
}
