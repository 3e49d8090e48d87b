"""Retries that cannot be written never make a job loop.

``RetryPolicy(base_delay=1e300, max_delay=1e300)`` used to be accepted: the
first failure's retry time overflowed the timestamp ("timestamp out of
range"), the job's task crashed, the heartbeat handed the row back as a claim
that never started, and the job ran again and again (64 runs in 20 s,
``max_retries=2`` notwithstanding). Now a policy's delays are finite and at
most 365 days, checked at construction; a policy stored with a job before
that bound existed is brought within it; and a retry the database refuses
anyway becomes a recorded final failure after one run.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import asyncpg
import pytest

from pg_scheduler import RetryPolicy, Scheduler, task
from pg_scheduler.config import MAX_RETRY_DELAY
from pg_scheduler.engine import write_failure
from pg_scheduler.store import Store
from tests.support.common import wait_until


@task(name="retry_bounds.flaky")
async def flaky(key: str) -> None:
    await _db.execute("INSERT INTO retry_bounds_runs (key) VALUES ($1)", key)
    raise RuntimeError(f"{key} failed")


_db: asyncpg.Pool


@pytest.fixture
async def runs_table(pool):
    global _db
    _db = pool
    await pool.execute("CREATE TABLE IF NOT EXISTS retry_bounds_runs (key text NOT NULL)")


async def _runs(pool: asyncpg.Pool, key: str) -> int:
    return await pool.fetchval("SELECT count(*) FROM retry_bounds_runs WHERE key = $1", key)


@pytest.mark.parametrize(
    "values",
    [
        {"base_delay": 1e300, "max_delay": 1e300},
        {"max_delay": 1e300},
        {"base_delay": MAX_RETRY_DELAY + 1},
        {"max_delay": math.inf},
        {"base_delay": math.inf},
        {"base_delay": math.nan},
        {"max_delay": math.nan},
        {"base_delay": -1.0},
        {"max_delay": -0.5},
        {"factor": math.inf},
        {"jitter": math.nan},
    ],
    ids=lambda v: ",".join(f"{k}={v[k]}" for k in v),
)
async def test_unbounded_policy_is_refused_at_construction(pool, values):
    with pytest.raises(ValueError):
        RetryPolicy(**values)
    policy = RetryPolicy()
    for name, value in values.items():
        with pytest.raises(ValueError):
            setattr(policy, name, value)
    assert policy == RetryPolicy()
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


def test_the_bound_itself_is_accepted():
    policy = RetryPolicy(base_delay=MAX_RETRY_DELAY, factor=1e300, max_delay=MAX_RETRY_DELAY)
    # A huge factor no longer overflows: the delay stops at max_delay (jitter aside).
    assert policy.nominal_delay(50) == MAX_RETRY_DELAY
    assert policy.delay_for(50) <= MAX_RETRY_DELAY * 2


async def test_policy_stored_before_the_bound_runs_once_then_waits(
    pool, make_scheduler, runs_table
):
    """The reported loop, through a job row whose stored policy predates the bound."""
    producer = Scheduler(pool)  # never started: it only enqueues
    job_id = await producer.schedule(
        flaky, execution_time=datetime.now(UTC), kwargs={"key": "stored"}, max_retries=2
    )
    await pool.execute(
        "UPDATE scheduled_jobs SET retry_policy ="
        ' \'{"base_delay": 1e300, "factor": 2.0, "max_delay": 1e300, "jitter": 0.1}\'::jsonb'
        " WHERE job_id = $1",
        job_id,
    )
    await make_scheduler()

    async def retried() -> bool:
        row = await pool.fetchrow(
            "SELECT status, retry_count FROM scheduled_jobs WHERE job_id = $1", job_id
        )
        return row["status"] == "pending" and row["retry_count"] == 1

    await wait_until(retried, timeout=20, message="the retry written")
    wait = await pool.fetchval(
        "SELECT EXTRACT(EPOCH FROM execution_time - now()) FROM scheduled_jobs WHERE job_id = $1",
        job_id,
    )
    # Brought within the bound: 365 days, jitter 0.1.
    assert MAX_RETRY_DELAY * 0.89 < wait < MAX_RETRY_DELAY * 1.11
    assert await _runs(pool, "stored") == 1


async def test_retry_refused_by_the_database_is_recorded_as_failed(
    pool, make_scheduler, runs_table
):
    """A retry the database refuses (here a trigger an operator added) ends the
    job as failed, saying why, after one run: never a re-run."""
    await pool.execute(
        """
        CREATE OR REPLACE FUNCTION refuse_retries() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.status = 'pending' AND OLD.status = 'running' AND NEW.retry_count > 0 THEN
                RAISE EXCEPTION 'retries are refused here';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_retries BEFORE UPDATE ON scheduled_jobs
            FOR EACH ROW EXECUTE FUNCTION refuse_retries();
        """
    )
    try:
        producer = Scheduler(pool)
        job_id = await producer.schedule(
            flaky,
            execution_time=datetime.now(UTC),
            kwargs={"key": "refused"},
            max_retries=2,
            retry_policy=RetryPolicy(base_delay=1.0, jitter=0.0),
        )
        await make_scheduler()

        async def failed() -> bool:
            return (
                await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id)
                == "failed"
            )

        await wait_until(failed, timeout=20, message="the job recorded as failed")
    finally:
        await pool.execute(
            "DROP TRIGGER IF EXISTS refuse_retries ON scheduled_jobs;"
            " DROP FUNCTION IF EXISTS refuse_retries()"
        )
    error = await pool.fetchval(
        "SELECT error_message FROM scheduled_jobs WHERE job_id = $1", job_id
    )
    assert error.startswith(
        "RuntimeError: refused failed [no retry: the retry could not be written"
    )
    assert "retries are refused here" in error
    assert await _runs(pool, "refused") == 1


async def test_retry_time_that_overflows_is_recorded_as_failed(pool, runs_table):
    """The retry statement itself with a delay past what a timestamp holds."""
    producer = Scheduler(pool)
    job_id = await producer.schedule(
        flaky, execution_time=datetime.now(UTC), kwargs={"key": "overflow"}, max_retries=2
    )
    store = Store(pool)
    [row] = await store.claim("overflow-worker", ["retry_bounds.flaky"], 1, 60.0)
    written = await write_failure(
        store, job_id, "overflow-worker", row["attempts"], "RuntimeError: boom", "tb", 1e300
    )
    assert written.outcome == "failed"
    row = await pool.fetchrow(
        "SELECT status, error_message, error_traceback FROM scheduled_jobs WHERE job_id = $1",
        job_id,
    )
    assert row["status"] == "failed"
    assert row["error_message"].startswith("RuntimeError: boom [no retry: the retry could not be")
    assert row["error_traceback"] == "tb"
