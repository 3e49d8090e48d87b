"""Batch tasks: a drain of N jobs with ``batch_size=100`` beside the plain drain
of as many jobs, in the same run.

``python benchmarks/batches.py [--n 50000] [--size 100] [--rounds 3] [--dsn DSN]``
(from the repository root, with this tree's library importable). One embedded
server (or ``--dsn``); each round, in a fresh database each:

* plain: N no-op jobs of a plain task, bulk-enqueued, drained by one
  ``Scheduler(max_concurrent_jobs=50, batch_claim_limit=50)``;
* batches: N jobs of a batch task (``batch_size=--size``, whose handler
  returns one ``None`` per job), drained by the same Scheduler: the handler
  is called N / size times. Reported as jobs/s, as a ratio to the plain
  drain of the same round, and the handler's calls.

Medians over the rounds are printed last, with every round's figures. The
plain drain's own before/after is ``benchmarks/ab_drain.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import structlog
from checkouts import admin, database_dsn, server_dsn  # benchmarks/, next to this script

from pg_scheduler import BatchItem, JobSpec, Scheduler, task

structlog.configure(
    wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    cache_logger_on_first_use=True,
)

_done = 0
_calls = 0
_target = 0
_finished: asyncio.Event | None = None


def _count(n: int) -> None:
    global _done
    _done += n
    if _done >= _target and _finished is not None:
        _finished.set()


@task(name="bench.noop")
async def noop(i: int) -> None:
    _count(1)


async def batched(batch: list[BatchItem]) -> list[None]:
    """Registered on each draining Scheduler only (never process-wide), so the
    plain drains run with no batch task registered."""
    global _calls
    _calls += 1
    _count(len(batch))
    return [None] * len(batch)


async def _fresh(dsn: str) -> tuple[asyncpg.Pool, str]:
    name = f"batches_{uuid.uuid4().hex[:8]}"
    await admin(dsn, f'CREATE DATABASE "{name}"')
    pool = await asyncpg.create_pool(database_dsn(dsn, name), min_size=2, max_size=10)
    await Scheduler(pool).initialize_db()
    return pool, name


async def _drop(dsn: str, pool: asyncpg.Pool, name: str) -> None:
    await pool.close()
    await admin(dsn, f'DROP DATABASE "{name}" WITH (FORCE)')


TICK = os.sysconf("SC_CLK_TCK")


def _backend_cpu(pids: set[int]) -> float:
    """CPU seconds the database's backends ``pids`` used so far (this machine's /proc)."""
    total = 0
    for pid in pids:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except OSError:
            pass
    return total / TICK


async def _drain(dsn: str, func: Any, n: int, size: int | None = None) -> dict[str, float]:
    """Seconds for one Scheduler to run ``n`` bulk-enqueued jobs of ``func``
    (``size``: registered on it as a batch task of that size), and the CPU
    this process and the database's backends spent per job (microseconds)."""
    global _done, _calls, _target, _finished
    pool, name = await _fresh(dsn)
    try:
        when = datetime.now(UTC) - timedelta(seconds=1)
        producer = Scheduler(pool)
        scheduler = Scheduler(pool, max_concurrent_jobs=50, batch_claim_limit=50)
        if size is not None:
            for host in (producer, scheduler):
                host.task(name="bench.batch", batch_size=size, batch_timeout=1.0)(func)
        await producer.schedule_bulk([JobSpec(func, when, (i,)) for i in range(n)], batch_size=5000)
        _done, _calls, _target, _finished = 0, 0, n, asyncio.Event()
        await pool.execute("VACUUM ANALYZE")
        await pool.execute("CHECKPOINT")
        backends = "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        pids = {r[0] for r in await pool.fetch(backends)}
        before = {pid: _backend_cpu({pid}) for pid in pids}
        started, cpu = time.perf_counter(), time.process_time()
        await scheduler.start()
        await asyncio.wait_for(_finished.wait(), 900)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        pids |= {r[0] for r in await pool.fetch(backends)}
        pg = sum(_backend_cpu({pid}) - before.get(pid, 0.0) for pid in pids)
        await scheduler.shutdown()
        left = await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE status <> 'completed'"
        )
        assert left == 0, f"{left} jobs not completed"
        return {
            "jobs_per_s": round(n / elapsed),
            "py_us": round(cpu / n * 1e6, 1),
            "pg_us": round(pg / n * 1e6, 1),
        }
    finally:
        await _drop(dsn, pool, name)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dsn")
    args = parser.parse_args()
    dsn = server_dsn(args.dsn, "pgs-batches-")
    n = args.n
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        figures: dict[str, Any] = {}
        for kind, ran in (
            ("plain", await _drain(dsn, noop, n)),
            ("batch", await _drain(dsn, batched, n, args.size)),
        ):
            figures |= {f"{kind}_{key}": value for key, value in ran.items()}
        figures["handler_calls"] = _calls
        figures["batch_vs_plain"] = round(
            figures["batch_jobs_per_s"] / figures["plain_jobs_per_s"], 2
        )
        rounds.append(figures)
        print(f"round {r + 1}: {json.dumps(figures)}", flush=True)
    medians = {key: statistics.median(f[key] for f in rounds) for key in rounds[0]}
    print("MEDIAN " + json.dumps(medians))


if __name__ == "__main__":
    asyncio.run(main())
