"""Job events sent by the transition statements (migration 0010), not by triggers."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta

import asyncpg

from pg_scheduler import RetryPolicy, Scheduler
from pg_scheduler.notify.events import JOB_KINDS

# The schema tests' database (two migrated schemas), its owner and a bare role.
from tests.integration.test_schema import db, owner, role  # noqa: F401
from tests.support import results_tasks
from tests.support.common import wait_until

FAST_RETRY = RetryPolicy(base_delay=0.01, factor=1, max_delay=0.01, jitter=0)


def now() -> datetime:
    return datetime.now(UTC)


async def _next(sub, job_id: str, timeout: float = 10.0):
    """The kinds of the events for ``job_id`` until a final one."""
    kinds = []
    while True:
        event = await asyncio.wait_for(sub.__anext__(), timeout)
        if event.job_id != job_id:
            continue
        kinds.append((event.kind, event.attempt))
        if event.outcome is not None:
            return kinds


async def test_no_update_trigger_on_the_jobs_table(pool):
    names = await pool.fetch(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'scheduled_jobs'::regclass"
        " AND NOT tgisinternal ORDER BY tgname"
    )
    assert "scheduled_jobs_events_update" not in {r["tgname"] for r in names}


async def test_claimed_jobs_send_every_transition(pool, make_scheduler):
    client = await make_scheduler(start=False)
    # Through NOTIFY and the claim, as from another process.
    worker = await make_scheduler(start_due_jobs_locally=False)
    async with client.events(JOB_KINDS - {"progress"}) as sub:
        ok = await client.schedule(results_tasks.echo, execution_time=now(), args=(1,))
        assert await _next(sub, ok) == [("scheduled", 0), ("started", 1), ("completed", 1)]
        retried = await client.schedule(
            results_tasks.fail_until,
            execution_time=now(),
            args=(2,),
            max_retries=2,
            retry_policy=FAST_RETRY,
        )
        assert await _next(sub, retried) == [
            ("scheduled", 0),
            ("started", 1),
            ("retried", 1),
            ("started", 2),
            ("completed", 2),
        ]
        failed = await client.schedule(results_tasks.boom, execution_time=now(), args=("x",))
        assert await _next(sub, failed) == [("scheduled", 0), ("started", 1), ("failed", 1)]
        later = now() + timedelta(hours=1)
        cancelled = await client.schedule(results_tasks.echo, execution_time=later)
        assert await client.cancel_job(cancelled)
        assert await _next(sub, cancelled) == [("scheduled", 0), ("cancelled", 0)]
        forced = await client.schedule(results_tasks.echo, execution_time=later)
        assert await client.update_job_status(forced, "failed")
        assert await _next(sub, forced) == [("scheduled", 0), ("failed", 0)]
    assert worker.worker_id


async def test_an_expired_claim_wakes_its_waiter_at_once(pool, make_scheduler):
    client = await make_scheduler(start=False)
    job_id = await client.schedule(
        results_tasks.echo, execution_time=now() - timedelta(seconds=30), misfire_grace_time=1
    )
    waiter = asyncio.create_task(client.wait_for(job_id, timeout=30))
    await asyncio.sleep(0)  # the waiter registers before the claim
    await client.events_hub.listening()
    started = time.monotonic()
    await make_scheduler(start_due_jobs_locally=False)
    job = await waiter
    assert job.status == "expired"
    # The event, not the poll (every 5 s), woke it.
    assert time.monotonic() - started < 3


async def test_a_rescue_sends_rescued(pool, make_scheduler):
    client = await make_scheduler(start=False)
    job_id = await client.schedule(results_tasks.echo, execution_time=now() + timedelta(hours=1))
    async with client.events(["rescued"]) as sub:
        # A dead worker's row: running, its lease long gone.
        await pool.execute(
            "UPDATE scheduled_jobs SET status = 'running', worker_id = 'dead', attempts = 1,"
            " started_at = now(), lease_until = now() - interval '1 minute' WHERE job_id = $1",
            job_id,
        )
        assert await client.recover_orphaned_jobs() == 1
        event = await asyncio.wait_for(sub.__anext__(), 10)
    assert (event.kind, event.job_id, event.worker_id) == ("rescued", job_id, "dead")


async def test_completions_are_sent_only_while_someone_waits(dsn, pool, make_scheduler):
    heard: list[str] = []
    listener = await asyncpg.connect(dsn)
    try:
        await listener.add_listener("pg_scheduler_events", lambda *a: heard.append(a[3]))
        worker = await make_scheduler()
        unwatched = await worker.schedule(results_tasks.echo, execution_time=now(), args=(1,))
        await wait_until(lambda: _status_is(pool, unwatched, "completed"), message="done")
        client = await make_scheduler(start=False)
        watched = await client.schedule(
            results_tasks.echo, execution_time=now() + timedelta(milliseconds=300), args=(2,)
        )
        await client.wait_for(watched, timeout=10)
        await wait_until(lambda: any(watched in p for p in heard), message="the event")
    finally:
        await listener.close()
    assert not any(unwatched in p and '"completed"' in p for p in heard), heard


async def _status_is(pool, job_id: str, status: str) -> bool:
    found = await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id)
    return found == status


async def test_a_waiter_that_may_not_ask_for_events_polls(db, owner, role):  # noqa: F811
    """A role with SELECT only on scheduler_event_flags: wait_for() logs, then polls."""
    from tests.integration.test_schema import A, as_role

    await owner.execute(
        f"GRANT USAGE ON SCHEMA {A} TO {role};"
        f"GRANT SELECT ON {A}.scheduled_jobs, {A}.job_attempts, {A}.scheduler_event_flags,"
        f" {A}.pg_scheduler_migrations TO {role}"
    )
    await owner.execute(
        f"INSERT INTO {A}.scheduled_jobs (job_id, job_name, task_name, execution_time, status,"
        " task_data) VALUES ('polled', 'n', 't', now(), 'running', '{}'::jsonb)"
    )
    limited = await asyncpg.create_pool(as_role(db, role), min_size=1, max_size=2)
    client = Scheduler(limited, schema=A)
    try:
        waiter = asyncio.create_task(client.wait_for("polled", timeout=30))
        await asyncio.sleep(0.3)  # the waiter is waiting (its first read saw it running)
        await owner.execute(f"UPDATE {A}.scheduled_jobs SET status = 'completed'")
        job = await waiter
        assert job.status == "completed"
    finally:
        await client.shutdown()
        await limited.close()


async def test_a_deleted_completion_wakes_its_waiter_only_if_someone_waits(dsn, make_scheduler):
    """Completed rows deleted at once: the DELETE trigger's "completed" is flagged too."""
    from pg_scheduler import VacuumConfig, VacuumPolicy, VacuumTrigger
    from pg_scheduler.api.results import JobNotFound

    heard: list[str] = []
    listener = await asyncpg.connect(dsn)
    try:
        await listener.add_listener("pg_scheduler_events", lambda *a: heard.append(a[3]))
        worker = await make_scheduler(
            vacuum_enabled=True,
            vacuum_config=VacuumConfig(completed=VacuumPolicy(VacuumTrigger.IMMEDIATE)),
        )
        quiet = await worker.schedule(results_tasks.echo, execution_time=now(), args=(1,))
        await wait_until(lambda: _gone(worker, quiet), message="deleted on completion")
        client = await make_scheduler(start=False)
        watched = await client.schedule(
            results_tasks.echo, execution_time=now() + timedelta(milliseconds=300), args=(2,)
        )
        started = time.monotonic()
        try:
            await client.wait_for(watched, timeout=10)
            raise AssertionError("the row was deleted: JobNotFound expected")
        except JobNotFound:
            pass
        assert time.monotonic() - started < 3  # woken by the event, not the 5 s poll
    finally:
        await listener.close()
    assert any(watched in p for p in heard)
    assert not any(quiet in p for p in heard), heard


async def _gone(scheduler, job_id: str) -> bool:
    return await scheduler.get_job(job_id) is None
