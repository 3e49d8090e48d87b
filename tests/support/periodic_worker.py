"""A Scheduler process for multi-process periodic tests.

``python -m tests.support.periodic_worker '<json>'`` (from the repository root)
with keys: ``declare`` ("tick" or
"locked"), ``dedup_key``, ``every`` (seconds, for tick), ``trigger`` (bool:
trigger the job once at start). SIGUSR1 calls the synchronous
``disable_periodic_job``; SIGTERM shuts down. Prints JSON lines: ``ready``,
``triggered``, ``disabled``, ``stopped``. Runs of the job body are written to
``periodic_runs``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from typing import Any


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def main(options: dict[str, Any]) -> None:
    import asyncpg

    from pg_scheduler import Scheduler
    from tests.support import periodic_tasks

    key = options["dedup_key"]
    if options["declare"] == "tick":
        periodic_tasks.declare_tick(key, float(options["every"]))
    else:
        periodic_tasks.declare_locked_sleeper(key)
    pool = await asyncpg.create_pool(
        os.environ["PG_SCHEDULER_TEST_DB_URL"], min_size=2, max_size=10
    )
    periodic_tasks.pool = pool
    scheduler = Scheduler(
        pool,
        vacuum_enabled=False,
        heartbeat_interval=0.2,
        heartbeat_threshold=2.0,
        lease_duration=3.0,
        rescue_interval=0.3,
        listener_health_interval=0.5,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def disable() -> None:
        returned = scheduler.disable_periodic_job(key)  # synchronous, returns at once
        say(event="disabled", at=time.time(), returned=returned)

    loop.add_signal_handler(signal.SIGUSR1, disable)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await scheduler.start()
    say(event="ready", pid=os.getpid(), at=time.time())
    if options.get("trigger"):
        job_id = await scheduler.trigger_periodic_job(key)
        say(event="triggered", job_id=job_id)
    await stop.wait()
    await scheduler.shutdown(grace_period=2.0)
    await pool.close()
    say(event="stopped")


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
