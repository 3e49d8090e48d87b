"""Every bad input raises TypeError/ValueError at the call, names the field, writes nothing.

Table-driven: each bad value is tried on every path where it can land in the
same column (schedule(), JobSpec + schedule_bulk, schedule_job(), the task
registry, @periodic, the Scheduler's defaults), against real PostgreSQL.
"""

from __future__ import annotations

import json
import math
import time
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from pg_scheduler import JobSpec, RetryPolicy, Scheduler
from pg_scheduler.periodic import PeriodicJobConfig
from pg_scheduler.support.codec import MAX_NESTING, MAX_TASK_DATA_BYTES
from pg_scheduler.support.validation import INT4_MAX, MAX_NAME_BYTES
from pg_scheduler.tasks import TaskRegistry
from tests.support import app_tasks

INT4_OVER = 2**31


def later() -> datetime:
    return datetime.now(UTC) + timedelta(hours=1)


def nested_lists(depth: int) -> list:
    """``depth`` lists, one inside the next: [[[...]]]."""
    outer: list = []
    inner = outer
    for _ in range(depth - 1):
        inner.append([])
        inner = inner[0]
    return outer


def nested_dicts(depth: int) -> dict:
    outer: dict = {}
    inner = outer
    for _ in range(depth - 1):
        inner["d"] = {}
        inner = inner["d"]
    return outer


def circular() -> list:
    value: list = []
    value.append(value)
    return value


# -- argument values: (id, args, kwargs, error, the field the message must name) --------
ARGUMENTS = [
    ("nul-in-arg", ("a\x00b",), {}, ValueError, r"args\[0\] .*NUL"),
    ("nul-in-nested-arg", (["x", "\x00"],), {}, ValueError, r"args\[0\]\[1\] .*NUL"),
    ("nul-in-kwargs-key", (), {"k\x00": 1}, ValueError, r"kwargs key .*NUL"),
    ("nul-in-nested-key", (), {"value": {"in\x00": 1}}, ValueError, r"kwargs\['value'\] key"),
    ("lone-surrogate-arg", ("\ud800",), {}, ValueError, r"args\[0\] .*surrogate"),
    ("lone-low-surrogate-kwarg", (), {"value": "x\udfff"}, ValueError, r"kwargs\['value'\] .*sur"),
    ("surrogate-in-kwargs-key", (), {"\ud800": 1}, ValueError, r"kwargs key .*surrogate"),
    ("nesting-10000", (nested_lists(10_000),), {}, ValueError, r"args\[0\]\[0\].* deep"),
    ("nesting-just-over", (nested_lists(MAX_NESTING + 1),), {}, ValueError, r"args\[0\].* deep"),
    ("dict-nesting-over", (), {"value": nested_dicts(300)}, ValueError, r"kwargs\['value'\].*deep"),
    ("circular", (circular(),), {}, ValueError, r"args\[0\]"),
    ("int-kwargs-key", (), {1: "x"}, TypeError, r"kwargs key 1 .*must be strings"),
    ("int-key-in-arg", ({1: "x"},), {}, TypeError, r"args\[0\] key 1 "),
    ("int-key-deep", (), {"value": {"a": {2: 3}}}, TypeError, r"kwargs\['value'\]\['a'\] key 2"),
    ("none-key", ({None: 1},), {}, TypeError, r"args\[0\] key None"),
    ("inf-arg", (math.inf,), {}, TypeError, r"args\[0\] .*not JSON-serializable"),
]

