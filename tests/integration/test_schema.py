"""schema=: two schemas in one database never see each other's jobs, wake-ups or
cancels; a worker runs with only the documented grants; migrate explains what
a role without CREATE lacks."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from pg_scheduler import Scheduler
from pg_scheduler.batching import batch_options_of
from pg_scheduler.store.migrate import MigrationError, migrate
from pg_scheduler.tasks import TaskRegistry
from tests.support import app_tasks
from tests.support.common import FAST, wait_until, with_database

A, B = "sched_a", "sched_b"

# The least a worker needs once an owner has migrated (docs/operations.md: schemas and privileges).
WORKER_GRANTS = """
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT ON {schema}.pg_scheduler_migrations TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.scheduled_jobs, {schema}.scheduler_workers
    TO {role};
GRANT SELECT, INSERT, UPDATE ON {schema}.periodic_jobs TO {role};
GRANT SELECT, INSERT, DELETE ON {schema}.job_attempts TO {role};
GRANT SELECT ON {schema}.scheduler_event_flags TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.scheduler_limits TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.workflow_steps TO {role};
GRANT SELECT, INSERT, UPDATE ON {schema}.workflow_signals TO {role};
GRANT SELECT, INSERT, UPDATE ON {schema}.workflow_waits TO {role};
GRANT SELECT, INSERT, DELETE ON {schema}.scheduler_key_starts TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON {schema}.scheduler_fair_share_starts TO {role};
GRANT SELECT, INSERT, DELETE ON {schema}.scheduler_batches TO {role};
"""


@pytest.fixture(scope="module")
async def db(server_dsn: str) -> AsyncIterator[str]:
    """A database of this module's own, with schemas A and B migrated."""
    name = f"pgs_schema_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = await asyncpg.connect(server_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    url = with_database(server_dsn, name)
    conn = await asyncpg.connect(url)
    try:
        for schema in (A, B):
            assert await migrate(conn, schema)
            assert await migrate(conn, schema) == []
        # Every object landed in its schema, none in public.
        assert await conn.fetchval("SELECT to_regclass('public.scheduled_jobs')") is None
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM pg_proc WHERE proname = 'pg_scheduler_notify_jobs'"
                " AND pronamespace::regnamespace::text = ANY($1::text[])",
                [A, B],
            )
            == 2
        )
    finally:
        await conn.close()
    yield url
    admin = await asyncpg.connect(server_dsn)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


@pytest.fixture
async def owner(db: str) -> AsyncIterator[asyncpg.Pool]:
    p = await asyncpg.create_pool(db, min_size=1, max_size=10)
    for schema in (A, B):
        await p.execute(f"TRUNCATE {schema}.scheduled_jobs, {schema}.scheduler_workers")
    yield p
    await p.close()


@pytest.fixture
async def role(db: str, server_dsn: str) -> AsyncIterator[str]:
    """A login role with no privileges at all; dropped afterwards."""
    name = f"pgs_worker_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(server_dsn)
    await admin.execute(f"CREATE ROLE {name} LOGIN")
    await admin.close()
    yield name
    conn = await asyncpg.connect(db)
    await conn.execute(f"DROP OWNED BY {name}")
    await conn.close()
    admin = await asyncpg.connect(server_dsn)
    await admin.execute(f"DROP ROLE {name}")
    await admin.close()


def as_role(url: str, role: str) -> str:
    parts = urlsplit(url)
    netloc = role + "@" + parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=netloc))


async def test_two_schemas_never_see_each_others_jobs_or_cancels(owner):
    a = Scheduler(owner, schema=A, **FAST)
    b = Scheduler(owner, schema=B, **FAST)
    for s in (a, b):
        s.register_task(app_tasks.wait_for)
    await a.start()
    await b.start()
    try:
        now = datetime.now(UTC)
        for s, key in ((a, "iso-a"), (b, "iso-b")):
            await s.schedule(app_tasks.wait_for, execution_time=now, args=(key,), job_id="same-id")
        for schema in (A, B):
            await wait_until(
                lambda schema=schema: _status(owner, schema, "same-id", "running"),
                message=f"same-id running in {schema}",
            )
        # Each schema's row was claimed by its own worker.
        assert await _worker_of(owner, A, "same-id") == a.worker_id
        assert await _worker_of(owner, B, "same-id") == b.worker_id
        await app_tasks.event("iso-b:started").wait()

        assert await a.cancel_job("same-id")
        assert (await a.get_job("same-id")).status == "cancelled"
        await wait_until(lambda: "same-id" not in a.worker.running, message="A's job stopped")
        # B's job with the same id is untouched and still running here.
        assert (await b.get_job("same-id")).status == "running"
        assert "same-id" in b.worker.running
        app_tasks.event("iso-b:release").set()
        await wait_until(lambda: _status(owner, B, "same-id", "completed"))
        assert (await b.get_job("same-id")).result == "released"
        assert (await a.get_job("same-id")).status == "cancelled"
    finally:
        app_tasks.event("iso-a:release").set()
        app_tasks.event("iso-b:release").set()
        await a.shutdown(grace_period=1.0)
        await b.shutdown(grace_period=1.0)


