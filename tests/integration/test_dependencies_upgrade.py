"""Migration 0015 on a database at 0014 with jobs in it, and applied twice."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from pg_scheduler import Scheduler
from pg_scheduler.store.migrate import current_version, load_migrations, migrate
from tests.support import dependency_tasks as t
from tests.support.common import FAST, migrate_up_to, wait_until, with_database


@pytest.fixture
async def fresh_db(server_dsn: str) -> AsyncIterator[str]:
    name = f"pgs_deps_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = await asyncpg.connect(server_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    yield with_database(server_dsn, name)
    admin = await asyncpg.connect(server_dsn)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


async def test_an_existing_database_upgrades_and_its_jobs_can_be_depended_on(fresh_db):
    conn = await asyncpg.connect(fresh_db)
    try:
        await migrate_up_to(conn, 14)  # the database as 0014 left it
        assert await current_version(conn) == 14
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(fresh_db, min_size=1, max_size=6)
    try:
        await pool.execute(t.TABLE)
        t.use_pool(pool)
        # Jobs written before the upgrade: one completed, one not yet due.
        old_rows = [(f"old-{n}", datetime.now(UTC) + timedelta(hours=1)) for n in ("done", "later")]
        for job_id, when in old_rows:
            await pool.execute(
                "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time,"
                " task_data) VALUES ($1, 'step', 'dep.step', $2, $3::jsonb)",
                job_id,
                when,
                '{"args": ["old"], "kwargs": {}}',
            )
        await pool.execute(
            "UPDATE scheduled_jobs SET status = 'completed', result = '\"kept\"'::jsonb,"
            " finished_at = now() WHERE job_id = 'old-done'"
        )
        async with pool.acquire() as conn:
            later = [m.version for m in load_migrations() if m.version > 14]
            assert await migrate(conn) == later
            assert await migrate(conn) == []
            # Applying the file again changes nothing (IF NOT EXISTS, OR REPLACE).
            [m] = [m for m in load_migrations() if m.version == 15]
            async with conn.transaction():
                await conn.execute(m.sql)
        flags = await pool.fetch("SELECT has_dependents, dependencies_unmet FROM scheduled_jobs")
        assert [tuple(r) for r in flags] == [(False, None)] * 2
        scheduler = Scheduler(pool, **FAST)
        await scheduler.start()
        try:
            now = datetime.now(UTC)
            ready = await scheduler.schedule(
                t.collect, execution_time=now, args=("ready",), depends_on=["old-done"]
            )
            held = await scheduler.schedule(
                t.step, execution_time=now, args=("held",), depends_on=["old-later"]
            )
            await wait_until(
                lambda: _status_is(pool, ready, "completed"), message="the dependent to run"
            )
            assert await scheduler.result(ready) == [["old-done", "kept"]]
            assert await pool.fetchval(
                "SELECT status FROM scheduled_jobs WHERE job_id = $1", held
            ) == ("waiting")
        finally:
            await scheduler.shutdown(grace_period=1.0)
    finally:
        t.use_pool(None)
        await pool.close()


async def _status_is(pool: asyncpg.Pool, job_id: str, status: str) -> bool:
    return await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id) == (
        status
    )
