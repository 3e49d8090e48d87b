"""Declared dependencies: chains drained beside a plain drain, the delay from a
dependency's completion to its dependent's start, and a diamond enqueued.

``python benchmarks/chains.py [--chains 100] [--length 100] [--rounds 3] [--dsn DSN]``
(from the repository root, with this tree's library importable). One embedded
server (or ``--dsn``); each round, in a fresh database each:

* plain: ``chains x length`` no-op jobs bulk-enqueued (jobs/s of that
  ``schedule_bulk``), drained by one
  ``Scheduler(max_concurrent_jobs=50, batch_claim_limit=50)``;
* beside waiting: the same plain drain with as many jobs waiting on a job due
  in an hour (what waiting jobs cost the claim);
* chains: as many no-op jobs as ``chains`` chains of ``length``
  (``pg_scheduler.chain``, one ``schedule_bulk``), drained by the same
  Scheduler; reported as jobs/s and as a ratio to the plain drain of the
  same round. The delay of each edge is the dependent's ``started_at`` (its
  claim) minus its dependency's ``finished_at`` (its completion), both the
  database's ``now()``: p50 and p99 over every edge (zero for a dependent
  its dependency's completion took over: the same statement), and the
  delay between the two jobs' bodies as they ran (this process's clock);
* single: one chain of ``length`` jobs alone, the same delays with no other
  work in the way (the mechanism's own cost: completion, trigger, NOTIFY,
  claim);
* diamond: one root, ``chains x length - 2`` jobs depending on it, one job
  depending on all of those, in one ``schedule_bulk``: nodes/s of that call
  (the specs built beforehand), and as a ratio to the plain enqueue.

Medians over the rounds are printed last, with every round's figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import structlog
from checkouts import admin, database_dsn, server_dsn  # benchmarks/, next to this script

from pg_scheduler import JobSpec, Scheduler, chain, task

structlog.configure(
    wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
    cache_logger_on_first_use=True,
)

_done = 0
_target = 0
_finished: asyncio.Event | None = None
#: When each job's body ran (this process's clock), by its argument.
_bodies: dict[int, float] = {}


@task(name="bench.noop")
async def noop(i: int) -> None:
    global _done
    _bodies[i] = time.perf_counter()
    _done += 1
    if _done >= _target and _finished is not None:
        _finished.set()


async def _fresh(dsn: str) -> tuple[asyncpg.Pool, str]:
    name = f"chains_{uuid.uuid4().hex[:8]}"
    await admin(dsn, f'CREATE DATABASE "{name}"')
    pool = await asyncpg.create_pool(database_dsn(dsn, name), min_size=2, max_size=10)
    await Scheduler(pool).initialize_db()
    return pool, name


async def _drop(dsn: str, pool: asyncpg.Pool, name: str) -> None:
    await pool.close()
    await admin(dsn, f'DROP DATABASE "{name}" WITH (FORCE)')


async def _drain(pool: asyncpg.Pool, count: int, left_waiting: int = 0) -> float:
    """Seconds for one Scheduler to run ``count`` enqueued jobs (besides
    ``left_waiting`` that stay waiting, and the job they wait for)."""
    global _done, _target, _finished
    _done, _target, _finished = 0, count, asyncio.Event()
    await pool.execute("VACUUM ANALYZE")
    await pool.execute("CHECKPOINT")
    scheduler = Scheduler(pool, max_concurrent_jobs=50, batch_claim_limit=50)
    started = time.perf_counter()
    await scheduler.start()
    await asyncio.wait_for(_finished.wait(), 900)
    elapsed = time.perf_counter() - started
    await scheduler.shutdown()
    left = await pool.fetchval("SELECT count(*) FROM scheduled_jobs WHERE status <> 'completed'")
    assert left == (left_waiting + 1 if left_waiting else 0), f"{left} jobs not completed"
    return elapsed


def _when() -> datetime:
    return datetime.now(UTC) - timedelta(seconds=1)


async def _delays(pool: asyncpg.Pool) -> list[float]:
    """Milliseconds from each dependency's completion to its dependent's claim."""
    rows = await pool.fetch(
        """SELECT EXTRACT(EPOCH FROM (d.started_at - p.finished_at)) * 1000 AS ms
             FROM job_dependencies e
             JOIN scheduled_jobs p ON p.job_id = e.depends_on
             JOIN scheduled_jobs d ON d.job_id = e.job_id"""
    )
    return sorted(float(r["ms"]) for r in rows)


def _body_delays(count: int, length: int) -> list[float]:
    """Milliseconds from each chain job's body to its successor's body (as
    the bodies saw them: the completion's write, the hand-over or claim, and
    the start, whatever the database stamped)."""
    return sorted(
        (_bodies[c * length + i + 1] - _bodies[c * length + i]) * 1000
        for c in range(count)
        for i in range(length - 1)
    )


def _pct(values: list[float], q: float) -> float:
    return round(values[min(len(values) - 1, int(q * len(values)))], 2)


async def plain(dsn: str, n: int) -> dict[str, Any]:
    pool, name = await _fresh(dsn)
    try:
        when = _when()
        specs = [JobSpec(noop, when, (i,)) for i in range(n)]
        started = time.perf_counter()
        await Scheduler(pool).schedule_bulk(specs)
        enqueued = time.perf_counter() - started
        return {
            "plain_enqueue_per_s": round(n / enqueued),
            "plain_jobs_per_s": round(n / await _drain(pool, n)),
        }
    finally:
        await _drop(dsn, pool, name)


async def beside_waiting(dsn: str, n: int) -> dict[str, Any]:
    """The plain drain with as many jobs waiting on a job due in an hour."""
    pool, name = await _fresh(dsn)
    try:
        scheduler = Scheduler(pool)
        later = datetime.now(UTC) + timedelta(hours=1)
        gate = JobSpec(noop, later, (-1,))
        await scheduler.schedule_bulk(
            [gate, *(JobSpec(noop, _when(), (i,), depends_on=[gate]) for i in range(n))]
        )
        when = _when()
        await scheduler.schedule_bulk([JobSpec(noop, when, (i,)) for i in range(n)])
        return {"plain_beside_waiting_jobs_per_s": round(n / await _drain(pool, n, n))}
    finally:
        await _drop(dsn, pool, name)


async def chains(dsn: str, count: int, length: int) -> dict[str, Any]:
    pool, name = await _fresh(dsn)
    try:
        when = _when()
        specs = [
            spec
            for c in range(count)
            for spec in chain(*(JobSpec(noop, when, (c * length + i,)) for i in range(length)))
        ]
        await Scheduler(pool).schedule_bulk(specs)
        _bodies.clear()
        elapsed = await _drain(pool, len(specs))
        delays = await _delays(pool)
        bodies = _body_delays(count, length)
        return {
            "chain_jobs_per_s": round(len(specs) / elapsed),
            "delay_p50_ms": _pct(delays, 0.5),
            "delay_p99_ms": _pct(delays, 0.99),
            "body_delay_p50_ms": _pct(bodies, 0.5),
            "body_delay_p99_ms": _pct(bodies, 0.99),
        }
    finally:
        await _drop(dsn, pool, name)


async def diamond(dsn: str, nodes: int) -> dict[str, Any]:
    pool, name = await _fresh(dsn)
    try:
        when = datetime.now(UTC) + timedelta(hours=1)
        built = time.perf_counter()
        root = JobSpec(noop, when, (0,))
        middle = [JobSpec(noop, when, (i,), depends_on=[root]) for i in range(1, nodes - 1)]
        sink = JobSpec(noop, when, (nodes - 1,), depends_on=middle)
        specs = [root, *middle, sink]
        built = time.perf_counter() - built
        started = time.perf_counter()
        ids = await Scheduler(pool).schedule_bulk(specs)
        elapsed = time.perf_counter() - started
        assert len(ids) == nodes
        return {
            "diamond_nodes_per_s": round(nodes / elapsed),
            "diamond_specs_built_per_s": round(nodes / built),
        }
    finally:
        await _drop(dsn, pool, name)


async def single(dsn: str, length: int) -> dict[str, Any]:
    pool, name = await _fresh(dsn)
    try:
        when = _when()
        specs = list(chain(*(JobSpec(noop, when, (i,)) for i in range(length))))
        await Scheduler(pool).schedule_bulk(specs)
        _bodies.clear()
        await _drain(pool, length)
        delays = await _delays(pool)
        bodies = _body_delays(1, length)
        return {
            "single_p50_ms": _pct(delays, 0.5),
            "single_p99_ms": _pct(delays, 0.99),
            "single_body_p50_ms": _pct(bodies, 0.5),
            "single_body_p99_ms": _pct(bodies, 0.99),
        }
    finally:
        await _drop(dsn, pool, name)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chains", type=int, default=100)
    parser.add_argument("--length", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dsn")
    args = parser.parse_args()
    dsn = server_dsn(args.dsn, "pgs-chains-")
    n = args.chains * args.length
    rounds: list[dict[str, Any]] = []
    for r in range(args.rounds):
        figures = await plain(dsn, n)
        figures |= await beside_waiting(dsn, n)
        figures |= await chains(dsn, args.chains, args.length)
        figures["chains_vs_plain"] = round(
            figures["chain_jobs_per_s"] / figures["plain_jobs_per_s"], 3
        )
        figures |= await single(dsn, args.length)
        figures |= await diamond(dsn, n)
        figures["diamond_vs_plain_enqueue"] = round(
            figures["diamond_nodes_per_s"] / figures["plain_enqueue_per_s"], 3
        )
        rounds.append(figures)
        print(f"round {r + 1}: {json.dumps(figures)}", flush=True)
    medians = {key: statistics.median(f[key] for f in rounds) for key in rounds[0]}
    print("MEDIAN " + json.dumps(medians))


if __name__ == "__main__":
    asyncio.run(main())
