"""schedule_bulk's rows (enqueue_rows): the same rows schedule() builds, ids in order.

The bulk builder checks and converts each distinct value once per call; these
tests hold it to the per-call path, field by field, over many combinations.
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from pg_scheduler import JobPriority, JobSpec, RetryPolicy
from pg_scheduler.config import UNSET
from pg_scheduler.enqueue.fields import JobOptions
from pg_scheduler.enqueue.producer import Producer
from pg_scheduler.enqueue.rows import spec_rows, spec_tuples
from pg_scheduler.tasks import TaskRegistry
from tests.support import app_tasks, dedupe_tasks, queue_tasks

TIMES = (
    datetime(2031, 1, 2, 3, 4, 5, tzinfo=UTC),
    datetime(2031, 1, 2, 3, 4, 5),  # naive: local time
    datetime(2031, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=-7))),
)
FUNCS = (
    (app_tasks.record, None),
    (queue_tasks.send_email, None),  # the task's own queue
    (app_tasks.record, "other"),
    (dedupe_tasks.sync_pending, None),  # a task-level dedupe key and scope
)

# A keyword argument each function takes besides its first (None: none).
KEYWORD = {
    app_tasks.record: "value",
    queue_tasks.send_email: "seconds",
    dedupe_tasks.sync_pending: None,
}


def varied_specs() -> list[dict[str, Any]]:
    """Keyword sets for JobSpec: every option, repeated and alternating."""
    combos = itertools.product(
        TIMES,
        JobPriority,
        (UNSET, None, 0, 7),
        (None, 3, 2.5),
        (None, RetryPolicy(base_delay=1.0)),
        FUNCS,
    )
    specs = []
    for i, (when, priority, grace, timeout, policy, (func, queue)) in enumerate(combos):
        specs.append(
            {
                "func": func,
                "execution_time": when,
                # One positional argument each function takes (a tuple or a
                # list), and a keyword it takes; arguments that do not fit raise.
                "args": ((i, "é", 1.5, None, [True]),) if i % 2 else [f"k{i}"],
                "kwargs": {KEYWORD[func]: {"n": i}} if i % 3 and KEYWORD[func] else None,
                "priority": priority,
                "max_retries": i % 4,
                "misfire_grace_time": grace,
                "timeout": timeout,
                "retry_policy": policy,
                "queue": queue,
                "job_id": f"user-{i}" if i % 5 == 0 else None,
                "dedupe_key": f"key-{i}" if i % 7 == 0 else None,
                "dedupe_scope": "pending" if i % 14 == 0 else None,
            }
        )
    return specs


def producer() -> Producer:
    return Producer(TaskRegistry(), lambda: 42)


def test_bulk_rows_are_the_rows_schedule_builds() -> None:
    options = varied_specs()
    bulk = list(spec_rows([JobSpec(**o) for o in options], producer().register, lambda: 42))
    single = producer()
    assert len(bulk) == len(options) > 1000
    for o, row in zip(options, bulk, strict=True):
        fields = dict(o)
        func, args, kwargs = fields.pop("func"), fields.pop("args"), fields.pop("kwargs")
        when = fields.pop("execution_time")
        expected = single.call_row(func, when, args, kwargs, JobOptions(**fields))
        if o["job_id"] is None:
            expected = expected._replace(job_id=row.job_id)
        assert row == expected
        assert [type(v) for v in row] == [type(v) for v in expected]


def test_streamed_tuples_are_the_same_rows() -> None:
    specs = [JobSpec(**o) for o in varied_specs()]
    named = list(spec_rows(specs, producer().register, lambda: 42))
    kept: list[tuple[Any, ...]] = []
    plain = list(spec_tuples(specs, producer().register, lambda: 42, kept))
    assert kept == plain
    assert all(type(row) is tuple for row in plain)
    assert [row[1:] for row in plain] == [tuple(row)[1:] for row in named]


def test_a_bad_value_after_good_ones_of_the_same_kind_raises() -> None:
    """A value seen good once is not checked again; a different one is."""
    when = datetime.now(UTC)
    specs = [JobSpec(app_tasks.record, when, args=("k",), max_retries=3) for _ in range(200)]
    specs[150].max_retries = -1
    with pytest.raises(ValueError, match="max_retries"):
        list(spec_rows(specs, producer().register, lambda: None))
    specs[150].max_retries = 3
    specs[199].queue = "no spaces"
    with pytest.raises(ValueError, match="queue"):
        list(spec_rows(specs, producer().register, lambda: None))


async def test_bulk_ids_ascend_in_input_order(pool, make_scheduler) -> None:
    scheduler = await make_scheduler(start=False)
    when = datetime.now(UTC) + timedelta(hours=1)
    specs = [JobSpec(app_tasks.record, when, args=(str(i),)) for i in range(500)]
    ids = await scheduler.schedule_bulk(specs)
    assert ids == sorted(ids) and len(set(ids)) == 500
    rows = await pool.fetch("SELECT job_id, task_data->'args'->>0 AS arg FROM scheduled_jobs")
    assert {r["job_id"]: r["arg"] for r in rows} == {i: str(n) for n, i in enumerate(ids)}
