"""Vacuum policies against real PostgreSQL: what goes, what stays, who vacuums."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from pg_scheduler import VacuumConfig, VacuumPolicy
from pg_scheduler.store.housekeeping import VACUUM_LOCK_KEY
from tests.support import app_tasks
from tests.support.common import wait_for_status, wait_until

NEVER = VacuumPolicy.never()


def only(**policies: VacuumPolicy) -> VacuumConfig:
    """A config that deletes nothing except what ``policies`` say."""
    base = {"completed": NEVER, "failed": NEVER, "cancelled": NEVER, "expired": NEVER}
    return VacuumConfig(**{**base, **policies})


async def add_row(
    pool,
    job_id: str,
    status: str,
    *,
    finished_ago: timedelta | None = timedelta(0),
    created_ago: timedelta = timedelta(0),
    job_name: str = "job",
) -> None:
    await pool.execute(
        """
        INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,
                                    created_at, finished_at)
        VALUES ($1, $2, $2, now() - $4::interval, $3, now() - $4::interval,
                CASE WHEN $5::interval IS NULL THEN NULL ELSE now() - $5::interval END)
        """,
        job_id,
        job_name,
        status,
        created_ago,
        finished_ago,
    )


async def ids(pool) -> set[str]:
    return {r["job_id"] for r in await pool.fetch("SELECT job_id FROM scheduled_jobs")}


async def test_after_days_measures_age_from_finish_not_creation(pool, make_scheduler):
    scheduler = await make_scheduler(
        start=False, vacuum_config=only(completed=VacuumPolicy.after_days(1))
    )
    await add_row(pool, "old", "completed", finished_ago=timedelta(days=2))
    # Created long ago, but finished an hour ago: stays.
    await add_row(
        pool, "late", "completed", finished_ago=timedelta(hours=1), created_ago=timedelta(days=30)
    )
    await add_row(pool, "pending", "pending", finished_ago=None, created_ago=timedelta(days=30))
    await add_row(pool, "failed-old", "failed", finished_ago=timedelta(days=30))
    counts = await scheduler.run_vacuum()
    assert counts == {"completed": 1, "failed": 0, "cancelled": 0, "expired": 0}
    assert await ids(pool) == {"late", "pending", "failed-old"}


async def test_fractional_days(pool, make_scheduler):
    policy = VacuumPolicy.after_days(1 / 24)  # one hour
    scheduler = await make_scheduler(start=False, vacuum_config=only(failed=policy))
    await add_row(pool, "two-hours", "failed", finished_ago=timedelta(hours=2))
    await add_row(pool, "half-hour", "failed", finished_ago=timedelta(minutes=30))
    assert (await scheduler.run_vacuum())["failed"] == 1
    assert await ids(pool) == {"half-hour"}


async def test_immediate_deletes_every_finished_row_of_that_status(pool, make_scheduler):
    scheduler = await make_scheduler(
        start=False, vacuum_config=only(cancelled=VacuumPolicy.immediate())
    )
    await add_row(pool, "c1", "cancelled", finished_ago=timedelta(0))
    await add_row(pool, "c2", "cancelled", finished_ago=timedelta(days=9))
    await add_row(pool, "done", "completed")
    await add_row(pool, "running", "running", finished_ago=None)
    assert (await scheduler.run_vacuum())["cancelled"] == 2
    assert await ids(pool) == {"done", "running"}


async def test_immediate_completed_deletes_on_completion(pool, make_scheduler):
    scheduler = await make_scheduler(
        vacuum_enabled=True, vacuum_config=VacuumConfig(completed=VacuumPolicy.immediate())
    )
    job_id = await scheduler.schedule(app_tasks.add, execution_time=datetime.now(UTC), args=(1, 2))
    failing = await scheduler.schedule(app_tasks.boom, execution_time=datetime.now(UTC))
    await wait_for_status(pool, failing, "failed")

    async def gone() -> bool:
        return await scheduler.get_job(job_id) is None

    await wait_until(gone, message="completed row deleted")
    # Failed rows follow their own policy (after_days(7)): kept.
    assert (await scheduler.get_job(failing)).error.startswith("ValueError")


async def test_keep_last_is_per_job_name(pool, make_scheduler):
    scheduler = await make_scheduler(
        start=False, vacuum_config=only(completed=VacuumPolicy.keep_last(2), batch_size=1)
    )
    for i in range(5):
        await add_row(
            pool, f"a{i}", "completed", finished_ago=timedelta(minutes=10 - i), job_name="a"
        )
    for i in range(3):
        await add_row(
            pool, f"b{i}", "completed", finished_ago=timedelta(minutes=10 - i), job_name="b"
        )
    await add_row(pool, "c0", "completed", job_name="c")
    # Other statuses of the same names are not counted nor touched.
    await add_row(pool, "a-failed", "failed", job_name="a")
    counts = await scheduler.run_vacuum()
    assert counts["completed"] == 4
    assert await ids(pool) == {"a3", "a4", "b1", "b2", "c0", "a-failed"}
    # Idempotent once within the limit.
    assert (await scheduler.run_vacuum())["completed"] == 0


async def test_keep_last_zero_and_same_finish_time(pool, make_scheduler):
    scheduler = await make_scheduler(
        start=False,
        vacuum_config=only(failed=VacuumPolicy.keep_last(0), expired=VacuumPolicy.keep_last(1)),
    )
    await add_row(pool, "f1", "failed")
    await add_row(pool, "f2", "failed")
    # Three rows finished in the same instant (one statement): exactly one stays.
    await pool.execute(
        """
        INSERT INTO scheduled_jobs
            (job_id, job_name, task_name, execution_time, status, finished_at)
        SELECT 'e' || i, 'e', 'e', now(), 'expired', now() FROM generate_series(1, 3) i
        """
    )
    counts = await scheduler.run_vacuum()
    assert counts["failed"] == 2 and counts["expired"] == 2
    assert await ids(pool) == {"e3"}  # ties broken by job_id, highest kept


async def test_never_keeps_everything(pool, make_scheduler):
    scheduler = await make_scheduler(start=False, vacuum_config=only())
    for status in ("completed", "failed", "cancelled", "expired"):
        await add_row(pool, status, status, finished_ago=timedelta(days=365))
    assert await scheduler.run_vacuum() == {
        "completed": 0,
        "failed": 0,
        "cancelled": 0,
        "expired": 0,
    }
    assert len(await ids(pool)) == 4


async def test_documented_defaults_including_expired(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)  # VacuumConfig(): 1, 7, 3 and 3 days
    ages = {"completed": 1, "failed": 7, "cancelled": 3, "expired": 3}
    for status, days in ages.items():
        await add_row(pool, f"{status}-old", status, finished_ago=timedelta(days=days, hours=1))
        await add_row(pool, f"{status}-new", status, finished_ago=timedelta(days=days, hours=-1))
    counts = await scheduler.run_vacuum()
    assert counts == {status: 1 for status in ages}
    assert await ids(pool) == {f"{status}-new" for status in ages}


async def test_batches_delete_everything_in_bounded_statements(pool, make_scheduler):
    scheduler = await make_scheduler(
        start=False, vacuum_config=only(completed=VacuumPolicy.immediate(), batch_size=7)
    )
    await pool.execute(
        """
        INSERT INTO scheduled_jobs
            (job_id, job_name, task_name, execution_time, status, finished_at)
        SELECT 'j' || i, 'n' || (i % 3), 't', now(), 'completed', now()
          FROM generate_series(1, 100) i
        """
    )
    assert (await scheduler.run_vacuum())["completed"] == 100
    assert await ids(pool) == set()


async def test_vacuum_skips_locked_rows_instead_of_waiting(pool, make_scheduler):
    scheduler = await make_scheduler(
        start=False, vacuum_config=only(completed=VacuumPolicy.immediate())
    )
    await add_row(pool, "held", "completed")
    await add_row(pool, "free", "completed")
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT 1 FROM scheduled_jobs WHERE job_id = 'held' FOR UPDATE")
        counts = await asyncio.wait_for(scheduler.run_vacuum(), 5)
    assert counts["completed"] == 1
    assert await ids(pool) == {"held"}


async def test_metrics_table_accumulates_per_day(pool, make_scheduler):
    config = only(
        completed=VacuumPolicy.immediate(), failed=VacuumPolicy.immediate(), track_metrics=True
    )
    scheduler = await make_scheduler(start=False, vacuum_config=config)
    await add_row(pool, "c1", "completed")
    await add_row(pool, "f1", "failed")
    await scheduler.run_vacuum()
    await add_row(pool, "c2", "completed")
    await scheduler.run_vacuum()
    # An older day, written by 0.2.x (no deleted_expired column value).
    await pool.execute(
        """
        INSERT INTO vacuum_stats (stat_date, deleted_completed, deleted_failed,
                                  deleted_cancelled, last_run, worker_id)
        VALUES (CURRENT_DATE - 3, 10, 1, 2, now() - interval '3 days', 'old')
        """
    )
    await pool.execute("UPDATE vacuum_stats SET deleted_expired = NULL WHERE worker_id = 'old'")

    today = await scheduler.get_vacuum_stats(1)
    assert len(today) == 1
    assert today[0]["deleted_completed"] == 2 and today[0]["deleted_failed"] == 1
    assert today[0]["deleted_expired"] == 0
    assert today[0]["worker_id"] == scheduler.worker_id
    week = await scheduler.get_vacuum_stats(7)
    assert [r["deleted_completed"] for r in week] == [2, 10]  # newest first
    assert week[1]["deleted_expired"] == 0
    totals = await scheduler.get_total_vacuum_stats()
    assert totals["total_deleted_completed"] == 12
    assert totals["total_deleted_failed"] == 2
    assert totals["total_deleted_cancelled"] == 2
    assert totals["total_deleted_expired"] == 0
    assert totals["days_tracked"] == 2
    assert totals["last_run"] is not None
    with pytest.raises(ValueError):
        await scheduler.get_vacuum_stats(-1)


async def test_no_metrics_without_track_metrics(pool, make_scheduler):
    scheduler = await make_scheduler(
        start=False, vacuum_config=only(completed=VacuumPolicy.immediate())
    )
    await add_row(pool, "c1", "completed")
    assert (await scheduler.run_vacuum())["completed"] == 1
    assert await scheduler.get_vacuum_stats(7) == []
    assert (await scheduler.get_total_vacuum_stats())["total_deleted_completed"] == 0


async def _vacuum_lock_held(pool) -> bool:
    return await pool.fetchval(
        """
        SELECT count(*) > 0 FROM pg_locks
         WHERE locktype = 'advisory' AND granted
           AND classid = ($1::bigint >> 32)::oid AND objid = ($1::bigint & 4294967295)::oid
        """,
        VACUUM_LOCK_KEY,
    )


async def test_one_replica_vacuums_at_a_time(pool, make_scheduler):
    config = only(completed=VacuumPolicy.immediate(), batch_size=50, track_metrics=True)
    first = await make_scheduler(start=False, vacuum_config=config)
    second = await make_scheduler(start=False, vacuum_config=config)
    total = 20_000
    await pool.execute(
        """
        INSERT INTO scheduled_jobs
            (job_id, job_name, task_name, execution_time, status, finished_at)
        SELECT 'j' || i, 'n', 't', now(), 'completed', now() FROM generate_series(1, $1) i
        """,
        total,
    )
    running = asyncio.create_task(first.run_vacuum())
    await wait_until(lambda: _vacuum_lock_held(pool), message="first replica holds the lock")
    assert not running.done()
    assert await second.run_vacuum() == {}  # skipped this round
    counts = await running
    assert counts["completed"] == total
    assert not await _vacuum_lock_held(pool)
    # Free again: the other replica may vacuum now.
    assert (await second.run_vacuum())["completed"] == 0
    stats = await first.get_vacuum_stats(1)
    assert stats[0]["deleted_completed"] == total


async def test_background_rounds_of_two_schedulers_never_overlap(pool, make_scheduler):
    config = only(
        completed=VacuumPolicy.immediate(),
        batch_size=100,
        interval_minutes=0.002,
        track_metrics=True,
    )
    a = await make_scheduler(vacuum_enabled=True, vacuum_config=config, run_periodic_jobs=False)
    b = await make_scheduler(vacuum_enabled=True, vacuum_config=config, run_periodic_jobs=False)
    rounds: dict[str, list[dict[str, int] | None]] = {a.worker_id: [], b.worker_id: []}
    for scheduler in (a, b):
        original = scheduler.vacuum.run_once

        async def traced(original=original, wid=scheduler.worker_id):
            result = await original()
            rounds[wid].append(result)
            return result

        scheduler.vacuum.run_once = traced  # type: ignore[method-assign]
    await pool.execute(
        """
        INSERT INTO scheduled_jobs
            (job_id, job_name, task_name, execution_time, status, finished_at)
        SELECT 'j' || i, 'n', 't', now(), 'completed', now() FROM generate_series(1, 5000) i
        """
    )

    async def empty() -> bool:
        return not await ids(pool)

    await wait_until(empty, message="all rows vacuumed")
    await wait_until(lambda: all(len(r) >= 3 for r in rounds.values()), message="rounds")
    deleted = sum(r["completed"] for rs in rounds.values() for r in rs if r)
    assert deleted == 5000  # no row counted twice
    totals = await a.get_total_vacuum_stats()
    assert totals["total_deleted_completed"] == 5000


async def test_vacuum_disabled_deletes_nothing(pool, make_scheduler):
    await add_row(pool, "ancient", "completed", finished_ago=timedelta(days=400))
    scheduler = await make_scheduler(
        vacuum_enabled=False,
        vacuum_config=VacuumConfig(completed=VacuumPolicy.immediate(), interval_minutes=0.001),
    )
    job_id = await scheduler.schedule(app_tasks.add, execution_time=datetime.now(UTC), args=(1, 1))
    await wait_for_status(pool, job_id, "completed")  # kept: not deleted on completion
    await asyncio.sleep(0.2)  # several would-be vacuum intervals
    assert await ids(pool) == {"ancient", job_id}


async def test_enabled_vacuum_runs_at_start(pool, make_scheduler):
    await add_row(pool, "ancient", "completed", finished_ago=timedelta(days=400))
    await add_row(pool, "fresh", "completed")
    await make_scheduler(vacuum_enabled=True)

    async def cleaned() -> bool:
        return await ids(pool) == {"fresh"}

    await wait_until(cleaned, message="first vacuum round")
