"""Tasks for the dependency tests: each run records its start (and, when it
returns, its end) in ``dep_runs`` by the database's clock, on its own pool.

In one process a test hands its pool over (:func:`use_pool`); a worker
process opens one on ``PG_SCHEDULER_DSN``.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import asyncpg

from pg_scheduler import current_job, task

_pool: asyncpg.Pool | None = None

TABLE = """
CREATE TABLE IF NOT EXISTS dep_runs (
    run_id     BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name       TEXT NOT NULL,
    job_id     TEXT NOT NULL,
    pid        INTEGER NOT NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    ended_at   TIMESTAMPTZ
)
"""

#: Released by a test to let ``gate`` jobs return.
gates: dict[str, asyncio.Event] = {}


def use_pool(pool: asyncpg.Pool | None) -> None:
    global _pool
    _pool = pool


async def fresh_runs(pool: asyncpg.Pool) -> None:
    """An empty ``dep_runs`` on ``pool``, which the tasks then use; no gate set."""
    await pool.execute(TABLE)
    await pool.execute("TRUNCATE dep_runs")
    use_pool(pool)
    gates.clear()


async def _get_pool() -> asyncpg.Pool:
    global _pool
    if _pool is None:  # one per worker process
        _pool = await asyncpg.create_pool(os.environ["PG_SCHEDULER_DSN"], min_size=1, max_size=4)
    return _pool


async def _started(name: str) -> int:
    pool = await _get_pool()
    run_id: int = await pool.fetchval(
        "INSERT INTO dep_runs (name, job_id, pid) VALUES ($1, $2, $3) RETURNING run_id",
        name,
        current_job().job_id,
        os.getpid(),
    )
    return run_id


async def _ended(run_id: int) -> None:
    pool = await _get_pool()
    await pool.execute("UPDATE dep_runs SET ended_at = clock_timestamp() WHERE run_id = $1", run_id)


@task(name="dep.step")
async def step(name: str = "", seconds: float = 0.0) -> str:
    """Record the run, sleep ``seconds``, return ``name``."""
    run_id = await _started(name)
    if seconds:
        await asyncio.sleep(seconds)
    await _ended(run_id)
    return name


@task(name="dep.fail")
async def fail(name: str) -> None:
    run_id = await _started(name)
    await _ended(run_id)
    raise RuntimeError(f"{name} failed on purpose")


@task(name="dep.collect")
async def collect(name: str) -> list[list[Any]]:
    """Return what the job's dependencies returned, as [job_id, result] pairs in
    the order ``dependency_results()`` gives them (a JSON object stored as
    jsonb would not keep it)."""
    run_id = await _started(name)
    results = await current_job().dependency_results()
    await _ended(run_id)
    return [[job_id, result] for job_id, result in results.items()]


@task(name="dep.gate")
async def gate(name: str) -> str:
    """Wait until the test sets ``gates[name]``."""
    run_id = await _started(name)
    await gates.setdefault(name, asyncio.Event()).wait()
    await _ended(run_id)
    return name


SETTINGS = {
    "max_concurrent_jobs": 10,
    "batch_claim_limit": 10,
    "vacuum_enabled": False,
    "heartbeat_interval": 0.3,
    "heartbeat_threshold": 2.0,
    "lease_duration": 3.0,
    "rescue_interval": 0.5,
}
