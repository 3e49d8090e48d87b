"""A rate-limited job (a per-key rate, or a task's or queue's global rate
limit) whose function would start later than the rate window's margin after
its claim was sent is stamped again first, or handed back when its window is
full (engine/rate_starts.py)."""

from __future__ import annotations

import time
from pathlib import Path

import asyncpg
import pytest

from pg_scheduler import JobSpec
from pg_scheduler.engine import rate_starts
from pg_scheduler.store.limits import LimitStore
from tests.support import key_tasks, limit_tasks, sync_tasks
from tests.support.common import wait_until
from tests.support.key_runs import finished, spans
from tests.support.spans import most_starts_in


async def _claimed_one(
    pool: asyncpg.Pool, scheduler, func=key_tasks.step, args=("r", 0), name: str = "keys.step"
):
    """One job of key ``r`` at 5/s claimed by the scheduler's worker (not started)."""
    await scheduler.schedule(func, args=args, concurrency_key="r", rate_limit_per_key="5/s")
    worker = scheduler.worker
    async with pool.acquire() as conn:
        claim = await worker.keyed.store.claim(
            conn,
            limit=1,
            tasks=[name],
            queues=None,
            worker_id=worker.worker_id,
            lease_seconds=60,
            cut=False,
        )
    (row,) = claim.rows
    return row


async def _stamps(pool: asyncpg.Pool) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT job_id, started_at FROM scheduler_key_starts WHERE concurrency_key = 'r'"
        " ORDER BY started_at"
    )


async def _fill_window(pool: asyncpg.Pool) -> None:
    """Five other starts of key ``r`` in its window, as other workers' claims."""
    await pool.execute(
        "INSERT INTO scheduler_key_starts (concurrency_key, started_at, job_id)"
        " SELECT 'r', clock_timestamp(), 'other-' || n FROM generate_series(1, 5) AS n"
    )


async def _start_late(scheduler, row, limited: bool = False) -> bool:
    """Run the claimed ``row`` as its worker would, its claim sent a second
    ago (so its start is late): execute_job's answer."""
    rate_starts = scheduler.worker.executor.rate_starts
    record = rate_starts.claimed_limited if limited else rate_starts.claimed
    record([row], time.monotonic() - 1.0)
    try:
        return await scheduler.worker.executor.execute_job(row)
    finally:
        # The completion's connection (a started worker lets go of it at shutdown).
        await scheduler.worker.completer.connection.release()


