"""Deadlocks around a worker's completion statements.

A completion batch the server rolls back to break a deadlock (here with an
outside transaction) is written again: the completer used to give up, the
row stayed running without an owner, the next heartbeat handed it back as a
claim that "never started", and another worker ran the job a second time.

The heartbeat (and the watchdog's renewal during a stall) and a completion
batch both lock the worker's running rows. The renewal used to lock them in
its scan's order and wait for each, the completion in job_id order: run side
by side they deadlocked, and PostgreSQL rolled one back after
deadlock_timeout (a second without completions, or a heartbeat lost). The
renewal now takes only rows no one holds (SKIP LOCKED, in job_id order) and
never waits, so no cycle can form: provoked below with the very interleaving
that deadlocked, the two statements both succeed. And since the heartbeat
never waits for a row lock, a completion stuck behind a lock held elsewhere
no longer stops it (every lease of the worker expired, and its jobs were
rescued while they ran).
"""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime

import asyncpg
import pytest

from pg_scheduler import Scheduler, task
from pg_scheduler.engine.completer import Completer
from pg_scheduler.store import Completion, Store
from tests.support.common import wait_until

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


async def _lock_waiters(pool: asyncpg.Pool, *pids: int) -> int:
    return await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND pid = ANY($1::int[])",
        list(pids),
    )


async def _renew_heartbeat(store: Store, conn: asyncpg.Connection) -> list[str]:
    rows = await conn.fetch(store._heartbeat, WORKER, 60.0, "host", 1, 10, ["deadlock.noop"], [])
    return sorted(r["job_id"] for r in rows)


async def _renew_stalled(store: Store, conn: asyncpg.Connection) -> list[str]:
    return sorted(await store.renew_while_stalled(conn, WORKER, 60.0, 60.0))


@pytest.mark.parametrize("renewal", [_renew_heartbeat, _renew_stalled], ids=["heartbeat", "stall"])
async def test_renewal_and_completion_cannot_deadlock(pool, dsn, renewal):
    """The interleaving that deadlocked: the completion waits for row a (held
    by an outside transaction) in job_id order, the renewal locks b (first in
    its scan) and asks for a; when a is free the completion takes it and asks
    for b. Now the renewal skips a and returns at once, and both succeed."""
    producer = Scheduler(pool)  # never started: it only enqueues
    now = datetime.now(UTC)
    # b first: the renewal's scan meets b before a, the completion a before b.
    for job_id in ("deadlock-b", "deadlock-a"):
        await producer.schedule(noop, execution_time=now, job_id=job_id)
    store = Store(pool)
    claimed = await store.claim(WORKER, ["deadlock.noop"], 2, 60.0)
    assert len(claimed) == 2
    settings = {"enable_seqscan": "off", "enable_bitmapscan": "off"}
    completing = await asyncpg.connect(dsn, server_settings=settings)
    renewing = await asyncpg.connect(dsn)
    rival = await asyncpg.connect(dsn)
    try:
        tx = rival.transaction()
        await tx.start()
        await rival.execute("SELECT 1 FROM scheduled_jobs WHERE job_id = 'deadlock-a' FOR UPDATE")
        completion = asyncio.ensure_future(
            store.complete(
                WORKER,
                [Completion("deadlock-a", 1, None), Completion("deadlock-b", 1, None)],
                False,
                completing,
            )
        )
        cpid, rpid = completing.get_server_pid(), renewing.get_server_pid()
        await wait_until(lambda: _lock_waiters(pool, cpid), message="the completion to wait")
        renewed = asyncio.ensure_future(renewal(store, renewing))
        # Before: the renewal waits for a too (behind the completion).
        await wait_until(
            lambda: renewed.done() or _lock_waiters(pool, rpid),
            message="the renewal to return or to wait",
        )
        await tx.commit()
        results = await asyncio.wait_for(
            asyncio.gather(completion, renewed, return_exceptions=True), 60
        )
    finally:
        for conn in (completing, renewing, rival):
            await conn.close()
    deadlocks = [r for r in results if isinstance(r, asyncpg.DeadlockDetectedError)]
    assert deadlocks == [], "the renewal and the completion deadlocked"
    assert results[0] == {"deadlock-a", "deadlock-b"}
    # Both rows are reported as running here (a was locked elsewhere: not renewed).
    assert results[1] == ["deadlock-a", "deadlock-b"]


@task(name="deadlock.held")
async def held(key: str) -> str:
    await _gates[key].wait()
    return key


_gates: dict[str, asyncio.Event] = {}
_keys = itertools.count()


async def test_heartbeat_renews_while_a_completion_waits_for_a_row_lock(pool, make_scheduler):
    """An outside transaction locks the row of a job that finishes: its
    completion waits for the lock. Meanwhile the worker's heartbeat keeps
    renewing its other job's lease (were it to wait for the completion, or for
    the lock itself, the rescuer would take every job of the worker, running or
    not). Once the lock is gone the completion is written; each job ran once."""
    tag = next(_keys)
    finish, longer = f"finish-{tag}", f"longer-{tag}"
    _gates[finish], _gates[longer] = asyncio.Event(), asyncio.Event()
    scheduler = await make_scheduler(lease_duration=3.0, heartbeat_threshold=2.0)
    now = datetime.now(UTC)
    locked_id = await scheduler.schedule(held, execution_time=now, kwargs={"key": finish})
    other_id = await scheduler.schedule(held, execution_time=now, kwargs={"key": longer})

    async def both_running() -> bool:
        n = await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE status = 'running' AND started_at IS NOT"
            " NULL AND NOT claimed_ahead"
        )
        return n == 2 and len(scheduler.worker.executor.running) == 2

    await wait_until(both_running, message="both jobs running")
    rival = await pool.acquire()
    try:
        tx = rival.transaction()
        await tx.start()
        await rival.execute("SELECT 1 FROM scheduled_jobs WHERE job_id = $1 FOR UPDATE", locked_id)
        _gates[finish].set()  # its completion now waits for the lock
        await wait_until(
            lambda: pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND query LIKE '%status = ''completed''%'"
            ),
            message="the completion to wait for the lock",
        )
        before = await pool.fetchval(
            "SELECT lease_until FROM scheduled_jobs WHERE job_id = $1", other_id
        )

        async def renewed() -> bool:
            lease = await pool.fetchval(
                "SELECT lease_until FROM scheduled_jobs WHERE job_id = $1 AND status = 'running'",
                other_id,
            )
            return lease is not None and lease > before

        # Several heartbeats (FAST: one per 0.2 s) while the completion waits.
        for _ in range(3):
            await wait_until(renewed, timeout=10, message="the other job's lease renewed")
            before = await pool.fetchval(
                "SELECT lease_until FROM scheduled_jobs WHERE job_id = $1", other_id
            )
        await tx.commit()
    finally:
        await pool.release(rival)
    await wait_until(
        lambda: pool.fetchval(
            "SELECT status = 'completed' FROM scheduled_jobs WHERE job_id = $1", locked_id
        ),
        message="the locked job completed once the lock is gone",
    )
    _gates[longer].set()
    await wait_until(
        lambda: pool.fetchval(
            "SELECT status = 'completed' FROM scheduled_jobs WHERE job_id = $1", other_id
        ),
        message="the other job completed",
    )
    rows = await pool.fetch(
        "SELECT job_id, attempts, rescue_count FROM scheduled_jobs ORDER BY job_id"
    )
    assert [(r["attempts"], r["rescue_count"]) for r in rows] == [(1, 0), (1, 0)]
