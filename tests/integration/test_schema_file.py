"""``pg_scheduler/store/schema.sql`` is what the migrations leave behind: a new
database, migrated, reads back from its catalog as exactly that text."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import asyncpg
import pytest

from pg_scheduler.store.dump_schema import (
    COMMAND,
    SCHEMA_FILE,
    diff,
    dump_schema,
    generate,
    object_lines,
    server_major,
)
from pg_scheduler.store.migrate import migrate
from tests.support.common import with_database

ROOT = Path(__file__).resolve().parents[2]


def _stale(committed: str, regenerated: str) -> str:
    return (
        f"{SCHEMA_FILE} and the migrations disagree; regenerate it with:\n"
        f"    {COMMAND}\n\n{diff(committed, regenerated)}"
    )


async def test_schema_file_is_what_the_migrations_leave(server_dsn: str) -> None:
    regenerated = await generate(server_dsn)
    committed = SCHEMA_FILE.read_text()
    major = server_major(regenerated)
    if major != server_major(committed):
        # Another major version prints definitions in its own words: the same
        # objects must be there; the full text is compared on the file's version.
        assert object_lines(regenerated) == object_lines(committed), _stale(committed, regenerated)
        pytest.skip(f"text compared on PostgreSQL {server_major(committed)} only (this is {major})")
    assert regenerated == committed, _stale(committed, regenerated)


async def test_the_file_shows_each_object_once_in_name_order() -> None:
    text = SCHEMA_FILE.read_text()
    objects = object_lines(text)
    assert len(objects) == len(set(objects))
    tables = [line.split()[2] for line in objects if line.startswith("-- [table]")]
    functions = [line.split()[2] for line in objects if line.startswith("-- [function]")]
    assert tables == sorted(tables) and "scheduled_jobs" in tables
    assert functions == sorted(functions) and "pg_scheduler_notify_jobs()" in functions
    # The wake-up function as 0012 last redefined it, not as 0001 first wrote it.
    assert "coalesce(n.status, 'pending') = 'pending'" in text
    # An index with its predicate, as 0013 left it.
    assert "scheduled_jobs_dedupe_pending_idx" in text and "(NOT started_before)" in text


@pytest.fixture
async def migrated_db(server_dsn: str):
    admin = await asyncpg.connect(server_dsn)
    name = f"pgs_schema_file_{uuid.uuid4().hex[:8]}"
    await admin.execute(f"CREATE DATABASE {name}")
    url = with_database(server_dsn, name)
    conn = await asyncpg.connect(url)
    try:
        await migrate(conn)
        yield conn
    finally:
        await conn.close()
        await admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        await admin.close()


async def test_a_schema_change_the_file_lacks_shows_as_a_diff(migrated_db) -> None:
    # What a new migration would do, without schema.sql being regenerated.
    await migrated_db.execute(
        "ALTER TABLE scheduled_jobs ADD COLUMN note text DEFAULT 'x' NOT NULL;"
        "CREATE INDEX scheduled_jobs_note_idx ON scheduled_jobs (note) WHERE note <> 'x';"
        "DROP TRIGGER scheduled_jobs_truncate_attempts ON scheduled_jobs"
    )
    regenerated = await dump_schema(migrated_db)
    committed = SCHEMA_FILE.read_text()
    assert regenerated != committed
    report = diff(committed, regenerated)
    assert "+    note text DEFAULT 'x'::text NOT NULL" in report
    assert (
        "+CREATE INDEX scheduled_jobs_note_idx" in report and "WHERE (note <> 'x'::text)" in report
    )
    assert "-CREATE TRIGGER scheduled_jobs_truncate_attempts" in report


def test_the_command_checks_and_writes_the_file(server_dsn: str, tmp_path) -> None:
    command = [sys.executable, "-m", "pg_scheduler.store.dump_schema", "--dsn", server_dsn]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, *args], capture_output=True, text=True, cwd=ROOT, timeout=120
        )

    target = tmp_path / "schema.sql"
    written = run("-o", str(target))
    assert written.returncode == 0, written.stderr
    assert run("--check", "-o", str(target)).returncode == 0

    target.write_text(target.read_text().replace("fillfactor=50", "fillfactor=70"))
    check = run("--check", "-o", str(target))
    assert check.returncode == 1
    assert "-    fillfactor=70" in check.stdout and "+    fillfactor=50" in check.stdout
    assert f"run {COMMAND}" in check.stderr
    assert "fillfactor=70" in target.read_text()  # --check writes nothing
