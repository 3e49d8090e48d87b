"""Parking: a sleeping workflow holds no slot, lease or worker, shows as
waiting, and resumes at its time (measured by the database); a workflow's
timeout counts across parks."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import wait_for_status, wait_until

from pg_scheduler import JobStatus, WorkflowContext, workflow

ran: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()


@workflow
async def napper(ctx: WorkflowContext, seconds: float) -> dict[str, Any]:
    before = await ctx.step("before", lambda: ran.update(["before"]) or "b")
    await ctx.sleep(timedelta(seconds=seconds))
    after = await ctx.step("after", lambda: ran.update(["after"]) or "a")
    return {"before": before, "after": after}


async def _resumed_late_by(pool: Any, job_id: str) -> float:
    """Seconds between the sleep's end and the next step's start (database clock)."""
    return await pool.fetchval(
        "SELECT EXTRACT(EPOCH FROM a.started_at - (s.result->>'until')::timestamptz)::float8"
        "  FROM workflow_steps s JOIN workflow_steps a ON a.job_id = s.job_id"
        " WHERE s.job_id = $1 AND s.kind = 'sleep' AND a.name = 'after'",
        job_id,
    )


async def test_a_sleeping_workflow_holds_nothing_and_resumes_at_its_time(pool, make_scheduler):
    scheduler = await make_scheduler(max_concurrent_jobs=1)
    job_id = await scheduler.schedule(napper, execution_time=datetime.now(UTC), args=(3.0,))
    await wait_for_status(pool, job_id, "waiting")
    row = await pool.fetchrow(
        "SELECT worker_id, lease_until, wait_kind, wake_at, now() AS now, attempts"
        " FROM scheduled_jobs WHERE job_id = $1",
        job_id,
    )
    assert row["worker_id"] is None and row["lease_until"] is None
    assert row["wait_kind"] == "sleep"
    assert 2.0 < (row["wake_at"] - row["now"]).total_seconds() <= 3.0
    assert row["attempts"] == 0  # a run that parks is not an attempt
    job = await scheduler.get_job(job_id)
    assert job.status is JobStatus.WAITING
    assert (job.wait_kind, job.wait_for, job.wake_at) == ("sleep", None, row["wake_at"])
    # No slot, no running job here: a plain job gets the only slot meanwhile.
    assert scheduler.worker.running == {}
    assert scheduler.worker.slots.active == 0
    assert await scheduler.run(_plain) == "plain"
    stats = await scheduler.stats()
    assert stats.counts["waiting"] == 1
    assert {t.task_name: t.waiting for t in stats.by_task}[job.task_name] == 1

    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == {"before": "b", "after": "a"}
    assert job.attempts == 1
    assert ran == Counter({"before": 1, "after": 1})
    late = await _resumed_late_by(pool, job_id)
    assert 0 <= late < 0.5, late
    statuses = await pool.fetch(
        "SELECT kind, status FROM workflow_steps WHERE job_id = $1 ORDER BY seq", job_id
    )
    assert [(r["kind"], r["status"]) for r in statuses] == [
        ("step", "completed"),
        ("sleep", "completed"),
        ("step", "completed"),
    ]


async def _plain() -> str:
    return "plain"


async def test_a_short_sleep_is_pending_until_its_time(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(napper, execution_time=datetime.now(UTC), args=(0.6,))
    await wait_until(lambda: ran["before"] == 1, message="the first step")
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED, job.error
    late = await _resumed_late_by(pool, job_id)
    assert 0 <= late < 0.3, late


@workflow
async def zero_nap(ctx: WorkflowContext) -> str:
    await ctx.sleep(0)
    await ctx.sleep_until(datetime(2000, 1, 1, tzinfo=UTC))
    return "awake"


async def test_a_sleep_already_over_goes_on_without_parking(pool, make_scheduler):
    scheduler = await make_scheduler()
    job = await scheduler.wait_for(
        await scheduler.schedule(zero_nap, execution_time=datetime.now(UTC)), timeout=10
    )
    assert job.status is JobStatus.COMPLETED and job.result == "awake"
    assert job.attempts == 1


@workflow(timeout=3)
async def overslept(ctx: WorkflowContext) -> str:
    await ctx.step("start", lambda: ran.update(["start"]))
    await ctx.sleep(timedelta(hours=1))
    ran["woke"] += 1
    return "never"


async def test_a_workflow_timeout_counts_across_parks(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(overslept, execution_time=datetime.now(UTC), max_retries=3)
    await wait_for_status(pool, job_id, "waiting")
    wake_at = await pool.fetchval("SELECT wake_at FROM scheduled_jobs WHERE job_id = $1", job_id)
    deadline = await pool.fetchval(
        "SELECT workflow_deadline FROM scheduled_jobs WHERE job_id = $1", job_id
    )
    assert wake_at == deadline  # it wakes at its deadline, not in an hour
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.FAILED
    assert job.error.startswith("WorkflowTimeout: workflow timed out: its timeout of 3 s")
    assert job.retry_count == 0
    assert ran == Counter({"start": 1})


@workflow(timeout=0.5)
async def slow_inside(ctx: WorkflowContext) -> str:
    await ctx.step("slow", asyncio.sleep, 5)
    return "never"


async def test_a_workflow_timeout_stops_a_run_in_progress(pool, make_scheduler):
    scheduler = await make_scheduler()
    job = await scheduler.wait_for(
        await scheduler.schedule(slow_inside, execution_time=datetime.now(UTC), max_retries=2),
        timeout=10,
    )
    assert job.status is JobStatus.FAILED
    assert job.error.startswith("WorkflowTimeout")
    assert job.retry_count == 0


async def test_cancelling_a_sleeping_workflow(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(napper, execution_time=datetime.now(UTC), args=(60.0,))
    await wait_for_status(pool, job_id, "waiting")
    assert await scheduler.cancel_job(job_id) is True
    job = await scheduler.get_job(job_id)
    assert job.status is JobStatus.CANCELLED
    assert await scheduler.cancel_job(job_id) is False
    assert ran == Counter({"before": 1})


async def test_many_sleepers_each_wake_once(pool, make_scheduler):
    scheduler = await make_scheduler(max_concurrent_jobs=5)
    second = await make_scheduler(max_concurrent_jobs=5)
    ids = [
        await scheduler.schedule(napper, execution_time=datetime.now(UTC), args=(2.5 + i / 20,))
        for i in range(20)
    ]
    for job_id in ids:
        job = await second.wait_for(job_id, timeout=20)
        assert job.status is JobStatus.COMPLETED, job.error
        assert job.attempts == 1
    assert ran == Counter({"before": 20, "after": 20})
