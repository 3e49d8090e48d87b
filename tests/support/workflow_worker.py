"""A worker process for tests/system/test_workflow_crash.py and
test_workflow_restart.py (``python -m tests.support.workflow_worker`` from the
repository root): runs workflow_crash_tasks and workflow_restart_tasks
on ``$PG_SCHEDULER_TEST_DB_URL`` with the fault-test timings until killed (or
stdin closes); prints ``ready`` on stdout once started."""

from __future__ import annotations

import asyncio
import os
import sys

import asyncpg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import workflow_crash_tasks  # noqa: F401  (registers the workflows)
import workflow_restart_tasks  # noqa: F401

from pg_scheduler import Scheduler


async def main() -> None:
    pool = await asyncpg.create_pool(
        os.environ["PG_SCHEDULER_TEST_DB_URL"], min_size=2, max_size=12
    )
    scheduler = Scheduler(
        pool,
        max_concurrent_jobs=10,
        heartbeat_interval=0.3,
        heartbeat_threshold=2.0,
        lease_duration=3.0,
        rescue_interval=0.5,
        listener_health_interval=0.5,
        vacuum_enabled=False,
        run_periodic_jobs=False,
    )
    await scheduler.start()
    print("ready", scheduler.worker_id, os.getpid(), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await scheduler.shutdown(grace_period=2.0)
    await pool.close()


if __name__ == "__main__":
    import structlog

    # Logs go to stderr (the test's log file); stdout carries only "ready".
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    asyncio.run(main())
