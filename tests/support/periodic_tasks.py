"""Periodic-job bodies shared by tests and their subprocesses (importable as
``tests.support.periodic_tasks``). Nothing here is decorated at import: each test or
subprocess declares the periodic jobs it needs, so other tests never see them."""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict
from datetime import timedelta

import asyncpg

from pg_scheduler import periodic

#: In-process runs, by name: (monotonic start, monotonic end).
runs: defaultdict[str, list[tuple[float, float]]] = defaultdict(list)
#: Set by a subprocess that wants each run written to ``periodic_runs``.
pool: asyncpg.Pool | None = None

RUNS_TABLE = """
CREATE TABLE IF NOT EXISTS periodic_runs (
    id      BIGSERIAL PRIMARY KEY,
    name    TEXT NOT NULL,
    pid     INTEGER NOT NULL,
    started TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
)
"""


async def record(name: str, seconds: float = 0.0) -> None:
    started = time.monotonic()
    if pool is not None:
        await pool.execute(
            "INSERT INTO periodic_runs (name, pid) VALUES ($1, $2)", name, os.getpid()
        )
    if seconds:
        await asyncio.sleep(seconds)
    runs[name].append((started, time.monotonic()))


async def tick() -> str:
    await record("tick")
    return "tick"


async def locked_sleeper() -> str:
    await record("locked_sleeper", float(os.environ.get("PERIODIC_LOCKED_SLEEP", "0")))
    return "slept"


def declare_tick(dedup_key: str, every: float) -> None:
    periodic(every=timedelta(seconds=every), dedup_key=dedup_key)(tick)


def declare_locked_sleeper(dedup_key: str) -> None:
    # Hourly: only manual triggers run it during a test.
    periodic(every=timedelta(hours=1), dedup_key=dedup_key, use_advisory_lock=True)(locked_sleeper)
