"""What code and test fixtures written for pg-scheduler 0.2.3 rely on:
the schema coming back after its tables are dropped, the ``_UNSET`` import,
schedule_bulk's IGNORE return, JobSpec of a plain function, re-registered
periodic jobs, the key words of 0.2.x's error messages, and priority order."""

from __future__ import annotations

import asyncio
import importlib
import os
import uuid
import warnings
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import asyncpg
import pytest
from structlog.testing import capture_logs

from pg_scheduler import ConflictResolution, JobPriority, JobSpec, PeriodicJobConfig, Scheduler
from pg_scheduler.config import UNSET
from pg_scheduler.store.migrate import Migration, expected_objects, load_migrations, migrate
from pg_scheduler.store.schema import MIGRATION_LOCK_KEY, SchemaStore
from tests.support import app_tasks
from tests.support.common import FAST, wait_until, with_database

periodic_module = importlib.import_module("pg_scheduler.periodic")
periodic = periodic_module.periodic

REPAIR_EVENT = "schema objects missing although their migrations are recorded; re-applying"


def later(seconds: float = 3600) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def repair_warnings(logs: list[dict]) -> list[dict]:
    return [e for e in logs if e["event"] == REPAIR_EVENT]


@pytest.fixture
async def fresh_pool(server_dsn):
    """A migrated database of its own: these tests drop tables."""
    name = f"pgs_compat_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = await asyncpg.connect(server_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    pool = await asyncpg.create_pool(with_database(server_dsn, name), min_size=1, max_size=8)
    await migrate(pool)
    yield pool
    await pool.close()
    admin = await asyncpg.connect(server_dsn)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    await admin.close()


async def drop_like_023_fixtures(pool: asyncpg.Pool) -> None:
    # What pg-scheduler 0.2.3's test fixtures do before and after each test.
    await pool.execute("DROP TABLE IF EXISTS scheduled_jobs CASCADE")
    await pool.execute("DROP TABLE IF EXISTS vacuum_stats CASCADE")


async def missing_objects(pool: asyncpg.Pool) -> list[str]:
    async with pool.acquire() as conn:
        implied = list(expected_objects(load_migrations()))
        return [str(o) for o in await SchemaStore(conn).missing(implied)]


# -- 1. the schema comes back ---------------------------------------------------------


async def test_every_object_the_migrations_imply_exists_after_migrating(fresh_pool):
    implied = {str(o) for o in expected_objects(load_migrations())}
    # The parse of the migration files finds the objects that matter...
    assert {
        "relation scheduled_jobs",
        "relation vacuum_stats",
        "relation periodic_jobs",
        "relation scheduled_jobs_claim_idx",
        "function pg_scheduler_notify_jobs",
        "trigger scheduled_jobs_notify_insert on scheduled_jobs",
    } <= implied
    # ...and none that a migration drops again (0001 drops 0.2.x's indexes).
    assert "relation idx_jobs_pending_priority" not in implied
    # Otherwise every start would "repair" a schema that is fine.
    assert await missing_objects(fresh_pool) == []
    with capture_logs() as logs:
        assert await migrate(fresh_pool) == []
    assert repair_warnings(logs) == []


FIRST_SQL = """
-- CREATE TABLE only_in_a_comment (x int);
CREATE TABLE IF NOT EXISTS jobs (id int);
CREATE UNIQUE INDEX IF NOT EXISTS jobs_id_idx ON jobs (id);
CREATE OR REPLACE FUNCTION wake() RETURNS trigger
LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
DROP TRIGGER IF EXISTS jobs_wake ON jobs;
CREATE TRIGGER jobs_wake
    AFTER INSERT ON jobs FOR EACH STATEMENT EXECUTE FUNCTION wake();
CREATE INDEX old_idx ON jobs (id);
"""
SECOND_SQL = "DROP INDEX IF EXISTS old_idx;\nCREATE TABLE extra (id int);"


def test_objects_are_read_from_the_migration_sql():
    parse = importlib.import_module("pg_scheduler.store.migrate")._ddl_of
    first = Migration(1, "one", FIRST_SQL, parse(FIRST_SQL))
    second = Migration(2, "two", SECOND_SQL, parse(SECOND_SQL))
    objects = {str(o): v for o, v in expected_objects([second, first]).items()}
    assert objects == {
        "relation jobs": 1,
        "relation jobs_id_idx": 1,
        "function wake": 1,
        "trigger jobs_wake on jobs": 1,
        "relation extra": 2,  # and old_idx, dropped by 2, is expected no more
    }


