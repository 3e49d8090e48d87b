"""LISTEN/NOTIFY wake-ups and sleeping until the next due job, not polling."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import asyncpg

from pg_scheduler import JobSpec, PollingConfig
from tests.support import app_tasks
from tests.support.common import wait_for_status, wait_until

# Polling so slow that only a notification or the due-time timer can explain a quick start.
SLOW_POLL = PollingConfig(min_interval=0.05, max_interval=30.0, idle_start_interval=30.0)


async def started_at(scheduler, job_id):
    job = await scheduler.get_job(job_id)
    return job.started_at


async def test_idle_worker_starts_a_job_for_now_within_milliseconds(pool, make_scheduler):
    scheduler = await make_scheduler(polling_config=SLOW_POLL)
    await asyncio.sleep(0.3)  # let the claim loop go idle
    delays = []
    for _ in range(20):
        before = datetime.now(UTC)
        job_id = await scheduler.schedule(app_tasks.noop, execution_time=before)
        await wait_for_status(pool, job_id, "completed", timeout=5)
        delays.append((await started_at(scheduler, job_id) - before).total_seconds())
    delays.sort()
    # Generous bounds for a loaded 2-core machine; the point is "not 30 s polling".
    assert delays[len(delays) // 2] < 0.1, delays
    assert delays[-1] < 1.0, delays


async def test_job_due_later_starts_at_its_due_time(pool, make_scheduler):
    scheduler = await make_scheduler(polling_config=SLOW_POLL)
    await asyncio.sleep(0.3)
    due = datetime.now(UTC) + timedelta(seconds=1.5)
    job_id = await scheduler.schedule(app_tasks.noop, execution_time=due)
    await wait_for_status(pool, job_id, "completed", timeout=10)
    late = (await started_at(scheduler, job_id) - due).total_seconds()
    assert 0 <= late < 0.5, late


async def test_one_notification_per_statement(pool, make_scheduler, dsn):
    scheduler = await make_scheduler(start=False)
    received: list[str] = []
    listener = await asyncpg.connect(dsn)
    await listener.add_listener("pg_scheduler_jobs", lambda *args: received.append(args[3]))
    try:
        later = datetime.now(UTC) + timedelta(hours=1)
        await scheduler.schedule_bulk([JobSpec(app_tasks.noop, later) for _ in range(1000)])
        await scheduler.schedule(app_tasks.noop, execution_time=later)
        await wait_until(lambda: len(received) >= 2, timeout=2)
        await asyncio.sleep(0.2)  # would any more arrive?
        assert len(received) == 2
    finally:
        await listener.close()


async def test_polling_is_the_safety_net_without_notifications(pool, make_scheduler):
    fast_poll = PollingConfig(min_interval=0.01, max_interval=0.3, idle_start_interval=0.05)
    scheduler = await make_scheduler(polling_config=fast_poll)
    await scheduler.listener.stop()  # no LISTEN connection at all
    scheduler.listener.live = False
    job_id = await scheduler.schedule(app_tasks.noop, execution_time=datetime.now(UTC))
    await wait_for_status(pool, job_id, "completed", timeout=3)


async def test_a_job_started_in_process_wakes_no_worker(pool, make_scheduler, dsn):
    # Migration 0012: a row inserted already running is started by the process
    # that wrote it; only pending inserts notify. The marker job, inserted
    # pending after it, proves the listener would have heard one.
    scheduler = await make_scheduler()
    received: list[str] = []
    listener = await asyncpg.connect(dsn)
    await listener.add_listener("pg_scheduler_jobs", lambda *args: received.append(args[3]))
    try:
        local = await scheduler.schedule(app_tasks.noop, execution_time=datetime.now(UTC))
        row = await pool.fetchrow(
            "SELECT status, worker_id FROM scheduled_jobs WHERE job_id = $1", local
        )
        assert row["worker_id"] == scheduler.worker_id  # started here, not claimed
        later = datetime.now(UTC) + timedelta(hours=1)
        await scheduler.schedule(app_tasks.noop, execution_time=later, queue="marker")
        await wait_until(lambda: "marker" in received, timeout=5, message="the marker's NOTIFY")
        assert received == ["marker"]
    finally:
        await listener.close()
