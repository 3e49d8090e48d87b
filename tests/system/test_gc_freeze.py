"""``Scheduler(gc_freeze=True)``, the default, freezes the objects alive at
start() out of Python's full garbage collections while it runs (process_gc);
``gc_freeze=False`` and ``pg-scheduler worker --no-gc-freeze`` leave the
collector alone."""

from __future__ import annotations

import asyncio
import gc
import json
import signal
from datetime import UTC, datetime

import pytest

from pg_scheduler import Scheduler
from tests.support import app_tasks
from tests.support.common import start_cli_worker, wait_for_status


@pytest.fixture(autouse=True)
def nothing_frozen():
    gc.unfreeze()
    yield
    gc.unfreeze()


async def test_frozen_while_running_and_thawed_by_the_last_shutdown(pool, make_scheduler):
    first = await make_scheduler(gc_freeze=True)
    assert gc.get_freeze_count() > 0
    second = await make_scheduler(gc_freeze=True)
    await first.shutdown()
    assert gc.get_freeze_count() > 0  # the second still runs
    await second.shutdown()
    assert gc.get_freeze_count() == 0


async def test_an_application_freeze_is_left_as_it_was(pool, make_scheduler):
    gc.freeze()  # the application's own, before the scheduler starts
    scheduler = await make_scheduler(gc_freeze=True)
    await scheduler.shutdown()
    assert gc.get_freeze_count() > 0


async def test_on_by_default(pool, make_scheduler):
    scheduler = await make_scheduler()
    assert gc.get_freeze_count() > 0
    await scheduler.shutdown()
    assert gc.get_freeze_count() == 0


async def test_false_leaves_the_collector_alone(pool, make_scheduler):
    scheduler = await make_scheduler(gc_freeze=False)
    assert gc.get_freeze_count() == 0
    await scheduler.shutdown()
    assert gc.get_freeze_count() == 0


async def worker_freeze_count(pool, dsn: str, *flags: str) -> int:
    """Run ``pg-scheduler worker tests.support.app_tasks`` with ``flags``; what a job
    there reports."""
    worker = await start_cli_worker(dsn, "tests.support.app_tasks", *flags)
    try:
        producer = Scheduler(pool)
        job_id = await producer.schedule(
            app_tasks.gc_freeze_count, execution_time=datetime.now(UTC)
        )
        await wait_for_status(pool, job_id, "completed", timeout=30)
        result = await pool.fetchval("SELECT result FROM scheduled_jobs WHERE job_id = $1", job_id)
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(worker.communicate(), 30)
    assert worker.returncode == 0, err.decode()[-2000:]
    return json.loads(result)


async def test_the_worker_command_freezes_unless_told_not_to(pool, dsn):
    assert await worker_freeze_count(pool, dsn) > 1000
    assert await worker_freeze_count(pool, dsn, "--no-gc-freeze") == 0
