"""The scheduler's own statements and the timeouts a user sets.

A ``statement_timeout`` or ``lock_timeout`` the application sets as a session
default (on its role, its database, or its pool's ``server_settings``) used to
apply to the claim and the completion as well: a completion that waited for a
row lock longer than that was cancelled, and the job's outcome was not
written. The sessions the scheduler holds for itself take their own timeouts
(not behind pgbouncer), and the pool's connections are the application's
again once handed back. The worker command's own pool has keepalives on.
"""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime

import asyncpg
import pytest

from pg_scheduler import Scheduler, task
from pg_scheduler.support.connections import KEEPALIVE_IDLE, USER_TIMEOUT, pool_options
from tests.support.common import wait_for_status, wait_until
from tests.support.tcp_proxy import TcpProxy

USER_SETTINGS = {"statement_timeout": "300ms", "lock_timeout": "100ms"}
release_job = asyncio.Event()
runs: list[str] = []  # one entry per execution of the job below


@task(name="own_timeouts.waits")
async def waits() -> str:
    runs.append("run")
    await release_job.wait()
    return "done"


async def _lock_waiters(pool: asyncpg.Pool) -> int:
    return await pool.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND datname = current_database()"
    )


async def test_a_users_session_timeouts_do_not_cancel_the_completion(dsn, pool, make_scheduler):
    release_job.clear()
    runs.clear()
    user_pool = await asyncpg.create_pool(
        dsn, min_size=1, max_size=10, server_settings=USER_SETTINGS
    )
    scheduler = await make_scheduler(db_pool=user_pool)
    try:
        job_id = await scheduler.schedule(waits, execution_time=datetime.now(UTC))
        await wait_for_status(pool, job_id, "running")
        locker = await asyncpg.connect(dsn)
        try:
            async with locker.transaction():
                await locker.execute(
                    "SELECT 1 FROM scheduled_jobs WHERE job_id = $1 FOR UPDATE", job_id
                )
                release_job.set()  # the job returns; its completion waits for the row
                await wait_until(
                    lambda: _lock_waiters(pool), timeout=10, message="completion waiting"
                )
                # Held past both of the user's timeouts (a heartbeat meanwhile
                # fails on them: it runs under the pool's own settings).
                await asyncio.sleep(0.6)
        finally:
            await locker.close()
        await wait_for_status(pool, job_id, "completed", timeout=10)
        row = await pool.fetchrow(
            "SELECT attempts, result::text AS result FROM scheduled_jobs WHERE job_id = $1",
            job_id,
        )
        assert row["attempts"] == 1 and row["result"] == '"done"'
        # Written the first time: not handed back as a claim that never
        # started, and run again.
        await scheduler.shutdown(grace_period=1.0)
        assert runs == ["run"]
        # Handed back, every connection of the pool has the user's settings again.
        conns = [await user_pool.acquire() for _ in range(user_pool.get_size())]
        try:
            for conn in conns:
                assert await conn.fetchval("SHOW statement_timeout") == "300ms"
                assert await conn.fetchval("SHOW lock_timeout") == "100ms"
        finally:
            for conn in conns:
                await user_pool.release(conn)
    finally:
        # Never close a pool a started scheduler still holds connections of.
        await scheduler.shutdown(grace_period=1.0)
        await user_pool.close()


async def test_the_worker_commands_pool_has_keepalives_and_its_own_timeouts(dsn):
    # Through a TCP proxy: the embedded server listens on a Unix socket only.
    proxy = await TcpProxy(TcpProxy.upstream_of(dsn)).start()
    try:
        user_side = {"statement_timeout": "300ms"}
        options = pool_options()
        # The role's defaults, as if set with ALTER ROLE, are overridden.
        own = await asyncpg.create_pool(
            proxy.dsn_for(dsn),
            min_size=1,
            max_size=1,
            **{**options, "server_settings": {**user_side, **options["server_settings"]}},
        )
        try:
            async with own.acquire() as conn:
                sock = conn._con._transport.get_extra_info("socket")
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE
                assert (
                    sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
                    == USER_TIMEOUT * 1000
                )
                assert await conn.fetchval("SHOW statement_timeout") == "0"
                assert await conn.fetchval("SHOW lock_timeout") == "0"
        finally:
            await own.close()
        # Behind pgbouncer no startup parameter is sent (it refuses unknown ones).
        assert "server_settings" not in pool_options(pgbouncer=True)
    finally:
        await proxy.close()


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), "10", True, None])
async def test_a_bad_statement_timeout_is_refused_at_construction(pool, bad):
    with pytest.raises(ValueError, match="statement_timeout"):
        Scheduler(pool, statement_timeout=bad)