async def test_a_notify_in_one_schema_does_not_reach_the_other(owner, db):
    a = Scheduler(owner, schema=A)
    b = Scheduler(owner, schema=B)
    channel_a = next(iter(a.listener._handlers))
    channel_b = next(iter(b.listener._handlers))
    assert channel_a != channel_b
    heard: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    listener = await asyncpg.connect(db)
    try:
        for channel in (channel_a, channel_b):
            await listener.add_listener(channel, lambda _c, _p, ch, pl: heard.put_nowait((ch, pl)))
        # A job inserted into A (its trigger fires), then a marker on B's channel
        # from the same session: notifications of one session arrive in order.
        async with owner.acquire() as conn:
            await a.schedule(
                app_tasks.noop,
                execution_time=datetime.now(UTC) + timedelta(hours=1),
                connection=conn,
            )
            await conn.execute("SELECT pg_notify($1, 'marker')", channel_b)
        first = await asyncio.wait_for(heard.get(), 10)
        second = await asyncio.wait_for(heard.get(), 10)
        assert first == (channel_a, "")
        assert second == (channel_b, "marker")  # B heard nothing before the marker
    finally:
        await listener.close()


async def test_a_worker_runs_with_only_the_documented_grants(owner, db, role):
    await owner.execute(WORKER_GRANTS.format(schema=A, role=role))
    pool = await asyncpg.create_pool(as_role(db, role), min_size=1, max_size=10)
    try:
        assert await pool.fetchval("SELECT current_user") == role
        scheduler = Scheduler(
            pool, schema=A, **{**FAST, "vacuum_enabled": True, "run_periodic_jobs": True}
        )
        scheduler.register_task(app_tasks.add)
        await scheduler.start()
        try:
            job = await scheduler.schedule(
                app_tasks.add, execution_time=datetime.now(UTC), args=(1, 2), job_id="least-1"
            )
            await wait_until(lambda: _status(owner, A, job, "completed"))
            assert (await scheduler.get_job(job)).result == 3
            assert await scheduler.cancel_job("least-1") is False  # finished already
            # Without DELETE on scheduler_throttles the vacuum keeps ended periods
            # and does the rest of its round.
            await owner.execute(
                f"INSERT INTO {A}.scheduler_throttles (throttle_key, job_id, until)"
                " VALUES ('ended', 'e1', clock_timestamp() - interval '1 hour')"
            )
            assert (await scheduler.run_vacuum()) is not None
            assert await owner.fetchval(f"SELECT count(*) FROM {A}.scheduler_throttles") == 1
            # Not the table's owner: its own VACUUM is off, and says so once.
            assert scheduler.table_vacuum is not None
            assert await scheduler.table_vacuum.run_once() is False
            assert scheduler.table_vacuum.allowed is False
        finally:
            await scheduler.shutdown(grace_period=1.0)
        assert await owner.fetchval(f"SELECT count(*) FROM {A}.scheduler_workers") == 0
    finally:
        await pool.close()


async def test_a_missing_grant_fails_start_before_the_worker_registers(owner, db, role):
    await owner.execute(WORKER_GRANTS.format(schema=A, role=role))
    await owner.execute(f"REVOKE UPDATE ON {A}.scheduled_jobs FROM {role}")
    pool = await asyncpg.create_pool(as_role(db, role), min_size=1, max_size=4)
    try:
        scheduler = Scheduler(pool, schema=A, **FAST)
        with pytest.raises(PermissionError, match=rf"UPDATE on \"?{A}\"?\.scheduled_jobs"):
            await scheduler.start()
        assert not scheduler.is_running
        assert await owner.fetchval(f"SELECT count(*) FROM {A}.scheduler_workers") == 0
    finally:
        await pool.close()


