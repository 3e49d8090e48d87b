"""schedule_bulk is all-or-nothing: one call's rows commit together or not at all.

Two kinds of failure in a later batch: a bad row that the checks refuse before
the first write, and a row that only the server refuses (a trigger raising for
one marked row, standing in for any error PostgreSQL can give mid-write).
Both with the pool and inside a caller's transaction that catches the error,
carries on and commits.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from pg_scheduler import ConflictResolution, JobSpec
from pg_scheduler.enqueue.producer import COPY_THRESHOLD
from tests.support import app_tasks

POISON = "poison"


def later() -> datetime:
    return datetime.now(UTC) + timedelta(hours=1)


def specs(count: int, user_ids: bool) -> list[JobSpec]:
    return [
        JobSpec(
            app_tasks.record, later(), args=(f"k{i}",), job_id=f"bulk-{i}" if user_ids else None
        )
        for i in range(count)
    ]


async def ids_in_table(pool: asyncpg.Pool) -> set[str]:
    return {r["job_id"] for r in await pool.fetch("SELECT job_id FROM scheduled_jobs")}


@pytest.fixture
async def server_refuses_poison(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """A row whose first argument is 'poison' fails inside PostgreSQL (COPY and INSERT)."""
    await pool.execute(
        """
        CREATE OR REPLACE FUNCTION test_refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.task_data -> 'args' ->> 0 = 'poison' THEN
                RAISE EXCEPTION 'refused by the test trigger';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER test_refuse_poison BEFORE INSERT ON scheduled_jobs
            FOR EACH ROW EXECUTE FUNCTION test_refuse_poison();
        """
    )
    try:
        yield
    finally:
        await pool.execute(
            "DROP TRIGGER IF EXISTS test_refuse_poison ON scheduled_jobs;"
            "DROP FUNCTION IF EXISTS test_refuse_poison();"
        )


# (id, make the bad spec, expected error): each refused by the checks before any write.
CHECKED = [
    ("nul-in-arg", lambda s: setattr(s, "args", ("a\x00",)), ValueError),
    ("nul-in-job-id", lambda s: setattr(s, "job_id", "id\x00"), ValueError),
    ("max-retries-2-31", lambda s: setattr(s, "max_retries", 2**31), ValueError),
    ("int-dict-key", lambda s: setattr(s, "kwargs", {"value": {1: 2}}), TypeError),
]


@pytest.mark.parametrize("user_ids", [False, True], ids=["generated-ids", "own-ids"])
@pytest.mark.parametrize("spoil, error", [pytest.param(c[1], c[2], id=c[0]) for c in CHECKED])
async def test_a_bad_row_in_a_later_batch_writes_nothing(
    pool, make_scheduler, user_ids, spoil, error
):
    scheduler = await make_scheduler(start=False)
    jobs = specs(5 * COPY_THRESHOLD, user_ids)
    spoil(jobs[-3])
    with pytest.raises(error):
        await scheduler.schedule_bulk(jobs, batch_size=COPY_THRESHOLD)
    assert await ids_in_table(pool) == set()

    # Inside the caller's transaction, which catches the error and commits its own work.
    async with pool.acquire() as conn, conn.transaction():
        await scheduler.schedule(
            app_tasks.noop, execution_time=later(), job_id="callers-own", connection=conn
        )
        with pytest.raises(error):
            await scheduler.schedule_bulk(jobs, batch_size=COPY_THRESHOLD, connection=conn)
    assert await ids_in_table(pool) == {"callers-own"}


@pytest.mark.parametrize(
    "user_ids, conflict",
    [
        pytest.param(False, ConflictResolution.IGNORE, id="generated-ids-copy"),
        pytest.param(True, ConflictResolution.IGNORE, id="own-ids-ignore"),
        pytest.param(True, ConflictResolution.RAISE, id="own-ids-raise"),
        pytest.param(True, ConflictResolution.REPLACE, id="own-ids-replace"),
    ],
)
async def test_a_row_the_server_refuses_in_a_later_batch_writes_nothing(
    pool, make_scheduler, server_refuses_poison, user_ids, conflict
):
    scheduler = await make_scheduler(start=False)
    count = 5 * COPY_THRESHOLD
    jobs = specs(count, user_ids)
    jobs[count - 3].args = (POISON,)  # in the last of five batches
    with pytest.raises(asyncpg.RaiseError, match="refused by the test trigger"):
        await scheduler.schedule_bulk(jobs, batch_size=COPY_THRESHOLD, conflict_resolution=conflict)
    assert await ids_in_table(pool) == set()

    async with pool.acquire() as conn, conn.transaction():
        await scheduler.schedule(
            app_tasks.noop, execution_time=later(), job_id="callers-own", connection=conn
        )
        with pytest.raises(asyncpg.RaiseError):
            await scheduler.schedule_bulk(
                jobs, batch_size=COPY_THRESHOLD, conflict_resolution=conflict, connection=conn
            )
        # The caller's transaction is intact and usable after the error.
        assert await conn.fetchval("SELECT count(*) FROM scheduled_jobs") == 1
    assert await ids_in_table(pool) == {"callers-own"}

    # Without the poisoned row the same call writes every row, once.
    jobs[count - 3].args = ("fine",)
    ids = await scheduler.schedule_bulk(
        jobs, batch_size=COPY_THRESHOLD, conflict_resolution=conflict
    )
    assert len(set(ids)) == count
    assert await ids_in_table(pool) == {*ids, "callers-own"}
