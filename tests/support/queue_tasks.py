"""Tasks in named queues, for tests/integration/test_queues.py and its worker subprocesses.

In-process tests read ``starts`` and ``peak``; subprocess workers record each
run in ``queue_runs`` (queue, pid, start time by the database's clock)."""

from __future__ import annotations

import asyncio
import os
from collections import defaultdict

import asyncpg

from pg_scheduler import current_job, task

starts: defaultdict[str, list[str]] = defaultdict(list)
running: defaultdict[str, int] = defaultdict(int)
peak: defaultdict[str, int] = defaultdict(int)
_pool: asyncpg.Pool | None = None


async def _track(queue: str, key: str, seconds: float) -> str:
    starts[queue].append(key)
    running[queue] += 1
    peak[queue] = max(peak[queue], running[queue])
    try:
        await asyncio.sleep(seconds)
    finally:
        running[queue] -= 1
    return key


@task(name="q.email", queue="emails")
async def send_email(key: str, seconds: float = 0.0) -> str:
    return await _track("emails", key, seconds)


@task(name="q.report", queue="reports")
async def build_report(key: str, seconds: float = 0.0) -> str:
    return await _track("reports", key, seconds)


@task(name="q.plain")
async def plain(key: str, seconds: float = 0.0) -> str:
    return await _track("default", key, seconds)


async def _record(queue: str, n: int, seconds: float) -> int:
    global _pool
    if _pool is None:  # one per worker process
        _pool = await asyncpg.create_pool(os.environ["PG_SCHEDULER_DSN"], min_size=1, max_size=4)
    await _pool.execute(
        "INSERT INTO queue_runs (queue, n, pid, at) VALUES ($1, $2, $3, clock_timestamp())",
        queue,
        n,
        os.getpid(),
    )
    await asyncio.sleep(seconds)
    return n


@task(name="q.mp_email", queue="emails")
async def mp_email(n: int, seconds: float = 0.0) -> int:
    return await _record("emails", n, seconds)


@task(name="q.mp_report", queue="reports")
async def mp_report(n: int, seconds: float = 0.0) -> int:
    return await _record("reports", n, seconds)


SETTINGS = {
    "max_concurrent_jobs": 10,
    "batch_claim_limit": 10,
    "vacuum_enabled": False,
    "heartbeat_interval": 0.5,
    "run_periodic_jobs": False,
}


@task(name="q.own_queue", queue="reports")
async def own_queue() -> str:
    """The queue the job sees through current_job()."""
    return current_job().queue
