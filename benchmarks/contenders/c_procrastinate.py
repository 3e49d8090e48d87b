"""procrastinate, per its docs: PsycopgConnector, ``run_worker_async(concurrency=50)``
with LISTEN/NOTIFY (the default), batch deferral with ``batch_defer_async``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from importlib.metadata import version
from typing import Any

import procrastinate

logging.getLogger("procrastinate").setLevel(logging.WARNING)


class Contender:
    version = f"procrastinate {version('procrastinate')}"

    def __init__(self, dsn: str, record: Any) -> None:
        self.dsn = dsn
        self.app = procrastinate.App(
            connector=procrastinate.PsycopgConnector(conninfo=dsn, max_size=20)
        )

        @self.app.task(name="bench_job", queue="bench")
        async def bench_job(i: int) -> None:
            record.ran(i)

        self.task = bench_job
        self.worker: asyncio.Task[None] | None = None

    async def setup(self) -> None:
        await self.app.open_async()
        with contextlib.suppress(Exception):
            await self.app.schema_manager.apply_schema_async()

    async def close(self) -> None:
        await self.app.close_async()

    async def _defer(self, ids: range, future: bool) -> None:
        deferrer = self.task.configure(schedule_in={"hours": 1}) if future else self.task
        for start in range(0, len(ids), 5000):
            await deferrer.batch_defer_async(*({"i": i} for i in ids[start : start + 5000]))

    async def enqueue_due(self, ids: range) -> None:
        await self._defer(ids, False)

    async def enqueue_future(self, ids: range) -> None:
        await self._defer(ids, True)

    async def enqueue_one(self, i: int, future: bool = False) -> None:
        if future:
            await self.task.configure(schedule_in={"hours": 1}).defer_async(i=i)
        else:
            await self.task.defer_async(i=i)

    async def _fetchval(self, sql: str) -> Any:
        row = await self.app.connector.execute_query_one_async(
            sql.replace("SELECT count(*)", "SELECT count(*) AS v", 1)
        )
        return row["v"]

    async def analyze(self) -> None:
        await self.app.connector.execute_query_async("ANALYZE procrastinate_jobs")

    async def count_jobs(self) -> int:
        return await self._fetchval("SELECT count(*) FROM procrastinate_jobs")

    async def remaining(self) -> int:
        return await self._fetchval(
            "SELECT count(*) FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"
            " AND (scheduled_at IS NULL OR scheduled_at <= now())"
        )

    async def prepare_worker(self, concurrency: int) -> None:
        pass

    async def start_worker(self, concurrency: int) -> None:
        self.worker = asyncio.create_task(
            self.app.run_worker_async(
                queues=["bench"],
                concurrency=concurrency,
                wait=True,
                install_signal_handlers=False,
            )
        )

    async def stop_worker(self) -> None:
        if self.worker is not None:
            self.worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self.worker, 60)
            self.worker = None
