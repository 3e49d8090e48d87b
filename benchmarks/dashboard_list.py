"""How fast the dashboard's job list answers on a large table.

    python -m benchmarks.dashboard_list [--rows 1000000] [--dsn DSN]

Fills a fresh database (on the server of --dsn / $PG_SCHEDULER_DSN, else a
throwaway embedded PostgreSQL) with ``--rows`` jobs in one
``INSERT ... SELECT generate_series`` (a realistic mix: 20 tasks, most rows
completed, some failed, pending, running, cancelled; created over 30 days;
the oldest fifth with random v4 ids, the rest time-ordered), runs ANALYZE,
then times the dashboard's own code path (``DashboardService.jobs``: the
keyset query and the JSON-ready rows, no HTTP) for the first page, a page
half-way down, and filtered pages. Each case: one warm-up, then ``--repeat``
timed calls; the median and the worst are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from pg_scheduler.dashboard.service import DashboardService, encode_cursor
from pg_scheduler.store.dashboard import ALL_STATUSES, Cursor, DashboardStore
from pg_scheduler.store.migrate import migrate

FILL = """
INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status, created_at,
                            started_at, finished_at, attempts, task_data, error_message)
SELECT CASE WHEN g <= $1 / 5 THEN gen_random_uuid()::text
            ELSE lpad(to_hex(g), 12, '0') || '-7000-8000-' || lpad(to_hex(g), 12, '0') END,
       'task_' || (g % 20), 'task_' || (g % 20), c, s,
       c, CASE WHEN s <> 'pending' THEN c END,
       CASE WHEN s IN ('completed', 'failed', 'cancelled') THEN c + interval '1 second' END,
       CASE WHEN s = 'pending' THEN 0 ELSE 1 END,
       jsonb_build_object('args', jsonb_build_array('user-' || g, g % 1000),
                          'kwargs', jsonb_build_object('region', 'eu-' || (g % 7))),
       CASE WHEN s = 'failed' THEN 'ValueError: bad input ' || g END
  FROM (SELECT g, now() - interval '30 days' * (1 - g::float8 / $1) AS c,
               CASE WHEN g % 100 < 90 THEN 'completed'
                    WHEN g % 100 < 95 THEN 'failed'
                    WHEN g % 100 < 98 THEN 'pending'
                    WHEN g % 100 < 99 THEN 'running'
                    ELSE 'cancelled' END AS s
          FROM generate_series(1, $1) g) x
"""


async def timed(label: str, call: Any, repeat: int) -> None:
    result = await call()  # warm-up (plans, caches)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = await call()
        times.append((time.perf_counter() - start) * 1000)
    rows = len(result["jobs"])
    print(
        f"  {label:<52} {statistics.median(times):7.1f} ms median "
        f"{max(times):7.1f} ms worst  ({rows} rows)"
    )


async def run(dsn: str, rows: int, repeat: int) -> None:
    name = f"pgs_dash_bench_{uuid.uuid4().hex[:6]}"
    admin = await asyncpg.connect(dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    url = urlunsplit(urlsplit(dsn)._replace(path="/" + name))
    pool = await asyncpg.create_pool(url, min_size=1, max_size=4)
    try:
        await migrate(pool)
        start = time.perf_counter()
        await pool.execute(FILL, rows)
        await pool.execute("ANALYZE scheduled_jobs")
        print(f"filled {rows:,} rows in {time.perf_counter() - start:.1f} s")
        service = DashboardService(pool, await DashboardStore.open(pool), "public")
        middle = await pool.fetchrow(
            "SELECT created_at, job_id FROM scheduled_jobs "
            "ORDER BY created_at DESC, job_id DESC OFFSET $1 LIMIT 1",
            rows // 2,
        )
        deep = encode_cursor(Cursor(middle["created_at"], middle["job_id"]))
        cases: list[tuple[str, dict[str, str]]] = [
            ("first page (50)", {}),
            (f"keyset page at row {rows // 2:,}", {"after": deep}),
            ("status=failed", {"status": "failed"}),
            ("status=failed, deep page", {"status": "failed", "after": deep}),
            ("task=task_7", {"task": "task_7"}),
            ("task=task_15, status=pending", {"task": "task_15", "status": "pending"}),
            ("created since 1d", {"since": "1d"}),
            ("created before 15 days ago (until=15d)", {"until": "15d"}),
            ("queue=default", {"queue": "default"}),
            ("status=expired (no rows)", {"status": "expired"}),
            ("search 'user-12345' in arguments (a scan)", {"q": "user-12345"}),
            ("task=nope (no rows: walks every status range)", {"task": "nope"}),
        ]
        print(f"dashboard job list, {rows:,} rows, {repeat} runs each:")
        for label, params in cases:
            await timed(label, lambda p=params: service.jobs(p), repeat)
        plan = await pool.fetch(
            "EXPLAIN (ANALYZE, BUFFERS) " + service.store._list,
            ALL_STATUSES,
            None,
            None,
            None,
            None,
            None,
            51,
            None,
        )
        print("plan of the first page:")
        for row in plan:
            print("   ", row[0])
    finally:
        await pool.close()
        admin = await asyncpg.connect(dsn)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--dsn", default=os.environ.get("PG_SCHEDULER_DSN"))
    args = parser.parse_args()
    dsn = args.dsn
    if dsn is None:
        from pg_scheduler.embedded import start

        dsn = start(Path(tempfile.mkdtemp(prefix="pgs-dash-")) / "pgdata", cleanup="delete").dsn
    asyncio.run(run(dsn, args.rows, args.repeat))


if __name__ == "__main__":
    main()
