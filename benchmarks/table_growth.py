"""Does the job table stay small, and the claim fast? (outside the test suite)

Part 1 pushes N short jobs (default 500,000) through the statements a worker
runs (``Store.insert``, ``Store.claim``, ``Store.complete``: the same SQL, minus
the Python task per job, so the run takes minutes), twice, in fresh databases:

* ``default``: the default VacuumConfig policies, with the service running.
  The default keeps completed jobs 1 day, which a minutes-long run never
  reaches, so the retention is compressed to ``--retention`` seconds (and the
  interval to ``--vacuum-every``): the question is whether the table levels
  off at "rows finished within the retention window", not how big a day is.
* ``disabled``: ``vacuum_enabled=False``: every finished row stays.

At checkpoints it records table and index sizes, live and dead tuples, and
the median time of one claim of 10 due jobs.

Part 2 measures the claim with 1,000,000 pending jobs due in the future
(bulk-inserted) against an empty table, and prints the claim's plan.

Jobs arrive at a sustained ``--rate`` (2,500/s by default, so the run spans a
few autovacuum passes, which the server starts at most once a minute per
database); about 7 minutes in all.

    python -m benchmarks.table_growth [--dsn DSN] [--jobs 500000] [--rate 2500]
        [--retention 10] [--vacuum-every 5] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from pg_scheduler.config import VacuumConfig, VacuumPolicy
from pg_scheduler.enums import PRIORITY_DB_VALUES
from pg_scheduler.services.vacuum import VacuumService
from pg_scheduler.store import Completion, NewJob, Store
from pg_scheduler.store.housekeeping import VacuumStore
from pg_scheduler.store.migrate import migrate

TASK = "bench:noop"
WORKER = "bench-worker"
INSERT_BATCH = 2000
CLAIM_BATCH = 200

SIZES = """
SELECT pg_relation_size('scheduled_jobs') AS heap,
       pg_total_relation_size('scheduled_jobs') AS total,
       pg_indexes_size('scheduled_jobs') AS indexes,
       (SELECT json_object_agg(indexrelid::regclass::text, pg_relation_size(indexrelid))
          FROM pg_index WHERE indrelid = 'scheduled_jobs'::regclass) AS per_index,
       (SELECT count(*) FROM scheduled_jobs) AS rows,
       s.n_dead_tup AS dead, s.autovacuum_count AS autovacuums
  FROM pg_stat_user_tables s WHERE s.relname = 'scheduled_jobs'
"""


def mb(n: int) -> float:
    return round(n / 1048576, 1)


def new_jobs(count: int, due: datetime) -> list[NewJob]:
    return [
        NewJob(
            job_id=uuid.uuid4().hex,
            job_name="noop",
            task_name=TASK,
            execution_time=due,
            task_data='{"args": [], "kwargs": {}}',
            priority=5,
            max_retries=0,
            misfire_grace_time=None,
            timeout=None,
            retry_policy=None,
        )
        for _ in range(count)
    ]


async def fresh_database(server_dsn: str, name: str) -> str:
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    return urlunsplit(urlsplit(server_dsn)._replace(path="/" + name))


async def drop_database(server_dsn: str, name: str) -> None:
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


async def claim_time_ms(store: Store, pool: asyncpg.Pool, samples: int = 30) -> float:
    """Median time of one claim of 10 due jobs (they are completed afterwards)."""
    timings = []
    for _ in range(samples):
        await store.insert(pool, new_jobs(10, datetime.now(UTC)))
        started = time.perf_counter()
        rows = await store.claim(WORKER, [TASK], 10, 60.0)
        timings.append((time.perf_counter() - started) * 1000)
        await store.complete(
            WORKER, [Completion(r["job_id"], r["attempts"], None) for r in rows], False
        )
    return round(statistics.median(timings), 3)


async def churn(
    dsn: str, jobs: int, vacuum: VacuumConfig | None, checkpoints: int, rate: float
) -> list[dict]:
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=4)
    await migrate(pool)
    store = Store(pool)
    service = None
    if vacuum is not None:
        service = VacuumService(VacuumStore(pool), vacuum, "bench-vacuum")
        service.start()
    report = []
    every = max(INSERT_BATCH, jobs // checkpoints)
    done = 0
    started = time.perf_counter()
    try:
        while done < jobs:
            # Sustained load at ``rate`` jobs/s (0: as fast as possible).
            if rate > 0:
                ahead = done / rate - (time.perf_counter() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
            await store.insert(pool, new_jobs(INSERT_BATCH, datetime.now(UTC)))
            for _ in range(INSERT_BATCH // CLAIM_BATCH):
                rows = await store.claim(WORKER, [TASK], CLAIM_BATCH, 60.0)
                await store.complete(
                    WORKER, [Completion(r["job_id"], r["attempts"], None) for r in rows], False
                )
                done += len(rows)
            if done % every < INSERT_BATCH or done >= jobs:
                sizes = dict(await pool.fetchrow(SIZES))
                point = {
                    "jobs": done,
                    "seconds": round(time.perf_counter() - started, 1),
                    "rows": sizes["rows"],
                    "dead": sizes["dead"],
                    "autovacuums": sizes["autovacuums"],
                    "heap_mb": mb(sizes["heap"]),
                    "indexes_mb": mb(sizes["indexes"]),
                    "total_mb": mb(sizes["total"]),
                    "per_index_mb": {k: mb(v) for k, v in json.loads(sizes["per_index"]).items()},
                    "claim_ms": await claim_time_ms(store, pool),
                }
                report.append(point)
                print(json.dumps(point), flush=True)
    finally:
        if service is not None:
            await service.stop()
        await pool.close()
    return report


CLAIM_PLAN = """
EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF)
SELECT j.job_id FROM unnest($1::int[]) AS p(priority)
 CROSS JOIN LATERAL (
    SELECT j.job_id FROM scheduled_jobs j
     WHERE j.status = 'pending' AND j.priority = p.priority
       AND j.execution_time <= now() AND j.task_name = ANY($2::text[])
     ORDER BY j.execution_time LIMIT 10 FOR UPDATE SKIP LOCKED) j
 LIMIT 10
