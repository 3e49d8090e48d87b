"""Poison outcomes in a real worker process: a job's SystemExit or unstorable result
must not stop the worker, nor make the job run again."""

from __future__ import annotations

import asyncpg
import pytest

from tests.support.common import wait_for_status, wait_until
from tests.system.test_faults import enqueue, producer, runs, runs_table, spawn  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kind", ["system-exit", "nul-result", "nul-error"])
async def test_poison_job_fails_once_and_the_worker_process_serves_on(
    pool: asyncpg.Pool,
    spawn,  # noqa: F811 (the imported fixture)
    producer,  # noqa: F811
    kind: str,
) -> None:
    worker = await spawn("w")
    worker_id = await worker.ready()
    bad = await enqueue(producer, "fault.poison", key="poison", kind=kind)
    await wait_for_status(pool, bad, "failed", timeout=20)
    seen = await pool.fetchval(
        "SELECT last_seen FROM scheduler_workers WHERE worker_id = $1", worker_id
    )
    good = await enqueue(producer, "fault.tracked", key="after")
    await wait_for_status(pool, good, "completed", timeout=20)

    async def heartbeat_moved() -> bool:
        latest = await pool.fetchval(
            "SELECT last_seen FROM scheduler_workers WHERE worker_id = $1", worker_id
        )
        return latest is not None and latest > seen

    await wait_until(heartbeat_moved, timeout=10, message="a later heartbeat")
    assert worker.proc.returncode is None
    assert len(await runs(pool, "poison")) == 1
    row = await pool.fetchrow(
        "SELECT attempts, rescue_count, worker_id FROM scheduled_jobs WHERE job_id = $1", bad
    )
    assert (row["attempts"], row["rescue_count"], row["worker_id"]) == (1, 0, worker_id)
