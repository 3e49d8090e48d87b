"""One worker process of the crash scenario: ``python crash_worker.py DSN JSON``.

JSON: Scheduler keyword arguments, plus ``step_sleep`` (seconds, see
``crash_flows``) and ``pool_size``. Prints ``READY <pid>`` once started, then
runs until its standard input closes (the parent stopped it or died), and shuts
down gracefully. Logs go to standard error.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
from pathlib import Path

import asyncpg
import structlog

sys.path.insert(0, str(Path(__file__).resolve().parent))

structlog.configure(
    wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
)

import crash_flows  # noqa: E402

from pg_scheduler import Scheduler  # noqa: E402


async def main() -> None:
    dsn, options = sys.argv[1], json.loads(sys.argv[2])
    crash_flows.STEP_SLEEP = float(options.pop("step_sleep", 0.0))
    pool_size = int(options.pop("pool_size", 10))
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=pool_size)
    crash_flows.POOL = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    scheduler = Scheduler(pool, **options)
    await scheduler.start()
    print(f"READY {os.getpid()}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await scheduler.shutdown()
    await crash_flows.POOL.close()
    await pool.close()


if __name__ == "__main__":
    asyncio.run(main())
