"""SyncClient enqueues from synchronous code, on its own
connection or inside the caller's psycopg 3 / psycopg2 transaction."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pg_scheduler import (
    ConflictResolution,
    JobPriority,
    JobSpec,
    PollingConfig,
    RetryPolicy,
    SyncClient,
)
from tests.support.common import job_status, wait_for_status

ran: dict[str, float] = {}


async def sync_client_note(key: str) -> str:
    ran[key] = time.monotonic()
    return key


def now() -> datetime:
    return datetime.now(UTC)


@pytest.fixture
def client(dsn: str) -> Iterator[SyncClient]:
    with SyncClient(dsn) as c:
        yield c


def connect(driver: str, dsn: str, autocommit: bool = False) -> Any:
    if driver == "psycopg":
        psycopg = pytest.importorskip("psycopg")
        return psycopg.connect(dsn, autocommit=autocommit)
    psycopg2 = pytest.importorskip("psycopg2")
    conn = psycopg2.connect(dsn)
    conn.autocommit = autocommit
    return conn


def in_thread(func: Any, *args: Any, **kwargs: Any) -> Any:
    """Sync code as an application runs it: in a thread with no event loop."""

    def call() -> Any:
        with pytest.raises(RuntimeError):
            asyncio.get_running_loop()
        return func(*args, **kwargs)

    return asyncio.to_thread(call)


async def test_own_connection_schedules_gets_and_cancels(pool, client):
    job_id = await in_thread(
        client.schedule,
        sync_client_note,
        execution_time=now() + timedelta(hours=1),
        args=("later",),
        priority=JobPriority.HIGH,
        max_retries=2,
        retry_policy=RetryPolicy(base_delay=5),
    )
    job = await in_thread(client.get_job, job_id)
    assert job is not None and job.status == "pending" and job.max_retries == 2
    row = await pool.fetchrow(
        "SELECT task_name, task_data::text AS data, priority FROM scheduled_jobs WHERE job_id = $1",
        job_id,
    )
    assert row["task_name"] == "tests.integration.test_sync_client:sync_client_note"
    assert '"later"' in row["data"]
    assert await in_thread(client.cancel_job, job_id) is True
    assert await job_status(pool, job_id) == "cancelled"
    assert await in_thread(client.cancel_job, job_id) is False
    assert await in_thread(client.get_job, "no-such-job") is None
    ids = await in_thread(
        client.schedule_bulk,
        [JobSpec(sync_client_note, now() + timedelta(hours=1), args=(str(n),)) for n in range(5)],
    )
    assert len(ids) == 5
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE job_id = ANY($1::text[])", ids
        )
        == 5
    )


async def test_bad_input_raises_at_the_call_and_writes_nothing(pool, client, dsn):
    with pytest.raises(TypeError, match="Expected an async function"):
        client.schedule(lambda: None, execution_time=now())
    with pytest.raises((TypeError, ValueError)):
        client.schedule(sync_client_note, execution_time=now(), args=("a\x00b",))
    with pytest.raises((TypeError, ValueError), match="max_retries"):
        client.schedule(sync_client_note, execution_time=now(), args=("x",), max_retries=-1)
    conn = connect("psycopg", dsn)
    try:
        with pytest.raises((TypeError, ValueError), match="priority"):
            client.schedule(
                sync_client_note, execution_time=now(), args=("x",), priority=7, connection=conn
            )
        with pytest.raises(TypeError, match="JobSpec"):
            client.schedule_bulk([object()], connection=conn)  # type: ignore[list-item]
        conn.commit()
    finally:
        conn.close()
    with pytest.raises(ValueError, match="pool_size"):
        SyncClient(dsn, pool_size=0)
    with pytest.raises(TypeError, match="dsn"):
        SyncClient(None)  # type: ignore[arg-type]
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
async def test_rolled_back_caller_transaction_writes_nothing(pool, client, dsn, driver):
    conn = connect(driver, dsn)
    try:
        job_id = client.schedule(
            sync_client_note, execution_time=now(), args=("rb",), connection=conn
        )
        ids = client.schedule_bulk(
            [JobSpec(sync_client_note, now(), args=(str(n),)) for n in range(3)], connection=conn
        )
        with conn.cursor() as cur:  # visible inside the caller's transaction
            cur.execute("SELECT count(*) FROM scheduled_jobs")
            assert cur.fetchone()[0] == 4
        conn.rollback()
    finally:
        conn.close()
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE job_id = ANY($1::text[])", [job_id, *ids]
        )
        == 0
    )


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
async def test_committed_caller_transaction_wakes_a_running_worker(
    pool, make_scheduler, client, dsn, driver
):
    # Polling alone would take 30 s: a start within seconds is the NOTIFY at commit.
    slow_poll = PollingConfig(idle_start_interval=30, max_interval=30, min_interval=30)
    scheduler = await make_scheduler(polling_config=slow_poll)
    scheduler.registry.register(sync_client_note)
    await asyncio.sleep(0)
    key = f"commit-{driver}"
    conn = connect(driver, dsn)

    def enqueue_and_commit() -> str:
        try:
            job_id = client.schedule(
                sync_client_note, execution_time=now(), args=(key,), connection=conn
            )
            conn.commit()
            return job_id
        finally:
            conn.close()

    job_id = await asyncio.to_thread(enqueue_and_commit)
    committed = time.monotonic()
    await wait_for_status(pool, job_id, "completed", timeout=10)
    assert ran[key] - committed < 5
    assert (await scheduler.get_job(job_id)).result == key


@pytest.mark.parametrize("driver", ["psycopg", "psycopg2"])
async def test_duplicate_id_raises_without_aborting_the_callers_transaction(
    pool, client, dsn, driver
):
    conn = connect(driver, dsn)
    try:
        first = client.schedule(
            sync_client_note, execution_time=now(), args=("a",), job_id="dup", connection=conn
        )
        assert first == "dup"
        with pytest.raises(ValueError, match="Job ID already exists"):
            client.schedule(
                sync_client_note, execution_time=now(), args=("b",), job_id="dup", connection=conn
            )
        with pytest.raises(ValueError, match="already exist"):
            client.schedule_bulk(
                [JobSpec(sync_client_note, now(), args=("c",), job_id="dup")],
                conflict_resolution=ConflictResolution.RAISE,
                connection=conn,
            )
        # IGNORE skips it (None in positional mode); REPLACE overwrites.
        assert client.schedule_bulk(
            [
                JobSpec(sync_client_note, now(), args=("d",), job_id="dup"),
                JobSpec(sync_client_note, now(), args=("e",), job_id="fresh"),
            ],
            connection=conn,
            positional=True,
        ) == [None, "fresh"]
        client.schedule(
            sync_client_note,
            execution_time=now() + timedelta(hours=1),
            args=("z",),
            job_id="dup",
            conflict_resolution=ConflictResolution.REPLACE,
            connection=conn,
        )
        conn.commit()  # the caller's transaction survived the errors
    finally:
        conn.close()
    data = await pool.fetchval("SELECT task_data::text FROM scheduled_jobs WHERE job_id = 'dup'")
    assert '"z"' in data
    assert await job_status(pool, "fresh") == "pending"


async def test_autocommit_connection_writes_at_once_and_bulk_is_all_or_nothing(pool, client, dsn):
    conn = connect("psycopg", dsn, autocommit=True)
    try:
        job_id = client.schedule(
            sync_client_note,
            execution_time=now() + timedelta(hours=1),
            args=("ac",),
            connection=conn,
        )
        assert await job_status(pool, job_id) == "pending"
        specs = [JobSpec(sync_client_note, now(), args=(str(n),)) for n in range(5)]
        specs.append(JobSpec(sync_client_note, now(), args=("taken",), job_id=job_id))
        with pytest.raises(ValueError, match="already exist"):
            client.schedule_bulk(
                specs, conflict_resolution=ConflictResolution.RAISE, batch_size=2, connection=conn
            )
        assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 1
    finally:
        conn.close()


async def test_usable_from_many_threads_and_after_close(dsn) -> None:
    await asyncio.to_thread(many_threads, dsn)


def many_threads(dsn: str) -> None:
    with SyncClient(dsn) as client:
        errors: list[BaseException] = []
        ids: list[str] = []

        def enqueue() -> None:
            try:
                for _ in range(5):
                    ids.append(
                        client.schedule(
                            sync_client_note,
                            execution_time=now() + timedelta(hours=1),
                            args=("t",),
                        )
                    )
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=enqueue) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors and len(set(ids)) == 20
        client.close()
        # Usable again after close (a new pool on first use).
        assert client.get_job(ids[0]) is not None
    assert not [t for t in threading.enumerate() if t.name == "pg_scheduler-sync-client"]


def _child_schedules(client: SyncClient, out: Any) -> None:
    # In a forked child: the parent's thread and pool are not inherited as usable.
    out.put(client.schedule(sync_client_note, execution_time=now(), args=("child",)))
    client.close()


async def test_a_client_used_before_fork_works_in_the_child(pool, client):
    import multiprocessing

    parent_id = client.schedule(
        sync_client_note, execution_time=now() + timedelta(hours=1), args=("p",)
    )
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_child_schedules, args=(client, out))
    proc.start()
    child_id = await asyncio.to_thread(out.get, True, 30)
    await asyncio.to_thread(proc.join, 30)
    assert proc.exitcode == 0
    assert await job_status(pool, child_id) == "pending"
    # The parent's client is untouched by the child's close().
    assert client.get_job(parent_id) is not None


async def test_dedupe_keys_on_own_connection_and_refused_on_a_callers(pool, client, dsn):
    first = await in_thread(
        client.schedule, sync_client_note, execution_time=now(), args=("a",), dedupe_key="k"
    )
    again = await in_thread(
        client.schedule,
        sync_client_note,
        execution_time=now(),
        args=("b",),
        dedupe_key="k",
        conflict_resolution=ConflictResolution.IGNORE,
    )
    assert again == first
    conn = connect("psycopg", dsn)
    try:
        with pytest.raises(ValueError, match="dedupe key"):
            client.schedule(
                sync_client_note,
                execution_time=now(),
                args=("c",),
                dedupe_key="other",
                connection=conn,
            )
        conn.commit()
    finally:
        conn.close()
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 1
