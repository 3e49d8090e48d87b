"""Migrations: exactly once under concurrency, adopting a 0.2.x table, refusing newer schemas."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

import pg_scheduler
from pg_scheduler import MigrationError, Scheduler
from pg_scheduler.store.migrate import current_version, load_migrations, migrate
from tests.support import app_tasks
from tests.support.common import migrate_up_to, wait_until, with_database

# The table as pg-scheduler 0.2.x creates it (its documented columns and indexes).
LEGACY_SCHEMA = """
CREATE TABLE scheduled_jobs (
    job_id TEXT PRIMARY KEY DEFAULT gen_random_uuid()::text,
    job_name TEXT NOT NULL,
    execution_time TIMESTAMPTZ NOT NULL,
    status TEXT DEFAULT 'pending',
    task_data JSONB,
    created_at TIMESTAMPTZ DEFAULT CURRENT_TIMESTAMP,
    last_heartbeat TIMESTAMPTZ,
    lease_until TIMESTAMPTZ,
    priority INTEGER DEFAULT 5,
    retry_count INTEGER DEFAULT 0,
    max_retries INTEGER DEFAULT 0,
    worker_id TEXT,
    error_message TEXT,
    misfire_grace_time INTEGER
);
CREATE INDEX idx_jobs_pending_priority ON scheduled_jobs(status, priority ASC, execution_time ASC)
    WHERE status = 'pending';
CREATE INDEX idx_jobs_worker_cleanup ON scheduled_jobs(worker_id, status)
    WHERE worker_id IS NOT NULL;
