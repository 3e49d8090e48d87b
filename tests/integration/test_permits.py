"""The max_concurrent_jobs semaphore (engine/slots.py Permits): a synchronous
take when uncontended, waiters served in order, no permit lost to a cancel."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

from pg_scheduler.engine.slots import Permits
from tests.support import app_tasks
from tests.support.common import wait_for_status, wait_until


async def test_take_is_synchronous_until_the_permits_run_out():
    permits = Permits(2)
    assert permits.take() and permits.take()
    assert not permits.take() and permits.locked()
    permits.release()
    assert not permits.locked() and permits.take()


async def test_a_release_hands_the_permit_to_the_first_waiter():
    permits = Permits(1)
    assert permits.take()
    order: list[int] = []

    async def wait(n: int) -> None:
        async with permits:
            order.append(n)

    first = asyncio.create_task(wait(1))
    second = asyncio.create_task(wait(2))
    await asyncio.sleep(0)  # both wait
    assert not permits.take()  # a waiter is first in line
    permits.release()
    await asyncio.gather(first, second)
    assert order == [1, 2]
    assert permits.take() and not permits.take()


async def test_a_cancelled_waiter_loses_no_permit():
    permits = Permits(1)
    assert permits.take()
    waiting = asyncio.create_task(permits.acquire())
    await asyncio.sleep(0)
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    permits.release()
    assert permits.take() and not permits.take()


async def test_a_waiter_cancelled_after_the_handoff_passes_the_permit_on():
    permits = Permits(1)
    assert permits.take()
    first = asyncio.create_task(permits.acquire())
    second = asyncio.create_task(permits.acquire())
    await asyncio.sleep(0)
    permits.release()  # handed to first, which has not resumed yet
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)
    assert first.cancelled()
    assert await asyncio.wait_for(second, 5)
    permits.release()
    assert permits.take() and not permits.take()


async def test_a_claimed_job_waits_for_a_permit_a_caller_holds(pool, make_scheduler):
    # execute_job_with_concurrency_control callers share the permits with
    # claimed jobs: one claimed while they hold all of them waits, then runs.
    scheduler = await make_scheduler(max_concurrent_jobs=1)
    key = f"permits-{uuid.uuid4().hex[:8]}"
    await scheduler.job_semaphore.acquire()
    try:
        job_id = await scheduler.schedule(
            app_tasks.record, execution_time=datetime.now(UTC), args=(key, 1)
        )
        await wait_until(
            lambda: job_id in scheduler.worker.slots.taken, message="the job to be started"
        )
        assert scheduler.worker.slots.taken[job_id] is False  # waiting for the permit
        assert not app_tasks.calls[key]
    finally:
        scheduler.job_semaphore.release()
    await wait_for_status(pool, job_id, "completed")
    assert app_tasks.calls[key] == [1]
    worker = scheduler.worker
    await wait_until(lambda: worker.in_flight == 0, message="nothing in flight")
    assert not worker.slots.taken and not worker.state.owned and worker.slots.semaphore.take()
