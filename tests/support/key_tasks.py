"""Tasks for the per-key limit tests: each run records its key, start and end
in ``key_runs`` (the same table from every worker process)."""

from __future__ import annotations

import asyncio
import os
import time

import asyncpg

from pg_scheduler import task

_pool: asyncpg.Pool | None = None
_making: asyncio.Future[asyncpg.Pool] | None = None


async def pool() -> asyncpg.Pool:
    """The pool runs are written through: one per worker process (jobs that
    start together wait for the same one; the tests close it)."""
    global _pool, _making
    if _pool is None:
        if _making is None or _making.done():
            _making = asyncio.ensure_future(
                asyncpg.create_pool(os.environ["PG_SCHEDULER_DSN"], min_size=1, max_size=4)
            )
        made = await asyncio.shield(_making)
        if _pool is None:
            _pool = made
    return _pool


async def close() -> None:
    """Close this process's pool (the tests' teardown); the next run makes another."""
    global _pool, _making
    made, _pool, _making = _pool, None, None
    if made is not None:
        await made.close()


async def record(key: str, n: int, started: float, hold: float, fail: bool = False) -> None:
    """Hold ``hold`` seconds, then write the run (``fail``: then raise)."""
    await asyncio.sleep(hold)
    ended = time.time()
    await (await pool()).execute(
        "INSERT INTO key_runs (key, n, pid, started, ended, failed)"
        " VALUES ($1, $2, $3, $4, $5, $6)",
        key,
        n,
        os.getpid(),
        started,
        ended,
        fail,
    )
    if fail:
        raise RuntimeError(f"run {n} of {key} fails")


@task(name="keys.hold", concurrency_key=lambda key, n, hold=0.02: key, max_running_per_key=2)
async def hold(key: str, n: int, hold: float = 0.02) -> int:
    await record(key, n, time.time(), hold)
    return n


@task(name="keys.step")
async def step(key: str, n: int, hold: float = 0.0, fail_first: int = 0) -> int:
    """Fails its first ``fail_first`` attempts (counted in key_runs)."""
    started = time.time()
    failed = 0
    if fail_first:
        failed = await (await pool()).fetchval(
            "SELECT count(*) FROM key_runs WHERE key = $1 AND n = $2 AND failed", key, n
        )
    await record(key, n, started, hold, fail=failed < fail_first)
    return n


@task(name="keys.block_loop")
async def block_loop(seconds: float) -> None:
    """Holds the worker's event loop (no await) for ``seconds``: the jobs it
    claimed meanwhile start late."""
    time.sleep(seconds)  # noqa: ASYNC251 (the point: a blocked loop)


SETTINGS = {
    "max_concurrent_jobs": 10,
    "batch_claim_limit": 10,
    "vacuum_enabled": False,
    "run_periodic_jobs": False,
    "heartbeat_interval": 0.3,
    "heartbeat_threshold": 2.0,
    "lease_duration": 3.0,
    "rescue_interval": 0.5,
}


async def make_table(pool: asyncpg.Pool) -> None:
    await pool.execute(
        "CREATE TABLE IF NOT EXISTS key_runs (key text, n int, pid int, started float8,"
        " ended float8, failed bool)"
    )
    await pool.execute("TRUNCATE key_runs")
