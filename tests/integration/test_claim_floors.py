"""The plain claim from floors (engine/heads.py): each group's head searched
from a floor instead of from the group's start, while finding the heads is slow."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from pg_scheduler import JobPriority, JobSpec, task
from pg_scheduler.engine import heads
from pg_scheduler.store.queues import Floors
from tests.support.common import wait_until

RUNS: Counter[str] = Counter()


@task(name="test.floors.a")
async def job_a(n: int) -> None:
    RUNS[f"a{n}"] += 1


@task(name="test.floors.b")
async def job_b(n: int) -> None:
    RUNS[f"b{n}"] += 1


async def test_the_seeded_claim_reads_each_group_from_its_floor(make_scheduler):
    scheduler = await make_scheduler(start=False)
    base = datetime.now(UTC) - timedelta(minutes=10)
    ids = [
        await scheduler.schedule(job_a, args=(i,), execution_time=base + timedelta(seconds=i))
        for i in range(5)
    ]
    other = await scheduler.schedule(job_b, args=(0,), execution_time=base)
    store = scheduler.store

    heads_read = await store.group_heads(store.pool, ["test.floors.a", "test.floors.b"], None)
    assert {(r["task_name"], r["execution_time"]) for r in heads_read} == {
        ("test.floors.a", base),
        ("test.floors.b", base),
    }

    # Only group a is named, from its third row: rows 0 and 1 and group b are not seen.
    floors = Floors(
        ["default"], ["test.floors.a"], [JobPriority.NORMAL.db_value], [base + timedelta(seconds=2)]
    )
    due = await store.seconds_until_next_due(["test.floors.a", "test.floors.b"], floors=floors)
    assert due is not None and -600 < due < -590  # the third row's, not the first's
    rows = await store.claim(
        "w-floors", ["test.floors.a", "test.floors.b"], 10, 30.0, floors=floors
    )
    assert sorted(r["job_id"] for r in rows) == sorted(ids[2:])

    # The plain claim reads every group from its start.
    rows = await store.claim("w-floors", ["test.floors.a", "test.floors.b"], 10, 30.0)
    assert sorted(r["job_id"] for r in rows) == sorted([ids[0], ids[1], other])


@pytest.fixture
def floors_always(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read of the heads counts as slow, and reads come every 50 ms."""
    monkeypatch.setattr(heads, "SLOW", -1.0)
    monkeypatch.setattr(heads, "QUICK", -2.0)
    monkeypatch.setattr(heads, "INTERVAL", 0.05)


async def test_with_floors_on_every_job_runs_once_new_groups_and_past_dated_rows_too(
    floors_always, make_scheduler
):
    RUNS.clear()
    scheduler = await make_scheduler()
    # Enqueued by a scheduler that does not run jobs: every job goes through the claim.
    producer = await make_scheduler(start=False)
    for i in range(50):
        await producer.schedule(job_a, args=(i,))
    await wait_until(lambda: scheduler.worker.heads.on, message="the floors on")
    await wait_until(lambda: len(RUNS) == 50, message="the first 50 jobs")

    # A group no read has seen yet (another task, another priority), a row
    # dated an hour back (before every floor), and a burst in a known group.
    await producer.schedule(job_b, args=(0,), priority=JobPriority.CRITICAL)
    await producer.schedule(
        job_a,
        args=(1000,),
        execution_time=datetime.now(UTC) - timedelta(hours=1),
        misfire_grace_time=None,
    )
    now = datetime.now(UTC)
    await producer.schedule_bulk([JobSpec(job_a, now, (i,)) for i in range(50, 550)])
    await wait_until(lambda: len(RUNS) == 552, timeout=20, message="every job ran")
    assert scheduler.worker.heads.on
    assert set(RUNS.values()) == {1}, [k for k, v in RUNS.items() if v != 1]
