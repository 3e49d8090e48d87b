"""procrastinate, configured as the drain harness configures it:
PsycopgConnector (pool max_size=20), ``run_worker_async(concurrency=50)``
with LISTEN/NOTIFY (its default), every other setting its default; the
producer defers with ``batch_defer_async``."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from typing import Any

import procrastinate

logging.getLogger("procrastinate").setLevel(logging.WARNING)


class Contender:
    version = f"procrastinate {version('procrastinate')}"
    job_table = "procrastinate_jobs"
    depth_sql = "SELECT count(*) FROM procrastinate_jobs WHERE status = 'todo'"
    relations = None  # every table of the database, with its indexes

    def __init__(self, dsn: str, options: dict[str, Any]) -> None:
        self.handler: Callable[[str], Awaitable[None]] | None = None
        self.app = procrastinate.App(
            connector=procrastinate.PsycopgConnector(conninfo=dsn, max_size=20)
        )

        @self.app.task(name="sustained_job", queue="sustained")
        async def sustained_job(p: str) -> None:
            assert self.handler is not None
            await self.handler(p)

        self.task = sustained_job

    async def install(self) -> None:
        async with self.app.open_async():
            await self.app.schema_manager.apply_schema_async()

    async def open_producer(self) -> None:
        await self.app.open_async()

    async def enqueue(self, payloads: list[str]) -> None:
        await self.task.batch_defer_async(*({"p": p} for p in payloads))

    async def run_worker(self, handler: Callable[[str], Awaitable[None]]) -> None:
        self.handler = handler
        async with self.app.open_async():
            await self.app.run_worker_async(
                queues=["sustained"], concurrency=50, wait=True, install_signal_handlers=False
            )

    async def close(self) -> None:
        await self.app.close_async()
