"""Concurrency keys: a keyed drain beside a plain drain, and per-key rates
across three worker processes.

``python benchmarks/keys.py [--jobs 50000] [--keys 1000] [--rate-keys 100]
[--rate-jobs 30] [--dsn DSN]`` (from the repository root, with this tree's
library importable). One embedded server (or ``--dsn``), a fresh database
for each part:

* plain: ``jobs`` no-op jobs bulk-enqueued, drained by one
  ``Scheduler(max_concurrent_jobs=50, batch_claim_limit=50)`` (jobs/s);
* keyed: the same jobs spread over ``keys`` keys with
  ``max_running_per_key=1``, drained by the same Scheduler; reported as
  jobs/s and as a ratio to the plain drain of the same run;
* rate: ``rate_keys`` keys at ``"5/s"``, ``rate_jobs`` jobs each, run by
  three ``pg-scheduler worker`` processes; every job body stamps its start
  (its own clock) into a table. Reported: the most starts of one key in any
  1 s window (must be <= 5), and the aggregate start rate as a share of
  ``rate_keys x 5/s`` (the starts over the first start to the last plus one
  second: a key at its limit starts 5, then 5 more a second later, ...).
  ``--rates-only --global-rate``: the same jobs under one global
  ``rate_limit`` of ``rate_keys x 5/s`` on their task instead.

For an A/B run, start it from outside both checkouts with ``PYTHONPATH`` set
to the one to measure: the workers import the library this script imported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import structlog
from checkouts import admin, database_dsn, server_dsn  # benchmarks/, next to this script

import pg_scheduler
from pg_scheduler import JobSpec, Scheduler, task

structlog.configure(
    wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    cache_logger_on_first_use=True,
)

RATE = 5
HERE = Path(__file__).resolve().parent
_done = 0
_target = 0
_finished: asyncio.Event | None = None
_stamps: asyncpg.Pool | None = None

#: The worker processes' settings (``pg-scheduler worker keys:SETTINGS``).
SETTINGS = {
    "max_concurrent_jobs": 20,
    "batch_claim_limit": 20,
    "vacuum_enabled": False,
    "run_periodic_jobs": False,
}


@task(name="bench.keys.noop")
async def noop(i: int) -> None:
    global _done
    _done += 1
    if _done >= _target and _finished is not None:
        _finished.set()


@task(name="bench.keys.rated", concurrency_key=lambda key, i: key, rate_limit_per_key=f"{RATE}/s")
async def rated(key: str, i: int) -> None:
    global _stamps
    started = time.time()
    if _stamps is None:  # one per worker process
        _stamps = await asyncpg.create_pool(os.environ["PG_SCHEDULER_DSN"], min_size=1, max_size=2)
    await _stamps.execute("INSERT INTO key_starts_seen (key, at) VALUES ($1, $2)", key, started)


@task(name="bench.keys.global_rated")
async def global_rated(key: str, i: int) -> None:
    """The same stamp, for a task under a global ``rate_limit`` (``--global-rate``)."""
    await rated(key, i)


async def _fresh(dsn: str) -> tuple[asyncpg.Pool, str, str]:
    name = f"keys_{uuid.uuid4().hex[:8]}"
    await admin(dsn, f'CREATE DATABASE "{name}"')
    url = database_dsn(dsn, name)
    pool = await asyncpg.create_pool(url, min_size=2, max_size=10)
    await Scheduler(pool).initialize_db()
    return pool, name, url


async def _drop(dsn: str, pool: asyncpg.Pool, name: str) -> None:
    await pool.close()
    await admin(dsn, f'DROP DATABASE "{name}" WITH (FORCE)')


async def _drain(pool: asyncpg.Pool, count: int) -> float:
    global _done, _target, _finished
    _done, _target, _finished = 0, count, asyncio.Event()
    await pool.execute("VACUUM ANALYZE")
    await pool.execute("CHECKPOINT")
    scheduler = Scheduler(pool, max_concurrent_jobs=50, batch_claim_limit=50)
    started = time.perf_counter()
    await scheduler.start()
    await asyncio.wait_for(_finished.wait(), 1800)
    elapsed = time.perf_counter() - started
    await scheduler.shutdown()
    left = await pool.fetchval("SELECT count(*) FROM scheduled_jobs WHERE status <> 'completed'")
    assert left == 0, f"{left} jobs not completed"
    return elapsed


async def drain(dsn: str, n: int, keys: int | None) -> float:
    """jobs/s of one drain of ``n`` no-op jobs (``keys``: spread over that
    many keys, one running per key)."""
    pool, name, _ = await _fresh(dsn)
    try:
        when = datetime.now(UTC) - timedelta(seconds=1)
        if keys is None:
            specs = [JobSpec(noop, when, (i,)) for i in range(n)]
        else:
            specs = [
                JobSpec(noop, when, (i,), concurrency_key=f"k{i % keys}", max_running_per_key=1)
                for i in range(n)
            ]
        await Scheduler(pool).schedule_bulk(specs)
        return n / await _drain(pool, n)
    finally:
        await _drop(dsn, pool, name)


def _most_in_window(starts: list[float], window: float) -> int:
    starts = sorted(starts)
    most = first = 0
    for last, t in enumerate(starts):
        while t - starts[first] >= window:
            first += 1
        most = max(most, last - first + 1)
    return most


async def rates(dsn: str, keys: int, per_key: int, global_rate: bool = False) -> dict[str, Any]:
    """``global_rate``: the same jobs under one global ``rate_limit`` of their
    task (``keys`` x 5/s) instead of a rate per key."""
    pool, name, url = await _fresh(dsn)
    here = HERE
    library = str(Path(pg_scheduler.__file__).parents[1])
    env = {
        **os.environ,
        "PG_SCHEDULER_DSN": url,
        # The workers import the library this script imported (a checkout
        # given by PYTHONPATH, for an A/B run).
        "PYTHONPATH": os.pathsep.join([str(here), library]),
    }
    workers: list[asyncio.subprocess.Process] = []
    try:
        await pool.execute("CREATE TABLE key_starts_seen (key text, at float8)")
        for _ in range(3):
            workers.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "pg_scheduler.cli",
                    "--log-level",
                    "warning",
                    "worker",
                    "keys:SETTINGS",
                    env=env,
                    cwd=library,  # ``-m`` puts the working directory first on the path
                )
            )
        deadline = time.monotonic() + 60
        while await pool.fetchval("SELECT count(*) FROM scheduler_workers") < 3:
            assert time.monotonic() < deadline, "3 workers did not register"
            await asyncio.sleep(0.1)
        when = datetime.now(UTC) - timedelta(seconds=1)
        func = rated
        if global_rate:
            func = global_rated
            await Scheduler(pool).configure_task(
                "bench.keys.global_rated", rate_limit=f"{keys * RATE}/s"
            )
        specs = [JobSpec(func, when, (f"r{k}", i)) for i in range(per_key) for k in range(keys)]
        await Scheduler(pool).schedule_bulk(specs)
        total = len(specs)
        deadline = time.monotonic() + 60 + 2 * per_key / RATE
        while await pool.fetchval("SELECT count(*) FROM key_starts_seen") < total:
            assert time.monotonic() < deadline, "the rated jobs did not all start"
            await asyncio.sleep(0.2)
        rows = await pool.fetch("SELECT key, at FROM key_starts_seen")
        claims = await pool.fetch(
            "SELECT concurrency_key AS key, EXTRACT(EPOCH FROM started_at)::float8 AS at"
            " FROM scheduled_jobs"
        )
        # Late starts whose window was full when stamped again (engine/rate_starts.py).
        handed_back = await pool.fetchval(
            "SELECT count(*) FROM job_attempts WHERE outcome = 'handed_back'"
        )
    finally:
        for w in workers:
            if w.returncode is None:
                w.terminate()
        for w in workers:
            await w.wait()
        await _drop(dsn, pool, name)
    by_key: dict[str, list[float]] = {}
    for r in rows:
        by_key.setdefault("all" if global_rate else r["key"], []).append(r["at"])
    starts = [r["at"] for r in rows]
    # At the limit each key starts 5 at once, then 5 more a second later, ...:
    # its last start comes (per_key / 5 - 1) s after its first. The aggregate
    # counts the run as the first start to the last, plus that last second.
    aggregate = len(starts) / (max(starts) - min(starts) + 1.0)
    claimed: dict[str, list[float]] = {}
    for r in claims:
        claimed.setdefault("all" if global_rate else r["key"], []).append(r["at"])
    return {
        "rate_most_starts_per_key_in_1s": max(_most_in_window(v, 1.0) for v in by_key.values()),
        # The same from the claims' own time (started_at: the database's now()).
        "rate_most_claims_per_key_in_1s": max(_most_in_window(v, 1.0) for v in claimed.values()),
        "rate_bodies_run": len(starts),
        "rate_handed_back": handed_back,
        "rate_aggregate_starts_per_s": round(aggregate, 1),
        "rate_share_of_limit": round(aggregate / (keys * RATE), 3),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--keys", type=int, default=1_000)
    parser.add_argument("--rate-keys", type=int, default=100)
    parser.add_argument("--rate-jobs", type=int, default=30)
    parser.add_argument("--dsn")
    parser.add_argument("--rates-only", action="store_true")
    parser.add_argument(
        "--global-rate",
        action="store_true",
        help="with --rates-only: one global rate_limit of rate-keys x 5/s on the task instead",
    )
    args = parser.parse_args()
    dsn = server_dsn(args.dsn, "pgs-keys-")
    figures: dict[str, Any] = {}
    if args.rates_only:
        figures = await rates(dsn, args.rate_keys, args.rate_jobs, args.global_rate)
        print("RESULT " + json.dumps(figures))
        return
    figures["plain_jobs_per_s"] = round(await drain(dsn, args.jobs, None))
    figures["keyed_jobs_per_s"] = round(await drain(dsn, args.jobs, args.keys))
    figures["keyed_vs_plain"] = round(figures["keyed_jobs_per_s"] / figures["plain_jobs_per_s"], 3)
    print(json.dumps(figures), flush=True)
    figures |= await rates(dsn, args.rate_keys, args.rate_jobs)
    print("RESULT " + json.dumps(figures))


if __name__ == "__main__":
    asyncio.run(main())
