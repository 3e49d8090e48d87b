"""Chaos run: many jobs over several worker processes, a kill -9 and a PostgreSQL restart.

    python scripts/chaos.py                # 10,000 jobs, 3 workers
    python scripts/chaos.py --jobs 2000    # quicker

It starts a private embedded PostgreSQL (nothing shared is touched), enqueues
``--jobs`` jobs, starts ``--workers`` worker processes (tests/fault_worker.py),
kills one with SIGKILL once a quarter of the jobs are done, restarts
PostgreSQL (``pg_ctl restart -m fast``) at half way, and waits for the rest.
Each execution of a job inserts a row into ``fault_runs``, so runs are
counted by the database, not by the scheduler under test.

It prints a summary and exits non-zero if a job was lost (did not end
``completed``) or ran more than once without a worker having died during it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TESTS_DIR = Path(__file__).resolve().parent.parent / "tests"
sys.path.insert(0, str(TESTS_DIR))

import asyncpg  # noqa: E402
import fault_tasks  # noqa: E402
from fault_worker import RUNS_DDL, WorkerProcess, restart_postgres  # noqa: E402

from pg_scheduler import JobSpec, Scheduler  # noqa: E402
from pg_scheduler.migrate import migrate  # noqa: E402
from pg_scheduler.reconnect import retry_on_disconnect  # noqa: E402

TIMINGS: dict[str, Any] = dict(
    heartbeat_interval=0.3,
    heartbeat_threshold=2.0,
    lease_duration=3.0,
    rescue_interval=0.5,
    listener_health_interval=0.5,
    vacuum_enabled=False,
    run_periodic_jobs=False,
)


async def count_completed(pool: asyncpg.Pool) -> int:
    return await retry_on_disconnect(
        lambda: pool.fetchval("SELECT count(*) FROM scheduled_jobs WHERE status = 'completed'"),
        what="progress",
    )


async def wait_for_completed(pool: asyncpg.Pool, target: int, deadline: float) -> int:
    while True:
        done = await count_completed(pool)
        if done >= target or time.monotonic() > deadline:
            return done
        await asyncio.sleep(0.05)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from pg_scheduler.embedded import start

    data_dir = Path(tempfile.mkdtemp(prefix="pgs-chaos-")) / "pgdata"
    log_dir = Path(tempfile.mkdtemp(prefix="pgs-chaos-logs-"))
    server = await asyncio.to_thread(start, data_dir, cleanup="delete")
    pool = await asyncpg.create_pool(server.dsn, min_size=1, max_size=4)
    workers: list[WorkerProcess] = []
    try:
        await migrate(pool)
        await pool.execute(RUNS_DDL)
        producer = Scheduler(pool, **TIMINGS)
        due = await pool.fetchval("SELECT now()")
        specs = [
            JobSpec(
                func=fault_tasks.quick,
                execution_time=due,
                kwargs={"key": f"c{i}", "max_sleep": args.max_sleep},
                job_id=f"c{i}",
            )
            for i in range(args.jobs)
        ]
        await producer.schedule_bulk(specs)

        workers = [
            await WorkerProcess.start(
                server.dsn,
                log_dir,
                f"worker-{n}",
                max_concurrent_jobs=args.concurrency,
                pool_size=args.concurrency // 2 + 6,
                **TIMINGS,
            )
            for n in range(args.workers)
        ]
        for worker in workers:
            await worker.ready(timeout=60)
        began = time.monotonic()
        deadline = began + args.timeout

        # kill -9 one worker a quarter of the way through.
        await wait_for_completed(pool, args.jobs // 4, deadline)
        victim = workers[0]
        killed_at = time.monotonic()
        victim.send(signal.SIGKILL)
        await victim.wait()
        in_flight = [
            r["job_id"]
            for r in await pool.fetch(
                "SELECT job_id FROM scheduled_jobs WHERE status = 'running' AND worker_id = $1",
                victim.worker_id,
            )
        ]

        async def victims_done() -> float:
            while True:
                n = await retry_on_disconnect(
                    lambda: pool.fetchval(
                        "SELECT count(*) FROM scheduled_jobs WHERE job_id = ANY($1::text[])"
                        " AND status = 'completed'",
                        in_flight,
                    ),
                    what="victims",
                )
                if n == len(in_flight) or time.monotonic() > deadline:
                    return time.monotonic() - killed_at
                await asyncio.sleep(0.05)

        victims_task = asyncio.create_task(victims_done())

        # Restart PostgreSQL half way through.
        await wait_for_completed(pool, args.jobs // 2, deadline)
        restart_began = time.monotonic()
        await asyncio.to_thread(restart_postgres, server)
        restart_took = time.monotonic() - restart_began
        before = await count_completed(pool)
        resumed_after = None
        while time.monotonic() < deadline:
            if await count_completed(pool) > before:
                resumed_after = time.monotonic() - restart_began
                break
            await asyncio.sleep(0.02)

        done = await wait_for_completed(pool, args.jobs, deadline)
        elapsed = time.monotonic() - began
        rescued_after = await victims_task

        statuses = {
            r["status"]: r["n"]
            for r in await pool.fetch(
                "SELECT status, count(*) AS n FROM scheduled_jobs GROUP BY status"
            )
        }
        runs = await pool.fetch(
            """
            SELECT job_key, count(*) AS n, array_agg(pid) AS pids
              FROM fault_runs WHERE phase = 'start' GROUP BY job_key
            """
        )
        executions = sum(r["n"] for r in runs)
        repeated = [r for r in runs if r["n"] > 1]
        explained = [r for r in repeated if victim.proc.pid in r["pids"]]
        unexplained = [r["job_key"] for r in repeated if victim.proc.pid not in r["pids"]]
        never_ran = args.jobs - len(runs)
        return {
            "jobs": args.jobs,
            "workers": args.workers,
            "completed": done,
            "statuses": statuses,
            "lost": args.jobs - statuses.get("completed", 0),
            "never_ran": never_ran,
            "executions": executions,
            "run_more_than_once": len(repeated),
            "of_which_worker_killed_mid_run": len(explained),
            "unexplained_repeats": unexplained[:20],
            "killed_worker_jobs_in_flight": len(in_flight),
            "killed_worker_jobs_all_completed_after_s": round(rescued_after, 2),
            "pg_restart_took_s": round(restart_took, 2),
            "progress_resumed_after_restart_s": None
            if resumed_after is None
            else round(resumed_after, 2),
            "elapsed_s": round(elapsed, 2),
            "throughput_jobs_per_s": round(args.jobs / elapsed, 1),
            "worker_logs": str(log_dir),
        }
    finally:
        for worker in workers:
            await worker.close()
        await pool.close()
        await asyncio.to_thread(server.stop)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=30, help="max_concurrent_jobs")
    parser.add_argument("--max-sleep", type=float, default=0.02, help="seconds each job sleeps")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON only")
    args = parser.parse_args()
    import logging

    import structlog

    # Only this process's own noise is silenced (its progress queries retry
    # through the restart); the workers log to files under worker_logs.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    summary = asyncio.run(run(args))
    if args.json:
        print(json.dumps(summary))
    else:
        print("chaos run summary")
        for key, value in summary.items():
            print(f"  {key:42} {value}")
    ok = summary["lost"] == 0 and not summary["unexplained_repeats"]
    print("RESULT:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
