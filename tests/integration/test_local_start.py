"""schedule() of a due job hands it straight to a worker of the same process."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta

import asyncpg

from pg_scheduler import Scheduler
from tests.support import app_tasks
from tests.support.common import wait_for_status, wait_until


def key() -> str:
    return f"local-{uuid.uuid4().hex[:8]}"


async def row(pool, job_id):
    return await pool.fetchrow(
        "SELECT status, worker_id, attempts FROM scheduled_jobs WHERE job_id = $1", job_id
    )


async def test_a_due_job_is_written_claimed_by_the_local_worker(pool, make_scheduler):
    worker = await make_scheduler()
    producer = Scheduler(pool)  # not started: the application's side
    k = key()
    job_id = await producer.schedule(
        app_tasks.wait_for, execution_time=datetime.now(UTC), args=(k,)
    )
    # Already running here when schedule() returns: no NOTIFY, no claim.
    stored = await row(pool, job_id)
    assert (stored["status"], stored["worker_id"], stored["attempts"]) == (
        "running",
        worker.worker_id,
        1,
    )
    await asyncio.wait_for(app_tasks.event(k + ":started").wait(), 5)
    assert job_id in worker.worker.running
    app_tasks.event(k + ":release").set()
    await wait_for_status(pool, job_id, "completed")
    assert app_tasks.calls[k] == ["start"]


async def test_a_job_runs_in_the_context_of_start_not_of_its_caller(pool, make_scheduler):
    """A local start runs in the worker's context, as a claimed job does: a
    request's context variables (its user, tenant, log bindings) stay in the
    request."""
    token = app_tasks.request_user.set("set before start()")
    try:
        worker = await make_scheduler()
    finally:
        app_tasks.request_user.reset(token)

    async def request_handler(when: datetime) -> str:
        app_tasks.request_user.set("alice")
        return await worker.schedule(app_tasks.seen_request_user, execution_time=when)

    local = await asyncio.create_task(request_handler(datetime.now(UTC)))
    assert (await row(pool, local))["status"] in ("running", "completed")  # started here
    claimed = await asyncio.create_task(request_handler(datetime.now(UTC) + timedelta(seconds=0.3)))
    for job_id in (local, claimed):
        await wait_for_status(pool, job_id, "completed")
        result = await pool.fetchval("SELECT result FROM scheduled_jobs WHERE job_id = $1", job_id)
        assert json.loads(result) == "set before start()"


async def test_inside_a_transaction_the_job_waits_for_the_commit(pool, make_scheduler):
    worker = await make_scheduler()
    k = key()
    async with pool.acquire() as conn, conn.transaction():
        job_id = await worker.schedule(
            app_tasks.record, execution_time=datetime.now(UTC), args=(k,), connection=conn
        )
        assert (
            await conn.fetchrow(
                "SELECT status, worker_id FROM scheduled_jobs WHERE job_id = $1", job_id
            )
        )["status"] == "pending"
        assert app_tasks.calls[k] == []
    await wait_for_status(pool, job_id, "completed")
    assert app_tasks.calls[k] == [None]


def spy_local_starts(scheduler: Scheduler) -> list:
    """Record the scheduler's already-claimed inserts (the local start path)."""
    seen: list = []
    real = scheduler.store.insert_running

    async def spy(*args):
        seen.append(args)
        return await real(*args)

    scheduler.store.insert_running = spy
    return seen


