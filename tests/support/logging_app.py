"""An application run as a child process by tests/system/test_logging.py: it
starts a Scheduler, runs one job and schedules one by a name nobody
registered (a library warning), with logging left alone ("unconfigured") or
configured through the standard library ("basicConfig"), whose handler's
records it prints as JSON lines on stdout at the end."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys

import asyncpg

from pg_scheduler import Scheduler
from tests.support import app_tasks
from tests.support.common import FAST

kept: list[logging.LogRecord] = []


class Keep(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        kept.append(record)


async def main(mode: str) -> None:
    if mode == "basicConfig":
        logging.basicConfig(level=logging.INFO, handlers=[Keep()])
    pool = await asyncpg.create_pool(os.environ["PG_SCHEDULER_DSN"], min_size=1, max_size=4)
    scheduler = Scheduler(pool, **FAST)
    await scheduler.start()
    try:
        job_id = await scheduler.schedule(app_tasks.add, args=(1, 2))
        assert await scheduler.result(job_id, timeout=10) == 3
        await scheduler.schedule_job("nobody.registered:this", None, {})
    finally:
        await scheduler.shutdown()
        await pool.close()
    for record in kept:
        line = {"logger": record.name, "level": record.levelname, "message": record.getMessage()}
        sys.stdout.write(json.dumps(line) + "\n")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
