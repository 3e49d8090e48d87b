"""This repository's pg_scheduler running plain ``def`` jobs in its thread pool
(``@task(executor="thread")``): the drain scenario only."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import c_pg_scheduler
from c_pg_scheduler import Contender as _Base

from pg_scheduler import JobSpec, task

LOOP: asyncio.AbstractEventLoop | Any = None


@task(name="bench.sync_job", executor="thread")
def sync_job(i: int) -> None:
    # A no-op job; the driver's bookkeeping is not thread-safe, so it runs on the loop.
    LOOP.call_soon_threadsafe(c_pg_scheduler.RECORD.ran, i)


class Contender(_Base):
    version = _Base.version + " [def jobs, thread executor]"

    async def _bulk(self, ids: range, when: datetime) -> None:
        global LOOP
        LOOP = asyncio.get_running_loop()
        specs = [JobSpec(func=sync_job, execution_time=when, args=(i,)) for i in ids]
        assert self.producer is not None
        await self.producer.schedule_bulk(specs, batch_size=5000)