# -- per-job fields: (id, field, value, error, the field the message must name) -------
FIELDS = [
    ("job-id-nul", "job_id", "a\x00b", ValueError, r"job_id .*NUL"),
    ("job-id-surrogate", "job_id", "id-\udc00", ValueError, r"job_id .*surrogate"),
    ("job-id-100k", "job_id", "x" * 100_000, ValueError, r"job_id is 100000 bytes"),
    ("job-id-utf8-over", "job_id", "é" * (MAX_NAME_BYTES // 2 + 1), ValueError, r"job_id is"),
    ("max-retries-2-31", "max_retries", INT4_OVER, ValueError, r"max_retries must be <="),
    ("max-retries-2-63", "max_retries", 2**63, ValueError, r"max_retries"),
    ("grace-2-31", "misfire_grace_time", INT4_OVER, ValueError, r"misfire_grace_time must be <="),
    ("timeout-nan", "timeout", math.nan, ValueError, r"timeout"),
    ("timeout-inf", "timeout", math.inf, ValueError, r"timeout must be a finite"),
    ("timeout-minus-inf", "timeout", -math.inf, ValueError, r"timeout"),
    (
        "time-year-1-east",
        "execution_time",
        datetime(1, 1, 1, 2, tzinfo=timezone(timedelta(hours=5))),
        ValueError,
        r"execution_time .* out of range",
    ),
    (
        "time-year-9999-west",
        "execution_time",
        datetime(9999, 12, 31, 22, tzinfo=timezone(timedelta(hours=-5))),
        ValueError,
        r"execution_time .* out of range",
    ),
    ("dedupe-key-nul", "dedupe_key", "a\x00b", ValueError, r"dedupe_key .*NUL"),
    ("dedupe-key-surrogate", "dedupe_key", "k-\udc00", ValueError, r"dedupe_key .*surrogate"),
    ("dedupe-key-100k", "dedupe_key", "x" * 100_000, ValueError, r"dedupe_key is 100000 bytes"),
    ("dedupe-key-empty", "dedupe_key", "", ValueError, r"dedupe_key must be a non-empty"),
    ("dedupe-key-int", "dedupe_key", 7, TypeError, r"dedupe_key must be a str"),
    ("dedupe-scope", "dedupe_scope", "running", ValueError, r"dedupe_scope must be one of"),
    # asyncpg would send these two as -infinity and infinity.
    ("time-min-utc", "execution_time", datetime.min.replace(tzinfo=UTC), ValueError, r"execution"),
    ("time-max-utc", "execution_time", datetime.max.replace(tzinfo=UTC), ValueError, r"execution"),
]

# schedule_job (0.2.x) has no timeout.
LEGACY_FIELDS = {
    "job_id",
    "max_retries",
    "misfire_grace_time",
    "execution_time",
    "dedupe_key",
    "dedupe_scope",
}


def cases() -> list[Any]:
    table = []
    for name, args, kwargs, error, match in ARGUMENTS:
        for path in ("schedule", "bulk", "schedule_job"):
            table.append(
                pytest.param(
                    path, {"args": args, "kwargs": kwargs}, error, match, id=f"{path}-{name}"
                )
            )
    for name, field, value, error, match in FIELDS:
        paths = ["schedule", "jobspec", "bulk"]
        if field in LEGACY_FIELDS:
            paths.append("schedule_job")
        for path in paths:
            table.append(pytest.param(path, {field: value}, error, match, id=f"{path}-{name}"))
    return table


async def attempt(scheduler: Scheduler, path: str, bad: dict[str, Any]) -> None:
    """Make the call ``path`` with the bad values in ``bad``, everything else good."""
    fields = {"execution_time": later(), "args": ("k",), "kwargs": {}, **bad}
    if path == "schedule":
        await scheduler.schedule(app_tasks.record, **fields)
    elif path == "jobspec":
        JobSpec(app_tasks.record, **fields)
    elif path == "bulk":
        # The bad spec last, after three batches' worth of good ones. Built good
        # and changed afterwards: schedule_bulk checks again.
        good = [JobSpec(app_tasks.record, later(), args=(str(i),)) for i in range(300)]
        spec = JobSpec(app_tasks.record, later(), args=("x",))
        for name, value in fields.items():
            setattr(spec, name, value)
        await scheduler.schedule_bulk([*good, spec], batch_size=100)
    else:
        task_data = {"args": list(fields.pop("args")), "kwargs": fields.pop("kwargs")}
        fields.pop("timeout", None)
        await scheduler.schedule_job("record", task_data=task_data, **fields)


@pytest.mark.parametrize("path, bad, error, match", cases())
async def test_bad_input_raises_names_the_field_and_writes_nothing(
    pool, make_scheduler, path, bad, error, match
):
    scheduler = await make_scheduler(start=False)
    with pytest.raises(error, match=match) as raised:
        await attempt(scheduler, path, bad)
    # A clean TypeError/ValueError of ours, not a database error passed through.
    assert type(raised.value) is error
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


# -- the other places a value lands in the same columns -----------------------------


async def periodic_fn() -> None:
    return None


PERIODIC = [
    ("max-retries", {"max_retries": INT4_OVER}, ValueError, r"max_retries="),
    (
        "grace-over-int4",
        {"misfire_grace_time": float(INT4_OVER)},
        ValueError,
        r"misfire_grace_time",
    ),
    ("grace-inf", {"misfire_grace_time": math.inf}, ValueError, r"misfire_grace_time"),
    ("grace-nan", {"misfire_grace_time": math.nan}, ValueError, r"misfire_grace_time"),
    ("jitter-inf", {"jitter": math.inf}, ValueError, r"jitter"),
    ("jitter-nan", {"jitter": math.nan}, ValueError, r"jitter"),
    ("job-name-nul", {"job_name": "p\x00"}, ValueError, r"job_name= .*NUL"),
    ("dedup-key-surrogate", {"dedup_key": "k\ud800"}, ValueError, r"dedup_key= .*surrogate"),
    ("dedup-key-too-long", {"dedup_key": "k" * 5000}, ValueError, r"dedup_key= is 5000 bytes"),
]


@pytest.mark.parametrize(
    "options, error, match", [pytest.param(*case[1:], id=case[0]) for case in PERIODIC]
)
async def test_periodic_arguments_landing_in_job_columns(pool, options, error, match):
    with pytest.raises(error, match=match) as raised:
        PeriodicJobConfig(periodic_fn, interval=timedelta(minutes=1), **options)
    assert type(raised.value) is error
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


async def task_fn() -> None:
    return None


@pytest.mark.parametrize(
    "call, error, match",
    [
        pytest.param(
            lambda: TaskRegistry().register(task_fn, name="t\x00"),
            ValueError,
            r"task name .*NUL",
            id="task-name-nul",
        ),
        pytest.param(
            lambda: TaskRegistry().register(task_fn, name="t" * 2000),
            ValueError,
            r"task name is 2000 bytes",
            id="task-name-too-long",
        ),
        pytest.param(
            lambda: RetryPolicy(base_delay=math.inf), ValueError, r"base_delay", id="retry-inf"
        ),
        pytest.param(
            lambda: RetryPolicy(max_delay=math.nan), ValueError, r"max_delay", id="retry-nan"
        ),
    ],
)
async def test_names_and_policies(pool, call, error, match):
    with pytest.raises(error, match=match):
        call()
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


async def test_scheduler_default_grace_is_bounded_to_the_column(pool):
    with pytest.raises(ValueError, match=r"misfire_grace_time must be <="):
        Scheduler(pool, misfire_grace_time=INT4_OVER)


@pytest.mark.parametrize("name", ["pgbouncer", "gc_freeze"])
@pytest.mark.parametrize("value", ["yes", 1, None])
async def test_scheduler_switches_must_be_bools(pool, name, value):
    with pytest.raises(TypeError, match=rf"{name} must be a bool, got {type(value).__name__}"):
        Scheduler(pool, **{name: value})
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


async def test_schedule_job_checks_its_job_name(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    for name, match in (("re\x00cord", r"job_name .*NUL"), ("r" * 2000, r"job_name is 2000")):
        with pytest.raises(ValueError, match=match):
            await scheduler.schedule_job(name, later(), {"args": [], "kwargs": {}})
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


@pytest.mark.parametrize(
    "zone, naive",
    [
        ("Asia/Kolkata", datetime(1, 1, 1, 1, 0)),
        ("America/New_York", datetime(9999, 12, 31, 23, 0)),
    ],
)
async def test_naive_datetimes_that_cannot_be_converted(
    pool, make_scheduler, monkeypatch, zone, naive
):
    """Naive means the process's local time: near year 1 east of UTC (or 9999 west
    of it) that is outside the years a datetime holds."""
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        scheduler = await make_scheduler(start=False)
        with pytest.raises(ValueError, match=r"execution_time .* out of range"):
            await scheduler.schedule(app_tasks.noop, execution_time=naive)
        with pytest.raises(ValueError, match=r"execution_time .* out of range"):
            JobSpec(app_tasks.noop, naive)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


# -- the limits themselves are accepted, and look-alikes are not refused --------------


async def test_values_at_the_limits_and_look_alikes_are_stored(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    kwargs = {
        "escaped_nul_text": "\\u0000 and \\ud800 are only text here",
        "emoji": "😀",
        "korean": "스케줄러",
        "braces": "{not a dict} [nor a list]",
        "nested": {"a": {"b": [1, {"c": None}]}},
    }
    longest_id = "é" * (MAX_NAME_BYTES // 2)
    job_id = await scheduler.schedule(
        app_tasks.record,
        execution_time=datetime(9999, 12, 31, 23, 59, tzinfo=UTC),
        args=("k",),
        kwargs={"value": kwargs},
        max_retries=INT4_MAX,
        misfire_grace_time=INT4_MAX,
        job_id=longest_id,
        timeout=1e300,
    )
    row = await pool.fetchrow("SELECT * FROM scheduled_jobs WHERE job_id = $1", job_id)
    assert row["job_id"] == longest_id
    assert json.loads(row["task_data"]) == {"args": ["k"], "kwargs": {"value": kwargs}}
    assert (row["max_retries"], row["misfire_grace_time"]) == (INT4_MAX, INT4_MAX)
    # An argument may nest MAX_NESTING deep (args[0] is the first level).
    deepest = nested_lists(MAX_NESTING)
    deep_id = await scheduler.schedule(app_tasks.record, execution_time=later(), args=(deepest,))
    stored = await pool.fetchval("SELECT task_data FROM scheduled_jobs WHERE job_id = $1", deep_id)
    assert json.loads(stored)["args"] == [deepest]
    earliest = datetime(1, 1, 1, 0, 0, 1, tzinfo=UTC)
    ids = await scheduler.schedule_bulk(
        [JobSpec(app_tasks.record, earliest, args=("k", kwargs)) for _ in range(150)]
    )
    stored = await pool.fetch(
        "SELECT execution_time, task_data FROM scheduled_jobs WHERE job_id = ANY($1)", ids
    )
    assert len(stored) == 150
    assert {r["execution_time"] for r in stored} == {earliest}
    assert json.loads(stored[0]["task_data"])["args"] == ["k", kwargs]


async def test_arguments_over_the_size_limit(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    huge = "x" * MAX_TASK_DATA_BYTES
    with pytest.raises(
        ValueError, match=r"args and kwargs of tests\.support\.app_tasks:record are \d+ bytes"
    ):
        await scheduler.schedule(app_tasks.record, execution_time=later(), args=(huge,))
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


async def test_update_job_status_refuses_waiting_and_writes_nothing(pool, make_scheduler):
    """'waiting' is a workflow's park, written with what wakes it; forced on a
    row, nothing would ever wake it again."""
    scheduler = await make_scheduler(start=False)
    job_id = await scheduler.schedule(
        _noop_for_waiting, execution_time=datetime.now(UTC) + timedelta(hours=1)
    )
    with pytest.raises(ValueError, match="waiting"):
        await scheduler.update_job_status(job_id, "waiting")
    assert await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id) == (
        "pending"
    )


async def _noop_for_waiting() -> None:
    return None
