"""A pooled connection that closes while its holder still uses it (a restart
between two statements of one block): asyncpg detaches its proxy, and the next
statement is refused as "released back to the pool". The scheduler's holders
(a bounded pool's block, a held connection) report it as the lost connection it
is, so their callers retry it instead of failing a job over it."""

from __future__ import annotations

from typing import Any

import asyncpg
import pytest

from pg_scheduler.engine.held import MIN_POOL_SIZE_TO_HOLD, HeldConnection
from pg_scheduler.store.bounded import BoundedPool, holding
from pg_scheduler.support.reconnect import is_connection_error, is_lost_while_held
from tests.support.common import proxy_detached, wait_until


async def _closed_between_statements(killer: asyncpg.Pool, conn: Any) -> None:
    """One statement, the backend terminated from outside, then a second one."""
    pid = await conn.fetchval("SELECT pg_backend_pid()")
    await killer.execute("SELECT pg_terminate_backend($1)", pid)
    await wait_until(lambda: proxy_detached(conn), timeout=10, message="the proxy detached")
    await conn.fetchval("SELECT 1")


async def test_the_refusal_is_a_lost_connection_only_to_its_holder(dsn, pool):
    own = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        conn = await own.acquire()
        with pytest.raises(asyncpg.InterfaceError) as caught:
            await _closed_between_statements(pool, conn)
        assert "released back to the pool" in str(caught.value)
        # Without knowing who holds it, it reads as a misuse, not a lost connection.
        assert not is_connection_error(caught.value)
        assert is_lost_while_held(caught.value)
        await own.release(conn)
        assert await own.fetchval("SELECT 2") == 2
    finally:
        await own.close()


async def test_a_bounded_block_reports_a_lost_connection(dsn, pool):
    raw = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    bounded = BoundedPool(raw, 10.0)
    try:
        with pytest.raises(asyncpg.ConnectionDoesNotExistError) as caught:
            async with bounded.acquire() as conn:
                await _closed_between_statements(pool, conn)
        assert is_connection_error(caught.value)
        # The pool replaced it: the next block works.
        async with bounded.acquire() as conn:
            assert await conn.fetchval("SELECT 3") == 3
    finally:
        await raw.close()


async def test_a_held_connection_reports_a_lost_connection_and_is_replaced(dsn, pool):
    own = await asyncpg.create_pool(dsn, min_size=1, max_size=MIN_POOL_SIZE_TO_HOLD)
    held = HeldConnection(own)
    try:
        first = await held.run(lambda db: db.fetchval("SELECT pg_backend_pid()"))
        with pytest.raises(asyncpg.ConnectionDoesNotExistError) as caught:
            await held.run(lambda db: _closed_between_statements(pool, db))
        assert is_connection_error(caught.value)
        second = await held.run(lambda db: db.fetchval("SELECT pg_backend_pid()"))
        assert second != first
    finally:
        await held.release()
        await own.close()


async def test_a_block_on_the_applications_own_pool_reports_a_lost_connection(dsn, pool):
    """The producer's multi-statement writes run on the application's pool as
    it is (``store.bounded.holding``): the same refusal is a lost connection,
    which the producer retries."""
    own = await asyncpg.create_pool(dsn, min_size=1, max_size=2)
    try:
        with pytest.raises(asyncpg.ConnectionDoesNotExistError):
            async with holding(own) as conn:
                await _closed_between_statements(pool, conn)
        async with holding(own) as conn:
            assert await conn.fetchval("SELECT 4") == 4
        # Any other error of the block is its own.
        with pytest.raises(asyncpg.DivisionByZeroError):
            async with holding(own) as conn:
                await conn.fetchval("SELECT 1 / 0")
    finally:
        await own.close()
