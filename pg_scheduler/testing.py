"""Helpers for testing your own tasks (needs ``pip install 'pg-scheduler[embedded]'``).

``scheduler_for_tests()``: a started Scheduler on a throwaway embedded
PostgreSQL database (a fresh database per call, dropped afterwards; the
server is shared by the process and stopped at exit)::

    async with scheduler_for_tests() as scheduler:
        assert await scheduler.run(add, 1, 2) == 3

``run_job()`` / ``run_eagerly()``: eager mode. The job runs inline in the
caller's task through the worker's own code path (its outcome written under
the lease guard, retries taken at once, without waiting for their delay), and
its final Job is returned: no worker loop, no sleeps.
"""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import asyncpg

from .api.results import JobNotFound
from .enums import JobStatus
from .models import Job
from .scheduler import Scheduler
from .store.events import EventStore

# Timings that make rescues, heartbeats and shutdown quick in a test.
TEST_SETTINGS: dict[str, Any] = dict(
    heartbeat_interval=0.2,
    heartbeat_threshold=2.0,
    lease_duration=3.0,
    rescue_interval=0.3,
    listener_health_interval=0.5,
    shutdown_grace_period=2.0,
    vacuum_enabled=False,
    run_periodic_jobs=False,
)

_server: Any = None


def _embedded_dsn() -> str:
    global _server
    if _server is None:
        from .embedded import start

        _server = start(tempfile.mkdtemp(prefix="pg-scheduler-test-") + "/pgdata", cleanup="delete")
    return _server.dsn


@asynccontextmanager
async def scheduler_for_tests(
    dsn: str | None = None, *, start: bool = True, **options: Any
) -> AsyncIterator[Scheduler]:
    """A Scheduler on a new, migrated database (on ``dsn``'s server, else the
    embedded one); the database is dropped on exit. ``options`` go to Scheduler."""
    server = dsn or _embedded_dsn()
    name = f"pgs_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    pool = await asyncpg.create_pool(server, database=name, min_size=1, max_size=10)
    scheduler = Scheduler(pool, **{**TEST_SETTINGS, **options})
    try:
        if start:
            await scheduler.start()
        else:
            await scheduler.initialize_db()
        yield scheduler
    finally:
        await scheduler.shutdown(grace_period=1.0)
        await pool.close()
        admin = await asyncpg.connect(server)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


async def run_job(scheduler: Scheduler, job_id: str) -> Job:
    """Run a pending job now, inline, and every retry it earns; its final Job.

    The Scheduler need not be started (it must know the task); the job runs
    whatever its execution_time.
    """
    store = EventStore(scheduler.store.pool, scheduler.store.schema)
    try:
        while True:
            row = await store.claim_one(job_id, scheduler.worker_id)
            if row is None:
                job = await scheduler.get_job(job_id)
                if job is None:
                    raise JobNotFound(job_id)
                if job.status is JobStatus.PENDING:
                    continue  # raced with a worker's claim of it; try again
                if job.status is JobStatus.RUNNING:
                    return await scheduler.wait_for(job_id)
                return job
            await scheduler.worker.executor.execute_job(row)
    finally:
        if not scheduler.is_running:
            # Completions keep a pooled connection between writes; the
            # shutdown of a started Scheduler gives it back, here we must.
            await scheduler.worker.completer.connection.release()


async def run_eagerly(
    scheduler: Scheduler, func: Callable[..., Any], *args: Any, **kwargs: Any
) -> Job:
    """Schedule ``func(*args, **kwargs)`` and run it inline (see run_job)."""
    job_id = await scheduler.schedule(
        func, execution_time=datetime.now(UTC), args=args, kwargs=kwargs
    )
    return await run_job(scheduler, job_id)
