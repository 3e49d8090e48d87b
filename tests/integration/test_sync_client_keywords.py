"""SyncClient takes exactly Scheduler's keywords, with the same defaults, checks
and rows, on its own connection and on the caller's: a keyword added to one
entry point and not the other fails here."""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pg_scheduler import (
    ConflictResolution,
    JobPriority,
    JobSpec,
    RetryPolicy,
    Scheduler,
    SyncClient,
)
from pg_scheduler.enqueue.fields import OPTION_NAMES
from tests.support.common import wait_for_status

psycopg = pytest.importorskip("psycopg")


async def deliver(to: str, *, subject: str = "") -> str:
    return to


def later() -> datetime:
    return datetime.now(UTC) + timedelta(hours=1)


def parameters(func: Any) -> list[tuple[str, Any, Any]]:
    """(name, kind, default) of each parameter but ``self``."""
    return [
        (p.name, p.kind, p.default)
        for p in inspect.signature(func).parameters.values()
        if p.name != "self"
    ]


@pytest.mark.parametrize("method", ["schedule", "schedule_bulk", "get_job", "cancel_job"])
def test_methods_take_the_schedulers_keywords_and_defaults(method):
    assert parameters(getattr(SyncClient, method)) == parameters(getattr(Scheduler, method))


def test_constructor_defaults_match_the_schedulers():
    client = dict((name, default) for name, _, default in parameters(SyncClient.__init__))
    scheduler = dict((name, default) for name, _, default in parameters(Scheduler.__init__))
    for name in ("schema", "misfire_grace_time", "retry_policy"):
        assert client[name] == scheduler[name], name


def test_one_declaration_of_a_jobs_fields_serves_every_entry_point():
    """schedule()'s per-job keywords are JobOptions' fields and JobSpec's, with
    JobSpec's defaults; the rest say how to write (conflict, connection)."""
    schedule = {name: default for name, _, default in parameters(Scheduler.schedule)}
    spec = {name: default for name, _, default in parameters(JobSpec.__init__)}
    how = {"conflict_resolution", "connection"}
    assert set(schedule) - how == set(spec)
    for name in set(spec) - {"func", "execution_time"}:
        assert spec[name] == schedule[name], name
    assert set(schedule) - how - {"func", "execution_time", "args", "kwargs"} == set(OPTION_NAMES)


@pytest.fixture
def client(dsn: str) -> Iterator[SyncClient]:
    with SyncClient(dsn) as c:
        yield c


COLUMNS = (
    "job_name, task_name, execution_time, task_data::text, priority, max_retries, "
    "misfire_grace_time, timeout, retry_policy::text, dedupe_key, dedupe_scope, queue, status"
)


async def rows_of(pool: Any, *ids: str) -> list[tuple[Any, ...]]:
    return [
        tuple(await pool.fetchrow(f"SELECT {COLUMNS} FROM scheduled_jobs WHERE job_id = $1", i))
        for i in ids
    ]


def through_connection(client: SyncClient, dsn: str, **keywords: Any) -> str:
    with psycopg.connect(dsn) as conn:  # commits at the end of the block
        return client.schedule(deliver, connection=conn, **keywords)


KEYWORD_SETS = {
    "every_keyword_set": dict(
        args=("a@example.com",),
        kwargs={"subject": "hi"},
        priority=JobPriority.HIGH,
        max_retries=3,
        conflict_resolution=ConflictResolution.REPLACE,
        misfire_grace_time=17,
        timeout=12.5,
        retry_policy=RetryPolicy(base_delay=5),
        queue="emails",
    ),
    "defaults": dict(args=("a@example.com",)),
    "no_misfire_limit": dict(args=("a@example.com",), misfire_grace_time=None),
}


@pytest.mark.parametrize("keywords", KEYWORD_SETS.values(), ids=KEYWORD_SETS.keys())
async def test_same_row_from_scheduler_own_connection_and_callers(
    pool, make_scheduler, client, dsn, keywords
):
    """Given the same keywords (or none), Scheduler.schedule and both SyncClient
    paths write the same row: the misfire default is the client's (300 s, as
    the Scheduler's), not "never expires"."""
    when = later()
    scheduler = await make_scheduler(start=False)
    ids = [
        await scheduler.schedule(deliver, execution_time=when, job_id="a", **keywords),
        client.schedule(deliver, execution_time=when, job_id="b", **keywords),
        through_connection(client, dsn, execution_time=when, job_id="c", **keywords),
    ]
    assert ids == ["a", "b", "c"]
    rows = await rows_of(pool, *ids)
    assert rows[0] == rows[1] == rows[2]
    grace = keywords.get("misfire_grace_time", 300)
    assert await pool.fetchval("SELECT misfire_grace_time FROM scheduled_jobs LIMIT 1") == grace


async def test_dedupe_keywords_on_own_connection_match_the_schedulers(pool, make_scheduler, client):
    when = later()
    scheduler = await make_scheduler(start=False)
    a = await scheduler.schedule(
        deliver, execution_time=when, args=("x",), dedupe_key="k1", dedupe_scope="pending"
    )
    b = client.schedule(
        deliver, execution_time=when, args=("x",), dedupe_key="k2", dedupe_scope="pending"
    )
    first, second = await rows_of(pool, a, b)
    assert first[:9] == second[:9] and first[10:] == second[10:]
    assert (first[9], second[9]) == ("k1", "k2")


