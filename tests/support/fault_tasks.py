"""Tasks for the fault-injection tests and the chaos run.

Every execution inserts a row into ``fault_runs`` (one row per phase, keyed
by a random run id), so a test can count how often a job really ran, on
which process, and whether its ``finally`` ran. The inserts go through their
own small pool, made lazily from ``$PG_SCHEDULER_TEST_DB_URL``, and retry on
connection errors (a run id makes a retried insert idempotent).
"""

from __future__ import annotations

import asyncio
import os
import random
import time
import uuid
from typing import Any

import asyncpg

from pg_scheduler import task
from pg_scheduler.support.reconnect import retry_on_disconnect

# Scheduler options for `pg-scheduler worker tests.support.fault_tasks:CLI_OPTIONS`.
CLI_OPTIONS: dict[str, Any] = {
    "heartbeat_interval": 0.3,
    "heartbeat_threshold": 2.0,
    "lease_duration": 3.0,
    "rescue_interval": 0.5,
    "listener_health_interval": 0.5,
    "vacuum_enabled": False,
    "run_periodic_jobs": False,
}

_pool: asyncpg.Pool | None = None
_pool_lock: asyncio.Lock | None = None


async def _get_pool() -> asyncpg.Pool:
    global _pool, _pool_lock
    if _pool is not None:
        return _pool
    if _pool_lock is None:
        _pool_lock = asyncio.Lock()
    async with _pool_lock:
        if _pool is None:
            url = os.environ["PG_SCHEDULER_TEST_DB_URL"]
            _pool = await retry_on_disconnect(
                lambda: asyncpg.create_pool(url, min_size=1, max_size=8),
                what="fault_tasks pool",
            )
    return _pool


async def record(key: str, phase: str) -> int:
    """Insert one ``fault_runs`` row; return how many ``phase`` rows ``key`` now has."""
    pool = await _get_pool()
    run_id = uuid.uuid4().hex

    async def insert() -> int:
        return await pool.fetchval(
            """
            WITH ins AS (
                INSERT INTO fault_runs (run_id, job_key, pid, phase) VALUES ($1, $2, $3, $4)
                ON CONFLICT (run_id) DO NOTHING
            )
            SELECT count(*) + 1 FROM fault_runs WHERE job_key = $2 AND phase = $4
               AND run_id <> $1
            """,
            run_id,
            key,
            os.getpid(),
            phase,
        )

    return await retry_on_disconnect(insert, what="record run")


@task(name="fault.tracked")
async def tracked(
    key: str, seconds: float = 0.0, first_seconds: float | None = None, fail_first: bool = False
) -> dict[str, Any]:
    """Record 'start', sleep, record 'finally' (also when cancelled).

    The first run of ``key`` sleeps ``first_seconds`` (if given) and, with
    ``fail_first``, raises afterwards; later runs sleep ``seconds``.
    """
    run = await record(key, "start")
    first = run == 1
    try:
        await asyncio.sleep(first_seconds if first and first_seconds is not None else seconds)
        if first and fail_first:
            raise RuntimeError(f"first run of {key} fails")
    finally:
        await record(key, "finally")
    return {"pid": os.getpid(), "run": run}


@task(name="fault.quick")
async def quick(key: str, max_sleep: float = 0.02) -> int:
    """A short job for the throughput-under-faults runs: record, sleep a little."""
    await record(key, "start")
    await asyncio.sleep(random.uniform(0, max_sleep))
    return os.getpid()


@task(name="fault.stale")
async def stale(key: str, first_seconds: float, fail: bool = False) -> dict[str, Any]:
    """First run: sleep, then fail or succeed with no await in between, so a worker
    resumed after SIGSTOP tries to write its outcome at once. Later runs return."""
    run = await record(key, "start")
    if run == 1:
        await asyncio.sleep(first_seconds)
        if fail:
            raise RuntimeError("outcome of the stale first run")
        return {"pid": os.getpid(), "run": run, "stale": True}
    return {"pid": os.getpid(), "run": run}


# Outcomes a job must not be able to loop on: each run is recorded,
# then the job returns or raises something the database or asyncio chokes on.
POISON_KINDS = ("nul-result", "surrogate-result", "big-result", "nul-error", "system-exit")


@task(name="fault.poison")
async def poison(key: str, kind: str) -> Any:
    await record(key, "start")
    if kind == "nul-result":
        return {"text": "a\x00b"}
    if kind == "surrogate-result":
        return ["x\ud800"]
    if kind == "big-result":
        return "x" * 1_100_000
    if kind == "nul-error":
        raise ValueError("bad\x00byte")
    if kind == "system-exit":
        raise SystemExit(1)
    raise ValueError(f"unknown poison kind {kind!r}")


async def _wait_for_go(key: str) -> None:
    pool = await _get_pool()
    sql = "SELECT 1 FROM fault_runs WHERE job_key = $1 AND phase = 'go'"
    while not await pool.fetchval(sql, key):  # noqa: ASYNC110 - polls another process
        await asyncio.sleep(0.05)


@task(name="fault.block_loop")
async def block_loop(key: str, seconds: float, await_after: bool = True) -> dict[str, Any]:
    """Wait for a 'go' row for ``key``, then block the event loop for
    ``seconds`` (time.sleep in an async def, the mistake under test)."""
    run = await record(key, "start")
    await _wait_for_go(key)
    time.sleep(seconds)  # noqa: ASYNC251 - the blocking job under test
    if await_after:
        await record(key, "after")
    return {"pid": os.getpid(), "run": run}
