"""Real PostgreSQL for every test: the embedded server, or PG_SCHEDULER_TEST_DSN."""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from pg_scheduler import Scheduler
from pg_scheduler.store.migrate import migrate

TESTS_DIR = Path(__file__).resolve().parent
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

TABLES = ["scheduled_jobs", "scheduler_workers", "vacuum_stats"]


def _with_database(dsn: str, database: str) -> str:
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


@pytest.fixture(scope="session")
def server_dsn() -> str:
    """A DSN for an administrative database on the server under test."""
    external = os.environ.get("PG_SCHEDULER_TEST_DSN")
    if external:
        return external
    from pg_scheduler.embedded import start

    data_dir = Path(tempfile.mkdtemp(prefix="pgs-test-")) / "pgdata"
    server = start(data_dir, cleanup="delete")
    return server.dsn


@pytest.fixture(scope="session")
async def dsn(server_dsn: str) -> AsyncIterator[str]:
    """A fresh database for this test session, migrated, dropped at the end."""
    name = f"pgs_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = _with_database(server_dsn, name)
    conn = await asyncpg.connect(url)
    try:
        await migrate(conn)
    finally:
        await conn.close()
    os.environ["PG_SCHEDULER_TEST_DB_URL"] = url
    yield url
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@pytest.fixture(scope="session")
async def pool(dsn: str) -> AsyncIterator[asyncpg.Pool]:
    p = await asyncpg.create_pool(dsn, min_size=2, max_size=20)
    yield p
    await p.close()


@pytest.fixture(autouse=True)
async def clean_tables(request: pytest.FixtureRequest) -> None:
    if "pool" not in request.fixturenames:
        return
    p: asyncpg.Pool = request.getfixturevalue("pool")
    existing = await p.fetch("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    names = [r["tablename"] for r in existing if r["tablename"] != "pg_scheduler_migrations"]
    if names:
        await p.execute("TRUNCATE " + ", ".join(f'"{n}"' for n in names))


FAST = dict(
    heartbeat_interval=0.2,
    heartbeat_threshold=2.0,
    lease_duration=3.0,
    rescue_interval=0.3,
    listener_health_interval=0.5,
    shutdown_grace_period=5.0,
    vacuum_enabled=False,
    # @periodic registrations are process-wide; tests that want them opt in.
    run_periodic_jobs=False,
)


@pytest.fixture
async def make_scheduler(
    pool: asyncpg.Pool,
) -> AsyncIterator[Callable[..., Awaitable[Scheduler]]]:
    """Start schedulers with test-speed timings; all are shut down afterwards."""
    started: list[Scheduler] = []

    async def factory(
        start: bool = True, db_pool: asyncpg.Pool | None = None, **options: Any
    ) -> Scheduler:
        settings = {**FAST, **options}
        scheduler = Scheduler(db_pool or pool, **settings)
        started.append(scheduler)
        if start:
            await scheduler.start()
        return scheduler

    yield factory
    for scheduler in reversed(started):
        await scheduler.shutdown(grace_period=1.0)


def child_env(dsn: str) -> dict[str, str]:
    """The environment of a test's child process: ``dsn`` as PG_SCHEDULER_DSN,
    and this directory importable (its task modules: app_tasks, mp_tasks, ...)."""
    return {
        **os.environ,
        "PG_SCHEDULER_DSN": dsn,
        "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
    }


async def start_cli_worker(dsn: str, app: str, *extra: str) -> asyncio.subprocess.Process:
    """``pg-scheduler --log-level warning worker APP [EXTRA...]`` on ``dsn``;
    stdout discarded, stderr piped (read it with ``communicate()``)."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pg_scheduler.cli",
        "--log-level",
        "warning",
        "worker",
        app,
        *extra,
        env=child_env(dsn),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def wait_until(
    predicate: Callable[[], Awaitable[bool] | bool],
    timeout: float = 10.0,
    interval: float = 0.02,
    message: str = "condition",
) -> None:
    """Poll ``predicate`` until true; fail the test after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message}")
        await asyncio.sleep(interval)


async def job_status(pool: asyncpg.Pool, job_id: str) -> str | None:
    return await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id)


async def wait_for_status(
    pool: asyncpg.Pool, job_id: str, status: str, timeout: float = 10.0
) -> None:
    async def reached() -> bool:
        return await job_status(pool, job_id) == status

    await wait_until(reached, timeout=timeout, message=f"job {job_id} to be {status}")
