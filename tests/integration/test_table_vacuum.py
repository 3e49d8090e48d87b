"""The workers' own VACUUM of the job table (services/table_vacuum.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from pg_scheduler import JobSpec, VacuumConfig, task
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
    import pytest

    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="table_vacuum_seconds"):
            VacuumConfig(table_vacuum_seconds=bad)