"""


@pytest.fixture
async def fresh_db(server_dsn):
    name = f"pgs_mig_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = await asyncpg.connect(server_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    yield with_database(server_dsn, name)
    admin = await asyncpg.connect(server_dsn)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


async def test_ten_processes_migrate_exactly_once(fresh_db):
    script = (
        "import asyncio, asyncpg, sys\n"
        "from pg_scheduler.store.migrate import migrate\n"
        "async def main():\n"
        "    conn = await asyncpg.connect(sys.argv[1])\n"
        "    print(len(await migrate(conn)))\n"
        "    await conn.close()\n"
        "asyncio.run(main())\n"
    )
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            script,
            fresh_db,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(10)
    ]
    outputs = [await p.communicate() for p in procs]
    assert all(p.returncode == 0 for p in procs), [e.decode()[-500:] for _, e in outputs]
    applied = sorted(int(out.decode().strip().splitlines()[-1]) for out, _ in outputs)
    known = len(load_migrations())
    assert applied == [0] * 9 + [known]
    conn = await asyncpg.connect(fresh_db)
    rows = await conn.fetch("SELECT version FROM pg_scheduler_migrations ORDER BY version")
    await conn.close()
    assert [r["version"] for r in rows] == [m.version for m in load_migrations()]


async def test_newer_schema_is_refused_and_left_untouched(fresh_db):
    conn = await asyncpg.connect(fresh_db)
    try:
        await migrate(conn)
        await conn.execute(
            "INSERT INTO pg_scheduler_migrations (version, name) VALUES (9999, 'from_the_future')"
        )
        before = await conn.fetchval("SELECT count(*) FROM pg_scheduler_migrations")
        with pytest.raises(MigrationError, match="newer than this pg_scheduler knows"):
            await migrate(conn)
        assert await conn.fetchval("SELECT count(*) FROM pg_scheduler_migrations") == before
        assert await current_version(conn) == 9999
    finally:
        await conn.close()


async def test_legacy_table_is_adopted_in_place(fresh_db):
    conn = await asyncpg.connect(fresh_db)
    past = datetime.now(UTC) - timedelta(seconds=5)
    try:
        await conn.execute(LEGACY_SCHEMA)
        await conn.execute(
            "INSERT INTO scheduled_jobs (job_id, job_name, execution_time, task_data, priority)"
            " VALUES ('legacy-1', 'add', $1, $2::jsonb, 5),"
            "        ('legacy-2', 'add', $1, $3::jsonb, 4)",
            past,
            json.dumps({"args": [40, 2], "kwargs": {}}),
            json.dumps({"args": [1, 2], "kwargs": {}}),
        )
        await conn.execute(
            "INSERT INTO scheduled_jobs (job_id, job_name, execution_time, status) "
            "VALUES ('legacy-done', 'add', $1, 'completed')",
            past,
        )
        await migrate(conn)
        rows = {r["job_id"]: r for r in await conn.fetch("SELECT * FROM scheduled_jobs")}
        assert rows["legacy-1"]["task_name"] == "add"
        assert rows["legacy-2"]["priority"] == 5  # folded onto a documented level
        assert rows["legacy-done"]["finished_at"] is not None
        indexes = {
            r["indexname"]
            for r in await conn.fetch(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'scheduled_jobs'"
            )
        }
        assert "idx_jobs_worker_cleanup" not in indexes
        assert "scheduled_jobs_claim_idx" in indexes
    finally:
        await conn.close()

    # A worker that registered `add` runs the rows 0.2.x wrote by bare name.
    pool = await asyncpg.create_pool(fresh_db, min_size=1, max_size=5)
    scheduler = Scheduler(
        pool, heartbeat_interval=0.2, vacuum_enabled=False, run_periodic_jobs=False
    )
    scheduler.register_task(app_tasks.add)
    await scheduler.start()
    try:

        async def done():
            statuses = await pool.fetch(
                "SELECT status FROM scheduled_jobs WHERE job_id IN ('legacy-1', 'legacy-2')"
            )
            return {r["status"] for r in statuses} == {"completed"}

        await wait_until(done)
        assert (await scheduler.get_job("legacy-1")).result == 42
    finally:
        await scheduler.shutdown()
        await pool.close()


async def test_a_missing_lower_numbered_migration_is_still_applied(fresh_db):
    conn = await asyncpg.connect(fresh_db)
    try:
        await migrate(conn)
        versions = [m.version for m in load_migrations()]
        if len(versions) < 2:
            pytest.skip("needs two migrations")
        # Pretend the second file landed after the third was applied.
        skipped = load_migrations()[1]
        await conn.execute(
            "DELETE FROM pg_scheduler_migrations WHERE version = $1", skipped.version
        )
        assert await migrate(conn) == [skipped.version]
        assert await migrate(conn) == []
    finally:
        await conn.close()


async def test_the_files_in_the_package_are_applied_and_recorded_by_their_names(fresh_db):
    files = sorted((Path(pg_scheduler.__file__).parent / "store" / "migrations").glob("*.sql"))
    assert [f.name for f in files][:1] == ["0001_initial.sql"]
    expected = [(int(f.name[:4]), f.stem[5:]) for f in files]
    assert [(m.version, m.name) for m in load_migrations()] == expected
    conn = await asyncpg.connect(fresh_db)
    try:
        assert await migrate(conn) == [version for version, _ in expected]
        assert await migrate(conn) == []  # applied once
        rows = await conn.fetch("SELECT version, name FROM pg_scheduler_migrations ORDER BY 1")
    finally:
        await conn.close()
    assert [(r["version"], r["name"]) for r in rows] == expected


async def test_workflows_parked_on_children_keep_their_count_across_0016(fresh_db):
    """A parent parked on children before 0016 (each child's end then marked
    its spawn step) gets its count from those steps, and wakes at the last end."""
    conn = await asyncpg.connect(fresh_db)
    try:
        await migrate(conn)
        # The database as 0014 left it: no counts; ended children's steps completed.
        await conn.execute("DROP TABLE workflow_waits")
        await conn.execute(
            "CREATE INDEX workflow_steps_waiting_idx ON workflow_steps (job_id, seq)"
            " WHERE status = 'waiting'"
        )
        await conn.execute("DELETE FROM pg_scheduler_migrations WHERE version = 16")
        await conn.execute(
            "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,"
            " has_children, wait_kind, wait_seq, wait_children)"
            " VALUES ('P', 'p', 'p', now(), 'waiting', true, 'children', 4, int4range(1, 4))"
        )
        for seq, status in ((1, "completed"), (2, "waiting"), (3, "waiting")):
            await conn.execute(
                "INSERT INTO workflow_steps (job_id, seq, kind, name, key, status, result)"
                " VALUES ('P', $1::int, 'spawn', 'c', $1::int::text, $2,"
                " jsonb_build_object('job_id', $3::text))",
                seq,
                status,
                f"c{seq}",
            )
            await conn.execute(
                "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,"
                " parent_job_id, parent_seq) VALUES ($1, 'c', 'c', now(), $2, 'P', $3)",
                f"c{seq}",
                "completed" if status == "completed" else "running",
                seq,
            )
        assert await migrate(conn) == [16]
        assert await conn.fetchval("SELECT wait_left FROM workflow_waits WHERE job_id = 'P'") == 2
        await conn.execute("UPDATE scheduled_jobs SET status = 'completed' WHERE job_id = 'c2'")
        assert await conn.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = 'P'") == (
            "waiting"
        )
        await conn.execute("UPDATE scheduled_jobs SET status = 'failed' WHERE job_id = 'c3'")
        assert await conn.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = 'P'") == (
            "pending"
        )
    finally:
        await conn.close()


async def test_jobs_written_before_0017_stay_plain_jobs(fresh_db):
    """Rows written before 0017 (no key columns) are plain jobs after it (no
    key, in the plain claim's index), and a keyed job written after it gets
    its enqueue number."""
    conn = await asyncpg.connect(fresh_db)
    try:
        await migrate_up_to(conn, 16)  # the database as 0016 left it
        await conn.execute(
            "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status)"
            " VALUES ('old', 'x', 'x', now(), 'pending')"
        )
        assert await migrate(conn) == [m.version for m in load_migrations() if m.version > 16]
        row = await conn.fetchrow(
            "SELECT concurrency_key, key_ordered, key_seq FROM scheduled_jobs WHERE job_id = 'old'"
        )
        assert tuple(row) == (None, False, None)
        predicate = await conn.fetchval(
            "SELECT pg_get_expr(indpred, indrelid) FROM pg_index"
            " WHERE indexrelid = 'scheduled_jobs_claim_idx'::regclass"
        )
        assert "concurrency_key IS NULL" in predicate
        plain = await conn.fetchval(
            "SELECT count(*) FROM scheduled_jobs"
            " WHERE status = 'pending' AND concurrency_key IS NULL"
        )
        assert plain == 1
        await conn.execute(
            "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,"
            " concurrency_key, key_ordered) VALUES ('new', 'x', 'x', now(), 'pending', 'k', true)"
        )
        assert await conn.fetchval("SELECT key_seq FROM scheduled_jobs WHERE job_id = 'new'")
        # Only an ordered key's jobs take a number: a plain or unordered job does not.
        await conn.execute(
            "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,"
            " concurrency_key) VALUES ('unordered', 'x', 'x', now(), 'pending', 'k'),"
            " ('plain', 'x', 'x', now(), 'pending', NULL)"
        )
        assert (
            await conn.fetchval("SELECT count(*) FROM scheduled_jobs WHERE key_seq IS NOT NULL")
            == 1
        )
    finally:
        await conn.close()


async def test_0019_adds_the_debounce_index_and_the_throttle_table_and_rewrites_nothing(fresh_db):
    """A database as 0016 left it, with keyed jobs: 0019 adds its index and
    table, leaves every row as it was, and a debounced burst then meets its row."""
    conn = await asyncpg.connect(fresh_db)
    try:
        await migrate(conn)
        await conn.execute("DROP INDEX scheduled_jobs_dedupe_debounce_idx")
        await conn.execute("DROP TABLE scheduler_throttles")
        await conn.execute("DELETE FROM pg_scheduler_migrations WHERE version = 19")
        await conn.execute(
            "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time,"
            " dedupe_key, dedupe_scope)"
            " VALUES ('a', 'f', 'f', now(), 'k', 'pending'), ('b', 'f', 'f', now(), 'k', 'active')"
        )
        before = await conn.fetch("SELECT * FROM scheduled_jobs ORDER BY job_id")
        assert await migrate(conn) == [19]
        assert [
            dict(r) for r in await conn.fetch("SELECT * FROM scheduled_jobs ORDER BY job_id")
        ] == [dict(r) for r in before]
        assert await conn.fetchval("SELECT count(*) FROM scheduler_throttles") == 0
        pool = await asyncpg.create_pool(fresh_db, min_size=1, max_size=2)
        try:
            scheduler = Scheduler(pool)
            ids = {
                await scheduler.schedule(app_tasks.add, args=(n, n), dedupe_key="k", debounce=60)
                for n in range(3)
            }
            assert len(ids) == 1 and ids.isdisjoint({"a", "b"})
        finally:
            await pool.close()
    finally:
        await conn.close()


async def test_pending_jobs_stay_in_the_plain_claim_across_0018(fresh_db):
    """Rows written before 0018 have no fair share key: the claim index 0018
    rebuilds holds them, the keyed index holds none, and they are claimed."""
    conn = await asyncpg.connect(fresh_db)
    try:
        await migrate(conn)
        # The database as 0016 left it.
        await conn.execute(
            "DROP TABLE scheduler_fair_share_starts, scheduler_fair_share_weights;"
            " DROP INDEX scheduled_jobs_fair_idx; DROP INDEX scheduled_jobs_claim_idx;"
            " ALTER TABLE scheduled_jobs DROP COLUMN fair_share_key,"
            " DROP COLUMN fair_share_weight;"
            " CREATE INDEX scheduled_jobs_claim_idx ON scheduled_jobs"
            " (queue, task_name, priority, execution_time) WHERE status = 'pending';"
            " DELETE FROM pg_scheduler_migrations WHERE version = 18"
        )
        await conn.execute(
            "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status)"
            " SELECT 'j' || n, 'f', 'f', now(), 'pending' FROM generate_series(1, 5) n"
        )
        assert await migrate(conn) == [18]
        predicate = await conn.fetchval(
            "SELECT pg_get_expr(indpred, indrelid) FROM pg_index"
            " WHERE indexrelid = 'scheduled_jobs_claim_idx'::regclass"
        )
        assert "fair_share_key IS NULL" in predicate
        assert (
            await conn.fetchval("SELECT count(*) FROM scheduled_jobs WHERE fair_share_key IS NULL")
            == 5
        )
        with pytest.raises(asyncpg.CheckViolationError):
            await conn.execute("UPDATE scheduled_jobs SET fair_share_weight = 0")
    finally:
        await conn.close()


async def test_0020_adds_the_batch_table_and_leaves_scheduled_jobs_alone(fresh_db):
    """A database as 0019 left it, with jobs: 0020 creates scheduler_batches
    (a GIN index on job_ids) and changes nothing of scheduled_jobs: same file,
    same columns, same rows."""
    conn = await asyncpg.connect(fresh_db)
    try:
        await migrate(conn)
        await conn.execute(
            "DROP TABLE scheduler_batches; DELETE FROM pg_scheduler_migrations WHERE version = 20"
        )
        await conn.execute(
            "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status)"
            " SELECT 'j' || n, 'f', 'f', now(), 'completed' FROM generate_series(1, 5) n"
        )
        before = await conn.fetch("SELECT * FROM scheduled_jobs ORDER BY job_id")
        file_of = "SELECT pg_relation_filenode('scheduled_jobs')"
        filenode = await conn.fetchval(file_of)
        assert await migrate(conn) == [20]
        assert await conn.fetchval(file_of) == filenode
        after = await conn.fetch("SELECT * FROM scheduled_jobs ORDER BY job_id")
        assert [dict(r) for r in before] == [dict(r) for r in after]
        columns = await conn.fetch(
            "SELECT attname, format_type(atttypid, atttypmod) AS type, attnotnull"
            " FROM pg_attribute WHERE attrelid = 'scheduler_batches'::regclass AND attnum > 0"
            " AND NOT attisdropped ORDER BY attnum"
        )
        assert [tuple(c) for c in columns] == [
            ("batch_id", "uuid", True),
            ("task_name", "text", True),
            ("queue", "text", True),
            ("worker_id", "text", False),
            ("started_at", "timestamp with time zone", True),
            ("batch_size", "integer", True),
            ("job_ids", "text[]", True),
        ]
        indexes = await conn.fetch(
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'scheduler_batches' ORDER BY 1"
        )
        defs = [r["indexdef"] for r in indexes]
        assert any("USING gin (job_ids)" in d and "fastupdate" in d for d in defs), defs
        # Idempotent, as every migration: applied again, nothing changes.
        await conn.execute("DELETE FROM pg_scheduler_migrations WHERE version = 20")
        assert await migrate(conn) == [20]
    finally:
        await conn.close()
