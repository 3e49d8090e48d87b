"""Two worker processes and a producer process share one database."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import pytest

from tests.support.common import child_env, start_cli_worker, wait_until

JOBS = 2000

PRODUCER = """
import asyncio, os, sys
from datetime import UTC, datetime
import asyncpg
from pg_scheduler import JobSpec, Scheduler
from tests.support import mp_tasks

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


async def explain_duplicates(pool, workers, logs: list[str], registered) -> str:
    """What a failure needs: for each n run twice (or never), its job rows, their
    attempts history (migration 0006: rescued, handed_back, ...), the runs and
    who ran them, whether the producer wrote the row twice, and the workers'
    warnings. Once seen: 'handed_back' attempts of jobs that had run, after
    'completion not written' (a completion batch lost a deadlock with the
    heartbeat; see tests/integration/test_completion_deadlock.py)."""
    runs = await pool.fetchrow("SELECT count(*) AS runs, count(DISTINCT n) AS n FROM job_runs")
    lines = [f"{runs['runs']} runs of {runs['n']} distinct n (expected {JOBS} of {JOBS})"]
    lines.append(f"worker pids: {[p.pid for p in workers]}, test pid {os.getpid()}")
    lines.append(f"registered workers at the end: {[dict(r) for r in registered]}")
    # The test loop is shared by the session: a task an earlier test left running
    # (a rescuer, a worker) acts on this database too.
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    lines.append(f"other tasks on the test's loop: {[repr(t.get_coro()) for t in others][:30]}")
    outcomes = await pool.fetch(
        "SELECT outcome, worker_id, count(*) FROM job_attempts GROUP BY 1, 2 ORDER BY 1, 2"
    )
    lines.append(f"job_attempts by outcome: {[tuple(r) for r in outcomes]}")
    by_pid = await pool.fetch("SELECT pid, count(*) FROM job_runs GROUP BY 1 ORDER BY 1")
    lines.append(f"runs by pid: {[tuple(r) for r in by_pid]}")
    twice = await pool.fetch(
        "SELECT n, count(*) AS runs, count(DISTINCT job_id) AS job_ids FROM job_runs"
        " GROUP BY n HAVING count(*) > 1 ORDER BY n"
    )
    lines.append(f"{len(twice)} n ran more than once: {[r['n'] for r in twice][:50]}")
    rows_per_n = await pool.fetch(
        "SELECT (task_data -> 'args' ->> 0)::int AS n, count(*) AS rows FROM scheduled_jobs"
        " GROUP BY 1 HAVING count(*) > 1"
    )
    lines.append(f"n with more than one scheduled_jobs row: {len(rows_per_n)}")
    for r in twice[:10]:
        n = r["n"]
        lines.append(f"--- n={n}: {r['runs']} runs, {r['job_ids']} job ids")
        for run in await pool.fetch("SELECT * FROM job_runs WHERE n = $1 ORDER BY at", n):
            lines.append(f"  run {dict(run)}")
        jobs = await pool.fetch(
            "SELECT job_id, status, attempts, rescue_count, unstarted_rescues, claimed_ahead,"
            " worker_id, created_at, started_at, finished_at, retry_count, error_message"
            " FROM scheduled_jobs WHERE (task_data -> 'args' ->> 0)::int = $1",
            n,
        )
        for job in jobs:
            lines.append(f"  job {dict(job)}")
            for a in await pool.fetch(
                "SELECT attempt, worker_id, started_at, finished_at, outcome, error"
                " FROM job_attempts WHERE job_id = $1 ORDER BY attempt_id",
                job["job_id"],
            ):
                lines.append(f"    attempt {dict(a)}")
    for pid, text in zip([p.pid for p in workers], logs, strict=True):
        notes = [line for line in text.splitlines() if "[warning" in line or "[error" in line]
        lines.append(f"--- worker {pid}: {len(notes)} warnings and errors, the first 40:")
        lines.extend(notes[:40])
        lines.append(f"--- worker {pid} stderr (last 2000 chars):")
        lines.append(text[-2000:])
    return "\n".join(lines)


@pytest.mark.slow
async def test_two_workers_and_a_producer_run_each_job_exactly_once(pool, dsn):
    await pool.execute(
        "CREATE TABLE IF NOT EXISTS job_runs (n int, pid int, job_id text, attempt int,"
        " at timestamptz DEFAULT clock_timestamp())"
    )
    workers = [await start_cli_worker(dsn, "tests.support.mp_tasks:SETTINGS") for _ in range(2)]
    try:
        producer = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            PRODUCER,
            str(JOBS),
            env=child_env(dsn),
            stderr=asyncio.subprocess.PIPE,
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
        # Who else works on this database (a leftover of an earlier test would
        # rescue, or run, these jobs too): read while ours are still registered.
        registered = await pool.fetch(
            "SELECT worker_id, hostname, pid, started_at, last_seen FROM scheduler_workers"
        )
    finally:
        for proc in workers:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        outcomes = [await asyncio.wait_for(proc.communicate(), 30) for proc in workers]
    logs = [e.decode() for _, e in outcomes]
    assert [p.returncode for p in workers] == [0, 0], [e[-2000:] for e in logs]
    runs = await pool.fetchrow(
        "SELECT count(*) AS runs, count(DISTINCT n) AS distinct_n, "
        "count(DISTINCT pid) AS pids FROM job_runs"
    )
    if runs["runs"] != JOBS or runs["distinct_n"] != JOBS:
        pytest.fail(await explain_duplicates(pool, workers, logs, registered))
    # Nothing here may give up a completion (no worker dies, the database stays
    # up): one given up is left running unowned and handed back to run again.
    assert not [e for e in logs if "completion not written" in e], [e[-3000:] for e in logs]
    assert runs["pids"] == 2  # both workers took part
    assert await pool.fetchval("SELECT count(*) FROM scheduler_workers") == 0  # unregistered
