"""schedule / schedule_bulk / schedule_job: parameters, conflicts, bad input, transactions."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone

import asyncpg
import pytest

from pg_scheduler import ConflictResolution, JobPriority, JobSpec, RetryPolicy, Scheduler
from pg_scheduler.enqueue.ids import new_job_ids
from tests.support import app_tasks
from tests.support.common import wait_for_status, wait_until


def later(seconds: float = 3600) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


async def count(pool) -> int:
    return await pool.fetchval("SELECT count(*) FROM scheduled_jobs")


async def test_schedule_stores_every_documented_parameter(pool, make_scheduler):
    scheduler = await make_scheduler(start=False, misfire_grace_time=77)
    when = later()
    job_id = await scheduler.schedule(
        app_tasks.record,
        execution_time=when,
        args=("k",),
        kwargs={"value": 2},
        priority=JobPriority.HIGH,
        max_retries=4,
        job_id="custom-1",
    )
    assert job_id == "custom-1"
    row = await pool.fetchrow("SELECT * FROM scheduled_jobs WHERE job_id = 'custom-1'")
    assert row["job_name"] == "record"
    assert row["task_name"] == "tests.support.app_tasks:record"
    assert row["execution_time"] == when
    assert row["status"] == "pending"
    assert json.loads(row["task_data"]) == {"args": ["k"], "kwargs": {"value": 2}}
    assert row["priority"] == 3
    assert row["max_retries"] == 4
    assert row["retry_count"] == 0
    assert row["misfire_grace_time"] == 77  # the scheduler default, since not given

    explicit = await scheduler.schedule(app_tasks.noop, execution_time=when, misfire_grace_time=5)
    never = await scheduler.schedule(app_tasks.noop, execution_time=when, misfire_grace_time=None)
    grace = dict(
        await pool.fetch(
            "SELECT job_id, misfire_grace_time FROM scheduled_jobs WHERE job_id = ANY($1)",
            [explicit, never],
        )
    )
    assert grace == {explicit: 5, never: None}


async def test_naive_datetime_means_local_time(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    naive = datetime(2030, 1, 1, 12, 0, 0)
    job_id = await scheduler.schedule(app_tasks.noop, execution_time=naive)
    stored = await pool.fetchval(
        "SELECT execution_time FROM scheduled_jobs WHERE job_id = $1", job_id
    )
    assert stored == naive.astimezone()
    aware = datetime(2030, 1, 1, 12, 0, 0, tzinfo=timezone(timedelta(hours=5)))
    job_id = await scheduler.schedule(app_tasks.noop, execution_time=aware)
    stored = await pool.fetchval(
        "SELECT execution_time FROM scheduled_jobs WHERE job_id = $1", job_id
    )
    assert stored == aware


def sync_function():
    return None


@pytest.mark.parametrize(
    "call, error, match",
    [
        (dict(func=sync_function), TypeError, "async function"),
        (
            dict(args=(object(),)),
            TypeError,
            r"args\[0\] of tests\.support\.app_tasks:record is not JSON-serializable",
        ),
        (dict(kwargs={"value": {1, 2}}), TypeError, r"kwargs\['value'\].*set"),
        (dict(args=(float("nan"),)), TypeError, "not JSON-serializable"),
        (dict(execution_time="tomorrow"), TypeError, "execution_time must be a datetime"),
        (dict(priority=5), TypeError, "priority must be a JobPriority"),
        (dict(max_retries=-1), ValueError, "max_retries"),
        (dict(job_id=""), ValueError, "job_id"),
        (dict(misfire_grace_time=-1), ValueError, "misfire_grace_time"),
        (dict(timeout=0), ValueError, "timeout"),
        (dict(conflict_resolution="raise"), TypeError, "ConflictResolution"),
        (dict(retry_policy={"base_delay": 1}), TypeError, "RetryPolicy"),
    ],
)
async def test_bad_input_raises_and_writes_nothing(pool, make_scheduler, call, error, match):
    scheduler = await make_scheduler(start=False)
    kwargs = dict(func=app_tasks.record, execution_time=later(), args=("k",))
    kwargs.update(call)
    func = kwargs.pop("func")
    with pytest.raises(error, match=match):
        await scheduler.schedule(func, **kwargs)
    assert await count(pool) == 0


async def test_bulk_bad_input_writes_nothing(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    good = JobSpec(app_tasks.noop, later())
    bad = JobSpec(app_tasks.record, later(), args=(object(),))
    with pytest.raises(TypeError, match="not JSON-serializable"):
        await scheduler.schedule_bulk([good] * 5 + [bad])
    with pytest.raises(TypeError, match="JobSpec"):
        await scheduler.schedule_bulk([good, {"func": app_tasks.noop}])
    # 0.2.x builds a spec of a plain function; schedule_bulk refuses it.
    with pytest.raises(TypeError, match="Expected an async function"):
        await scheduler.schedule_bulk([good, JobSpec(sync_function, later())])
    with pytest.raises(ValueError, match="batch_size"):
        await scheduler.schedule_bulk([good], batch_size=0)
    assert await count(pool) == 0


@pytest.mark.parametrize(
    "field, value, error, match",
    [
        ("execution_time", "tomorrow", TypeError, "execution_time must be a datetime"),
        ("priority", 5, TypeError, "priority must be a JobPriority"),
        ("max_retries", -1, ValueError, "max_retries"),
        ("max_retries", True, TypeError, "max_retries"),
        ("job_id", "  ", ValueError, "job_id"),
        ("misfire_grace_time", 1.5, TypeError, "misfire_grace_time"),
        ("timeout", -2, ValueError, "timeout"),
        ("retry_policy", {"base_delay": 1}, TypeError, "RetryPolicy"),
        ("args", "abc", TypeError, "args must be a tuple or list"),
        ("kwargs", [("a", 1)], TypeError, "kwargs must be a dict"),
    ],
)
async def test_jobspec_checks_fields_when_built_and_again_in_bulk(
    pool, make_scheduler, field, value, error, match
):
    with pytest.raises(error, match=match):
        JobSpec(**{"func": app_tasks.noop, "execution_time": later(), field: value})
    # Changed after it was built: schedule_bulk still refuses it, writing nothing.
    scheduler = await make_scheduler(start=False)
    changed = JobSpec(app_tasks.noop, later())
    setattr(changed, field, value)
    specs = [JobSpec(app_tasks.noop, later()) for _ in range(300)] + [changed]
    with pytest.raises(error, match=match):
        await scheduler.schedule_bulk(specs, batch_size=100)
    assert await count(pool) == 0


def test_jobspec_keeps_its_fields_and_compares_by_value():
    when = later()
    spec = JobSpec(app_tasks.record, when, ["k", 1], None, JobPriority.LOW, 2, "id-1")
    assert spec.args == ("k", 1) and spec.kwargs == {}
    assert spec.priority is JobPriority.LOW and spec.max_retries == 2 and spec.job_id == "id-1"
    assert spec == JobSpec(app_tasks.record, when, ("k", 1), {}, JobPriority.LOW, 2, "id-1")
    assert spec != JobSpec(app_tasks.record, when, ("k", 2), {}, JobPriority.LOW, 2, "id-1")
    assert repr(spec).startswith("JobSpec(func=<function record")


def test_generated_ids_are_version_7_uuids_in_time_order():
    first = new_job_ids(1000)
    assert len(set(first)) == 1000
    parsed = [uuid.UUID(i) for i in first]
    assert {u.version for u in parsed} == {7}
    assert {u.variant for u in parsed} == {uuid.RFC_4122}
    assert all(str(u) == i for u, i in zip(parsed, first, strict=True))
    # The leading 48 bits are the millisecond clock: later calls never sort earlier.
    clock = int(first[0][:8] + first[0][9:13], 16)
    assert abs(clock / 1000 - time.time()) < 5
    second = new_job_ids(1)[0]
    assert second[:13] >= first[-1][:13]


async def test_bulk_over_many_batches_writes_each_row_once_with_its_own_id(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    specs = [JobSpec(app_tasks.record, later(), args=(f"k{i}",)) for i in range(2350)]
    ids = await scheduler.schedule_bulk(specs, batch_size=200)
    assert len(set(ids)) == 2350
    rows = await pool.fetch("SELECT job_id, task_data FROM scheduled_jobs")
    args_by_id = {r["job_id"]: json.loads(r["task_data"])["args"] for r in rows}
    assert len(args_by_id) == 2350
    assert all(args_by_id[job_id] == [f"k{i}"] for i, job_id in enumerate(ids))


async def test_conflict_resolution_single(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    first = later(100)
    await scheduler.schedule(app_tasks.record, execution_time=first, args=("a",), job_id="dup")
    with pytest.raises(ValueError, match="already exists"):
        await scheduler.schedule(
            app_tasks.record, execution_time=later(), args=("b",), job_id="dup"
        )
    assert (
        await scheduler.schedule(
            app_tasks.record,
            execution_time=later(),
            args=("c",),
            job_id="dup",
            conflict_resolution=ConflictResolution.IGNORE,
        )
        == "dup"
    )
    row = await pool.fetchrow("SELECT task_data, execution_time FROM scheduled_jobs")
    assert json.loads(row["task_data"])["args"] == ["a"] and row["execution_time"] == first
    second = later(200)
    assert (
        await scheduler.schedule(
            app_tasks.add,
            execution_time=second,
            args=(1, 2),
            job_id="dup",
            priority=JobPriority.LOW,
            conflict_resolution=ConflictResolution.REPLACE,
        )
        == "dup"
    )
    row = await pool.fetchrow("SELECT * FROM scheduled_jobs")
    assert (row["task_name"], row["priority"], row["execution_time"]) == (
        "tests.support.app_tasks:add",
        8,
        second,
    )
    assert json.loads(row["task_data"])["args"] == [1, 2]
    assert await count(pool) == 1


async def test_replace_revives_a_finished_job_but_never_touches_a_running_one(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(
        app_tasks.add, execution_time=later(-1), args=(1, 1), job_id="again"
    )
    await wait_for_status(pool, job_id, "completed")
    await scheduler.schedule(
        app_tasks.add,
        execution_time=later(-1),
        args=(2, 2),
        job_id="again",
        conflict_resolution=ConflictResolution.REPLACE,
    )
    await wait_until_result(scheduler, "again", 4)

    key = "replace-running"
    app_tasks.calls[key].clear()
    app_tasks.events.pop(key + ":started", None)
    await scheduler.schedule(
        app_tasks.sleep_for, execution_time=later(-1), args=(key, 0.5), job_id="busy"
    )
    await asyncio.wait_for(app_tasks.event(key + ":started").wait(), 10)
    await scheduler.schedule(
        app_tasks.noop,
        execution_time=later(),
        job_id="busy",
        conflict_resolution=ConflictResolution.REPLACE,
    )
    await wait_for_status(pool, "busy", "completed")
    assert (await scheduler.get_job("busy")).result == "slept"


async def wait_until_result(scheduler, job_id, expected):
    from tests.support.common import wait_until

    async def ready():
        job = await scheduler.get_job(job_id)
        return job is not None and job.status == "completed" and job.result == expected

    await wait_until(ready)


async def test_bulk_positional_returns_ids_in_order_with_none_for_ignored(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    await scheduler.schedule(app_tasks.noop, execution_time=later(), job_id="exists")
    specs = [JobSpec(app_tasks.record, later(), args=(f"k{i}",)) for i in range(2500)]
    specs[10] = JobSpec(app_tasks.noop, later(), job_id="exists")
    specs[20] = JobSpec(
        app_tasks.noop,
        later(),
        job_id="new-one",
        priority=JobPriority.CRITICAL,
        max_retries=2,
        misfire_grace_time=None,
    )
    ids = await scheduler.schedule_bulk(specs, batch_size=1000, positional=True)
    assert len(ids) == 2500
    assert ids[10] is None and ids[20] == "new-one"
    assert all(isinstance(i, str) for n, i in enumerate(ids) if n != 10)
    assert await count(pool) == 2500  # 2499 new + the existing one
    row = await pool.fetchrow("SELECT * FROM scheduled_jobs WHERE job_id = 'new-one'")
    assert (row["priority"], row["max_retries"], row["misfire_grace_time"]) == (1, 2, None)
    default_grace = await pool.fetchval(
        "SELECT misfire_grace_time FROM scheduled_jobs WHERE job_id = $1", ids[0]
    )
    assert default_grace == 300


async def test_bulk_raise_checks_everything_before_writing(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    await scheduler.schedule(app_tasks.noop, execution_time=later(), job_id="taken")
    specs = [JobSpec(app_tasks.noop, later()) for _ in range(1500)]
    specs.append(JobSpec(app_tasks.noop, later(), job_id="taken"))
    with pytest.raises(ValueError, match="taken"):
        await scheduler.schedule_bulk(specs, conflict_resolution=ConflictResolution.RAISE)
    assert await count(pool) == 1
    with pytest.raises(ValueError, match="repeated"):
        await scheduler.schedule_bulk(
            [JobSpec(app_tasks.noop, later(), job_id="x")] * 2,
            conflict_resolution=ConflictResolution.REPLACE,
        )
    assert await count(pool) == 1


async def test_bulk_replace_overwrites(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    await scheduler.schedule(app_tasks.noop, execution_time=later(), job_id="r1")
    ids = await scheduler.schedule_bulk(
        [
            JobSpec(app_tasks.add, later(), args=(1, 2), job_id="r1"),
            JobSpec(app_tasks.add, later(), args=(3, 4), job_id="r2"),
        ],
        conflict_resolution=ConflictResolution.REPLACE,
    )
    assert ids == ["r1", "r2"]
    names = dict(await pool.fetch("SELECT job_id, task_name FROM scheduled_jobs"))
    assert names == {"r1": "tests.support.app_tasks:add", "r2": "tests.support.app_tasks:add"}


async def test_schedule_job_low_level_form(pool, make_scheduler):
    scheduler = await make_scheduler(misfire_grace_time=123)
    job_id = await scheduler.schedule_job("add", later(-1), {"args": [20, 22]})
    await wait_for_status(pool, job_id, "completed")
    job = await scheduler.get_job(job_id)
    assert job.result == 42 and job.misfire_grace_time == 123
    with pytest.raises(ValueError, match="already exists"):
        await scheduler.schedule_job("add", later(), {"args": [1, 1]}, job_id=job_id)
    with pytest.raises(ValueError, match="only 'args' and 'kwargs'"):
        await scheduler.schedule_job("add", later(), {"argz": []})


async def test_transactional_enqueue_rollback_and_commit(pool, make_scheduler):
    scheduler = await make_scheduler()
    key = "tx"
    app_tasks.calls[key].clear()
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        rolled_back = await scheduler.schedule(
            app_tasks.record, execution_time=later(-1), args=(key, "rolled back"), connection=conn
        )
        bulk = await scheduler.schedule_bulk(
            [JobSpec(app_tasks.record, later(-1), args=(key, "bulk rolled back"))], connection=conn
        )
        assert await conn.fetchval("SELECT count(*) FROM scheduled_jobs") == 2
        await tx.rollback()
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE job_id = ANY($1)", [rolled_back, *bulk]
        )
        == 0
    )

    async with pool.acquire() as conn:
        async with conn.transaction():
            committed = await scheduler.schedule(
                app_tasks.record, execution_time=later(-1), args=(key, "committed"), connection=conn
            )
            # Not visible to others, so not run, before the commit.
            assert (
                await pool.fetchval(
                    "SELECT count(*) FROM scheduled_jobs WHERE job_id = $1", committed
                )
                == 0
            )
            await asyncio.sleep(0.3)
            assert app_tasks.calls[key] == []
    await wait_for_status(pool, committed, "completed")
    assert app_tasks.calls[key] == ["committed"]


async def test_duplicate_inside_a_transaction_does_not_abort_it(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    await scheduler.schedule(app_tasks.noop, execution_time=later(), job_id="seen")
    async with pool.acquire() as conn:
        async with conn.transaction():
            with pytest.raises(ValueError):
                await scheduler.schedule(
                    app_tasks.noop, execution_time=later(), job_id="seen", connection=conn
                )
            await scheduler.schedule(
                app_tasks.noop, execution_time=later(), job_id="fresh", connection=conn
            )
    assert await count(pool) == 2


async def test_racing_processes_on_one_id(pool, make_scheduler):
    """Many concurrent writers of one id: RAISE raises for all but one, IGNORE/REPLACE never."""
    schedulers = [await make_scheduler(start=False) for _ in range(3)]
    for resolution in ConflictResolution:
        job_id = f"race-{resolution.value}"
        calls = [
            s.schedule(
                app_tasks.record,
                execution_time=later(),
                args=(str(n),),
                job_id=job_id,
                conflict_resolution=resolution,
            )
            for n in range(12)
            for s in schedulers[n % 3 : n % 3 + 1]
        ]
        results = await asyncio.gather(*calls, return_exceptions=True)
        errors = [r for r in results if isinstance(r, Exception)]
        if resolution is ConflictResolution.RAISE:
            assert len(errors) == 11 and all(isinstance(e, ValueError) for e in errors)
        else:
            assert errors == [] and set(results) == {job_id}
        assert (
            await pool.fetchval("SELECT count(*) FROM scheduled_jobs WHERE job_id = $1", job_id)
            == 1
        )


async def test_job_timeout_and_retry_schedule_visible(pool, make_scheduler):
    scheduler = await make_scheduler(
        job_timeout=0.2, retry_policy=RetryPolicy(base_delay=30, factor=2, max_delay=100, jitter=0)
    )
    job_id = await scheduler.schedule(
        app_tasks.sleep_for, execution_time=later(-1), args=("timeout", 5), max_retries=3
    )

    async def retried():
        job = await scheduler.get_job(job_id)
        return job.retry_count == 1 and job.status == "pending"

    from tests.support.common import wait_until

    await wait_until(retried)
    job = await scheduler.get_job(job_id)
    # Pending again, no current error; the timed-out attempt is in the history.
    assert job.error is None
    assert [(a.outcome, a.error) for a in job.attempt_history] == [
        ("timed_out", "timed out after 0.2 s")
    ]
    assert job.next_retry_at is not None and job.next_retry_at > datetime.now(UTC)
    assert job.planned_retry_delays == [60.0, 100.0]
    own = await scheduler.schedule(
        app_tasks.sleep_for, execution_time=later(-1), args=("timeout-own", 5), timeout=0.1
    )
    await wait_for_status(pool, own, "failed")
    assert (await scheduler.get_job(own)).error == "timed out after 0.1 s"


async def test_schedule_does_not_wait_for_the_connections_reset(dsn):
    """The row is committed when the INSERT answers; asyncpg's reset of the
    connection (one more round trip) happens after schedule() returned, and
    closing the pool still waits for it."""
    reset_started = asyncio.Event()
    go_on = asyncio.Event()
    armed = False

    async def slow_reset(conn: asyncpg.Connection) -> None:
        if armed:
            reset_started.set()
            await go_on.wait()
        await conn.reset()

    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=3, reset=slow_reset)
    try:
        producer = Scheduler(pool)
        # The first call also reads the schema's state; only later resets are held.
        await producer.schedule(app_tasks.record, execution_time=later(), args=("r",))
        await wait_until(
            lambda: pool.get_idle_size() == pool.get_size(), message="its connection back"
        )
        armed = True
        single = await asyncio.wait_for(
            producer.schedule(app_tasks.record, execution_time=later(), args=("r",)), 10
        )
        await asyncio.wait_for(reset_started.wait(), 10)  # still resetting
        assert not go_on.is_set()
        other = await asyncpg.connect(dsn)  # committed: another session sees it
        try:
            stored = await other.fetchval(
                "SELECT status FROM scheduled_jobs WHERE job_id = $1", single
            )
        finally:
            await other.close()
        assert stored == "pending"
        # A bulk (a COPY, on another connection of the pool) does not wait either.
        specs = [
            JobSpec(func=app_tasks.record, execution_time=later(), args=(i,)) for i in range(600)
        ]
        ids = await asyncio.wait_for(producer.schedule_bulk(specs), 10)
        assert len(ids) == 600
    finally:
        go_on.set()
        await asyncio.wait_for(pool.close(), 10)
