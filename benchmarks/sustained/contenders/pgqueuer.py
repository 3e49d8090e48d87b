"""pgqueuer, configured as the drain harness configures it: one QueueManager
per worker process on a dedicated asyncpg connection,
``run(batch_size=25, max_concurrent_tasks=50)``, LISTEN/NOTIFY wake-ups, every
other setting its default. The producer enqueues through a pool driver."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib.metadata import version
from typing import Any

import asyncpg
from pgqueuer import AsyncpgDriver, AsyncpgPoolDriver, Job, Queries, QueueManager


class Contender:
    version = f"pgqueuer {version('pgqueuer')}"
    job_table = "pgqueuer"
    depth_sql = "SELECT count(*) FROM pgqueuer WHERE status = 'queued'"
    relations = None  # every table of the database, with its indexes

    def __init__(self, dsn: str, options: dict[str, Any]) -> None:
        self.dsn = dsn
        self.pool: asyncpg.Pool | None = None
        self.queries: Queries | None = None

    async def install(self) -> None:
        conn = await asyncpg.connect(self.dsn)
        try:
            queries = Queries(AsyncpgDriver(conn))
            if not await queries.schema_is_installed():
                await queries.install()
        finally:
            await conn.close()

    async def open_producer(self) -> None:
        self.pool = await asyncpg.create_pool(self.dsn, min_size=2, max_size=10)
        self.queries = Queries(AsyncpgPoolDriver(self.pool))

    async def enqueue(self, payloads: list[str]) -> None:
        assert self.queries is not None
        n = len(payloads)
        await self.queries.enqueue(["job"] * n, [p.encode() for p in payloads], [0] * n)

    async def run_worker(self, handler: Callable[[str], Awaitable[None]]) -> None:
        conn = await asyncpg.connect(self.dsn)
        qm = QueueManager(Queries(AsyncpgDriver(conn)))

        @qm.entrypoint("job")
        async def job(job: Job) -> None:
            await handler((job.payload or b"").decode())

        try:
            await qm.run(batch_size=25, max_concurrent_tasks=50)
        finally:
            qm.shutdown.set()
            await conn.close()

    async def close(self) -> None:
        if self.pool is not None:
            await self.pool.close()