async def test_only_a_worker_with_batch_tasks_needs_scheduler_batches(owner, db, role):
    await owner.execute(WORKER_GRANTS.format(schema=A, role=role))
    await owner.execute(f"REVOKE ALL ON {A}.scheduler_batches FROM {role}")
    pool = await asyncpg.create_pool(as_role(db, role), min_size=1, max_size=10)
    try:
        # No batch task (its own registry: none of other modules'): it
        # starts, and get_job leaves the batch out.
        scheduler = Scheduler(pool, schema=A, tasks=TaskRegistry(), **FAST)

        @scheduler.task(name="schema.plain")
        async def add(a: int, b: int) -> int:  # a function no other test made a batch task
            return a + b

        registry = scheduler.registry
        batched_names = [n for n in registry.names() if batch_options_of(registry.resolve(n))]
        assert batched_names == []
        await scheduler.start()
        try:
            job = await scheduler.schedule(add, args=(2, 3), job_id="nobatch-1")
            await wait_until(lambda: _status(owner, A, job, "completed"))
            found = await scheduler.get_job(job)
            assert found is not None and (found.result, found.batch_id) == (5, None)
        finally:
            await scheduler.shutdown(grace_period=1.0)
        # A batch task: its batches are recorded, so the grant is checked at start.
        batched = Scheduler(pool, schema=A, tasks=TaskRegistry(), **FAST)

        @batched.task(name="schema.batched", batch_size=10)
        async def batched_task(batch: list[Any]) -> list[Any]:
            return [None for _ in batch]

        with pytest.raises(PermissionError, match="scheduler_batches"):
            await batched.start()
    finally:
        await pool.close()


async def test_migrate_by_a_role_that_cannot_create_exits_with_one_clear_line(owner, db, role):
    # An existing schema the role may use but not create in, and one that does not exist.
    await owner.execute(
        f"CREATE SCHEMA IF NOT EXISTS nocreate; GRANT USAGE ON SCHEMA nocreate TO {role}"
    )
    for schema, missing in (
        ("nocreate", "CREATE on schema nocreate"),
        ("absent", "CREATE on database"),
    ):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pg_scheduler.cli",
            "--dsn",
            as_role(db, role),
            "--schema",
            schema,
            "migrate",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await proc.communicate()
        lines = err.decode().strip().splitlines()
        assert proc.returncode == 2, err.decode()
        assert len(lines) == 1, lines
        assert missing in lines[0] and role in lines[0], lines
        assert "Traceback" not in err.decode()
    # The library raises the same as a MigrationError.
    conn = await asyncpg.connect(as_role(db, role))
    try:
        with pytest.raises(MigrationError, match="lacks CREATE on schema nocreate"):
            await migrate(conn, "nocreate")
    finally:
        await conn.close()


async def test_schema_names_are_checked(owner):
    with pytest.raises(ValueError, match="schema must be 1 to 40 bytes"):
        Scheduler(owner, schema="x" * 41)
    with pytest.raises(ValueError, match="schema"):
        Scheduler(owner, schema="")
    with pytest.raises(TypeError, match="schema must be a str"):
        Scheduler(owner, schema=None)


async def _status(pool: asyncpg.Pool, schema: str, job_id: str, status: str) -> bool:
    value = await pool.fetchval(
        f"SELECT status FROM {schema}.scheduled_jobs WHERE job_id = $1", job_id
    )
    return value == status


async def _worker_of(pool: asyncpg.Pool, schema: str, job_id: str) -> str:
    return await pool.fetchval(
        f"SELECT worker_id FROM {schema}.scheduled_jobs WHERE job_id = $1", job_id
    )


async def test_the_cli_reads_the_schema_it_is_given(owner, db):
    b = Scheduler(owner, schema=B)
    job_id = await b.schedule(
        app_tasks.noop, execution_time=datetime.now(UTC) + timedelta(hours=1), job_id="cli-b"
    )
    seen = {}
    for schema in (A, B):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pg_scheduler.cli",
            "--dsn",
            db,
            "--schema",
            schema,
            "jobs",
            "--json",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        seen[schema] = {j["job_id"] for j in json.loads(out)}
    assert job_id in seen[B]
    assert job_id not in seen[A]
