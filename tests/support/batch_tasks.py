"""A batch task for the kill -9 test: each call records, for every job of its
batch, the job id, the attempt and the worker's pid in ``batch_runs`` by the
database's clock (on its own pool, ``PG_SCHEDULER_DSN``), then sleeps a
little so that a kill lands mid-batch."""

from __future__ import annotations

import asyncio
import os

import asyncpg

from pg_scheduler import BatchItem, task

_pool: asyncpg.Pool | None = None

TABLE = """
CREATE TABLE IF NOT EXISTS batch_runs (
    run_id     BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id     TEXT NOT NULL,
    attempt    INTEGER NOT NULL,
    pid        INTEGER NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
)
"""

#: How long each call holds its batch.
SECONDS = 0.2


async def _get_pool() -> asyncpg.Pool:
    global _pool
    if _pool is None:  # one per worker process
        _pool = await asyncpg.create_pool(os.environ["PG_SCHEDULER_DSN"], min_size=1, max_size=2)
    return _pool


@task(name="batch.record", batch_size=20, batch_timeout=0.2)
async def record(batch: list[BatchItem]) -> list[int]:
    pool = await _get_pool()
    await pool.executemany(
        "INSERT INTO batch_runs (job_id, attempt, pid) VALUES ($1, $2, $3)",
        [(item.job_id, item.attempt, os.getpid()) for item in batch],
    )
    await asyncio.sleep(SECONDS)
    return [item.arg for item in batch]


SETTINGS = {
    "max_concurrent_jobs": 4,
    "batch_claim_limit": 10,
    "vacuum_enabled": False,
    "heartbeat_interval": 0.3,
    "heartbeat_threshold": 2.0,
    "lease_duration": 3.0,
    "rescue_interval": 0.5,
}
