"""A newcomer's first calls: ``execution_time`` optional (now) or ``delay=``,
arguments held to the task's signature at the call, a task's name given
where its function belongs, and a name nobody registered."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from structlog.testing import capture_logs

from pg_scheduler import JobSpec, SyncClient
from tests.support import app_tasks


async def count(pool) -> int:
    return await pool.fetchval("SELECT count(*) FROM scheduled_jobs")


async def due_at(pool, job_id: str) -> datetime:
    return await pool.fetchval(
        "SELECT execution_time FROM scheduled_jobs WHERE job_id = $1", job_id
    )


# -- execution_time optional, delay= ------------------------------------------------------


async def test_no_time_means_now_and_delay_means_from_now(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    before = datetime.now(UTC)
    now_id = await scheduler.schedule(app_tasks.record, args=("now",))
    later_id = await scheduler.schedule(
        app_tasks.record, args=("later",), delay=timedelta(seconds=30)
    )
    seconds_id = await scheduler.schedule(app_tasks.record, args=("secs",), delay=90)
    after = datetime.now(UTC)
    assert before <= await due_at(pool, now_id) <= after
    assert before + timedelta(seconds=30) <= await due_at(pool, later_id)
    assert await due_at(pool, later_id) <= after + timedelta(seconds=30)
    assert before + timedelta(seconds=90) <= await due_at(pool, seconds_id)
    assert await due_at(pool, seconds_id) <= after + timedelta(seconds=90)


async def test_a_due_job_without_a_time_runs(make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(app_tasks.add, args=(2, 3))
    assert await scheduler.result(job_id, timeout=10) == 5


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"delay": timedelta(seconds=-5)}, ValueError, r"delay .*>= 0, got -5s"),
        ({"delay": -1.5}, ValueError, r"got -1.5s"),
        ({"delay": float("nan")}, ValueError, "delay"),
        ({"delay": "5"}, TypeError, "delay must be a timedelta or a number"),
        ({"delay": True}, TypeError, "delay"),
        ({"delay": timedelta(days=3_000_000)}, ValueError, "out of range"),
        (
            {"delay": 5, "execution_time": datetime.now(UTC)},
            ValueError,
            "execution_time or delay, not both",
        ),
    ],
)
async def test_bad_delays_raise_and_write_nothing(pool, make_scheduler, kwargs, error, match):
    scheduler = await make_scheduler(start=False)
    with pytest.raises(error, match=match):
        await scheduler.schedule(app_tasks.noop, **kwargs)
    with pytest.raises(error, match=match):
        await scheduler.schedule_bulk([JobSpec(app_tasks.noop, **kwargs)])
    with pytest.raises(error, match=match):
        await scheduler.schedule_job("noop", task_data={}, **kwargs)
    assert await count(pool) == 0


async def test_schedule_job_keeps_its_positional_time_and_takes_none(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    scheduler.register_task(app_tasks.record)
    when = datetime.now(UTC) + timedelta(hours=1)
    positional = await scheduler.schedule_job(
        "tests.support.app_tasks:record", when, {"args": ["p"]}
    )
    assert await due_at(pool, positional) == when
    before = datetime.now(UTC)
    bare = await scheduler.schedule_job("tests.support.app_tasks:record", task_data={"args": ["b"]})
    delayed = await scheduler.schedule_job(
        "tests.support.app_tasks:record", task_data={"args": ["d"]}, delay=60
    )
    assert await due_at(pool, bare) >= before
    assert await due_at(pool, delayed) >= before + timedelta(seconds=60)


async def test_bulk_specs_without_a_time(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    before = datetime.now(UTC)
    ids = await scheduler.schedule_bulk(
        [JobSpec(app_tasks.record, args=(str(i),)) for i in range(150)]  # COPY
        + [JobSpec(app_tasks.record, args=("d",), delay=timedelta(minutes=5))]
    )
    times = [await due_at(pool, job_id) for job_id in ids]
    assert all(before <= t <= before + timedelta(seconds=30) for t in times[:150])
    assert times[150] >= before + timedelta(minutes=5)


async def test_sync_client_takes_no_time_or_a_delay(pool, dsn):
    with SyncClient(dsn) as client:
        before = datetime.now(UTC)
        now_id = await asyncio.to_thread(client.schedule, app_tasks.record, args=("s",))
        later_id = await asyncio.to_thread(
            client.schedule, app_tasks.record, args=("s",), delay=timedelta(seconds=20)
        )
        with pytest.raises(ValueError, match="not both"):
            client.schedule(app_tasks.noop, execution_time=before, delay=1)
    assert await due_at(pool, now_id) >= before
    assert await due_at(pool, later_id) >= before + timedelta(seconds=20)
    assert await count(pool) == 2


async def test_leaving_the_time_out_names_no_internal_class(make_scheduler):
    """Whatever goes wrong, no message names a class the user never wrote."""
    scheduler = await make_scheduler(start=False)
    with pytest.raises(TypeError) as raised:
        await scheduler.schedule(app_tasks.add, args=(1,))
    assert "Jobs" not in str(raised.value) and "app_tasks:add(a, b) cannot take" in str(
        raised.value
    )


# -- arguments bound at the call ------------------------------------------------------------


async def test_arguments_the_signature_cannot_take_raise_and_write_nothing(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    cases = [
        ((), {}, "missing a required argument: 'a'"),
        ((1, 2, 3), {}, "too many positional arguments"),
        ((1, 2), {"c": 2}, "unexpected keyword argument 'c'"),
        ((1, 2), {"a": 1}, "multiple values for argument 'a'"),
    ]
    for args, kwargs, reason in cases:
        with pytest.raises(TypeError, match=rf"app_tasks:add\(a, b\).*{reason}"):
            await scheduler.schedule(app_tasks.add, args=args, kwargs=kwargs)
    good = [JobSpec(app_tasks.add, args=(1, 2)) for _ in range(120)]
    # A JobSpec is built whatever its arguments (as in 0.2.x); schedule_bulk binds them.
    bad = JobSpec(app_tasks.add, args=(1,))
    with pytest.raises(TypeError, match="missing a required argument"):
        await scheduler.schedule_bulk([*good, bad])  # COPY, streamed
    with pytest.raises(TypeError, match="missing a required argument"):
        await scheduler.schedule_bulk([bad, *good[:3]])
    scheduler.register_task(app_tasks.add)
    with pytest.raises(TypeError, match="too many positional arguments"):
        await scheduler.schedule_job("tests.support.app_tasks:add", None, {"args": [1, 2, 3]})
    assert await count(pool) == 0
    # What fits is written, keywords included.
    await scheduler.schedule(app_tasks.add, args=(1,), kwargs={"b": 2})
    await scheduler.schedule_bulk(good[:2])
    assert await count(pool) == 3


async def test_the_sync_client_binds_arguments_on_both_connections(pool, dsn):
    psycopg = pytest.importorskip("psycopg")
    with SyncClient(dsn) as client:
        with pytest.raises(TypeError, match="missing a required argument"):
            await asyncio.to_thread(client.schedule, app_tasks.add, args=(1,))
        with pytest.raises(TypeError, match="too many positional"):
            await asyncio.to_thread(client.schedule_bulk, [JobSpec(app_tasks.add, args=(1, 2, 3))])
        with psycopg.connect(dsn) as conn:
            with pytest.raises(TypeError, match="missing a required argument"):
                client.schedule(app_tasks.add, args=(1,), connection=conn)
    assert await count(pool) == 0


async def test_a_task_name_given_to_schedule_points_at_schedule_job(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    with pytest.raises(TypeError, match=r"schedule_job\('emails.send', \.\.\.\)"):
        await scheduler.schedule("emails.send")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="schedule_job"):
        JobSpec("emails.send")  # type: ignore[arg-type]
    assert await count(pool) == 0


# -- a name nobody registered -----------------------------------------------------------------


async def test_schedule_job_warns_once_about_a_name_no_worker_lists(pool, make_scheduler):
    async def only_there() -> None: ...

    worker = await make_scheduler(start=False)
    worker.register_task(only_there, name="only.there")
    await worker.start()  # its row in scheduler_workers lists "only.there"
    producer = await make_scheduler(start=False)
    assert "only.there" not in producer.registry
    typo_name = f"no.such:task{uuid.uuid4().hex[:6]}"  # warned once per process
    with capture_logs() as logs:
        typo = await producer.schedule_job(typo_name, None, {})
        await producer.schedule_job(typo_name, None, {})
        await producer.schedule_job("only.there", None, {})
    # (The running worker's rescuer may also report the due job nobody runs.)
    warned = [e for e in logs if "a task no worker has registered" in e["event"]]
    assert [e["task"] for e in warned] == [typo_name]
    assert warned[0]["log_level"] == "warning"
    # Written all the same: its worker may not have started yet.
    row = await pool.fetchrow(
        "SELECT task_name, task_data FROM scheduled_jobs WHERE job_id = $1", typo
    )
    assert row["task_name"] == typo_name and json.loads(row["task_data"])["args"] == []