async def test_dropped_tables_come_back_on_initialize_db_and_start(fresh_pool):
    await drop_like_023_fixtures(fresh_pool)
    assert "relation scheduled_jobs" in await missing_objects(fresh_pool)
    scheduler = Scheduler(fresh_pool, **FAST)
    with capture_logs() as logs:
        await scheduler.initialize_db()
        await scheduler.start()
    try:
        assert await missing_objects(fresh_pool) == []
        [warning] = repair_warnings(logs)  # once: start() finds nothing missing
        assert warning["log_level"] == "warning"
        assert "relation scheduled_jobs" in warning["missing"]
        assert "relation vacuum_stats" in warning["missing"]
        assert warning["versions"] == [m.version for m in load_migrations()]
        # Recorded once each, as before.
        versions = await fresh_pool.fetch("SELECT version FROM pg_scheduler_migrations")
        assert sorted(r["version"] for r in versions) == [m.version for m in load_migrations()]
        # A working queue again: the wake-up trigger and claim index are back too.
        job_id = await scheduler.schedule(
            app_tasks.add,
            execution_time=datetime.now(UTC) + timedelta(milliseconds=200),
            args=(2, 3),
        )

        async def completed() -> bool:
            job = await scheduler.get_job(job_id)
            return job is not None and job.status == "completed" and job.result == 5

        await wait_until(completed, message="the job on the recreated table")
    finally:
        await scheduler.shutdown(grace_period=1.0)


async def test_repair_keeps_the_rows_that_are_still_there(fresh_pool):
    scheduler = Scheduler(fresh_pool, **FAST)
    job_id = await scheduler.schedule(app_tasks.noop, execution_time=later(), job_id="keep-me")
    await fresh_pool.execute("DROP TABLE vacuum_stats")
    await fresh_pool.execute("DROP INDEX scheduled_jobs_claim_idx")
    with capture_logs() as logs:
        applied = await migrate(fresh_pool)
    assert applied == [m.version for m in load_migrations()]
    [warning] = repair_warnings(logs)
    assert set(warning["missing"]) == {"relation vacuum_stats", "relation scheduled_jobs_claim_idx"}
    assert await missing_objects(fresh_pool) == []
    row = await fresh_pool.fetchrow(
        "SELECT status, task_name FROM scheduled_jobs WHERE job_id = $1", job_id
    )
    assert (row["status"], row["task_name"]) == ("pending", "tests.support.app_tasks:noop")


async def test_only_versions_from_the_first_damaged_one_are_reapplied(fresh_pool):
    versions = [m.version for m in load_migrations()]
    damaged = expected_objects(load_migrations())
    # A relation created by the newest migration that creates one, after the
    # first: earlier versions are left alone, it and every later one re-applied.
    created = [(v, o) for o, v in damaged.items() if o.kind == "relation" and v > versions[0]]
    assert created, "the migrations create relations after the first version"
    version, relation = max(created)
    kind = await fresh_pool.fetchval(
        "SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)", relation.name
    )
    await fresh_pool.execute(f"DROP {'INDEX' if kind == 'i' else 'TABLE'} {relation.name}")
    expected = [v for v in versions if v >= version]
    with capture_logs() as logs:
        assert await migrate(fresh_pool) == expected
    assert repair_warnings(logs)[0]["versions"] == expected
    assert await missing_objects(fresh_pool) == []


async def test_a_current_schema_is_checked_without_the_migration_lock(fresh_pool):
    async with fresh_pool.acquire() as holder:
        await holder.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        try:
            # It would wait for the lock forever if it asked for it.
            assert await asyncio.wait_for(migrate(fresh_pool), timeout=30) == []
        finally:
            await holder.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)


async def test_repair_waits_for_the_migration_lock(fresh_pool):
    async with fresh_pool.acquire() as holder:
        await holder.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK_KEY)
        await drop_like_023_fixtures(fresh_pool)
        repair = asyncio.create_task(migrate(fresh_pool))
        try:

            async def waiting_for_lock() -> bool:
                return bool(
                    await holder.fetchval(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                    )
                )

            await wait_until(waiting_for_lock, timeout=30, message="repair to wait for the lock")
            assert not repair.done()
            assert "relation scheduled_jobs" in await missing_objects(fresh_pool)
        finally:
            await holder.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK_KEY)
        assert await asyncio.wait_for(repair, timeout=30)
    assert await missing_objects(fresh_pool) == []


async def test_concurrent_starts_repair_once(fresh_pool):
    await drop_like_023_fixtures(fresh_pool)
    with capture_logs() as logs:
        results = await asyncio.gather(*(migrate(fresh_pool) for _ in range(5)))
    assert sorted(bool(r) for r in results) == [False] * 4 + [True]
    assert len(repair_warnings(logs)) == 1
    assert await missing_objects(fresh_pool) == []


# -- 2. the _UNSET sentinel -------------------------------------------------------------


