"""What tests share besides fixtures: test-speed timings, waiting with a deadline,
job status reads, and the environment and command line of a child process."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

SUPPORT_DIR = Path(__file__).resolve().parent
# The repository root: on a child's PYTHONPATH, ``tests.support.*`` imports there.
ROOT = SUPPORT_DIR.parent.parent

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


def with_database(dsn: str, database: str) -> str:
    """``dsn`` pointing at another database on the same server."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


def child_pythonpath() -> str:
    """PYTHONPATH for a child process: the repository root first (its
    ``tests.support`` task modules import by that name), then the caller's."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)


def child_env(dsn: str) -> dict[str, str]:
    """The environment of a test's child process: ``dsn`` as PG_SCHEDULER_DSN,
    and ``tests.support`` importable (its task modules: app_tasks, mp_tasks, ...)."""
    return {**os.environ, "PG_SCHEDULER_DSN": dsn, "PYTHONPATH": child_pythonpath()}


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


async def proxy_detached(conn: Any) -> bool:
    """True once the pool has detached ``conn`` (a pooled connection's proxy)
    because its connection closed: every call on it is refused then."""
    try:
        conn.is_closed()
    except asyncpg.InterfaceError:
        return True
    return False


async def job_status(pool: asyncpg.Pool, job_id: str) -> str | None:
    return await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id)


async def wait_for_status(
    pool: asyncpg.Pool, job_id: str, status: str, timeout: float = 10.0
) -> None:
    async def reached() -> bool:
        return await job_status(pool, job_id) == status

    await wait_until(reached, timeout=timeout, message=f"job {job_id} to be {status}")


async def migrate_up_to(conn: asyncpg.Connection, version: int, schema: str = "public") -> None:
    """Apply the migrations up to ``version`` only: a database as that version
    left it, for the upgrade tests of the later ones."""
    import pg_scheduler.store.migrate as migrate_module

    every = migrate_module.load_migrations
    kept = [m for m in every() if m.version <= version]
    migrate_module.load_migrations = lambda: kept  # type: ignore[assignment]
    try:
        await migrate_module.migrate(conn, schema)
    finally:
        migrate_module.load_migrations = every  # type: ignore[assignment]
