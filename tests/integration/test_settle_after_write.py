"""A job's task ends when its function returns; its row stays owned and held
(heartbeats renew it, it counts against the held-row bound) until the
completer has written the completion, and only then is it let go."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import asyncpg

from tests.support import app_tasks
from tests.support.common import wait_for_status, wait_until


@asynccontextmanager
async def completion_blocked(pool, scheduler) -> AsyncIterator[str]:
    """A job that has returned, whose completion write waits for a row lock
    held here until the block ends; yields the job's id."""
    key = f"settle-{uuid.uuid4().hex[:8]}"
    job_id = await scheduler.schedule(
        app_tasks.wait_for, execution_time=datetime.now(UTC), args=(key,)
    )
    await wait_until(lambda: app_tasks.calls[key] == ["start"], message="the job to start")
    rival: asyncpg.Connection = await pool.acquire()
    tx = rival.transaction()
    await tx.start()
    try:
        # The completion's UPDATE waits for this lock.
        await rival.execute("SELECT 1 FROM scheduled_jobs WHERE job_id = $1 FOR UPDATE", job_id)
        app_tasks.event(key + ":release").set()
        yield job_id
    finally:
        await tx.rollback()
        await pool.release(rival)


async def test_a_row_is_held_until_its_completion_is_written(pool, make_scheduler):
    scheduler = await make_scheduler()
    worker = scheduler.worker
    async with completion_blocked(pool, scheduler) as job_id:
        await wait_until(
            lambda: not worker.state.tasks and job_id not in worker.running,
            message="the job's task to end",
        )
        assert worker.completer.pending == 1
        assert job_id in worker.state.owned and worker.in_flight == 1
        assert worker.slots.active == 0  # the slot is free, the row still held
    await wait_for_status(pool, job_id, "completed")
    await wait_until(lambda: worker.in_flight == 0, message="the row to be let go")
    assert job_id not in worker.state.owned and worker.completer.pending == 0


async def test_shutdown_waits_for_a_queued_completion(pool, make_scheduler):
    scheduler = await make_scheduler()
    worker = scheduler.worker
    async with completion_blocked(pool, scheduler) as job_id:
        await wait_until(lambda: not worker.state.tasks, message="the job's task to end")
        stopping = asyncio.create_task(scheduler.shutdown())
        await wait_until(lambda: not worker.state.claiming, message="shutdown to begin")
        assert not stopping.done()
    await stopping
    await wait_for_status(pool, job_id, "completed")
    assert worker.in_flight == 0 and job_id not in worker.state.owned
