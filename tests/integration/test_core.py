"""Scheduling and running jobs end to end against real PostgreSQL."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from pg_scheduler import JobPriority, JobStatus, RetryPolicy
from tests.support import app_tasks
from tests.support.common import job_status, wait_for_status, wait_until


def now() -> datetime:
    return datetime.now(UTC)


async def test_scheduled_job_runs_and_stores_result(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(app_tasks.add, execution_time=now(), args=(2, 3))
    await wait_for_status(pool, job_id, "completed")
    job = await scheduler.get_job(job_id)
    assert job.status is JobStatus.COMPLETED
    assert job.result == 5
    assert job.attempts == 1
    assert job.job_name == "add"
    assert job.task_name == "tests.support.app_tasks:add"
    assert job.started_at is not None and job.finished_at >= job.started_at
    assert job.worker_id == scheduler.worker_id


async def test_delayed_job_waits_for_its_time(pool, make_scheduler):
    scheduler = await make_scheduler()
    key = "delayed"
    app_tasks.calls[key].clear()
    due = now() + timedelta(seconds=1.0)
    job_id = await scheduler.schedule(app_tasks.record, execution_time=due, args=(key, 1))
    await asyncio.sleep(0.5)
    assert app_tasks.calls[key] == []
    assert await job_status(pool, job_id) == "pending"

    await wait_for_status(pool, job_id, "completed", timeout=5)
    job = await scheduler.get_job(job_id)
    assert job.started_at >= due


async def test_failing_job_retries_then_completes(pool, make_scheduler):
    scheduler = await make_scheduler()
    key = "retry-ok"
    app_tasks.calls[key].clear()
    job_id = await scheduler.schedule(
        app_tasks.fail_times,
        execution_time=now(),
        args=(key, 2),
        max_retries=3,
        retry_policy=RetryPolicy(base_delay=0.05, factor=2, max_delay=1, jitter=0),
    )

    await wait_for_status(pool, job_id, "completed", timeout=10)
    job = await scheduler.get_job(job_id)
    assert job.attempts == 3
    assert job.retry_count == 2
    assert job.result == "ok"
    # The error of a completed job is None; earlier attempts keep theirs.
    assert job.error is None and job.traceback is None
    assert [(a.attempt, a.outcome) for a in job.attempt_history] == [
        (1, "failed"),
        (2, "failed"),
        (3, "completed"),
    ]
    assert "planned failure 2" in job.attempt_history[1].error
    assert "RuntimeError" in job.attempt_history[1].traceback
    assert job.attempt_history[2].error is None


async def test_failing_job_ends_failed_with_traceback(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(
        app_tasks.boom,
        execution_time=now(),
        max_retries=1,
        retry_policy=RetryPolicy(base_delay=0.01, jitter=0),
    )

    await wait_for_status(pool, job_id, "failed")
    job = await scheduler.get_job(job_id)
    assert job.attempts == 2
    assert job.error == "ValueError: boom from the job"
    assert "Traceback" in job.traceback and "boom from the job" in job.traceback


async def test_priority_orders_claims(pool, make_scheduler):
    scheduler = await make_scheduler(start=False, max_concurrent_jobs=1, batch_claim_limit=1)
    key = "prio"
    app_tasks.calls[key].clear()
    t = now() - timedelta(seconds=5)
    for name, prio in [
        ("low", JobPriority.LOW),
        ("normal", JobPriority.NORMAL),
        ("critical", JobPriority.CRITICAL),
        ("high", JobPriority.HIGH),
    ]:
        await scheduler.schedule(
            app_tasks.record, execution_time=t, args=(key, name), priority=prio
        )
    await scheduler.start()
    await wait_until(lambda: len(app_tasks.calls[key]) == 4)
    assert app_tasks.calls[key] == ["critical", "high", "normal", "low"]


async def test_expired_job_is_not_run(pool, make_scheduler):
    scheduler = await make_scheduler(start=False, misfire_grace_time=1)
    key = "expired"
    app_tasks.calls[key].clear()
    late = await scheduler.schedule(
        app_tasks.record, execution_time=now() - timedelta(seconds=30), args=(key, "late")
    )
    never = await scheduler.schedule(
        app_tasks.record,
        execution_time=now() - timedelta(seconds=30),
        args=(key, "never-expires"),
        misfire_grace_time=None,
    )
    own = await scheduler.schedule(
        app_tasks.record,
        execution_time=now() - timedelta(seconds=30),
        args=(key, "own-grace"),
        misfire_grace_time=60,
    )
    await scheduler.start()

    async def settled():
        statuses = [await job_status(pool, j) for j in (late, never, own)]
        return statuses == ["expired", "completed", "completed"]

    await wait_until(settled)
    assert sorted(app_tasks.calls[key]) == ["never-expires", "own-grace"]
    job = await scheduler.get_job(late)
    assert "misfire_grace_time" in job.error
    assert job.attempts == 0


async def test_unserializable_result_completes_without_result(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(app_tasks.returns_object, execution_time=now())

    await wait_for_status(pool, job_id, "completed")
    assert (await scheduler.get_job(job_id)).result is None


async def test_cancel_pending_job_prevents_run(pool, make_scheduler):
    scheduler = await make_scheduler()
    key = "cancel-pending"
    app_tasks.calls[key].clear()
    job_id = await scheduler.schedule(
        app_tasks.record, execution_time=now() + timedelta(seconds=1), args=(key,)
    )
    assert await scheduler.cancel_job(job_id) is True
    assert await scheduler.cancel_job(job_id) is False
    assert await scheduler.cancel_job("no-such-job") is False
    await asyncio.sleep(1.5)
    assert app_tasks.calls[key] == []
    assert await job_status(pool, job_id) == "cancelled"


async def test_cancel_running_job_stops_its_coroutine(pool, make_scheduler):
    scheduler = await make_scheduler()
    key = "cancel-running"
    app_tasks.calls[key].clear()
    app_tasks.events.pop(key + ":started", None)
    job_id = await scheduler.schedule(app_tasks.sleep_for, execution_time=now(), args=(key, 30))
    await asyncio.wait_for(app_tasks.event(key + ":started").wait(), 10)
    assert await scheduler.cancel_job(job_id)
    await wait_until(lambda: "finally" in app_tasks.calls[key], timeout=3)
    assert await job_status(pool, job_id) == "cancelled"
    assert not scheduler.worker.running
