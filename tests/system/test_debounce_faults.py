"""A debounced job whose worker is killed (kill -9) mid-run: the burst ended
when the job started, so a call meanwhile begins the next burst; the rescue
returns the first job to pending without taking its key back, and both jobs
complete, each once per attempt. Workers in their own processes (FAULT
timings: heartbeat_threshold=2 s, rescue every 0.5 s)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.support import fault_tasks
from tests.support.common import wait_for_status, wait_until
from tests.support.fault_worker import FAULT, RUNS_DDL, WorkerProcess

pytestmark = pytest.mark.slow

KEY = "debounced-kill9"


@pytest.fixture
async def workers(dsn: str, tmp_path: Path, pool: asyncpg.Pool) -> AsyncIterator[list[Any]]:
    await pool.execute(RUNS_DDL)
    await pool.execute("TRUNCATE fault_runs")
    started = [await WorkerProcess.start(dsn, tmp_path, name, **FAULT) for name in ("a", "b")]
    yield started
    for worker in started:
        await worker.close()
        print(f"----- {worker.name} (pid {worker.proc.pid}) -----\n{worker.log_tail(6000)}")


async def starts(pool: asyncpg.Pool, key: str) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT pid FROM fault_runs WHERE job_key = $1 AND phase = 'start' ORDER BY at", key
    )


async def test_kill_9_mid_run_the_next_burst_and_the_rescue_both_complete(
    pool, workers, make_scheduler
):
    producer = await make_scheduler(start=False)  # only enqueues
    await asyncio.gather(*(w.ready() for w in workers))

    async def call(run_key: str, **extra: Any) -> str:
        return await producer.schedule(
            fault_tasks.tracked,
            kwargs={"key": run_key, **extra},
            dedupe_key=KEY,
            debounce=0.3,
        )

    burst = {await call("first", seconds=0.05, first_seconds=120) for _ in range(5)}
    [first] = burst
    await wait_until(lambda: starts(pool, "first"), timeout=15, message="the first run")
    holder = await pool.fetchval("SELECT worker_id FROM scheduled_jobs WHERE job_id = $1", first)
    victim = next(w for w in workers if w.worker_id == holder)
    victim.send(signal.SIGKILL)
    assert await victim.wait() == -signal.SIGKILL

    # Started, the first job's burst is over: this call begins another.
    second = await call("second")
    assert second != first
    bound = FAULT["heartbeat_threshold"] + FAULT["rescue_interval"]
    await wait_for_status(pool, first, "completed", timeout=bound + 15)
    await wait_for_status(pool, second, "completed", timeout=15)
    rows = await pool.fetch(
        "SELECT job_id, attempts, rescue_count FROM scheduled_jobs WHERE dedupe_key = $1"
        " ORDER BY created_at",
        KEY,
    )
    assert [(r["job_id"], r["attempts"], r["rescue_count"]) for r in rows] == [
        (first, 2, 1),
        (second, 1, 0),
    ]
    assert len(await starts(pool, "first")) == 2 and len(await starts(pool, "second")) == 1
