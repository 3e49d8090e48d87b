"""Idle latency behind pgbouncer (transaction mode), with and without listen_dsn.

One due job at a time goes into an idle worker whose pool goes through
pgbouncer; the time from ``schedule()`` (another pool, as another process
would) to the job's start is recorded. 10 warm-up jobs, then ``--jobs``.

    python scripts/pgbouncer_latency.py --bouncer-dsn postgresql://u@host:6432/db \\
        --direct-dsn postgresql://u@host:5432/db

It works in a schema of its own (dropped at the end), so any database will do.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from datetime import UTC, datetime

import asyncpg

from pg_scheduler import Scheduler
from pg_scheduler.store.migrate import migrate
from pg_scheduler.tasks import TaskRegistry

SCHEMA = "pgs_latency"
_started: dict[str, asyncio.Future[float]] = {}


async def ping(token: str) -> None:
    _started[token].set_result(time.perf_counter())


async def measure(args: argparse.Namespace, listen: bool) -> tuple[float, float]:
    tasks = TaskRegistry()
    tasks.register(ping, name="latency.ping")
    worker_pool = await asyncpg.create_pool(args.bouncer_dsn, statement_cache_size=0, max_size=10)
    producer_pool = await asyncpg.create_pool(
        args.bouncer_dsn, statement_cache_size=0, min_size=1, max_size=2
    )
    worker = Scheduler(
        worker_pool,
        schema=SCHEMA,
        pgbouncer=True,
        listen_dsn=args.direct_dsn if listen else None,
        vacuum_enabled=False,
        run_periodic_jobs=False,
        tasks=tasks,
    )
    producer = Scheduler(producer_pool, schema=SCHEMA, pgbouncer=True, tasks=tasks)
    await worker.start()
    latencies = []
    try:
        for i in range(args.jobs + 10):
            await asyncio.sleep(0.2)  # let the worker go idle again
            token = str(i)
            _started[token] = asyncio.get_running_loop().create_future()
            sent = time.perf_counter()
            await producer.schedule(ping, execution_time=datetime.now(UTC), args=(token,))
            latencies.append(await asyncio.wait_for(_started[token], 30) - sent)
    finally:
        await worker.shutdown()
        await worker_pool.close()
        await producer_pool.close()
    ordered = sorted(latencies[10:])
    return statistics.median(ordered) * 1000, ordered[int(len(ordered) * 0.99) - 1] * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bouncer-dsn", required=True, help="through pgbouncer")
    parser.add_argument("--direct-dsn", required=True, help="the same database, directly")
    parser.add_argument("--jobs", type=int, default=100)
    args = parser.parse_args()
    conn = await asyncpg.connect(args.direct_dsn)
    try:
        await migrate(conn, SCHEMA)
        for listen in (True, False):
            p50, p99 = await measure(args, listen)
            mode = "listen_dsn" if listen else "polling  "
            print(f"{mode}: {args.jobs} jobs, p50 {p50:.1f} ms, p99 {p99:.1f} ms", flush=True)
    finally:
        await conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
        await conn.close()


if __name__ == "__main__":
    asyncio.run(main())
