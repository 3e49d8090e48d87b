"""Tasks for the priority-across-limits tests: an unlimited no-op, and limited
tasks whose runs record their own start and end stamps (``lp_runs``)."""

from __future__ import annotations

import asyncio
import os
import time

import asyncpg

from pg_scheduler import task

_pool: asyncpg.Pool | None = None


async def _record(kind: str, n: int, started: float) -> None:
    global _pool
    ended = time.time()
    if _pool is None:  # one per worker process
        _pool = await asyncpg.create_pool(os.environ["PG_SCHEDULER_DSN"], min_size=1, max_size=4)
    await _pool.execute(
        "INSERT INTO lp_runs (kind, n, pid, started, ended) VALUES ($1, $2, $3, $4, $5)",
        kind,
        n,
        os.getpid(),
        started,
        ended,
    )


@task(name="lp.plain")
async def plain(n: int) -> int:
    return n


@task(name="lp.capped", max_running=2)
async def capped(n: int) -> int:
    started = time.time()
    await asyncio.sleep(0.005)
    await _record("capped", n, started)
    return n


@task(name="lp.rated")
async def rated(n: int) -> int:
    await _record("rated", n, time.time())
    return n


@task(name="lp.held", max_running=1)
async def held(n: int) -> int:
    started = time.time()
    await asyncio.sleep(0.5)
    await _record("held", n, started)
    return n


#: lp.gate job n runs until OPEN[n] is set (in-process workers only).
OPEN: dict[int, asyncio.Event] = {}


@task(name="lp.gate", max_running=1)
async def gate(n: int) -> int:
    await OPEN.setdefault(n, asyncio.Event()).wait()
    return n


SETTINGS = {
    "max_concurrent_jobs": 10,
    "batch_claim_limit": 10,
    "vacuum_enabled": False,
    "heartbeat_interval": 0.5,
    "run_periodic_jobs": False,
}

# Rescue within seconds (a killed worker's jobs come back quickly).
FAST_RESCUE = {
    **SETTINGS,
    "heartbeat_interval": 0.3,
    "heartbeat_threshold": 2.0,
    "lease_duration": 3.0,
    "rescue_interval": 0.5,
}
