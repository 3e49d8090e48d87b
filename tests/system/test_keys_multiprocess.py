"""Concurrency keys across three worker processes, one killed with SIGKILL
midway: an ordered key's jobs run one at a time in enqueue order, no key
ever runs more than its max_running_per_key, and no key starts more than
its rate allows (spans recorded by the job bodies)."""

from __future__ import annotations

import asyncio
import signal
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from pg_scheduler import JobSpec, Scheduler
from tests.support import key_tasks
from tests.support.common import start_cli_worker, wait_until
from tests.support.spans import max_overlap, most_starts_in

ORDERED = 40
CAPPED_KEYS = 4
PER_KEY = 20


async def stop(workers: list[asyncio.subprocess.Process]) -> None:
    for w in workers:
        if w.returncode is None:
            w.terminate()
    for w in workers:
        try:
            await asyncio.wait_for(w.wait(), 20)
        except TimeoutError:
            w.kill()
            await w.wait()


async def run_with_a_kill(
    pool: asyncpg.Pool, dsn: str, specs: list[JobSpec], kill_after: int, done: str, expected: int
) -> None:
    """Three ``key_tasks`` workers run ``specs``; one is killed with SIGKILL
    once ``kill_after`` runs are recorded; returns when ``done`` (a count of
    completed jobs) reaches ``expected``, the workers stopped."""
    await key_tasks.make_table(pool)
    workers = [await start_cli_worker(dsn, "tests.support.key_tasks:SETTINGS") for _ in range(3)]
    try:

        async def registered() -> bool:
            return await pool.fetchval("SELECT count(*) FROM scheduler_workers") >= 3

        await wait_until(registered, timeout=60, interval=0.1, message="3 workers")
        await Scheduler(pool).schedule_bulk(specs)  # never started: it only enqueues

        async def some_ran() -> bool:
            return await pool.fetchval("SELECT count(*) FROM key_runs") >= kill_after

        await wait_until(some_ran, timeout=60, interval=0.02, message=f"{kill_after} runs")
        workers[0].send_signal(signal.SIGKILL)
        await workers[0].wait()

        async def all_done() -> bool:
            return await pool.fetchval(done) == expected

        await wait_until(all_done, timeout=120, interval=0.1, message="every job completed")
    finally:
        await stop(workers)


@pytest.mark.slow
async def test_keys_hold_across_processes_and_a_killed_worker(pool: asyncpg.Pool, dsn: str):
    specs = [
        JobSpec(key_tasks.step, args=("ordered", n, 0.05), concurrency_key="o", ordered=True)
        for n in range(ORDERED)
    ]
    specs += [
        JobSpec(key_tasks.hold, args=(f"cap{k}", n, 0.1))  # the task's key, 2 at once
        for n in range(PER_KEY)
        for k in range(CAPPED_KEYS)
    ]
    await run_with_a_kill(
        pool,
        dsn,
        specs,
        kill_after=15,
        done="SELECT count(*) FROM scheduled_jobs WHERE status = 'completed'",
        expected=len(specs),
    )

    rows = await pool.fetch(
        "SELECT n, started, ended FROM key_runs WHERE key = 'ordered' ORDER BY started"
    )
    order = [r["n"] for r in rows]
    # A run the kill cut short may run again (recorded twice), never out of order.
    assert order == sorted(order) and set(order) == set(range(ORDERED))
    assert max_overlap([(r["started"], r["ended"]) for r in rows]) == 1
    for k in range(CAPPED_KEYS):
        spans = await pool.fetch("SELECT started, ended FROM key_runs WHERE key = $1", f"cap{k}")
        assert len({*range(PER_KEY)}) == PER_KEY
        assert max_overlap([(r["started"], r["ended"]) for r in spans]) <= 2
    assert await pool.fetchval("SELECT count(DISTINCT pid) FROM key_runs") >= 2


RATED_KEYS = 4
RATED_PER_KEY = 16


@pytest.mark.slow
async def test_per_key_rates_hold_by_body_time_with_stalled_loops_and_a_killed_worker(
    pool: asyncpg.Pool, dsn: str
):
    """Jobs that block their worker's loop make other jobs of that worker
    start late (each is stamped again or handed back), and a worker is killed
    midway: every rated job runs, and no key starts more than 4 bodies in any
    1 s span, as the bodies' own clocks time them."""
    now = datetime.now(UTC)
    specs = [
        JobSpec(
            key_tasks.step,
            now,
            (f"rated{k}", n),
            concurrency_key=f"rated{k}",
            rate_limit_per_key="4/s",
        )
        for n in range(RATED_PER_KEY)
        for k in range(RATED_KEYS)
    ]
    # Loop stalls of 0.4 s, one every 0.2 s for 4 s, in whichever worker takes them.
    specs += [
        JobSpec(key_tasks.block_loop, now + timedelta(seconds=0.2 * i), (0.4,)) for i in range(20)
    ]
    await run_with_a_kill(
        pool,
        dsn,
        specs,
        kill_after=8,
        done="SELECT count(*) FROM scheduled_jobs"
        " WHERE status = 'completed' AND task_name = 'keys.step'",
        expected=RATED_KEYS * RATED_PER_KEY,
    )

    for k in range(RATED_KEYS):
        rows = await pool.fetch("SELECT n, started FROM key_runs WHERE key = $1", f"rated{k}")
        # A run the kill cut short may run again: every run is a start the rate counts.
        assert {r["n"] for r in rows} == set(range(RATED_PER_KEY))
        assert most_starts_in([r["started"] for r in rows], 1.0) <= 4
