"""``pg-scheduler demo``: a visible mix of immediate, delayed, retried and periodic jobs."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime, timedelta

import asyncpg

from .config import RetryPolicy
from .periodic import periodic
from .scheduler import Scheduler
from .tasks import task, task_name_of

_attempts: dict[str, int] = {}


@task(name="demo.greet")
async def greet(name: str) -> str:
    await asyncio.sleep(random.uniform(0.05, 0.3))
    return f"hello, {name}"


@task(name="demo.flaky")
async def flaky(key: str, failures: int) -> str:
    _attempts[key] = _attempts.get(key, 0) + 1
    if _attempts[key] <= failures:
        raise ConnectionError(f"upstream unavailable (attempt {_attempts[key]})")
    return f"succeeded on attempt {_attempts[key]}"


@periodic(every=timedelta(seconds=3), job_name="demo_heartbeat", dedup_key="demo-heartbeat")
async def demo_heartbeat() -> str:
    return datetime.now(UTC).strftime("tick at %H:%M:%S")


async def run_demo(pool: asyncpg.Pool, seconds: float = 12.0) -> None:
    scheduler = Scheduler(
        pool,
        max_concurrent_jobs=10,
        vacuum_enabled=False,
        retry_policy=RetryPolicy(base_delay=1.0, factor=2.0, jitter=0.0),
    )
    await scheduler.initialize_db()
    # Each run starts clean: drop what an earlier demo left unfinished.
    await pool.execute(
        "DELETE FROM scheduled_jobs WHERE status IN ('pending', 'running')"
        " AND task_name = ANY($1::text[])",
        [task_name_of(f) for f in (greet, flaky, demo_heartbeat)],
    )
    await scheduler.start()
    started = datetime.now(UTC)
    ids: list[str] = []
    try:
        now = datetime.now(UTC)
        for name in ("Ada", "Grace", "Linus"):
            ids.append(await scheduler.schedule(greet, execution_time=now, args=(name,)))
        ids.append(
            await scheduler.schedule(
                greet, execution_time=now + timedelta(seconds=4), args=("later",)
            )
        )
        ids.append(
            await scheduler.schedule(flaky, execution_time=now, args=("flaky", 2), max_retries=3)
        )
        print(
            f"demo: scheduled {len(ids)} jobs plus a periodic job every 3 s "
            f"on worker {scheduler.worker_id}; running for {seconds:g} s\n"
        )
        last_seen: dict[str, str] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while loop.time() < deadline:
            await asyncio.sleep(0.5)
            rows = await pool.fetch(
                """SELECT job_id, job_name, status, attempts, result::text AS result,
                          error_message
                     FROM scheduled_jobs
                    WHERE job_id = ANY($1::text[])
                       OR (job_name = 'demo_heartbeat' AND created_at >= $2)
                    ORDER BY execution_time""",
                ids,
                started,
            )
            for row in rows:
                state = f"{row['status']}:{row['attempts']}"
                if last_seen.get(row["job_id"]) == state:
                    continue
                last_seen[row["job_id"]] = state
                detail = row["result"] or row["error_message"] or ""
                print(
                    f"  {row['job_name']:<16} {row['status']:<10} attempt {row['attempts']}"
                    f"  {detail}"
                )
    finally:
        await scheduler.shutdown()
    print("\ndemo: done")
