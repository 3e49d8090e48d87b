"""The claim loop's and the completion writer's own pooled connections."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import asyncpg
import pytest

from pg_scheduler.engine.held import MIN_POOL_SIZE_TO_HOLD, HeldConnection
from pg_scheduler.support.reconnect import is_connection_error
from tests.support import app_tasks
from tests.support.common import wait_for_status, wait_until


async def pid_of(db) -> int:
    return await db.fetchval("SELECT pg_backend_pid()")


async def test_keeps_one_backend_commits_asynchronously_and_resets_on_release(dsn):
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=MIN_POOL_SIZE_TO_HOLD)
    try:
        held = HeldConnection(pool, asynchronous_commit=True)
        assert held.enabled
        pids = {await held.run(pid_of) for _ in range(5)}
        assert len(pids) == 1
        assert await held.run(lambda db: db.fetchval("SHOW synchronous_commit")) == "off"
        await held.release()
        # Back in the pool, reset: no other user of the pool inherits the setting.
        conns = [await pool.acquire() for _ in range(MIN_POOL_SIZE_TO_HOLD)]
        try:
            settings = {await c.fetchval("SHOW synchronous_commit") for c in conns}
            assert settings == {"on"}
            assert pids <= {c.get_server_pid() for c in conns}
        finally:
            for c in conns:
                await pool.release(c)
    finally:
        await pool.close()


async def test_a_small_pool_is_not_held_from(dsn):
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=MIN_POOL_SIZE_TO_HOLD - 1)
    try:
        held = HeldConnection(pool, asynchronous_commit=True)
        assert not held.enabled
        assert await held.run(lambda db: db.fetchval("SHOW synchronous_commit")) == "on"
        # Nothing kept: the whole pool can still be taken at once.
        conns = await asyncio.wait_for(
            asyncio.gather(*(pool.acquire() for _ in range(MIN_POOL_SIZE_TO_HOLD - 1))), 5
        )
        for c in conns:
            await pool.release(c)
    finally:
        await pool.close()


async def run_after_kill(held: HeldConnection) -> int:
    """The first statement after a kill works on a new backend, or (when it
    races the pool noticing) fails as a lost connection and the next one works."""
    try:
        return await held.run(pid_of)
    except Exception as exc:
        assert is_connection_error(exc), repr(exc)
        return await held.run(pid_of)


async def test_a_killed_backend_is_replaced(dsn, pool):
    own = await asyncpg.create_pool(dsn, min_size=1, max_size=MIN_POOL_SIZE_TO_HOLD)
    held = HeldConnection(own)
    try:
        first = await held.run(pid_of)
        await pool.execute("SELECT pg_terminate_backend($1)", first)
        second = await run_after_kill(held)
        assert second != first
        assert await held.run(pid_of) == second
        # Killed during a statement: that statement fails as a lost connection.
        blocker = asyncio.ensure_future(held.run(lambda db: db.fetchval("SELECT pg_sleep(30)")))
        await wait_until(
            lambda: pool.fetchval(
                "SELECT count(*) = 1 FROM pg_stat_activity WHERE pid = $1 AND state = 'active'",
                second,
            )
        )
        await pool.execute("SELECT pg_terminate_backend($1)", second)
        with pytest.raises(Exception) as caught:
            await blocker
        assert is_connection_error(caught.value)
        third = await run_after_kill(held)
        assert third not in (first, second)
        # A statement's own error keeps the connection.
        with pytest.raises(asyncpg.DivisionByZeroError):
            await held.run(lambda db: db.fetchval("SELECT 1 / 0"))
        assert await held.run(pid_of) == third
    finally:
        await held.release()
        await own.close()


async def test_worker_runs_on_after_its_held_backends_are_killed(pool, make_scheduler):
    # Through NOTIFY and the claim, so the held claim connection is used (a
    # job started in-process wakes no claim: migration 0012).
    scheduler = await make_scheduler(start_due_jobs_locally=False)
    first = await scheduler.schedule(app_tasks.noop, execution_time=datetime.now(UTC))
    await wait_for_status(pool, first, "completed")
    claim_conn = scheduler.worker.connection._conn
    ack_conn = scheduler.worker.completer.connection._conn
    assert claim_conn is not None and ack_conn is not None
    pids = [claim_conn.get_server_pid(), ack_conn.get_server_pid()]
    await pool.execute("SELECT pg_terminate_backend(p) FROM unnest($1::int[]) AS p", pids)
    jobs = [
        await scheduler.schedule(app_tasks.noop, execution_time=datetime.now(UTC)) for _ in range(5)
    ]
    for job_id in jobs:
        await wait_for_status(pool, job_id, "completed", timeout=15)
    new_pid = scheduler.worker.connection._conn.get_server_pid()
    assert new_pid not in pids


async def test_a_statement_sent_after_the_release_keeps_no_connection(dsn):
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=MIN_POOL_SIZE_TO_HOLD)
    try:
        held = HeldConnection(pool)
        await held.run(pid_of)
        assert pool.get_idle_size() == pool.get_size() - 1  # kept between statements
        await held.release()
        # Late to the shutdown: it runs, on a pooled connection given back after it.
        await held.run(pid_of)
        assert pool.get_idle_size() == pool.get_size()
        # Held again (a start after the shutdown): kept between statements again.
        held.hold()
        assert await held.run(pid_of) == await held.run(pid_of)
        assert pool.get_idle_size() == pool.get_size() - 1
        await held.release()
        assert pool.get_idle_size() == pool.get_size()
    finally:
        # A connection left taken would make this wait for ever.
        await asyncio.wait_for(pool.close(), 10)


async def test_a_stopped_and_restarted_worker_leaves_every_connection_in_the_pool(
    pool, make_scheduler
):
    scheduler = await make_scheduler(start_due_jobs_locally=False)
    for _ in range(2):
        jobs = [
            await scheduler.schedule(app_tasks.noop, execution_time=datetime.now(UTC))
            for _ in range(5)
        ]
        for job_id in jobs:
            await wait_for_status(pool, job_id, "completed")
        # The claim loop and the completion writer hold theirs while running.
        assert scheduler.worker.connection._conn is not None
        assert scheduler.worker.completer.connection._conn is not None
        await scheduler.shutdown()
        # A statement late to the shutdown takes nothing for good.
        await scheduler.worker.completer.connection.run(pid_of)
        await wait_until(
            lambda: pool.get_idle_size() == pool.get_size(), message="every connection back"
        )
        await scheduler.start()
