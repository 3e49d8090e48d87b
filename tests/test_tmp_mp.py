"""Two worker processes and a producer process share one database."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest
from conftest import wait_until

TESTS_DIR = Path(__file__).resolve().parent
JOBS = 2000

PRODUCER = """
import asyncio, os, sys
from datetime import UTC, datetime
import asyncpg
from pg_scheduler import JobSpec, Scheduler
import mp_tasks

async def main():
    pool = await asyncpg.create_pool(os.environ["PG_SCHEDULER_DSN"], min_size=1, max_size=4)
    scheduler = Scheduler(pool)  # never started: it only enqueues
    now = datetime.now(UTC)
    total = int(sys.argv[1])
    for n in range(100):  # some one by one...
        await scheduler.schedule(mp_tasks.log_run, execution_time=now, args=(n,))
    specs = [JobSpec(mp_tasks.log_run, now, args=(n,)) for n in range(100, total)]
    await scheduler.schedule_bulk(specs, batch_size=500)  # ...the rest in bulk
    await pool.close()

asyncio.run(main())
"""


def env(dsn: str) -> dict[str, str]:
    return {
        **os.environ,
        "PG_SCHEDULER_DSN": dsn,
        "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
    }


@pytest.mark.slow
async def test_two_workers_and_a_producer_run_each_job_exactly_once(pool, dsn):
    await pool.execute("CREATE TABLE IF NOT EXISTS job_runs (n int, pid int)")
    workers = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pg_scheduler.cli",
            "--log-level",
            "warning",
            "worker",
            "mp_tasks:SETTINGS",
            env=env(dsn),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        for _ in range(2)
    ]
    try:
        producer = await asyncio.create_subprocess_exec(
            sys.executable, "-c", PRODUCER, str(JOBS), env=env(dsn), stderr=asyncio.subprocess.PIPE
        )
        _, err = await producer.communicate()
        assert producer.returncode == 0, err.decode()[-2000:]

        async def all_done():
            return (
                await pool.fetchval(
                    "SELECT count(*) FROM scheduled_jobs WHERE status = 'completed'"
                )
                == JOBS
            )

        await wait_until(all_done, timeout=60, interval=0.2, message="all jobs completed")
    finally:
        for proc in workers:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        outcomes = [await asyncio.wait_for(proc.communicate(), 30) for proc in workers]
    assert [p.returncode for p in workers] == [0, 0], [e.decode()[-2000:] for _, e in outcomes]
    runs = await pool.fetchrow(
        "SELECT count(*) AS runs, count(DISTINCT n) AS distinct_n, "
        "count(DISTINCT pid) AS pids FROM job_runs"
    )
    if runs["runs"] != JOBS:
        dup = await pool.fetch("SELECT n, array_agg(pid) AS pids FROM job_runs GROUP BY n HAVING count(*) > 1 ORDER BY n")
        print("DUPS", [(r["n"], r["pids"]) for r in dup][:50])
        print("ERR0", outcomes[0][1].decode()[-6000:])
        print("ERR1", outcomes[1][1].decode()[-6000:])
    assert runs["runs"] == JOBS and runs["distinct_n"] == JOBS
    assert runs["pids"] == 2  # both workers took part
    assert await pool.fetchval("SELECT count(*) FROM scheduler_workers") == 0  # unregistered
