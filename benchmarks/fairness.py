"""Weighted fair share measured: starts per tenant over time, two worker processes.

``python benchmarks/fairness.py [--scale 1.0] [--workers 2] [--dsn DSN]``
(from the repository root, with this tree's library importable). One
embedded server (or ``--dsn``); three drains, each in a fresh database, each
by ``--workers`` worker processes (``Scheduler(max_concurrent_jobs=50,
batch_claim_limit=50)``) started once the backlog is in:

* equal: four tenants with backlogs of 200,000, 20,000, 2,000 and 200 jobs
  (times ``--scale``), equal weights, all due, the biggest enqueued first;
* weights: four tenants of 50,000 jobs each (times ``--scale``) with weights
  1, 2, 4 and 8;
* plain: as many jobs as ``equal`` without a key (the drain fair share must
  leave alone), by the same workers.

Every job body records ``time.time()`` and its tenant; each worker writes
its records to a file when the queue is empty. Reported per drain: jobs/s
(first start to last; and as a ratio to the plain drain), each tenant's
first and last start (seconds from the drain's first start), and, over every
1 s window (and every 100 ms window) in which at least two tenants have work
throughout (a tenant has work until its last start), Jain's fairness index
of the starts divided by weight, (sum x)^2 / (n * sum x^2), over those
tenants: its minimum and median; for ``weights``, each tenant's share of
the starts while all four had work, against its weight's share.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
from checkouts import admin, database_dsn, server_dsn  # benchmarks/, next to this script

from pg_scheduler import JobSpec, Scheduler, task

STARTS: list[tuple[float, str]] = []


@task(name="bench.fair_record")
async def record(tenant: str) -> None:
    STARTS.append((time.time(), tenant))


async def child(dsn: str, out: str) -> None:
    """A worker process: runs jobs until the queue is empty, then writes its starts."""
    import logging

    import structlog

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING),
        cache_logger_on_first_use=True,
    )
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=8)
    scheduler = Scheduler(pool, max_concurrent_jobs=50, batch_claim_limit=50, vacuum_enabled=False)
    await scheduler.start()
    idle_since: float | None = None
    while True:
        await asyncio.sleep(0.25)
        left = await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE status IN ('pending', 'running')"
        )
        if left:
            idle_since = None
        elif idle_since is None:
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > 0.5:
            break
    await scheduler.shutdown()
    await pool.close()
    await asyncio.to_thread(Path(out).write_text, json.dumps(STARTS))


async def _fresh(dsn: str) -> tuple[asyncpg.Pool, str]:
    name = f"fair_{uuid.uuid4().hex[:8]}"
    await admin(dsn, f'CREATE DATABASE "{name}"')
    pool = await asyncpg.create_pool(database_dsn(dsn, name), min_size=2, max_size=10)
    await Scheduler(pool).initialize_db()
    return pool, name


async def _drain(dsn: str, tenants: list[tuple[str, int, float | None]]) -> list[tuple[float, str]]:
    """Enqueue each tenant's backlog (name, jobs, weight; a None weight: no key
    at all), run the workers until it is drained; every start (time, tenant)."""
    pool, name = await _fresh(dsn)
    try:
        scheduler = Scheduler(pool)
        when = datetime.now(UTC) - timedelta(seconds=1)
        for tenant, count, weight in tenants:
            keyed = weight is not None
            specs = [
                JobSpec(
                    record,
                    when,
                    (tenant,),
                    fair_share_key=tenant if keyed else None,
                    fair_share_weight=weight if keyed and weight != 1 else None,
                )
                for _ in range(count)
            ]
            for start in range(0, len(specs), 50_000):
                await scheduler.schedule_bulk(specs[start : start + 50_000])
        await pool.execute("VACUUM ANALYZE")
        await pool.execute("CHECKPOINT")
        files = [tempfile.mktemp(suffix=".json") for _ in range(ARGS.workers)]
        env = {**os.environ, "PYTHONPATH": os.getcwd()}
        procs = [
            await asyncio.create_subprocess_exec(
                sys.executable, __file__, "--child", database_dsn(dsn, name), out, env=env
            )
            for out in files
        ]
        for proc in procs:
            if await asyncio.wait_for(proc.wait(), 3600) != 0:
                raise RuntimeError(f"worker exited with {proc.returncode}")
        starts: list[tuple[float, str]] = []
        for out in files:
            text = await asyncio.to_thread(Path(out).read_text)
            starts += [(float(s[0]), str(s[1])) for s in json.loads(text)]
            os.unlink(out)
        left = await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE status <> 'completed'"
        )
        assert left == 0, f"{left} jobs not completed"
        assert len(starts) == sum(c for _, c, _ in tenants), "a start was not recorded"
        return sorted(starts)
    finally:
        await pool.close()
        await admin(dsn, f'DROP DATABASE "{name}" WITH (FORCE)')


def _jain(values: list[float]) -> float:
    total = sum(values)
    return total * total / (len(values) * sum(v * v for v in values)) if total else 1.0


def _windows(
    starts: list[tuple[float, str]], weights: dict[str, float], width: float
) -> list[float]:
    """Jain's index of starts/weight in each ``width`` window where at least two
    tenants have work throughout."""
    t0 = starts[0][0]
    last = {t: max(s for s, x in starts if x == t) for t in weights}
    found = []
    edge = t0
    while edge + width <= starts[-1][0]:
        busy = [t for t in weights if last[t] >= edge + width]
        if len(busy) >= 2:
            counts = dict.fromkeys(busy, 0)
            for s, t in starts:
                if edge <= s < edge + width and t in counts:
                    counts[t] += 1
            found.append(_jain([counts[t] / weights[t] for t in busy]))
        edge += width
    return found


def _report(label: str, starts: list[tuple[float, str]], weights: dict[str, float]) -> dict:
    t0, t1 = starts[0][0], starts[-1][0]
    out: dict[str, Any] = {"jobs": len(starts), "jobs_per_s": round(len(starts) / (t1 - t0))}
    tenants = {}
    for t in weights:
        mine = [s for s, x in starts if x == t]
        tenants[t] = {
            "jobs": len(mine),
            "first_s": round(mine[0] - t0, 3),
            "last_s": round(mine[-1] - t0, 3),
        }
    out["tenants"] = tenants
    if len(weights) > 1:
        for width in (1.0, 0.1):
            j = _windows(starts, weights, width)
            if j:
                out[f"jain_{width:g}s"] = {
                    "windows": len(j),
                    "min": round(min(j), 4),
                    "median": round(statistics.median(j), 4),
                }
        # Shares while all tenants had work.
        until = min(tenants[t]["last_s"] for t in weights) + t0
        counts = dict.fromkeys(weights, 0)
        for s, t in starts:
            if s <= until:
                counts[t] += 1
        total = sum(counts.values())
        wsum = sum(weights.values())
        out["shares_while_all_busy"] = {
            t: {
                "share": round(counts[t] / total, 4),
                "weight_share": round(weights[t] / wsum, 4),
                "off_by": round(counts[t] / total / (weights[t] / wsum) - 1, 4),
            }
            for t in weights
        }
        out["all_busy_s"] = round(until - t0, 3)
    print(label, json.dumps(out), flush=True)
    return out


async def main() -> None:
    dsn = server_dsn(ARGS.dsn, "fairness-bench-")
    scale = ARGS.scale
    sizes = [max(1, round(n * scale)) for n in (200_000, 20_000, 2_000, 200)]
    equal = [(f"t{i}_{n}", n, 1.0) for i, n in enumerate(sizes)]
    each = max(1, round(50_000 * scale))
    weighted = [(f"w{w}", each, float(w)) for w in (1, 2, 4, 8)]
    results = {}
    results["plain"] = _report("plain", await _drain(dsn, [("plain", sum(sizes), None)]), {})
    results["equal"] = _report("equal", await _drain(dsn, equal), {t: w for t, _, w in equal})
    results["weights"] = _report(
        "weights", await _drain(dsn, weighted), {t: w for t, _, w in weighted}
    )
    results["plain_again"] = _report(
        "plain_again", await _drain(dsn, [("plain", sum(sizes), None)]), {}
    )
    plain = statistics.mean([results["plain"]["jobs_per_s"], results["plain_again"]["jobs_per_s"]])
    print(
        "ratios to the plain drain:",
        json.dumps({k: round(results[k]["jobs_per_s"] / plain, 3) for k in ("equal", "weights")}),
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        asyncio.run(child(sys.argv[2], sys.argv[3]))
        sys.exit(0)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", help="PostgreSQL server (default: an embedded one)")
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--workers", type=int, default=2)
    ARGS = parser.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    asyncio.run(main())
