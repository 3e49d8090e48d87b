"""Real PostgreSQL for every test: the embedded server, or PG_SCHEDULER_TEST_DSN.

The fixtures here serve all three tiers; each test is marked with its tier
(``unit``, ``integration``, ``system``) from the folder it lives in. What tests
share besides fixtures (``wait_until``, ``child_env``, ...) is in
``tests/support/common.py``."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from pg_scheduler import Scheduler
from pg_scheduler.store.migrate import migrate
from tests.support.common import FAST, with_database
from tests.support.tcp_proxy import TcpProxy

TESTS_DIR = Path(__file__).resolve().parent
TIERS = ("unit", "integration", "system")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier: the folder under tests/ it lives in."""
    for item in items:
        parts = item.path.resolve().relative_to(TESTS_DIR).parts
        if len(parts) > 1 and parts[0] in TIERS:
            item.add_marker(getattr(pytest.mark, parts[0]))


TABLES = ["scheduled_jobs", "scheduler_workers", "vacuum_stats"]


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
    url = with_database(server_dsn, name)
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


@pytest.fixture
async def runs(
    pool: asyncpg.Pool, dsn: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[None]:
    """A fresh ``key_runs`` table for the per-key tasks (tests.support.key_tasks),
    which write through their own pool: closed before and after the test."""
    from tests.support import key_tasks

    monkeypatch.setenv("PG_SCHEDULER_DSN", dsn)
    await key_tasks.make_table(pool)
    await key_tasks.close()
    yield
    await key_tasks.close()


@pytest.fixture
async def proxy(dsn: str) -> AsyncIterator[TcpProxy]:
    """A TCP proxy to the test database (tests.support.tcp_proxy), to break the
    path without closing it (black_hole), or reset it (cut)."""
    p = await TcpProxy(TcpProxy.upstream_of(dsn)).start()
    yield p
    await p.close()
