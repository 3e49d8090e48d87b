"""The CLI's attempt history, on() callbacks, and pg_scheduler.testing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from pg_scheduler import RetryPolicy
from pg_scheduler.testing import run_eagerly, run_job, scheduler_for_tests

# The autouse fixture keeps the in-process CLI from configuring structlog for
# the rest of the session.
from tests.integration.test_cli_ops import _keep_test_logging, cli  # noqa: F401
from tests.support import results_tasks
from tests.support.common import wait_for_status

FAST_RETRY = RetryPolicy(base_delay=0.01, factor=1, max_delay=0.01, jitter=0)


async def test_cli_jobs_id_shows_the_attempt_history(pool, dsn, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(
        results_tasks.fail_until,
        execution_time=datetime.now(UTC),
        args=(2,),
        max_retries=2,
        retry_policy=FAST_RETRY,
    )
    await scheduler.wait_for(job_id, timeout=20)
    shown = await cli(dsn, "jobs", job_id)
    assert shown.code == 0, shown.err
    assert "attempts" in shown.out and "RuntimeError: attempt 1 failed on purpose" in shown.out
    lines = [line for line in shown.out.splitlines() if scheduler.worker_id in line]
    assert any("failed" in line for line in lines) and any("completed" in line for line in lines)
    data = (await cli(dsn, "jobs", job_id, "--json")).json()
    assert [a["outcome"] for a in data["attempt_history"]] == ["failed", "completed"]
    assert data["error"] is None


async def test_on_calls_back_for_each_event(pool, make_scheduler):
    scheduler = await make_scheduler()
    seen: list[tuple[str, str]] = []
    done = asyncio.Event()

    async def record(event):
        seen.append((event.kind, event.job_id))
        if event.kind == "completed":
            done.set()

    sub = scheduler.on(["started", "completed"], record, task="results.echo")
    await sub.ready()
    job_id = await scheduler.schedule(
        results_tasks.echo, execution_time=datetime.now(UTC), args=(1,)
    )
    await asyncio.wait_for(done.wait(), 10)
    sub.close()
    assert seen == [("started", job_id), ("completed", job_id)]


async def test_eager_mode_runs_inline_with_retries(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    job = await run_eagerly(scheduler, results_tasks.echo, [1, "two"])
    assert job.status == "completed" and job.result == [1, "two"]
    job_id = await scheduler.schedule(
        results_tasks.fail_until,
        execution_time=datetime(2100, 1, 1, tzinfo=UTC),  # due time ignored
        args=(3,),
        max_retries=3,
        retry_policy=RetryPolicy(base_delay=3600, jitter=0),  # retries taken at once
    )
    job = await run_job(scheduler, job_id)
    assert job.status == "completed" and job.attempts == 3
    assert [a.outcome for a in job.attempt_history] == ["failed", "failed", "completed"]
    failed = await run_eagerly(scheduler, results_tasks.boom, "eager")
    assert failed.status == "failed" and "ValueError: eager" in failed.error


async def test_scheduler_for_tests_gives_a_started_scheduler_on_a_fresh_database(server_dsn):
    async with scheduler_for_tests(server_dsn) as scheduler:
        assert scheduler.is_running
        assert await scheduler.run(results_tasks.echo, "hi") == "hi"
        assert await scheduler.store.pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 1
    assert not scheduler.is_running


async def test_truncating_the_jobs_empties_the_attempts(pool, make_scheduler):
    # No foreign key: "TRUNCATE scheduled_jobs" (0.2.x fixtures) keeps working.
    scheduler = await make_scheduler(start=False)
    job = await run_eagerly(scheduler, results_tasks.boom, "gone")
    assert [a.outcome for a in job.attempt_history] == ["failed"]
    await pool.execute("TRUNCATE scheduled_jobs")
    assert await pool.fetchval("SELECT count(*) FROM job_attempts") == 0


async def test_events_and_waiters_are_namespaced_by_schema(pool, make_scheduler):
    schema = "results_ev"
    await pool.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    try:
        ours = await make_scheduler(schema=schema)
        public = await make_scheduler(start=False)
        assert ours.events_hub.store.channel == f"pg_scheduler_events:{schema}"
        async with ours.events("completed") as mine, public.events("completed") as theirs:
            job_id = await ours.schedule(
                results_tasks.fail_until,
                execution_time=datetime.now(UTC),
                args=(2,),
                max_retries=1,
                retry_policy=FAST_RETRY,
            )
            assert await ours.result(job_id, timeout=10) == "ok"
            event = await asyncio.wait_for(mine.__anext__(), 10)
            assert (event.job_id, event.attempt) == (job_id, 2)
            job = await ours.get_job(job_id)
            assert [a.outcome for a in job.attempt_history] == ["failed", "completed"]
            assert theirs._queue.qsize() == 0
    finally:
        await ours.shutdown()
        await pool.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


async def test_a_job_handed_back_at_shutdown_keeps_that_attempt(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(
        results_tasks.wait_cancel, execution_time=datetime.now(UTC), args=("back",)
    )
    await wait_for_status(pool, job_id, "running")
    await scheduler.shutdown(grace_period=0.1)
    job = await scheduler.get_job(job_id)
    assert job.status == "pending" and job.attempts == 0 and job.error is None
    assert [(a.attempt, a.outcome) for a in job.attempt_history] == [(1, "handed_back")]
    assert job.attempt_history[0].worker_id == scheduler.worker_id
