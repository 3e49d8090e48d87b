"""This repository's pg_scheduler: ``Scheduler(pool, max_concurrent_jobs=50,
batch_claim_limit=50)`` per worker process, every other setting its default
(completed rows kept, the library's own vacuum policy); the producer is a
Scheduler that is never started (``schedule_bulk`` only)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import asyncpg
import structlog

# Warnings and up, as an application would log (before the library binds its loggers).
structlog.configure(
    wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    cache_logger_on_first_use=True,
)

import pg_scheduler  # noqa: E402
from pg_scheduler import JobSpec, Scheduler, task  # noqa: E402

HANDLER: Callable[[str], Awaitable[None]] | None = None


@task(name="sustained.job")
async def job(p: str) -> None:
    assert HANDLER is not None
    await HANDLER(p)


class Contender:
    version = f"pg_scheduler {getattr(pg_scheduler, '__version__', 'dev')} (this repo)"
    job_table = "scheduled_jobs"
    depth_sql = (
        "SELECT count(*) FROM scheduled_jobs WHERE status = 'pending' AND execution_time <= now()"
    )
    relations = None  # every table of the database, with its indexes

    def __init__(self, dsn: str, options: dict[str, Any]) -> None:
        self.dsn = dsn
        # Scheduler keyword arguments of the workers beyond the two fixed ones
        # (the test shortens the lease so that a killed worker's jobs come back soon).
        self.options = options
        self.pool: asyncpg.Pool | None = None
        self.producer: Scheduler | None = None

    async def install(self) -> None:
        self.pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=2)
        await Scheduler(self.pool).initialize_db()

    async def open_producer(self) -> None:
        self.pool = await asyncpg.create_pool(self.dsn, min_size=2, max_size=10)
        self.producer = Scheduler(self.pool)

    async def enqueue(self, payloads: list[str]) -> None:
        assert self.producer is not None
        now = datetime.now(UTC)
        await self.producer.schedule_bulk(
            [JobSpec(func=job, execution_time=now, args=(p,)) for p in payloads]
        )

    async def run_worker(self, handler: Callable[[str], Awaitable[None]]) -> None:
        global HANDLER
        HANDLER = handler
        self.pool = await asyncpg.create_pool(self.dsn, min_size=2, max_size=10)
        scheduler = Scheduler(
            self.pool, max_concurrent_jobs=50, batch_claim_limit=50, **self.options
        )
        await scheduler.start()
        try:
            await asyncio.Event().wait()  # until cancelled (SIGTERM)
        finally:
            await scheduler.shutdown()

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
