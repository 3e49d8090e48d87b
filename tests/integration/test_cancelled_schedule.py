"""A ``schedule()`` cancelled while its in-process start is in flight (a
request handler that timed out, a task group torn down) leaves no row
``running`` under its worker: the row goes back to pending at once, without
counting an attempt, and shutdown hands back every row held here that this
process does not run. Another worker then runs those rows at once, not after
the lease."""

from __future__ import annotations

import asyncio
import random
from datetime import UTC, datetime

import pytest

from tests.support import handback_tasks as tasks
from tests.support.common import wait_for_status, wait_until

LEASE = 60.0  # far beyond what any wait here allows: no rescue explains a result


@pytest.fixture(autouse=True)
def fresh_tasks() -> None:
    tasks.reset()


async def cancel_schedules(scheduler, numbers: range, rng: random.Random) -> None:
    """``schedule()`` each number, cancelled at a random point of its way (before,
    during or after the insert), by ``task.cancel()`` or ``wait_for``'s timeout."""
    for n in numbers:
        call = scheduler.schedule(tasks.count_run, execution_time=datetime.now(UTC), args=(n,))
        if rng.random() < 0.5:
            task = asyncio.ensure_future(call)
            for _ in range(rng.randint(0, 8)):
                await asyncio.sleep(0)
            if rng.random() < 0.5:
                await asyncio.sleep(rng.uniform(0, 0.002))
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        else:
            try:
                await asyncio.wait_for(call, timeout=rng.uniform(0, 0.003))
            except TimeoutError:
                pass


async def rows_of(pool) -> list:
    return await pool.fetch(
        "SELECT (task_data->'args'->>0)::int AS n, status, attempts, worker_id"
        " FROM scheduled_jobs WHERE task_name = 'handback.count_run'"
    )


async def test_cancelled_schedules_leave_nothing_running_through_shutdown(pool, make_scheduler):
    rng = random.Random()
    worker = await make_scheduler(max_concurrent_jobs=20, lease_duration=LEASE)
    await cancel_schedules(worker, range(300), rng)
    # Some calls still in flight as the shutdown begins.
    late = [
        asyncio.ensure_future(
            worker.schedule(tasks.count_run, execution_time=datetime.now(UTC), args=(n,))
        )
        for n in range(300, 320)
    ]
    await asyncio.sleep(0)
    await worker.shutdown()
    await asyncio.gather(*late, return_exceptions=True)

    rows = await rows_of(pool)
    assert rows, "no schedule() call got its row written"
    left = [r for r in rows if r["status"] == "running"]
    assert left == [], f"{len(left)} of {len(rows)} rows left running"
    for r in rows:
        if r["status"] == "completed":
            assert tasks.runs[r["n"]] == 1, r
        else:
            assert r["status"] == "pending" and r["attempts"] == 0, r
            assert r["worker_id"] is None and tasks.runs[r["n"]] == 0, r

    # Another worker runs what was handed back at once (the lease is 60 s).
    waiting = [r["n"] for r in rows if r["status"] == "pending"]
    await make_scheduler(lease_duration=LEASE)

    async def all_done() -> bool:
        return all(r["status"] == "completed" for r in await rows_of(pool))

    await wait_until(all_done, timeout=15.0, message="the handed-back rows to complete")
    assert all(tasks.runs[r["n"]] == 1 for r in await rows_of(pool))
    assert all(tasks.runs[n] == 1 for n in waiting)


async def test_a_cancelled_schedule_hands_its_row_back_while_the_worker_runs(pool, make_scheduler):
    """Not only at shutdown: the row of an interrupted in-process start goes back
    at once (not at a heartbeat: none comes within this test) and this worker
    claims and runs it, once."""
    rng = random.Random()
    worker = await make_scheduler(
        max_concurrent_jobs=20,
        lease_duration=LEASE,
        heartbeat_interval=30.0,
        heartbeat_threshold=LEASE,
    )
    await cancel_schedules(worker, range(200), rng)

    async def settled() -> bool:
        rows = await rows_of(pool)
        return bool(rows) and all(r["status"] == "completed" for r in rows)

    await wait_until(settled, timeout=10.0, message="every written row to complete")
    assert all(tasks.runs[r["n"]] == 1 for r in await rows_of(pool))


async def test_shutdown_leaves_rows_another_live_worker_runs(pool, make_scheduler):
    runner = await make_scheduler(lease_duration=LEASE)
    job = await runner.schedule(tasks.hold, execution_time=datetime.now(UTC), args=("long",))
    await asyncio.wait_for(tasks.began("long").wait(), 10)
    other = await make_scheduler(lease_duration=LEASE)
    await cancel_schedules(other, range(50), random.Random())
    await other.shutdown()
    row = await pool.fetchrow(
        "SELECT status, worker_id, attempts FROM scheduled_jobs WHERE job_id = $1", job
    )
    assert (row["status"], row["worker_id"], row["attempts"]) == ("running", runner.worker_id, 1)
    tasks.gate("long").set()
    await wait_for_status(pool, job, "completed")
    assert tasks.runs["long"] == 1


async def test_the_shutdown_hand_back_spares_the_jobs_this_worker_runs(pool, make_scheduler):
    """The statement shutdown ends with, run on a live worker: a row held under
    its id that it does not run (a claim whose answer was lost) goes back; the
    job it is running stays."""
    worker = await make_scheduler(lease_duration=LEASE)
    job = await worker.schedule(tasks.hold, execution_time=datetime.now(UTC), args=("mine",))
    await asyncio.wait_for(tasks.began("mine").wait(), 10)
    await pool.execute(
        "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,"
        " task_data, worker_id, attempts, started_at, lease_until)"
        " VALUES ('lost-answer', 'count_run', 'handback.count_run', now(), 'running',"
        " '{\"args\": [7], \"kwargs\": {}}', $1, 1, now(), now() + interval '1 minute')",
        worker.worker_id,
    )
    assert await worker.worker.handback.hand_back_unowned() == ["lost-answer"]
    mine = await pool.fetchrow(
        "SELECT status, worker_id, attempts FROM scheduled_jobs WHERE job_id = $1", job
    )
    assert (mine["status"], mine["worker_id"], mine["attempts"]) == (
        "running",
        worker.worker_id,
        1,
    )
    # The handed-back row runs (here), with its attempt not counted twice.
    await wait_for_status(pool, "lost-answer", "completed")
    assert (
        await pool.fetchval("SELECT attempts FROM scheduled_jobs WHERE job_id = 'lost-answer'") == 1
    )
    assert tasks.runs[7] == 1
    tasks.gate("mine").set()
    await wait_for_status(pool, job, "completed")
