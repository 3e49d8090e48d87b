"""A completion batch the server rolls back to break a deadlock is written again.

The heartbeat and a completion batch both lock the worker's running rows, each
in its own order, so they can deadlock; PostgreSQL then aborts one of them.
When the victim was the completion, the completer used to give up: the job's
task ended as if its completion could never be written, the row stayed
running without an owner, the next heartbeat handed it back as a claim that
"never started", and another worker ran the job a second time (seen in
test_multiprocess under load: 40 of 2,000 jobs ran twice).

Here the deadlock is provoked on purpose: a transaction holds one row of the
batch, waits until the completion holds the other and waits for it, then asks
for the row the completion holds.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg
import pytest
from conftest import wait_until

from pg_scheduler import Scheduler, task
from pg_scheduler.engine.completer import Completer
from pg_scheduler.store import Completion, Store

WORKER = "deadlock-worker"


@task(name="deadlock.noop")
async def noop() -> None:
    return None


async def _waiting_completion(pool: asyncpg.Pool) -> bool:
    return bool(
        await pool.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            " AND query LIKE '%status = ''completed''%'"
        )
    )


async def test_completion_rolled_back_by_a_deadlock_is_written_again(pool, dsn):
    producer = Scheduler(pool)  # never started: it only enqueues
    now = datetime.now(UTC)
    for job_id in ("deadlock-a", "deadlock-b"):
        await producer.schedule(noop, execution_time=now, job_id=job_id)
    claimed = await Store(pool).claim(WORKER, ["deadlock.noop"], 2, 60.0)
    assert sorted(r["job_id"] for r in claimed) == ["deadlock-a", "deadlock-b"]

    # Index scans only: the batch locks its rows in job_id order (a first).
    ordered = await asyncpg.create_pool(
        dsn,
        min_size=1,
        max_size=2,
        server_settings={"enable_seqscan": "off", "enable_bitmapscan": "off"},
    )
    rival = await asyncpg.connect(dsn)
    completer = Completer(Store(ordered), WORKER, lambda: False)
    try:
        tx = rival.transaction()
        await tx.start()
        try:
            # The completion's backend must be the one that detects the deadlock.
            async with rival.transaction():
                await rival.execute("SET LOCAL deadlock_timeout = '60s'")
        except asyncpg.InsufficientPrivilegeError:
            pytest.skip("needs a superuser to choose the deadlock victim")
        await rival.execute("SELECT 1 FROM scheduled_jobs WHERE job_id = 'deadlock-b' FOR UPDATE")
        written = asyncio.gather(
            completer.submit(Completion("deadlock-a", 1, None)),
            completer.submit(Completion("deadlock-b", 1, None)),
        )
        await wait_until(lambda: _waiting_completion(pool), message="the completion to wait")
        # The batch holds a (so this probe fails) and waits for b.
        with pytest.raises(asyncpg.LockNotAvailableError):
            async with rival.transaction():
                await rival.execute(
                    "SELECT 1 FROM scheduled_jobs WHERE job_id = 'deadlock-a' FOR UPDATE NOWAIT"
                )
        # Now a cycle: the server rolls the completion back (after its 1 s deadlock_timeout).
        await rival.execute("SELECT 1 FROM scheduled_jobs WHERE job_id = 'deadlock-a' FOR UPDATE")
        await tx.commit()
        assert await asyncio.wait_for(written, 30) == [True, True]
    finally:
        if not rival.is_closed():
            await rival.close()
        await completer.connection.release()
        await ordered.close()
    rows = await pool.fetch(
        "SELECT job_id, status FROM scheduled_jobs WHERE job_id LIKE 'deadlock-%' ORDER BY 1"
    )
    assert [tuple(r) for r in rows] == [("deadlock-a", "completed"), ("deadlock-b", "completed")]


async def test_heartbeat_never_runs_beside_this_workers_completion(pool, make_scheduler):
    # Both lock the worker's running rows in their own order: the heartbeat
    # waits for a completion statement in flight instead of racing it.
    scheduler = await make_scheduler()
    lock = scheduler.worker.completer.statement_lock
    await lock.acquire()  # as a completion statement would
    try:
        beat = asyncio.ensure_future(scheduler.heartbeat.run_once())
        await asyncio.sleep(0.3)  # a heartbeat round takes a few ms
        assert not beat.done()
    finally:
        lock.release()
    await asyncio.wait_for(beat, 10)
