"""A job that blocks the event loop is blamed; its worker's
innocent jobs are spared.

Workers run in their own processes with the fault-test timings (heartbeat
every 0.3 s, threshold 2 s, lease 3 s, rescue every 0.5 s): the blocked
worker's own rescuer is blocked too, so only another process can rescue its
jobs, as in production.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.support.common import wait_until
from tests.support.fault_worker import FAULT, RUNS_DDL, WorkerProcess

pytestmark = pytest.mark.slow

Spawn = Callable[..., Awaitable[WorkerProcess]]
BLOCK = 3.5  # seconds: longer than heartbeat_threshold (2 s) and the lease (3 s)


@pytest.fixture
async def spawn(dsn: str, tmp_path: Path, pool: asyncpg.Pool) -> AsyncIterator[Spawn]:
    await pool.execute(RUNS_DDL)
    await pool.execute("TRUNCATE fault_runs")
    started: list[WorkerProcess] = []

    async def start(name: str, **options: Any) -> WorkerProcess:
        worker = await WorkerProcess.start(dsn, tmp_path, name, **{**FAULT, **options})
        started.append(worker)
        await worker.ready()
        return worker

    yield start
    for worker in started:
        await worker.close()
        print(f"----- {worker.name} (pid {worker.proc.pid}) -----\n{worker.log_tail(6000)}")


@pytest.fixture
async def producer(make_scheduler: Callable[..., Awaitable[Any]]) -> Any:
    return await make_scheduler(start=False)  # enqueues only


async def enqueue(producer: Any, task: str, max_retries: int = 0, **kwargs: Any) -> str:
    return await producer.schedule_job(
        task, datetime.now(UTC), {"kwargs": kwargs}, max_retries=max_retries
    )


async def starts(pool: asyncpg.Pool, key: str, phase: str = "start") -> int:
    return await pool.fetchval(
        "SELECT count(*) FROM fault_runs WHERE job_key = $1 AND phase = $2", key, phase
    )


async def rows(pool: asyncpg.Pool, ids: list[str]) -> dict[str, asyncpg.Record]:
    found = await pool.fetch(
        """SELECT job_id, status, worker_id, attempts, rescue_count, retry_count,
                  error_message, result::text AS result
             FROM scheduled_jobs WHERE job_id = ANY($1::text[])""",
        ids,
    )
    return {r["job_id"]: r for r in found}


async def setup_blocked_worker(
    pool: asyncpg.Pool, spawn: Spawn, producer: Any, blocker_kwargs: dict[str, Any], **options: Any
) -> tuple[WorkerProcess, WorkerProcess, str, list[str]]:
    """Worker A runs 4 innocent jobs and the blocker; worker B is live (it would
    rescue and re-run them); then the blocker is told to block."""
    a = await spawn("blocked", **options)
    innocents = [
        await enqueue(producer, "fault.tracked", key=f"innocent-{n}", seconds=BLOCK + 2.5)
        for n in range(4)
    ]
    blocker = await enqueue(producer, "fault.block_loop", key="blocker", **blocker_kwargs)
    assert await pool.fetchval(
        "SELECT max_retries FROM scheduled_jobs WHERE job_id = $1", blocker
    ) == blocker_kwargs.get("max_retries", 0)
    keys = [f"innocent-{n}" for n in range(4)] + ["blocker"]

    async def all_started_on_a() -> bool:
        if not all([await starts(pool, k) for k in keys]):
            return False
        found = await rows(pool, [*innocents, blocker])
        return all(r["worker_id"] == a.worker_id for r in found.values())

    await wait_until(all_started_on_a, timeout=20, message="all five jobs to start on A")
    b = await spawn("bystander")
    await pool.execute(
        "INSERT INTO fault_runs (run_id, job_key, pid, phase) VALUES ('go', 'blocker', 0, 'go')"
    )
    return a, b, blocker, innocents


async def test_blocker_runs_once_and_innocent_jobs_complete(pool, spawn, producer):
    a, _b, blocker, innocents = await setup_blocked_worker(
        pool, spawn, producer, {"seconds": BLOCK}
    )

    async def all_completed() -> bool:
        found = await rows(pool, [*innocents, blocker])
        return all(r["status"] == "completed" for r in found.values())

    await wait_until(all_completed, timeout=30, message="all five jobs to complete")
    for job_id, row in (await rows(pool, [*innocents, blocker])).items():
        assert row["worker_id"] == a.worker_id, job_id
        assert row["attempts"] == 1 and row["rescue_count"] == 0, dict(row)
    assert await starts(pool, "blocker") == 1
    for n in range(4):
        assert await starts(pool, f"innocent-{n}") == 1
    assert not await pool.fetchval("SELECT count(*) FROM job_attempts")
    log = a.log_text()
    assert "event loop blocked: a job is running blocking code" in log
    blocked_line = next(line for line in log.splitlines() if "running blocking code" in line)
    assert f"fault.block_loop ({blocker})" in blocked_line
    assert "watchdog renewing this worker's leases while the event loop is blocked" in log


@pytest.mark.parametrize("await_after", [True, False], ids=["awaits-after", "returns-at-once"])
async def test_blocker_past_the_stall_limit_is_failed_and_its_late_result_refused(
    pool, spawn, producer, await_after
):
    max_retries = 1 if await_after else 0
    a, _b, blocker, innocents = await setup_blocked_worker(
        pool,
        spawn,
        producer,
        {"seconds": BLOCK, "await_after": await_after, "max_retries": max_retries},
        loop_stall_limit=2.0,
    )
    expected = "pending" if max_retries else "failed"

    async def settled() -> bool:
        found = await rows(pool, [*innocents, blocker])
        return found[blocker]["status"] == expected and all(
            found[i]["status"] == "completed" for i in innocents
        )

    await wait_until(settled, timeout=30, message="blocker failed, innocents completed")
    # The blocked process has run again (its innocents completed after the stall),
    # so a late completion of the blocker would have been written by now.
    await asyncio.sleep(0.5)
    found = await rows(pool, [*innocents, blocker])
    row = found[blocker]
    assert row["status"] == expected and row["result"] is None
    assert row["rescue_count"] == 0 and row["attempts"] == 1
    assert row["retry_count"] == max_retries
    for job_id in innocents:
        assert found[job_id]["attempts"] == 1 and found[job_id]["rescue_count"] == 0
    attempts = await pool.fetch("SELECT job_id, outcome, error, traceback FROM job_attempts")
    assert [(r["job_id"], r["outcome"]) for r in attempts] == [(blocker, "failed")]
    assert "blocked the event loop for" in attempts[0]["error"]
    assert "loop_stall_limit=2 s" in attempts[0]["error"]
    assert "block_loop" in attempts[0]["traceback"]  # where the loop was stuck
    assert await starts(pool, "blocker") == 1
    log = a.log_text()
    assert "job failed: it blocked the event loop" in log
    if not await_after:
        assert "lease was lost; outcome not written" in log