"""


async def backlog(dsn: str, future_jobs: int) -> dict[str, Any]:
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=4)
    await migrate(pool)
    store = Store(pool)
    result: dict[str, Any] = {"empty_claim_ms": await claim_time_ms(store, pool, samples=100)}
    started = time.perf_counter()
    await pool.execute(
        """
        INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status, priority)
        SELECT 'future-' || i, 'noop', $2, now() + interval '1 hour' + i * interval '1 second',
               'pending', (ARRAY[1, 3, 5, 8])[1 + i % 4]
          FROM generate_series(1, $1) i
        """,
        future_jobs,
        TASK,
    )
    await pool.execute("VACUUM ANALYZE scheduled_jobs")
    result["insert_seconds"] = round(time.perf_counter() - started, 1)
    result["future_jobs"] = future_jobs
    result["backlog_claim_ms"] = await claim_time_ms(store, pool, samples=100)
    await store.insert(pool, new_jobs(10, datetime.now(UTC)))
    plan = await pool.fetch(CLAIM_PLAN, PRIORITY_DB_VALUES, [TASK])
    result["claim_plan"] = [r[0] for r in plan]
    sizes = dict(await pool.fetchrow(SIZES))
    result["total_mb"] = mb(sizes["total"])
    result["per_index_mb"] = {k: mb(v) for k, v in json.loads(sizes["per_index"]).items()}
    await pool.close()
    return result


async def main(args: argparse.Namespace) -> dict[str, Any]:
    server = args.dsn
    if server is None:
        from pg_scheduler.embedded import start

        server = start().dsn
    results: dict[str, Any] = {
        "jobs": args.jobs,
        "rate": args.rate,
        "retention_seconds": args.retention,
        "vacuum_every_seconds": args.vacuum_every,
    }
    defaults = VacuumConfig()
    days = args.retention / 86400
    scenarios = {
        # The default policies, time-compressed (see the module docstring).
        "default": VacuumConfig(
            completed=VacuumPolicy.after_days(days),
            failed=VacuumPolicy.after_days(days * 7),
            cancelled=VacuumPolicy.after_days(days * 3),
            expired=VacuumPolicy.after_days(days * 3),
            interval_minutes=args.vacuum_every / 60,
            batch_size=defaults.batch_size,
        ),
        "disabled": None,
    }
    for name, config in scenarios.items():
        if args.only and name not in args.only:
            continue
        database = f"pgs_growth_{name}"
        print(f"-- {name}", flush=True)
        dsn = await fresh_database(server, database)
        try:
            results[name] = await churn(dsn, args.jobs, config, args.checkpoints, args.rate)
        finally:
            await drop_database(server, database)
    if args.only and "backlog" not in args.only:
        return results
    print("-- backlog", flush=True)
    dsn = await fresh_database(server, "pgs_growth_backlog")
    try:
        results["backlog"] = await backlog(dsn, args.future)
    finally:
        await drop_database(server, "pgs_growth_backlog")
    print(json.dumps(results["backlog"], indent=2), flush=True)
    return results


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="server DSN (default: the embedded server)")
    parser.add_argument("--jobs", type=int, default=500_000)
    parser.add_argument("--future", type=int, default=1_000_000)
    parser.add_argument("--retention", type=float, default=30.0, help="seconds (for 1 day)")
    parser.add_argument("--vacuum-every", type=float, default=10.0, help="seconds")
    parser.add_argument("--checkpoints", type=int, default=10)
    parser.add_argument(
        "--rate", type=float, default=2500, help="jobs per second (0: as fast as possible)"
    )
    parser.add_argument("--only", choices=["default", "disabled", "backlog"], action="append")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    results = asyncio.run(main(args))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    cli()
