"""Reliability edge cases that need no subprocess: in-process schedulers on the test database."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from pg_scheduler import task
from tests.support.common import wait_for_status, wait_until

attempts: list[int] = []


@task(name="reliability.awaits_cancelled_task")
async def awaits_cancelled_task() -> None:
    """Raises CancelledError from inside the job: it awaits a task someone else cancelled."""
    attempts.append(1)
    inner = asyncio.create_task(asyncio.sleep(60))
    asyncio.get_running_loop().call_soon(inner.cancel)
    await inner


async def test_cancelled_error_raised_by_the_job_itself_fails_the_attempt(pool, make_scheduler):
    attempts.clear()
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule_job(
        "reliability.awaits_cancelled_task", datetime.now(UTC), {}
    )
    await wait_for_status(pool, job_id, "failed", timeout=15)
    job = await scheduler.get_job(job_id)
    assert job.attempts == 1 and attempts == [1]  # ran once, not handed back and rerun
    assert job.error.startswith("CancelledError")
    assert "Traceback" in job.traceback
    # The worker is intact: it still runs jobs.
    await wait_until(lambda: scheduler.worker.in_flight == 0, message="slots freed")