async def test_unset_import_is_the_sentinel_jobspec_uses(pool, make_scheduler):
    from pg_scheduler.job_spec import _UNSET

    assert _UNSET is UNSET
    assert JobSpec(app_tasks.noop, later()).misfire_grace_time is _UNSET
    scheduler = await make_scheduler(start=False, misfire_grace_time=77)
    ids = await scheduler.schedule_bulk(
        [
            JobSpec(app_tasks.noop, later(), job_id="default-grace"),
            JobSpec(app_tasks.noop, later(), job_id="unset-grace", misfire_grace_time=_UNSET),
            JobSpec(app_tasks.noop, later(), job_id="no-grace", misfire_grace_time=None),
        ]
    )
    assert ids == ["default-grace", "unset-grace", "no-grace"]
    rows = await pool.fetch("SELECT job_id, misfire_grace_time FROM scheduled_jobs")
    assert {r["job_id"]: r["misfire_grace_time"] for r in rows} == {
        "default-grace": 77,
        "unset-grace": 77,
        "no-grace": None,
    }


# -- 3. schedule_bulk with IGNORE ----------------------------------------------------------


async def test_bulk_ignore_returns_only_the_ids_it_inserted(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)

    def specs(*ids: str) -> list[JobSpec]:
        return [JobSpec(app_tasks.noop, later(), job_id=i) for i in ids]

    ignore = ConflictResolution.IGNORE
    assert await scheduler.schedule_bulk(specs("a", "b", "c"), conflict_resolution=ignore) == [
        "a",
        "b",
        "c",
    ]
    assert await scheduler.schedule_bulk(specs("a", "b", "c"), conflict_resolution=ignore) == []
    # The default is IGNORE; new ids come back in input order, existing ones are left out.
    assert await scheduler.schedule_bulk(specs("d", "a", "e", "d")) == ["d", "e"]
    assert await scheduler.schedule_bulk(specs("f", "b", "g"), positional=True) == [
        "f",
        None,
        "g",
    ]
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 7
    # The other policies return every id, as before.
    replaced = await scheduler.schedule_bulk(
        specs("a", "h"), conflict_resolution=ConflictResolution.REPLACE
    )
    assert replaced == ["a", "h"]


