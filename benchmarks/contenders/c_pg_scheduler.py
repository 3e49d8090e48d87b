"""This repository's pg_scheduler (the project venv, editable install)."""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import structlog

# The application's logging setup, as in production: warnings and up (the
# peers' stdlib loggers print nothing below WARNING unconfigured, either).
# Before importing the library: its module loggers bind at import.
structlog.configure(
    wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    cache_logger_on_first_use=True,
)

import pg_scheduler  # noqa: E402
from pg_scheduler import (  # noqa: E402
    JobPriority,
    JobSpec,
    Scheduler,
    VacuumConfig,
    VacuumPolicy,
    VacuumTrigger,
    task,
)

RECORD: Any = None


@task(name="bench.job")
async def job(i: int) -> None:
    RECORD.ran(i)


async def foreign_job(i: int) -> None:
    """Never registered with the worker: the "unregistered task" backlog."""
    RECORD.ran(i)


class Contender:
    version = f"pg_scheduler {getattr(pg_scheduler, '__version__', 'dev')} (this repo)"

    def __init__(self, dsn: str, record: Any) -> None:
        global RECORD
        RECORD = record
        self.dsn = dsn
        self.pool: asyncpg.Pool | None = None
        self.scheduler: Scheduler | None = None
        # Producer side: a scheduler object that is never started (schedule() only).
        self.producer: Scheduler | None = None

    async def setup(self) -> None:
        self.pool = await asyncpg.create_pool(self.dsn, min_size=2, max_size=10)
        self.producer = Scheduler(self.pool)
        await self.producer.initialize_db()

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()

    async def _bulk(self, ids: range, when: datetime) -> None:
        specs = [JobSpec(func=job, execution_time=when, args=(i,)) for i in ids]
        assert self.producer is not None
        await self.producer.schedule_bulk(specs, batch_size=5000)

    async def enqueue_due(self, ids: range) -> None:
        await self._bulk(ids, datetime.now(UTC) - timedelta(seconds=1))

    async def enqueue_future(self, ids: range) -> None:
        await self._bulk(ids, datetime.now(UTC) + timedelta(hours=1))

    async def enqueue_one(self, i: int, future: bool = False) -> None:
        assert self.producer is not None
        when = datetime.now(UTC) + (timedelta(hours=1) if future else timedelta(0))
        await self.producer.schedule(job, execution_time=when, args=(i,))

    async def enqueue_from_outside(self, i: int, priority: str) -> None:
        """One due job, as another process schedules it (this object never runs a worker)."""
        assert self.producer is not None
        level = JobPriority.CRITICAL if priority == "critical" else JobPriority.NORMAL
        await self.producer.schedule(
            job, execution_time=datetime.now(UTC), args=(i,), priority=level
        )

    async def analyze(self) -> None:
        assert self.pool is not None
        await self.pool.execute("ANALYZE scheduled_jobs")

    async def count_jobs(self) -> int:
        assert self.pool is not None
        return await self.pool.fetchval("SELECT count(*) FROM scheduled_jobs")

    async def remaining(self) -> int:
        assert self.pool is not None
        return await self.pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE status IN ('pending', 'running')"
            " AND execution_time <= now()"
        )

    async def prepare_worker(self, concurrency: int, queues: list[str] | None = None) -> None:
        assert self.pool is not None
        options: dict[str, Any] = {}
        if queues is not None:
            options["queues"] = queues
        if os.environ.get("PGS_BENCH_DELETE_COMPLETED"):
            # Variant: completed rows deleted at once (VacuumPolicy IMMEDIATE).
            options["vacuum_config"] = VacuumConfig(completed=VacuumPolicy(VacuumTrigger.IMMEDIATE))
        if os.environ.get("PGS_BENCH_NO_LOCAL_START"):
            # Variant: jobs reach the worker through NOTIFY + claim, as from another process.
            options["start_due_jobs_locally"] = False
        if os.environ.get("PGS_BENCH_NO_GC_FREEZE"):
            # Variant: gc_freeze=False (full collections walk every object
            # alive at start).
            options["gc_freeze"] = False
        self.scheduler = Scheduler(
            self.pool, max_concurrent_jobs=concurrency, batch_claim_limit=concurrency, **options
        )

    async def enqueue_foreign(self, ids: range, kind: str) -> None:
        """Due jobs the worker of the queue scenarios must never run."""
        when = datetime.now(UTC) - timedelta(seconds=1)
        if kind == "queue":
            specs = [
                JobSpec(func=job, execution_time=when, args=(i,), queue="elsewhere") for i in ids
            ]
        else:
            specs = [JobSpec(func=foreign_job, execution_time=when, args=(i,)) for i in ids]
        assert self.producer is not None
        await self.producer.schedule_bulk(specs, batch_size=5000)

    async def enqueue_foreign_one(self, i: int) -> None:
        assert self.producer is not None
        await self.producer.schedule(
            job, execution_time=datetime.now(UTC), args=(i,), queue="elsewhere"
        )

    async def backend_pid(self) -> int:
        assert self.pool is not None
        return await self.pool.fetchval("SELECT pg_backend_pid()")

    async def start_worker(self, concurrency: int, queues: list[str] | None = None) -> None:
        if self.scheduler is None:
            await self.prepare_worker(concurrency, queues)
        assert self.scheduler is not None
        await self.scheduler.start()

    async def stop_worker(self) -> None:
        if self.scheduler is not None:
            await self.scheduler.shutdown()
            self.scheduler = None
