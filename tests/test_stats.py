"""Scheduler.stats() against real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

import app_tasks
import pytest
from conftest import wait_for_status

from pg_scheduler import VacuumConfig, VacuumPolicy
from pg_scheduler.observe.stats import QueueStats, collect_stats


async def add_rows(pool, count: int, status: str, task: str, **sql: str) -> None:
    """Insert ``count`` rows; ``sql`` overrides column expressions (executed per row)."""
    columns = {
        "execution_time": "now()",
        "finished_at": "now()"
        if status in ("completed", "failed", "cancelled", "expired")
        else "NULL",
        "worker_id": "NULL",
        **sql,
    }
    await pool.execute(
        f"""
        INSERT INTO scheduled_jobs (job_id, job_name, task_name, status, execution_time,
                                    finished_at, worker_id)
        SELECT gen_random_uuid()::text, $1, $1, $2, {columns["execution_time"]},
               {columns["finished_at"]}, {columns["worker_id"]}
          FROM generate_series(1, $3)
        """,
        task,
        status,
        count,
    )


async def test_snapshot_of_counts_ages_rates_and_workers(pool):
    await add_rows(pool, 3, "pending", "mod:a", execution_time="now() - interval '90 seconds'")
    await add_rows(pool, 2, "pending", "mod:a", execution_time="now() + interval '1 hour'")
    await add_rows(pool, 1, "pending", "mod:b", execution_time="now() - interval '10 seconds'")
    await add_rows(pool, 2, "running", "mod:a", worker_id="'w-live'")
    await add_rows(pool, 1, "running", "mod:b", worker_id="'w-dead'")
    await add_rows(pool, 6, "completed", "mod:a", finished_at="now() - interval '30 seconds'")
    await add_rows(pool, 4, "completed", "mod:b", finished_at="now() - interval '10 minutes'")
    await add_rows(pool, 2, "failed", "mod:a", finished_at="now() - interval '20 seconds'")
    await add_rows(pool, 1, "expired", "mod:b", finished_at="now() - interval '2 hours'")
    await add_rows(pool, 1, "cancelled", "mod:b", finished_at="now() - interval '2 minutes'")
    await pool.execute(
        """
        INSERT INTO scheduler_workers (worker_id, hostname, pid, max_concurrent, tasks, last_seen)
        VALUES ('w-live', 'h1', 11, 5, '{mod:a}', now()),
               ('w-dead', 'h2', 22, 3, '{mod:b}', now() - interval '1 hour')
        """
    )

    stats = await collect_stats(pool, heartbeat_threshold=120)
    assert isinstance(stats, QueueStats)
    assert stats.counts == {
        "pending": 6,
        "running": 3,
        "waiting": 0,
        "completed": 10,
        "failed": 2,
        "cancelled": 1,
        "expired": 1,
    }
    assert stats.due == 4 and stats.scheduled == 2
    by_task = {t.task_name: t for t in stats.by_task}
    assert by_task["mod:a"].pending == 5 and by_task["mod:a"].due == 3
    assert by_task["mod:a"].completed == 6 and by_task["mod:a"].failed == 2
    assert by_task["mod:b"].expired == 1 and by_task["mod:b"].cancelled == 1
    assert stats.running_by_worker == {"w-live": 2, "w-dead": 1}
    assert 89 <= stats.oldest_pending_age < 100

    minute, five, hour = stats.windows
    assert (minute.seconds, minute.completed, minute.failed) == (60, 6, 2)
    assert minute.throughput == pytest.approx(6 / 60)
    assert minute.failure_rate == pytest.approx(2 / 8)
    assert (five.completed, five.cancelled) == (6, 1)
    assert (hour.completed, hour.failed, hour.expired) == (10, 2, 0)
    assert stats.window(3600) is hour

    workers = {w.worker_id: w for w in stats.workers}
    assert workers["w-live"].alive and workers["w-live"].running == 2
    assert not workers["w-dead"].alive and workers["w-dead"].running == 1
    assert workers["w-dead"].seen_seconds_ago > 3000
    assert stats.live_workers == 1
    # Serializable as is, for --json and exporters.
    assert stats.model_dump(mode="json")["counts"]["pending"] == 6


async def test_empty_queue(pool):
    stats = await collect_stats(pool)
    assert stats.counts["pending"] == 0 and stats.due == 0
    assert stats.oldest_pending_age is None
    assert stats.workers == [] and stats.live_workers == 0
    assert all(w.failure_rate is None and w.throughput == 0 for w in stats.windows)


async def test_bad_windows_rejected(pool):
    with pytest.raises(ValueError, match="windows"):
        await collect_stats(pool, windows=(0,))


async def test_scheduler_stats_live(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(app_tasks.add, execution_time=datetime.now(UTC), args=(1, 2))
    failed = await scheduler.schedule(app_tasks.boom, execution_time=datetime.now(UTC))
    await wait_for_status(pool, job_id, "completed")
    await wait_for_status(pool, failed, "failed")
    stats = await scheduler.stats()
    assert stats.live_workers == 1 and stats.workers[0].worker_id == scheduler.worker_id
    assert stats.counts["completed"] == 1 and stats.counts["failed"] == 1
    assert stats.windows[0].failure_rate == pytest.approx(0.5)
    assert not stats.completed_deleted


async def test_throughput_unknown_when_completed_rows_are_deleted(pool, make_scheduler):
    scheduler = await make_scheduler(
        start=False,
        vacuum_enabled=True,
        vacuum_config=VacuumConfig(completed=VacuumPolicy.immediate()),
    )
    stats = await scheduler.stats()
    assert stats.completed_deleted
    assert all(w.throughput is None and w.failure_rate is None for w in stats.windows)
