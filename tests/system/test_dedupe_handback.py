"""Dedupe scope "pending" (migration 0013): a job holds its key until it really
starts. A row claimed ahead into a worker's buffer has not started: it holds
the key while it waits there, and when it is handed back unstarted (its queue
paused, the buffer's time limit, shutdown) it goes back to pending still
holding it, so no second never-started job with the key can be written, by
any producer. Once it starts, the key is free for a successor."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import psycopg
import pytest

from pg_scheduler import ConflictResolution, SyncClient
from tests.support import handback_tasks as tasks
from tests.support.common import wait_for_status, wait_until

KEY = "sync:42"
MIGRATION_0013 = Path(__file__).resolve().parents[2] / "pg_scheduler" / "store" / "migrations"


def now() -> datetime:
    return datetime.now(UTC)


def later() -> datetime:
    return now() + timedelta(hours=1)


@pytest.fixture(autouse=True)
def fresh_tasks() -> None:
    tasks.reset()


@pytest.fixture
async def other_pool(dsn: str):
    p = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    yield p
    await p.close()


async def row(pool, job_id: str):
    return await pool.fetchrow(
        "SELECT status, claimed_ahead, worker_id, attempts FROM scheduled_jobs WHERE job_id = $1",
        job_id,
    )


async def keyed_rows(pool) -> list:
    return await pool.fetch(
        "SELECT job_id, status FROM scheduled_jobs WHERE dedupe_key = $1 ORDER BY created_at", KEY
    )


async def schedule_keyed(producer, name: str, conflict=ConflictResolution.RAISE) -> str:
    return await producer.schedule(
        tasks.hold,
        execution_time=now(),
        args=(name,),
        dedupe_key=KEY,
        dedupe_scope="pending",
        conflict_resolution=conflict,
    )


async def assert_held_by(pool, producer, dsn: str, holder: str) -> None:
    """Every producer is refused the key while ``holder`` holds it, and the table
    shows one row with the key."""
    with pytest.raises(ValueError, match=holder):
        await schedule_keyed(producer, "second")
    assert await schedule_keyed(producer, "second", ConflictResolution.IGNORE) == holder
    # The index itself refuses it, whatever writes the row.
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.UniqueViolation):
            await conn.execute(
                "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time,"
                " status, task_data, dedupe_key, dedupe_scope)"
                " VALUES ('raw-second', 'hold', 'handback.hold', now(), 'pending',"
                ' \'{"args": ["raw"], "kwargs": {}}\', %s, \'pending\')',
                (KEY,),
            )
    assert [r["job_id"] for r in await keyed_rows(pool)] == [holder]


async def claimed_ahead_behind_a_blocker(pool, scheduler) -> str:
    """A job holding the worker's only slot, then a keyed job claimed ahead
    behind it (running in the database, waiting in the worker's buffer)."""
    await scheduler.schedule(tasks.hold, execution_time=now(), args=("blocker",))
    await asyncio.wait_for(tasks.began("blocker").wait(), 10)
    holder = await schedule_keyed(scheduler, "k")

    async def ahead() -> bool:
        r = await row(pool, holder)
        return r["status"] == "running" and r["claimed_ahead"]

    await wait_until(ahead, message="the keyed job claimed ahead")
    assert (await row(pool, holder))["worker_id"] == scheduler.worker_id
    return holder


async def test_a_row_claimed_ahead_holds_its_key_and_still_does_after_its_queue_is_paused(
    pool, dsn, other_pool, make_scheduler
):
    worker = await make_scheduler(max_concurrent_jobs=1, batch_claim_limit=1)
    worker.worker.handback.max_buffer_wait = 3600.0  # only the pause hands it back here
    producer = await make_scheduler(start=False, db_pool=other_pool)
    holder = await claimed_ahead_behind_a_blocker(pool, worker)
    await assert_held_by(pool, producer, dsn, holder)

    await worker.pause_queue("default")
    await wait_for_status(pool, holder, "pending")
    r = await row(pool, holder)
    assert r["worker_id"] is None and r["attempts"] == 0
    await assert_held_by(pool, producer, dsn, holder)

    # Claimed again with a free slot, it starts at once: the key is free for the next one.
    tasks.gate("blocker").set()
    await wait_until(lambda: worker.worker.slots.held == 0, message="the blocker settled")
    await worker.resume_queue("default")
    await asyncio.wait_for(tasks.began("k").wait(), 10)
    successor = await schedule_keyed(producer, "next")
    assert successor != holder
    assert [r["job_id"] for r in await keyed_rows(pool)] == [holder, successor]
    tasks.gate("k").set()
    await wait_for_status(pool, holder, "completed")
    assert tasks.runs["k"] == 1


async def test_handed_back_by_the_buffer_time_limit_it_keeps_its_key(
    pool, dsn, other_pool, make_scheduler
):
    worker = await make_scheduler(max_concurrent_jobs=1, batch_claim_limit=1)
    producer = await make_scheduler(start=False, db_pool=other_pool)
    holder = await claimed_ahead_behind_a_blocker(pool, worker)
    # Waiting longer than max_buffer_wait (1 s) for a slot: handed back.
    await wait_for_status(pool, holder, "pending")
    await assert_held_by(pool, producer, dsn, holder)

    # Migration 0013 applied again leaves the row holding its key.
    sql = next(MIGRATION_0013.glob("0013_*.sql")).read_text()
    async with pool.acquire() as conn:
        await conn.execute(sql)
    await assert_held_by(pool, producer, dsn, holder)

    tasks.gate("k").set()
    tasks.gate("blocker").set()
    await wait_for_status(pool, holder, "completed")
    assert await schedule_keyed(producer, "next") != holder


async def test_started_from_the_buffer_it_lets_the_key_go_at_the_next_heartbeat(
    pool, dsn, other_pool, make_scheduler
):
    worker = await make_scheduler(max_concurrent_jobs=1, batch_claim_limit=1)
    worker.worker.handback.max_buffer_wait = 3600.0
    producer = await make_scheduler(start=False, db_pool=other_pool)
    holder = await claimed_ahead_behind_a_blocker(pool, worker)
    tasks.gate("blocker").set()  # its slot frees: the buffered job starts
    await asyncio.wait_for(tasks.began("k").wait(), 10)

    async def reported() -> bool:
        return not (await row(pool, holder))["claimed_ahead"]

    await wait_until(reported, message="the heartbeat to report the start")
    successor = await schedule_keyed(producer, "next")
    assert successor != holder
    tasks.gate("k").set()
    await wait_for_status(pool, holder, "completed")
    assert (await row(pool, successor))["status"] in ("pending", "running", "completed")


async def test_handed_back_at_shutdown_it_keeps_its_key_until_another_worker_starts_it(
    pool, dsn, make_scheduler
):
    worker = await make_scheduler(max_concurrent_jobs=1, batch_claim_limit=1, lease_duration=60)
    worker.worker.handback.max_buffer_wait = 3600.0
    holder = await claimed_ahead_behind_a_blocker(pool, worker)
    down = asyncio.create_task(worker.shutdown(grace_period=30))
    # The buffer goes back first, while the blocker still runs in its grace.
    await wait_for_status(pool, holder, "pending")
    client = SyncClient(dsn)
    try:

        def sync_schedule(conflict: ConflictResolution) -> str:
            return client.schedule(
                tasks.hold,
                execution_time=now(),
                args=("second",),
                dedupe_key=KEY,
                dedupe_scope="pending",
                conflict_resolution=conflict,
            )

        with pytest.raises(ValueError, match=holder):
            await asyncio.to_thread(sync_schedule, ConflictResolution.RAISE)
        tasks.gate("blocker").set()
        await asyncio.wait_for(down, 30)
        r = await row(pool, holder)
        assert r["status"] == "pending" and r["attempts"] == 0
        assert await asyncio.to_thread(sync_schedule, ConflictResolution.IGNORE) == holder
        assert [r["job_id"] for r in await keyed_rows(pool)] == [holder]
        assert tasks.runs["k"] == 0

        # Another worker starts it; then the key is free.
        tasks.gate("k").set()
        await make_scheduler()
        await wait_for_status(pool, holder, "completed")
        successor = await asyncio.to_thread(sync_schedule, ConflictResolution.RAISE)
        assert successor != holder
        assert tasks.runs["k"] == 1
    finally:
        await asyncio.to_thread(client.close)


async def test_rescued_from_a_killed_worker_before_it_started_it_keeps_its_key(
    pool, dsn, tmp_path, make_scheduler
):
    """kill -9 of a worker holding a keyed row claimed ahead: the rescue puts it
    back to pending still holding its key (it never started)."""
    import signal

    from tests.support.fault_worker import FAULT, RUNS_DDL, WorkerProcess

    await pool.execute(RUNS_DDL)
    await pool.execute("TRUNCATE fault_runs")
    producer = await make_scheduler(start=False)
    victim = await WorkerProcess.start(
        dsn, tmp_path, "victim", **{**FAULT, "max_concurrent_jobs": 1, "batch_claim_limit": 1}
    )
    try:
        await victim.ready()
        blocker = await producer.schedule_job(
            "fault.tracked", now(), {"kwargs": {"key": "blocker", "first_seconds": 120}}
        )
        await wait_until(
            lambda: pool.fetchval(
                "SELECT status = 'running' FROM scheduled_jobs WHERE job_id = $1", blocker
            ),
            message="the blocker running",
        )

        def by_name(conflict: ConflictResolution) -> object:
            return producer.schedule_job(
                "fault.quick",
                now(),
                {"kwargs": {"key": "keyed"}},
                conflict_resolution=conflict,
                dedupe_key=KEY,
                dedupe_scope="pending",
            )

        holder = await by_name(ConflictResolution.RAISE)

        async def ahead() -> bool:
            r = await row(pool, holder)
            return r["status"] == "running" and r["claimed_ahead"]

        await wait_until(ahead, timeout=15, message="the keyed job claimed ahead")
        victim.send(signal.SIGKILL)
        await victim.wait()

        async def rescued() -> bool:
            await producer.recover_orphaned_jobs()
            return (await row(pool, holder))["status"] == "pending"

        await wait_until(rescued, timeout=20, interval=0.2, message="the rescue")
        with pytest.raises(ValueError, match=holder):
            await by_name(ConflictResolution.RAISE)
        assert await by_name(ConflictResolution.IGNORE) == holder
        assert [r["job_id"] for r in await keyed_rows(pool)] == [holder]
        assert await pool.fetchval("SELECT count(*) FROM fault_runs WHERE job_key = 'keyed'") == 0
    finally:
        await victim.close()