async def test_the_claim_stamps_each_start_with_its_job(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    row = await _claimed_one(pool, scheduler)
    assert [s["job_id"] for s in await _stamps(pool)] == [row["job_id"]]
    assert (row["claimed_rate"], row["claimed_period"]) == (5, 1.0)


async def test_a_late_start_with_room_moves_its_stamp_to_now(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    row = await _claimed_one(pool, scheduler)
    (before,) = await _stamps(pool)
    keys = scheduler.worker.keyed.store
    async with pool.acquire() as conn:
        moved = await keys.restamp(
            conn,
            key="r",
            job_id=row["job_id"],
            worker_id=scheduler.worker.worker_id,
            attempt=row["attempts"],
            most=5,
            period=1.0,
        )
    assert moved is True
    (after,) = await _stamps(pool)
    assert after["job_id"] == row["job_id"] and after["started_at"] > before["started_at"]


async def test_a_late_start_with_its_window_full_is_handed_back_unrun(pool, make_scheduler, runs):
    """Five other starts of the key landed in the window meanwhile: the late
    job's stamp goes, it is pending again with its attempt not spent, and its
    function never ran."""
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    row = await _claimed_one(pool, scheduler)
    await _fill_window(pool)
    assert await _start_late(scheduler, row) is False
    job = await pool.fetchrow(
        "SELECT status, attempts, worker_id FROM scheduled_jobs WHERE job_id = $1", row["job_id"]
    )
    assert (job["status"], job["attempts"], job["worker_id"]) == ("pending", 0, None)
    assert sorted(s["job_id"] for s in await _stamps(pool)) == [f"other-{n}" for n in range(1, 6)]
    assert await pool.fetchval("SELECT count(*) FROM key_runs") == 0
    assert not scheduler.worker.executor.rate_starts.stamped


async def test_a_late_start_no_longer_this_workers_writes_nothing_and_does_not_run(
    pool, make_scheduler, runs
):
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    row = await _claimed_one(pool, scheduler)
    # The lease was lost and another worker took the job meanwhile.
    await pool.execute(
        "UPDATE scheduled_jobs SET worker_id = 'elsewhere', attempts = attempts + 1"
        " WHERE job_id = $1",
        row["job_id"],
    )
    before = await _stamps(pool)
    assert await _start_late(scheduler, row) is False
    assert await _stamps(pool) == before
    job = await pool.fetchrow(
        "SELECT status, worker_id FROM scheduled_jobs WHERE job_id = $1", row["job_id"]
    )
    assert (job["status"], job["worker_id"]) == ("running", "elsewhere")
    assert await pool.fetchval("SELECT count(*) FROM key_runs") == 0


async def test_when_every_start_is_late_the_rate_holds_and_each_job_runs_once(
    pool, make_scheduler, runs, monkeypatch
):
    """A worker whose every function starts late (as if its loop were always
    busy): every start is stamped again before it runs, some are handed back
    and claimed again, and the starts of each key, timed by the functions
    themselves, stay within the rate."""
    stamped = rate_starts.RateStarts.claimed
    restamps = 0

    def late(self, rows, sent):
        stamped(self, rows, sent - 1.0)

    monkeypatch.setattr(rate_starts.RateStarts, "claimed", late)
    scheduler = await make_scheduler(max_concurrent_jobs=20, batch_claim_limit=20)
    keys = scheduler.worker.keyed.store
    real = keys.restamp

    async def counted(*args, **kwargs):
        nonlocal restamps
        restamps += 1
        return await real(*args, **kwargs)

    keys.restamp = counted
    await scheduler.schedule_bulk(
        [
            JobSpec(key_tasks.step, args=(key, n), concurrency_key=key, rate_limit_per_key="4/s")
            for n in range(10)
            for key in ("r1", "r2")
        ]
    )
    await finished(pool, 20, timeout=30)
    assert restamps >= 20
    for key in ("r1", "r2"):
        starts = [s for s, _ in await spans(pool, key)]
        assert len(starts) == 10
        assert most_starts_in(starts, 1.0) <= 4
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE status = 'completed' AND attempts = 1"
        )
        == 20
    )


@pytest.mark.parametrize(
    ("func", "name"),
    [(sync_tasks.mark_thread, "sync.mark_thread"), (sync_tasks.mark_process, "sync.mark_process")],
)
@pytest.mark.parametrize("full", [False, True])
async def test_a_late_thread_or_process_job_is_checked_where_its_function_starts(
    pool, make_scheduler, tmp_path: Path, func, name, full
):
    """The check runs in the thread that calls the function (a thread job) or
    that owns the process (before it sends the arguments): room, the stamp
    moves and the function runs; a full window, the function never runs and
    the job is pending again (a process job's child is reaped)."""
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    mark = tmp_path / "ran"
    row = await _claimed_one(pool, scheduler, func, (str(mark),), name)
    (before,) = await _stamps(pool)
    if full:
        await _fill_window(pool)
    result = await _start_late(scheduler, row)
    job = await pool.fetchrow(
        "SELECT status, attempts FROM scheduled_jobs WHERE job_id = $1", row["job_id"]
    )
    mine = [s for s in await _stamps(pool) if s["job_id"] == row["job_id"]]
    if full:
        assert result is False and not mark.exists()
        assert (job["status"], job["attempts"]) == ("pending", 0)
        assert mine == []
    else:
        assert mark.exists()
        (after,) = mine
        assert after["started_at"] > before["started_at"]
        # The function started after its new stamp.
        assert float(mark.read_text()) >= after["started_at"].timestamp()
        assert (job["status"], job["attempts"]) == ("completed", 1)
    assert scheduler.worker.executor.sync.pids == {}


# -- global rate limits (scheduler_limits) --------------------------------------------