async def test_future_jobs_and_a_full_worker_go_through_the_queue(pool, make_scheduler):
    worker = await make_scheduler(max_concurrent_jobs=1)
    local_starts = spy_local_starts(worker)
    later = await worker.schedule(
        app_tasks.noop, execution_time=datetime.now(UTC) + timedelta(hours=1)
    )
    assert (await row(pool, later))["status"] == "pending"
    assert local_starts == []
    # Past its misfire grace: not started here; the claim expires it.
    late = await worker.schedule(
        app_tasks.noop,
        execution_time=datetime.now(UTC) - timedelta(seconds=30),
        misfire_grace_time=1,
    )
    await wait_for_status(pool, late, "expired")
    local_starts.clear()
    busy = key()
    first = await worker.schedule(
        app_tasks.wait_for, execution_time=datetime.now(UTC), args=(busy,)
    )
    assert len(local_starts) == 1
    await asyncio.wait_for(app_tasks.event(busy + ":started").wait(), 5)
    k = key()
    # No free slot: written pending, for whichever worker frees one first.
    queued = await worker.schedule(app_tasks.record, execution_time=datetime.now(UTC), args=(k,))
    assert len(local_starts) == 1
    app_tasks.event(busy + ":release").set()
    await wait_for_status(pool, first, "completed")
    await wait_for_status(pool, queued, "completed")
    assert (await row(pool, later))["status"] == "pending"


async def test_turned_off_or_another_pool_means_no_local_start(dsn, pool, make_scheduler):
    worker = await make_scheduler(start_due_jobs_locally=False)
    other_pool = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        for producer in (worker, Scheduler(other_pool)):
            local_starts = spy_local_starts(producer)
            job_id = await producer.schedule(app_tasks.noop, execution_time=datetime.now(UTC))
            await wait_for_status(pool, job_id, "completed")
            assert local_starts == []
    finally:
        await other_pool.close()


async def test_many_concurrent_local_starts_run_each_job_once(dsn, pool, make_scheduler):
    local = await make_scheduler(max_concurrent_jobs=5)
    other_pool = await asyncpg.create_pool(dsn, min_size=1, max_size=6)
    remote = await make_scheduler(db_pool=other_pool, max_concurrent_jobs=5)
    try:
        k = key()
        ids = await asyncio.gather(
            *(
                local.schedule(app_tasks.record, execution_time=datetime.now(UTC), args=(k, n))
                for n in range(200)
            )
        )

        async def all_done() -> bool:
            return (
                await pool.fetchval(
                    "SELECT count(*) FROM scheduled_jobs"
                    " WHERE job_id = ANY($1) AND status = 'completed'",
                    ids,
                )
                == 200
            )

        await wait_until(all_done, timeout=30)
        assert sorted(app_tasks.calls[k]) == list(range(200))
        # The first ones found free local slots and started without a claim.
        started_here = await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE job_id = ANY($1) AND worker_id = $2",
            ids,
            local.worker_id,
        )
        assert started_here >= 5
    finally:
        await remote.shutdown()
        await other_pool.close()


async def test_local_starts_give_every_connection_back_to_the_pool(dsn):
    # The insert's connection goes back in the background (the job starts
    # without waiting for asyncpg's reset): none may be kept.
    own = await asyncpg.create_pool(dsn, min_size=8, max_size=8)
    worker = Scheduler(own, max_concurrent_jobs=20, batch_claim_limit=20)
    await worker.start()
    try:
        await wait_until(lambda: own.get_idle_size() > 0, message="an idle connection")
        idle_before = own.get_idle_size()
        ids = [
            await worker.schedule(app_tasks.add, execution_time=datetime.now(UTC), args=(i, 1))
            for i in range(40)
        ]
        stored = await own.fetch("SELECT worker_id FROM scheduled_jobs WHERE job_id = ANY($1)", ids)
        assert {r["worker_id"] for r in stored} <= {worker.worker_id}

        async def done() -> bool:
            n = await own.fetchval(
                "SELECT count(*) FROM scheduled_jobs WHERE job_id = ANY($1)"
                " AND status = 'completed'",
                ids,
            )
            return n == len(ids)

        await wait_until(done, message="every job completed")
        await wait_until(
            lambda: own.get_idle_size() >= idle_before,
            message=f"{idle_before} idle connections again",
        )
    finally:
        await worker.shutdown()
        await asyncio.wait_for(own.close(), 10)