async def test_the_clients_misfire_default_applies_on_both_paths(pool, dsn):
    with SyncClient(dsn, misfire_grace_time=42) as client:
        own = client.schedule(deliver, execution_time=later(), args=("x",))
        theirs = through_connection(client, dsn, execution_time=later(), args=("x",))
    graces = await pool.fetch(
        "SELECT misfire_grace_time FROM scheduled_jobs WHERE job_id = ANY($1::text[])",
        [own, theirs],
    )
    assert [r[0] for r in graces] == [42, 42]


@pytest.mark.parametrize("path", ["own_connection", "callers_connection"])
async def test_queue_keyword_reaches_a_worker_of_that_queue(
    pool, make_scheduler, client, dsn, path
):
    scheduler = await make_scheduler(queues=["emails"])
    scheduler.registry.register(deliver)
    now = datetime.now(UTC)
    if path == "own_connection":
        job_id = client.schedule(deliver, execution_time=now, args=("q",), queue="emails")
    else:
        job_id = through_connection(client, dsn, execution_time=now, args=("q",), queue="emails")
    assert await pool.fetchval("SELECT queue FROM scheduled_jobs WHERE job_id = $1", job_id) == (
        "emails"
    )
    await wait_for_status(pool, job_id, "completed", timeout=60)
    assert (await scheduler.get_job(job_id)).result == "q"


BAD_SCHEDULE = {
    "execution_time": dict(execution_time="now"),
    "execution_time_range": dict(execution_time=datetime.max),
    "args": dict(args="abc"),
    "args_nul": dict(args=("a\x00b",)),
    "kwargs": dict(kwargs=[1]),
    "priority": dict(priority=7),
    "max_retries": dict(max_retries=-1),
    "max_retries_bool": dict(max_retries=True),
    "job_id": dict(job_id=""),
    "conflict_resolution": dict(conflict_resolution="raise"),
    "misfire_grace_time": dict(misfire_grace_time=-1),
    "misfire_grace_time_str": dict(misfire_grace_time="5"),
    "timeout": dict(timeout=0),
    "timeout_inf": dict(timeout=math.inf),
    "retry_policy": dict(retry_policy=5),
    "queue": dict(queue="no spaces"),
    "queue_type": dict(queue=5),
    "dedupe_scope": dict(dedupe_key="k", dedupe_scope="forever"),
    "unknown_keyword": dict(queues="emails"),
}


def _said(info: Any) -> tuple[type, str]:
    # Python names the class in "X.schedule() got an unexpected keyword argument".
    return info.type, re.sub(r"^\w+\.(?=schedule)", "", str(info.value))


def error_of(call: Any) -> tuple[type, str]:
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    return _said(info)


async def awaited_error_of(call: Any) -> tuple[type, str]:
    with pytest.raises((TypeError, ValueError)) as info:
        await call()
    return _said(info)


@pytest.mark.parametrize("bad", BAD_SCHEDULE.values(), ids=BAD_SCHEDULE.keys())
async def test_bad_input_raises_the_schedulers_error_and_writes_nothing(
    pool, make_scheduler, client, dsn, bad
):
    scheduler = await make_scheduler(start=False)
    keywords = {"execution_time": later(), "args": ("x",), **bad}
    expected = await awaited_error_of(lambda: scheduler.schedule(deliver, **keywords))
    assert error_of(lambda: client.schedule(deliver, **keywords)) == expected
    conn = psycopg.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT 1")  # the caller's transaction is open
        assert error_of(lambda: client.schedule(deliver, connection=conn, **keywords)) == expected
        with conn.cursor() as cur:  # and still usable
            cur.execute("SELECT count(*) FROM scheduled_jobs")
            assert cur.fetchone()[0] == 0
        conn.commit()
    finally:
        conn.close()
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


BAD_BULK = {
    "batch_size": dict(batch_size=0),
    "positional": dict(positional="yes"),
    "conflict_resolution": dict(conflict_resolution="ignore"),
    "jobs": dict(jobs=[object()]),
    "jobs_type": dict(jobs=5),
    "repeated_ids": dict(
        jobs=[JobSpec(deliver, later(), args=("x",), job_id="same")] * 2,
        conflict_resolution=ConflictResolution.RAISE,
    ),
}


@pytest.mark.parametrize("bad", BAD_BULK.values(), ids=BAD_BULK.keys())
async def test_bad_bulk_input_raises_the_schedulers_error_and_writes_nothing(
    pool, make_scheduler, client, dsn, bad
):
    scheduler = await make_scheduler(start=False)
    keywords = {"jobs": [JobSpec(deliver, later(), args=("x",))], **bad}
    expected = await awaited_error_of(lambda: scheduler.schedule_bulk(**keywords))
    assert error_of(lambda: client.schedule_bulk(**keywords)) == expected
    conn = psycopg.connect(dsn)
    try:
        assert error_of(lambda: client.schedule_bulk(connection=conn, **keywords)) == expected
        conn.commit()
    finally:
        conn.close()
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0
