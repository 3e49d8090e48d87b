"""chancy, as its docs recommend for async jobs: a queue with the AsyncExecutor,
``concurrency=50`` and eager polling, one Worker, LISTEN/NOTIFY on, default
plugins (pruner, recovery, ...) kept."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from typing import Any

from chancy import Chancy, Queue, Worker, job

RECORD: Any = None


@job(queue="bench")
async def bench_job(*, i: int) -> None:
    RECORD.ran(i)


class Contender:
    version = f"chancy {version('chancy')}"

    def __init__(self, dsn: str, record: Any) -> None:
        global RECORD
        RECORD = record
        self.dsn = dsn
        self.chancy: Chancy | None = None
        self.worker: Worker | None = None
        self.concurrency = 50

    async def setup(self) -> None:
        log = logging.getLogger("chancy-bench")
        log.setLevel(logging.WARNING)
        self.chancy = Chancy(self.dsn, log=log, max_connection_pool_size=20)
        await self.chancy.__aenter__()
        await self.chancy.migrate()

    async def close(self) -> None:
        if self.chancy is not None:
            await self.chancy.__aexit__(None, None, None)

    async def _declare(self, concurrency: int) -> None:
        assert self.chancy is not None
        await self.chancy.declare(
            Queue(
                "bench",
                concurrency=concurrency,
                executor="chancy.executors.asyncex.AsyncExecutor",
                polling_interval=1,
                eager_polling=True,
            ),
            upsert=True,
        )

    async def _push(self, ids: range, when: datetime | None) -> None:
        assert self.chancy is not None
        jobs = []
        for i in ids:
            j = bench_job.job.with_kwargs(i=i)
            if when is not None:
                j = j.with_scheduled_at(when)
            jobs.append(j)
        async for _ in self.chancy.push_many(jobs, batch_size=5000):
            pass

    async def enqueue_due(self, ids: range) -> None:
        await self._push(ids, None)

    async def enqueue_future(self, ids: range) -> None:
        await self._push(ids, datetime.now(UTC) + timedelta(hours=1))

    async def enqueue_one(self, i: int, future: bool = False) -> None:
        assert self.chancy is not None
        j = bench_job.job.with_kwargs(i=i)
        if future:
            j = j.with_scheduled_at(datetime.now(UTC) + timedelta(hours=1))
        await self.chancy.push(j)

    async def _fetchval(self, sql: str) -> Any:
        assert self.chancy is not None
        async with self.chancy.pool.connection() as conn:
            cur = await conn.execute(sql)
            row = await cur.fetchone()
            return row[0] if row else None

    async def analyze(self) -> None:
        assert self.chancy is not None
        async with self.chancy.pool.connection() as conn:
            await conn.execute("ANALYZE chancy_jobs")

    async def count_jobs(self) -> int:
        return await self._fetchval("SELECT count(*) FROM chancy_jobs")

    async def remaining(self) -> int:
        return await self._fetchval(
            "SELECT count(*) FROM chancy_jobs WHERE state IN ('pending', 'running')"
            " AND scheduled_at <= now()"
        )

    async def prepare_worker(self, concurrency: int) -> None:
        await self._declare(concurrency)

    async def start_worker(self, concurrency: int) -> None:
        assert self.chancy is not None
        await self._declare(concurrency)
        self.worker = Worker(self.chancy, register_signal_handlers=False, shutdown_timeout=10)
        await self.worker.start()

    async def stop_worker(self) -> None:
        if self.worker is not None:
            await asyncio.wait_for(self.worker.stop(), 60)
            self.worker = None
