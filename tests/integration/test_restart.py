"""A Scheduler shut down and started again works as a new one (as in 0.2.x):
it claims, hears NOTIFY, runs thread jobs, and gives back every connection."""

from __future__ import annotations

from datetime import UTC, datetime

from pg_scheduler import BatchItem, PollingConfig, Scheduler, task
from tests.support import app_tasks, otel_workflow_tasks, sync_tasks
from tests.support.common import wait_for_status, wait_until

# Woken only by NOTIFY within the test's deadlines: no poll comes in time.
SLOW_POLL = PollingConfig(min_interval=30.0, max_interval=60.0, idle_start_interval=30.0)


@task(name="restart.batch", batch_size=5, batch_timeout=0.1)
async def batch_noop(batch: list[BatchItem]) -> list[int]:
    return [len(batch)] * len(batch)


async def test_a_scheduler_started_again_after_its_shutdown_runs_jobs_again(pool, make_scheduler):
    scheduler = await make_scheduler(start_due_jobs_locally=False, polling_config=SLOW_POLL)
    client = Scheduler(pool)  # not started: its jobs reach the worker by NOTIFY
    for round_ in range(3):
        jobs = [
            await client.schedule(app_tasks.noop, execution_time=datetime.now(UTC))
            for _ in range(5)
        ]
        jobs.append(await client.schedule(sync_tasks.sleep_one, execution_time=datetime.now(UTC)))
        jobs += [
            await client.schedule(batch_noop, execution_time=datetime.now(UTC)) for _ in range(5)
        ]
        flow = await client.schedule(otel_workflow_tasks.flow, args=(round_,))
        await wait_for_status(pool, flow, "waiting", timeout=10)
        await client.signal(flow, "go", 1)
        for job_id in [*jobs, flow]:
            await wait_for_status(pool, job_id, "completed", timeout=10)
        workers = await pool.fetchval(
            "SELECT count(*) FROM scheduler_workers WHERE worker_id = $1", scheduler.worker_id
        )
        assert workers == 1, f"round {round_}: the worker is registered"
        await scheduler.shutdown()
        assert not scheduler.is_running
        await wait_until(
            lambda: pool.get_idle_size() == pool.get_size(),
            message=f"round {round_}: every connection back in the pool",
        )
        await scheduler.start()


async def test_an_immediate_shutdown_applies_to_that_shutdown_only(pool, make_scheduler):
    scheduler = await make_scheduler()
    scheduler.request_immediate_shutdown()
    await scheduler.shutdown()
    await scheduler.start()
    job_id = await scheduler.schedule(app_tasks.sleep_for, args=("restart-grace", 0.5))
    await wait_for_status(pool, job_id, "running")
    await scheduler.shutdown(grace_period=10)
    # Given its grace period: it finished, not handed back.
    status = await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id)
    assert status == "completed"
