"""pgqueuer, as its docs recommend for throughput: one QueueManager on a
dedicated asyncpg connection, an entrypoint without a concurrency limit,
``run(batch_size=25, max_concurrent_tasks=50)`` (the cap must be at least
twice the batch), LISTEN/NOTIFY wake-ups."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from importlib.metadata import version
from typing import Any

import asyncpg
from pgqueuer import AsyncpgDriver, Job, Queries, QueueManager


class Contender:
    version = f"pgqueuer {version('pgqueuer')}"

    def __init__(self, dsn: str, record: Any) -> None:
        self.dsn = dsn
        self.record = record
        self.conn: asyncpg.Connection | None = None
        self.queries: Queries | None = None
        self.qm: QueueManager | None = None
        self.task: asyncio.Task[None] | None = None
        self.worker_conn: asyncpg.Connection | None = None

    async def setup(self) -> None:
        self.conn = await asyncpg.connect(self.dsn)
        self.queries = Queries(AsyncpgDriver(self.conn))
        if not await self.queries.schema_is_installed():
            await self.queries.install()

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()

    async def _enqueue(self, ids: range, after: timedelta | None) -> None:
        assert self.queries is not None
        for start in range(0, len(ids), 5000):
            part = ids[start : start + 5000]
            n = len(part)
            await self.queries.enqueue(
                ["job"] * n, [str(i).encode() for i in part], [0] * n, [after] * n
            )

    async def enqueue_due(self, ids: range) -> None:
        await self._enqueue(ids, None)

    async def enqueue_future(self, ids: range) -> None:
        await self._enqueue(ids, timedelta(hours=1))

    async def enqueue_one(self, i: int, future: bool = False) -> None:
        assert self.queries is not None
        await self.queries.enqueue(
            "job", str(i).encode(), 0, timedelta(hours=1) if future else None
        )

    async def analyze(self) -> None:
        assert self.conn is not None
        await self.conn.execute("ANALYZE pgqueuer")

    async def count_jobs(self) -> int:
        assert self.conn is not None
        return await self.conn.fetchval("SELECT count(*) FROM pgqueuer")

    async def remaining(self) -> int:
        assert self.conn is not None
        return await self.conn.fetchval(
            "SELECT count(*) FROM pgqueuer WHERE execute_after <= now()"
        )

    async def prepare_worker(self, concurrency: int) -> None:
        self.worker_conn = await asyncpg.connect(self.dsn)
        self.qm = QueueManager(Queries(AsyncpgDriver(self.worker_conn)))
        record = self.record

        @self.qm.entrypoint("job")
        async def job(job: Job) -> None:
            record.ran(int(job.payload or b"0"))

    async def start_worker(self, concurrency: int) -> None:
        if self.qm is None:
            await self.prepare_worker(concurrency)
        assert self.qm is not None
        batch = max(1, concurrency // 2)
        self.task = asyncio.create_task(
            self.qm.run(batch_size=batch, max_concurrent_tasks=concurrency)
        )

    async def stop_worker(self) -> None:
        if self.qm is not None and self.task is not None:
            self.qm.shutdown.set()
            await asyncio.wait_for(self.task, 60)
        if self.worker_conn is not None:
            await self.worker_conn.close()
        self.qm = self.task = self.worker_conn = None
