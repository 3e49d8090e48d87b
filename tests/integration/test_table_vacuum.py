"""The workers' own VACUUM of the job table (services/table_vacuum.py)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import asyncpg
import pytest

from pg_scheduler import JobSpec, VacuumConfig, task
from pg_scheduler.services import table_vacuum
from pg_scheduler.services.table_vacuum import TableVacuumService
from pg_scheduler.store.table_vacuum import TableVacuumStore
from tests.support.common import wait_until

DONE: set[int] = set()


@task(name="test.table_vacuum.noop")
async def noop(n: int) -> None:
    DONE.add(n)


async def _vacuums(pool) -> int:
    return await pool.fetchval(
        # A VACUUM that found autovacuum at work is a no-op (SKIP_LOCKED): count both.
        "SELECT vacuum_count + autovacuum_count FROM pg_stat_user_tables"
        " WHERE relid = 'scheduled_jobs'::regclass"
    )


async def test_a_worker_vacuums_the_job_table_once_it_holds_dead_rows(pool, make_scheduler):
    DONE.clear()
    before = await _vacuums(pool)
    scheduler = await make_scheduler(vacuum_config=VacuumConfig(table_vacuum_seconds=0.2))
    producer = await make_scheduler(start=False)
    now = datetime.now(UTC)
    await producer.schedule_bulk([JobSpec(noop, now, (i,)) for i in range(3000)])
    await wait_until(lambda: len(DONE) == 3000, timeout=60, message="every job ran")

    # The claims and the completions left two dead versions per job: the
    # statistics count them, and a worker runs VACUUM (seen from the server).
    await wait_until(lambda: scheduler.table_vacuum.vacuums >= 1, timeout=20, message="a VACUUM")
    assert scheduler.table_vacuum.allowed is True

    async def counted() -> bool:
        return await _vacuums(pool) > before

    await wait_until(counted, timeout=10, message="the server counted the VACUUM")
    dead = await pool.fetchval(
        "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'scheduled_jobs'::regclass"
    )
    assert dead < 3000, dead


async def test_none_leaves_the_table_to_autovacuum(make_scheduler):
    scheduler = await make_scheduler(vacuum_config=VacuumConfig(table_vacuum_seconds=None))
    assert scheduler.table_vacuum is None


def test_the_interval_must_be_positive():
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="table_vacuum_seconds"):
            VacuumConfig(table_vacuum_seconds=bad)


_DEAD = "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = 'scheduled_jobs'::regclass"


async def _churn(pool: asyncpg.Pool, n: int = 1500) -> None:
    """n jobs inserted, claimed and completed by hand: two dead versions each,
    counted by the statistics at once."""
    ids = [f"churn-{uuid.uuid4().hex}" for _ in range(n)]
    async with pool.acquire() as conn:
        await conn.execute(
            "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time)"
            " SELECT i, 'churn', 'churn', now() FROM unnest($1::text[]) i",
            ids,
        )
        await conn.execute(
            "UPDATE scheduled_jobs SET status = 'running', started_at = now()"
            " WHERE job_id = ANY($1::text[])",
            ids,
        )
        await conn.execute(
            "UPDATE scheduled_jobs SET status = 'completed', finished_at = now()"
            " WHERE job_id = ANY($1::text[])",
            ids,
        )
        await conn.execute("SELECT pg_stat_force_next_flush()")
        await conn.execute("SELECT 1")

    async def counted() -> bool:
        return await pool.fetchval(_DEAD) >= 1000

    await wait_until(counted, timeout=20, message="the dead rows counted")


async def test_rounds_prune_the_heap_and_clean_the_indexes_at_most_once_a_minute(pool, monkeypatch):
    # Autovacuum left out, so that the rounds counted below find the dead rows.
    await pool.execute("ALTER TABLE scheduled_jobs SET (autovacuum_enabled = false)")
    try:
        await _rounds(pool, monkeypatch)
    finally:
        await pool.execute("ALTER TABLE scheduled_jobs RESET (autovacuum_enabled)")


async def _rounds(pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    service = TableVacuumService(TableVacuumStore(pool), interval=0.05)

    await _churn(pool)
    await wait_until(service.run_once, timeout=20, message="a VACUUM")
    # A worker's first VACUUM also cleans the indexes.
    assert (service.vacuums, service.index_rounds) == (1, 1)

    await _churn(pool)
    await wait_until(service.run_once, timeout=20, message="another VACUUM")
    # Within the minute, the heap only; it still removes the dead rows.
    assert (service.vacuums, service.index_rounds) == (2, 1)

    async def removed() -> bool:
        return await pool.fetchval(_DEAD) < 1000

    await wait_until(removed, timeout=20, message="the dead rows removed")

    # Once this worker's last index round is older than INDEX_EVERY, the next
    # round cleans the indexes again.
    monkeypatch.setattr(table_vacuum, "INDEX_EVERY", 0.0)
    await _churn(pool)
    await wait_until(service.run_once, timeout=20, message="one more VACUUM")
    assert (service.vacuums, service.index_rounds) == (3, 2)
    await wait_until(removed, timeout=20, message="the dead rows removed")
