"""Chaos run: many jobs over several worker processes, repeated kill -9s, a PostgreSQL restart,
and poison jobs.

    python -m scripts.chaos                # 10,000 jobs, 3 workers (from the repository root)
    python -m scripts.chaos --jobs 2000    # quicker

It starts a private embedded PostgreSQL (nothing shared is touched), enqueues
``--jobs`` ordinary jobs plus ``--poison`` poison jobs (a NUL or a lone
surrogate in the result, a result over the size limit, a NUL in the error,
``SystemExit``), starts ``--workers`` worker processes (tests/support/fault_worker.py),
kills a random one with SIGKILL every ``--kill-every`` seconds (a random
value in that range) and starts a replacement, restarts PostgreSQL
(``pg_ctl restart -m fast``) at half way, and waits until no job is pending
or running. Each execution of a job inserts a row into ``fault_runs``, so
runs are counted by the database, not by the scheduler under test.

It prints a summary and exits non-zero if a job was lost or stuck, an
ordinary job did not complete, a job failed without having run, a poison job
did not fail, or a job ran more than once without one of its runs having
been on a killed worker.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg

from pg_scheduler import JobSpec, Scheduler
from pg_scheduler.store.migrate import migrate
from pg_scheduler.support.reconnect import retry_on_disconnect
from tests.support import fault_tasks
from tests.support.fault_worker import RUNS_DDL, WorkerProcess, restart_postgres

TIMINGS: dict[str, Any] = dict(
    heartbeat_interval=0.3,
    heartbeat_threshold=2.0,
    lease_duration=3.0,
    rescue_interval=0.5,
    listener_health_interval=0.5,
    vacuum_enabled=False,
    run_periodic_jobs=False,
)


async def fetchval(pool: asyncpg.Pool, query: str, *args: Any) -> Any:
    return await retry_on_disconnect(lambda: pool.fetchval(query, *args), what="progress")


async def count_completed(pool: asyncpg.Pool) -> int:
    return await fetchval(pool, "SELECT count(*) FROM scheduled_jobs WHERE status = 'completed'")


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
    retired: list[WorkerProcess] = []
    killed_pids: set[int] = set()
    started_count = 0

    async def start_worker() -> WorkerProcess:
        nonlocal started_count
        started_count += 1
        worker = await WorkerProcess.start(
            server.dsn,
            log_dir,
            f"worker-{started_count}",
            max_concurrent_jobs=args.concurrency,
            pool_size=args.concurrency // 2 + 6,
            **TIMINGS,
        )
        await worker.ready(timeout=90)
        return worker

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
        kinds = fault_tasks.POISON_KINDS
        poison = {f"p{i}": kinds[i % len(kinds)] for i in range(args.poison)}
        specs += [
            JobSpec(fault_tasks.poison, due, kwargs={"key": key, "kind": kind}, job_id=key)
            for key, kind in poison.items()
        ]
        random.shuffle(specs)
        await producer.schedule_bulk(specs)
        total = len(specs)

        workers = list(await asyncio.gather(*(start_worker() for _ in range(args.workers))))
        began = time.monotonic()
        deadline = began + args.timeout
        all_done = asyncio.Event()

        async def killer() -> None:
            low, high = args.kill_every
            while not all_done.is_set():
                try:
                    await asyncio.wait_for(all_done.wait(), random.uniform(low, high))
                    return
                except TimeoutError:
                    pass
                at = random.randrange(len(workers))
                victim = workers[at]
                killed_pids.add(victim.proc.pid)
                victim.send(signal.SIGKILL)
                await victim.wait()
                retired.append(victim)
                workers[at] = await start_worker()

        kills = asyncio.create_task(killer())

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

        while time.monotonic() < deadline:
            open_jobs = await fetchval(
                pool, "SELECT count(*) FROM scheduled_jobs WHERE status IN ('pending', 'running')"
            )
            if open_jobs == 0:
                break
            await asyncio.sleep(0.1)
        elapsed = time.monotonic() - began
        all_done.set()
        await kills

        statuses = {
            r["status"]: r["n"]
            for r in await pool.fetch(
                "SELECT status, count(*) AS n FROM scheduled_jobs GROUP BY status"
            )
        }
        jobs = {
            r["job_id"]: r
            for r in await pool.fetch("SELECT job_id, status, error_message FROM scheduled_jobs")
        }
        runs = {
            r["job_key"]: r
            for r in await pool.fetch(
                """
                SELECT job_key, count(*) AS n, array_agg(pid) AS pids
                  FROM fault_runs WHERE phase = 'start' GROUP BY job_key
                """
            )
        }
        repeated = [r for r in runs.values() if r["n"] > 1]
        explained = [r for r in repeated if killed_pids.intersection(r["pids"])]
        unexplained = [r["job_key"] for r in repeated if not killed_pids.intersection(r["pids"])]
        ordinary = [f"c{i}" for i in range(args.jobs)]
        failed_unrun = [
            job_id for job_id, r in jobs.items() if r["status"] == "failed" and job_id not in runs
        ]
        poison_not_failed = [k for k in poison if jobs.get(k) and jobs[k]["status"] != "failed"]
        poison_runs = {k: runs[k]["n"] if k in runs else 0 for k in poison}
        return {
            "jobs": total,
            "ordinary_jobs": args.jobs,
            "poison_jobs": len(poison),
            "workers": args.workers,
            "kills": len(killed_pids),
            "statuses": statuses,
            "lost": total - len(jobs),
            "stuck": statuses.get("pending", 0) + statuses.get("running", 0),
            "ordinary_not_completed": sum(
                1 for k in ordinary if jobs.get(k) and jobs[k]["status"] != "completed"
            ),
            "failed_without_having_run": len(failed_unrun),
            "poison_failed": len(poison) - len(poison_not_failed),
            "poison_not_failed": poison_not_failed[:20],
            "poison_runs_once": sum(1 for n in poison_runs.values() if n == 1),
            "poison_runs_more_than_once": sum(1 for n in poison_runs.values() if n > 1),
            "executions": sum(r["n"] for r in runs.values()),
            "run_more_than_once": len(repeated),
            "of_which_on_a_killed_worker": len(explained),
            "unexplained_repeats": unexplained[:20],
            "pg_restart_took_s": round(restart_took, 2),
            "progress_resumed_after_restart_s": None
            if resumed_after is None
            else round(resumed_after, 2),
            "elapsed_s": round(elapsed, 2),
            "throughput_jobs_per_s": round(total / elapsed, 1),
            "worker_logs": str(log_dir),
        }
    finally:
        for worker in workers + retired:
            await worker.close()
        await pool.close()
        await asyncio.to_thread(server.stop)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=30, help="max_concurrent_jobs")
    parser.add_argument("--max-sleep", type=float, default=0.02, help="seconds each job sleeps")
    parser.add_argument("--poison", type=int, default=100, help="poison jobs (5 kinds)")
    parser.add_argument(
        "--kill-every",
        type=float,
        nargs=2,
        default=(4.0, 6.0),
        metavar=("MIN", "MAX"),
        help="seconds between kill -9s",
    )
    parser.add_argument("--timeout", type=float, default=600.0)
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
    ok = (
        summary["lost"] == 0
        and summary["stuck"] == 0
        and summary["ordinary_not_completed"] == 0
        and summary["failed_without_having_run"] == 0
        and not summary["poison_not_failed"]
        and not summary["unexplained_repeats"]
    )
    print("RESULT:", "OK" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
