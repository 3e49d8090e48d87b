"""A finished job's objects are freed by reference counting as soon as its
outcome is written, not left to Python's cyclic garbage collector: a cycle
per job (task -> context -> current_job() -> job -> task) made the collector's
full passes, each a pause of the event loop of tens of milliseconds, run
every second or so under a drain (the p99 start delay of a CRITICAL job
scheduled meanwhile)."""

from __future__ import annotations

import gc
import uuid
from datetime import UTC, datetime

from pg_scheduler.context import JobContext
from pg_scheduler.engine.job import ClaimedJob, RunningJob
from tests.support import app_tasks
from tests.support.common import wait_for_status, wait_until

PER_JOB = (RunningJob, ClaimedJob, JobContext)


def alive() -> int:
    return sum(isinstance(o, PER_JOB) for o in gc.get_objects())


async def test_finished_jobs_leave_no_reference_cycles(pool, make_scheduler):
    scheduler = await make_scheduler()
    worker = scheduler.worker
    key = f"garbage-{uuid.uuid4().hex[:8]}"
    gc.collect()
    gc.disable()  # only reference counting frees anything from here on
    try:
        before = alive()
        ids = [
            await scheduler.schedule(
                app_tasks.record, execution_time=datetime.now(UTC), args=(key, i)
            )
            for i in range(30)
        ]
        for job_id in ids:
            await wait_for_status(pool, job_id, "completed")
        await wait_until(lambda: worker.in_flight == 0, message="every row let go")
        assert len(app_tasks.calls[key]) == 30
        assert alive() == before
    finally:
        gc.enable()
