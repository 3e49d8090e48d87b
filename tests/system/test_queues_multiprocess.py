"""Worker processes serving different queues, and pause/resume across processes."""

from __future__ import annotations

import asyncio
import sys

import pytest

from pg_scheduler.store import QueueStore
from tests.support.common import child_env, start_cli_worker, wait_until

PRODUCER = """
import asyncio, os, sys
from datetime import UTC, datetime
import asyncpg
from pg_scheduler import JobSpec, Scheduler
from tests.support import queue_tasks

async def main():
    pool = await asyncpg.create_pool(os.environ["PG_SCHEDULER_DSN"], min_size=1, max_size=4)
    scheduler = Scheduler(pool)  # never started: it only enqueues
    now = datetime.now(UTC)
    total, seconds = int(sys.argv[1]), float(sys.argv[2])
    specs = []
    for n in range(total):
        func = queue_tasks.mp_email if n % 2 else queue_tasks.mp_report
        specs.append(JobSpec(func, now, args=(n, seconds)))
    await scheduler.schedule_bulk(specs, batch_size=500)
    await pool.close()

asyncio.run(main())
"""


async def start_worker(dsn: str, *extra: str) -> asyncio.subprocess.Process:
    return await start_cli_worker(dsn, "tests.support.queue_tasks:SETTINGS", *extra)


async def produce(dsn: str, total: int, seconds: float) -> None:
    producer = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        PRODUCER,
        str(total),
        str(seconds),
        env=child_env(dsn),
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await producer.communicate()
    assert producer.returncode == 0, err.decode()[-2000:]


async def stop(workers: list[asyncio.subprocess.Process]) -> None:
    for w in workers:
        if w.returncode is None:
            w.terminate()
    for w in workers:
        try:
            await asyncio.wait_for(w.wait(), 20)
        except TimeoutError:
            w.kill()
            await w.wait()


async def live_workers(pool, n: int) -> None:
    async def ready() -> bool:
        return await pool.fetchval("SELECT count(*) FROM scheduler_workers") == n

    await wait_until(ready, timeout=30, message=f"{n} workers registered")


@pytest.mark.slow
async def test_two_processes_serving_different_queues_run_only_their_own(pool, dsn):
    await pool.execute(
        "CREATE TABLE IF NOT EXISTS queue_runs (queue text, n int, pid int, at timestamptz)"
    )
    emails = await start_worker(dsn, "--queues", "emails")
    reports = await start_worker(dsn, "--queues", "reports=4")
    workers = [emails, reports]
    try:
        await live_workers(pool, 2)
        await produce(dsn, 600, 0.0)

        async def all_done() -> bool:
            return (
                await pool.fetchval(
                    "SELECT count(*) FROM scheduled_jobs WHERE status = 'completed'"
                )
                == 600
            )

        await wait_until(all_done, timeout=90, interval=0.2, message="all jobs completed")
        rows = await pool.fetch("SELECT queue, pid, count(*) AS n FROM queue_runs GROUP BY 1, 2")
        assert {(r["queue"], r["pid"]): r["n"] for r in rows} == {
            ("emails", emails.pid): 300,
            ("reports", reports.pid): 300,
        }
    finally:
        await stop(workers)
    for w in workers:
        assert w.returncode == 0, (await w.stderr.read()).decode()[-2000:]


@pytest.mark.slow
async def test_pause_stops_new_starts_on_every_worker_within_a_second(pool, dsn):
    await pool.execute(
        "CREATE TABLE IF NOT EXISTS queue_runs (queue text, n int, pid int, at timestamptz)"
    )
    workers = [await start_worker(dsn) for _ in range(2)]
    try:
        await live_workers(pool, 2)
        # 0.1 s jobs, 10 at a time per worker: about 20 s of work for both.
        await produce(dsn, 4000, 0.1)

        async def both_busy() -> bool:
            return (
                await pool.fetchval(
                    "SELECT count(DISTINCT pid) FROM queue_runs WHERE queue = 'emails'"
                )
                == 2
            )

        await wait_until(both_busy, timeout=30, message="both workers running e-mails")
        await QueueStore(pool).set_paused("emails", True)  # what pause_queue() runs
        paused_at = await pool.fetchval("SELECT clock_timestamp()")  # after its commit

        # Reports keep running on both workers for a while after the pause...
        async def reports_after_pause() -> bool:
            return (
                await pool.fetchval(
                    "SELECT count(DISTINCT pid) FROM queue_runs"
                    " WHERE queue = 'reports' AND at > $1::timestamptz + interval '1.5 seconds'",
                    paused_at,
                )
                == 2
            )

        await wait_until(reports_after_pause, timeout=30, message="reports after the pause")
        # ...while no e-mail started later than one second after it.
        late = await pool.fetchval(
            "SELECT count(*) FROM queue_runs"
            " WHERE queue = 'emails' AND at > $1::timestamptz + interval '1 second'",
            paused_at,
        )
        assert late == 0
        pending = await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE queue = 'emails' AND status = 'pending'"
        )
        assert pending > 0
        # Resume (as the CLI does): e-mails start again, on both workers.
        resume = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "pg_scheduler.cli",
            "queues",
            "resume",
            "emails",
            env=child_env(dsn),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, err = await resume.communicate()
        assert resume.returncode == 0, err.decode()
        resumed_at = await pool.fetchval("SELECT clock_timestamp()")

        async def emails_again() -> bool:
            return (
                await pool.fetchval(
                    "SELECT count(DISTINCT pid) FROM queue_runs WHERE queue = 'emails' AND at > $1",
                    resumed_at,
                )
                == 2
            )

        await wait_until(emails_again, timeout=30, message="e-mails on both workers after resume")
    finally:
        await stop(workers)
    # Nothing lost: every job is pending, running or completed, none failed.
    bad = await pool.fetchval(
        "SELECT count(*) FROM scheduled_jobs"
        " WHERE status NOT IN ('pending', 'running', 'completed')"
    )
    assert bad == 0
