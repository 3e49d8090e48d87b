"""``pg-scheduler demo``: a visible mix of immediate, delayed, retried and periodic jobs."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import asyncpg

from ..config import RetryPolicy
from ..periodic import periodic
from ..scheduler import Scheduler
from ..store.cli import CliStore
from ..store.periodic import PERIODIC_TASK_PREFIX
from ..support.install import install_hint
from ..tasks import task, task_name_of

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


# The periodic job's key, and the task its window rows route to.
PERIODIC_KEY = "demo-heartbeat"
PERIODIC_TASK = f"{PERIODIC_TASK_PREFIX}{PERIODIC_KEY}"


@periodic(every=timedelta(seconds=3), job_name="heartbeat", dedup_key=PERIODIC_KEY)
async def demo_heartbeat() -> str:
    return datetime.now(UTC).strftime("tick at %H:%M:%S")


# One name per job in the table: the job name (the periodic job's, too).
_HEADER = f"  {'job':<10} {'status':<10} {'attempt':>7} {'ms':>8}  result / error"


def _row(row: asyncpg.Record) -> str:
    ms = row["duration_ms"]
    duration = "-" if ms is None else f"{ms:.1f}"
    detail = row["result"] or row["error_message"] or ""
    if row["status"] == "pending" and row["error_message"]:
        detail = f"will retry: {row['error_message']}"
    return (
        f"  {row['job_name']:<10} {row['status']:<10} {row['attempts']:>7} {duration:>8}  {detail}"
    ).rstrip()


async def _clean_up(store: CliStore) -> None:
    """Drop the demo's unfinished jobs (retries, the next periodic window) and
    its periodic job's stored row."""
    tasks = [task_name_of(f) for f in (greet, flaky, demo_heartbeat)]
    await store.delete_unfinished([*tasks, PERIODIC_TASK])
    await store.forget_periodic([PERIODIC_KEY])


async def run_demo(pool: asyncpg.Pool, seconds: float = 12.0) -> None:
    scheduler = Scheduler(
        pool,
        max_concurrent_jobs=10,
        vacuum_enabled=False,
        retry_policy=RetryPolicy(base_delay=1.0, factor=2.0, jitter=0.0),
    )
    await scheduler.initialize_db()
    store = CliStore(pool)
    # Each run starts clean, and ends clean (below): no job of the demo's is left
    # waiting for a worker that has gone, and no periodic job nobody declares.
    await _clean_up(store)
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
            f"on worker {scheduler.worker_id}; running for {seconds:g} s\n",
            flush=True,
        )
        print(_HEADER, flush=True)
        last_seen: dict[str, str] = {}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while loop.time() < deadline:
            await asyncio.sleep(0.5)
            for row in await store.demo_rows(ids, "heartbeat", started):
                state = f"{row['status']}:{row['attempts']}"
                if last_seen.get(row["job_id"]) == state:
                    continue
                last_seen[row["job_id"]] = state
                print(_row(row), flush=True)
    finally:
        await scheduler.shutdown()
        await _clean_up(store)
    cli = _command()
    print(
        "\ndemo: done. Its pending jobs and periodic job are removed; the finished jobs\n"
        "stay in the database: see them in the web dashboard\n"
        f"  {cli} dashboard\n"
        f"(it needs the dashboard extra: {install_hint('dashboard')})\n"
        f"or in the terminal with `{cli} status --watch` and `{cli} jobs`.\n"
        "Point your own code at the embedded database with\n"
        f"PG_SCHEDULER_DSN=$({cli} dsn)."
    )


def _command() -> str:
    """How to type this command again from here: ``pg-scheduler`` when that
    is what the shell finds, else its path (``.venv/bin/pg-scheduler`` when
    the virtualenv is not activated)."""
    here = Path(sys.executable).parent / "pg-scheduler"
    found = shutil.which("pg-scheduler")
    if found is not None and Path(found).resolve() == here.resolve():
        return "pg-scheduler"
    if not here.exists():
        return "pg-scheduler"
    try:
        relative = os.path.relpath(here)
    except ValueError:  # another drive
        return str(here)
    return min(relative, str(here), key=len)
