"""A worker process for tests/system/test_results.py: runs results_tasks until stdin
closes. ``python -m tests.support.results_worker`` from the repository root."""

from __future__ import annotations

import asyncio
import os
import sys

import asyncpg

from pg_scheduler import Scheduler
from tests.support import results_tasks  # noqa: F401  (registers the tasks)


async def main() -> None:
    pool = await asyncpg.create_pool(os.environ["PG_SCHEDULER_DSN"], min_size=2, max_size=8)
    scheduler = Scheduler(
        pool,
        max_concurrent_jobs=50,
        batch_claim_limit=50,
        vacuum_enabled=False,
        run_periodic_jobs=False,
        heartbeat_interval=0.5,
    )
    await scheduler.start()
    print("ready", scheduler.worker_id, file=sys.stderr, flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)  # EOF: the test is done
    await scheduler.shutdown(grace_period=2.0)
    await pool.close()


asyncio.run(main())