async def _limit_runs(pool: asyncpg.Pool) -> None:
    await pool.execute(
        "CREATE TABLE IF NOT EXISTS limit_runs (n int, pid int, started float8, ended float8)"
    )
    await pool.execute("TRUNCATE limit_runs")


async def _limited_one(pool: asyncpg.Pool, scheduler):
    """One job of ``limits.rated`` (5/s) claimed by the worker's limited claim (not started)."""
    await scheduler.configure_task("limits.rated", rate_limit="5/s")
    await scheduler.schedule(limit_tasks.rated, args=(0,))
    worker = scheduler.worker
    async with pool.acquire() as conn:
        rows = await worker.limits.store.claim(
            conn,
            [("task", "limits.rated")],
            limit=1,
            tasks=["limits.rated"],
            queues=None,
            caps=None,
            worker_id=worker.worker_id,
            lease_seconds=60,
        )
    (row,) = rows
    return row


async def _limit_starts(pool: asyncpg.Pool) -> list:
    return list(
        await pool.fetchval(
            "SELECT recent_starts FROM scheduler_limits"
            " WHERE scope = 'task' AND name = 'limits.rated'"
        )
    )


async def test_a_limited_claim_returns_its_stamp_and_the_rates_margin(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    row = await _limited_one(pool, scheduler)
    assert await _limit_starts(pool) == [row["limit_stamp"]]
    assert row["limit_margin"] == pytest.approx(LimitStore.margin(1.0))


@pytest.mark.parametrize("full", [False, True])
async def test_a_late_start_of_a_limited_job_moves_its_stamp_or_is_handed_back(
    pool, make_scheduler, dsn, monkeypatch, full
):
    monkeypatch.setenv("PG_SCHEDULER_DSN", dsn)
    await _limit_runs(pool)
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    row = await _limited_one(pool, scheduler)
    if full:  # five starts of other workers' claims landed meanwhile
        await pool.execute(
            "UPDATE scheduler_limits SET recent_starts = recent_starts"
            " || array_fill(clock_timestamp(), ARRAY[5]) WHERE name = 'limits.rated'"
        )
    others = [s for s in await _limit_starts(pool) if s != row["limit_stamp"]]
    await _start_late(scheduler, row, limited=True)
    job = await pool.fetchrow(
        "SELECT status, attempts FROM scheduled_jobs WHERE job_id = $1", row["job_id"]
    )
    starts = await _limit_starts(pool)
    ran = await pool.fetch("SELECT started FROM limit_runs")
    if full:
        assert (job["status"], job["attempts"]) == ("pending", 0)
        assert starts == others and ran == []
    else:
        assert (job["status"], job["attempts"]) == ("completed", 1)
        (moved,) = starts
        assert moved > row["limit_stamp"]
        (run,) = ran
        assert run["started"] >= moved.timestamp()


async def test_when_every_limited_start_is_late_the_global_rate_holds(
    pool, make_scheduler, dsn, monkeypatch
):
    monkeypatch.setenv("PG_SCHEDULER_DSN", dsn)
    await _limit_runs(pool)
    stamped = rate_starts.RateStarts.claimed_limited

    def late(self, rows, sent):
        stamped(self, rows, sent - 1.0)

    monkeypatch.setattr(rate_starts.RateStarts, "claimed_limited", late)
    scheduler = await make_scheduler(max_concurrent_jobs=20, batch_claim_limit=20)
    await scheduler.configure_task("limits.rated", rate_limit="4/s")
    await scheduler.schedule_bulk([JobSpec(limit_tasks.rated, args=(n,)) for n in range(12)])

    async def all_ran() -> bool:
        return await pool.fetchval("SELECT count(*) FROM limit_runs") == 12

    await wait_until(all_ran, timeout=30, message="12 runs")
    starts = [r["started"] for r in await pool.fetch("SELECT started FROM limit_runs")]
    assert most_starts_in(starts, 1.0) <= 4
    assert max(starts) - min(starts) >= 2.0  # 12 starts at 4/s need three windows
    assert sorted(r["n"] for r in await pool.fetch("SELECT n FROM limit_runs")) == list(range(12))