async def test_bulk_positional_must_be_a_bool(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    with pytest.raises(TypeError, match="positional"):
        await scheduler.schedule_bulk([JobSpec(app_tasks.noop, later())], positional="yes")
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


# -- 4. JobSpec of a plain function ------------------------------------------------------


def plain_function() -> None:
    return None


async def test_jobspec_of_a_plain_function_fails_in_schedule_bulk(pool, make_scheduler):
    spec = JobSpec(func=plain_function, execution_time=later())
    assert spec.func is plain_function
    scheduler = await make_scheduler(start=False)
    good = [JobSpec(app_tasks.noop, later()) for _ in range(3)]
    with pytest.raises(TypeError, match="Expected an async function"):
        await scheduler.schedule_bulk([*good, spec])
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0
    with pytest.raises(TypeError, match="func must be a callable"):
        JobSpec(func="app_tasks.noop", execution_time=later())


# -- 5. periodic jobs registered again -----------------------------------------------------


@pytest.fixture
def isolated_periodic_registry():
    saved = dict(periodic_module._registry)
    yield
    periodic_module._registry.clear()
    periodic_module._registry.update(saved)


ran: dict[str, asyncio.Event] = {}


def first_definition():
    # Two definitions of `ticker` in one module, as a module reloaded or a test
    # suite defining the same job in several tests gives.
    async def ticker() -> None:
        ran.setdefault("first", asyncio.Event()).set()

    return ticker


def second_definition():
    async def ticker() -> None:
        ran.setdefault("second", asyncio.Event()).set()

    return ticker


async def test_redefined_periodic_function_replaces_the_earlier_one(
    pool, make_scheduler, isolated_periodic_registry
):
    ran.clear()
    first, second = first_definition(), second_definition()
    every = timedelta(milliseconds=200)
    periodic(every=every)(first)
    key = next(k for k, c in periodic_module._registry.items() if c.func is first)
    with capture_logs() as logs, warnings.catch_warnings():
        warnings.simplefilter("error")  # a redefinition is no mistake: no RuntimeWarning
        assert periodic(every=every)(second) is second
    assert periodic_module.registered_periodic_job(key).func is second
    [warning] = [e for e in logs if e.get("dedup_key") == key and e["log_level"] == "warning"]
    assert warning["log_level"] == "warning" and "replaces" in warning["event"]
    assert (
        warning["replaced"] == "tests.integration.test_compat_023.first_definition.<locals>.ticker"
    )
    assert warning["by"] == "tests.integration.test_compat_023.second_definition.<locals>.ticker"
    # The windows run the new definition.
    await make_scheduler(run_periodic_jobs=True)
    await asyncio.wait_for(ran.setdefault("second", asyncio.Event()).wait(), timeout=30)
    assert "first" not in ran


async def test_another_function_taking_an_explicit_dedup_key_warns_loudly(
    isolated_periodic_registry,
):
    async def nightly_export() -> None:
        return None

    async def nightly_cleanup() -> None:
        return None

    periodic(cron="0 2 * * *", dedup_key="nightly")(nightly_export)
    with capture_logs() as logs, pytest.warns(RuntimeWarning) as caught:
        periodic(every=timedelta(hours=1), dedup_key="nightly")(nightly_cleanup)
    message = str(caught[0].message)
    assert "nightly_export" in message and "nightly_cleanup" in message
    assert caught[0].filename == __file__  # points at the decoration
    [event] = [e for e in logs if e.get("dedup_key") == "nightly" and e["log_level"] == "warning"]
    assert event["log_level"] == "warning"
    assert event["replaced_schedule"].startswith("cron 0 2 * * *")
    assert event["schedule"] != event["replaced_schedule"]
    assert periodic_module.registered_periodic_job("nightly").func is nightly_cleanup


# -- 6. the key words of 0.2.x's messages ----------------------------------------------------


async def _job() -> None:
    return None


def _sync_job() -> None:
    return None


@pytest.mark.parametrize(
    ("kwargs", "func", "error", "words"),
    [
        ({"every": timedelta(minutes=5), "cron": "* * * * *"}, _job, ValueError, "both"),
        ({}, _job, ValueError, "Either"),
        ({"every": timedelta(minutes=1)}, _sync_job, TypeError, "async functions"),
        (
            {"cron": "0 0 * * *", "timezone": "Invalid/Timezone"},
            _job,
            ValueError,
            "Invalid timezone",
        ),
    ],
)
def test_error_messages_keep_the_words_of_02x(
    kwargs, func, error, words, isolated_periodic_registry
):
    before = dict(periodic_module._registry)
    with pytest.raises(error, match=words):
        periodic(**kwargs)(func)
    assert periodic_module._registry == before
    # The same words from the configuration object itself.
    config = {"interval": kwargs.get("every"), "cron": kwargs.get("cron")}
    with pytest.raises(error, match=words):
        PeriodicJobConfig(func, timezone=kwargs.get("timezone"), **config)


def test_a_zoneinfo_and_its_name_mean_the_same_zone(isolated_periodic_registry):
    by_name = PeriodicJobConfig(_job, cron="0 0 * * *", timezone="Asia/Tokyo")
    by_zone = PeriodicJobConfig(_job, cron="0 0 * * *", timezone=ZoneInfo("Asia/Tokyo"))
    assert by_name.timezone == by_zone.timezone == ZoneInfo("Asia/Tokyo")
    assert by_name.dedup_key == by_zone.dedup_key


# -- 7. priority order of jobs due together ----------------------------------------------------

started: list[str] = []


async def note_start(label: str) -> None:
    started.append(label)


@pytest.mark.parametrize("max_concurrent_jobs", [1, 16])
async def test_jobs_due_together_start_in_priority_order(pool, make_scheduler, max_concurrent_jobs):
    started.clear()
    scheduler = await make_scheduler(start=False, max_concurrent_jobs=max_concurrent_jobs)
    due = datetime.now(UTC) - timedelta(seconds=1)
    # Inserted lowest priority first, and one row per statement, so that
    # neither insertion order nor physical order matches priority order.
    order = [JobPriority.LOW, JobPriority.NORMAL, JobPriority.HIGH, JobPriority.CRITICAL] * 3
    for n, priority in enumerate(order):
        await scheduler.schedule(
            note_start, execution_time=due, args=(f"{priority.name}-{n}",), priority=priority
        )
    await scheduler.start()
    await wait_until(lambda: len(started) == len(order), timeout=30, message="all jobs started")
    levels = [label.split("-")[0] for label in started]
    assert levels == ["CRITICAL"] * 3 + ["HIGH"] * 3 + ["NORMAL"] * 3 + ["LOW"] * 3


async def test_start_calls_a_subclass_s_initialize_db_and_check_privileges(pool):
    """0.2.x's start() migrates through ``self.initialize_db()``: a subclass that
    overrides it (or the grant check) is called by start(), in that order."""
    calls: list[str] = []

    class Audited(Scheduler):
        async def initialize_db(self) -> None:
            calls.append("initialize_db")
            await super().initialize_db()

        async def check_privileges(self) -> None:
            calls.append("check_privileges")
            await super().check_privileges()

    scheduler = Audited(pool, **FAST)
    await scheduler.start()
    try:
        assert calls == ["initialize_db", "check_privileges"]
        assert scheduler.is_running
    finally:
        await scheduler.shutdown(grace_period=1.0)
