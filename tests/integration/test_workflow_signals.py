"""Signals: durable (sent before the wait: not lost), first one wins, streams,
timeouts, refused for unknown and finished jobs, and a parked workflow woken
by the signal's NOTIFY, never lost to a race with its park."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pg_scheduler import (
    JobNotFound,
    JobStatus,
    PollingConfig,
    SyncClient,
    WaitTimeout,
    WorkflowContext,
    workflow,
)
from tests.support.common import wait_for_status, wait_until

ran: Counter[str] = Counter()
gates: dict[str, asyncio.Event] = {}
stamps: dict[str, float] = {}

# No polling to fall back on: a wake-up that is not the NOTIFY's shows as a hang.
NO_POLLING = PollingConfig(idle_start_interval=30.0, max_interval=30.0)


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()
    gates.clear()
    stamps.clear()


def _gate(job_id: str) -> asyncio.Event:
    return gates.setdefault(job_id, asyncio.Event())


@workflow
async def approval(ctx: WorkflowContext, gated: bool) -> Any:
    await ctx.step("asked", lambda: ran.update(["asked"]))
    if gated:
        await _gate(ctx.job_id).wait()
    decision = await ctx.wait_for_signal("approved")
    stamps[ctx.job_id] = time.monotonic()
    await ctx.step("after", lambda: ran.update(["after"]))
    return decision


async def test_a_signal_sent_before_the_wait_is_taken_without_parking(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(approval, execution_time=datetime.now(UTC), args=(True,))
    await wait_until(lambda: ran["asked"] == 1, message="the first step")
    await scheduler.signal(job_id, "approved", {"by": "ann"})
    _gate(job_id).set()
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == {"by": "ann"}
    assert job.attempts == 1
    rows = await pool.fetch(
        "SELECT s.kind, s.status, s.result::text AS result, g.consumed_seq"
        "  FROM workflow_steps s LEFT JOIN workflow_signals g ON g.job_id = s.job_id"
        " WHERE s.job_id = $1 AND s.kind = 'signal'",
        job_id,
    )
    assert [(r["status"], r["result"], r["consumed_seq"]) for r in rows] == [
        ("completed", '{"payload": {"by": "ann"}}', 2)
    ]


async def test_a_parked_workflow_is_woken_by_the_signal_not_by_polling(pool, make_scheduler):
    scheduler = await make_scheduler(polling_config=NO_POLLING)
    job_id = await scheduler.schedule(approval, execution_time=datetime.now(UTC), args=(False,))
    await wait_for_status(pool, job_id, "waiting")
    job = await scheduler.get_job(job_id)
    assert (job.wait_kind, job.wait_for, job.wake_at) == ("signal", "approved", None)
    await asyncio.sleep(0.3)  # the claim loop is asleep now, for up to 30 s
    sent = time.monotonic()
    await scheduler.signal(job_id, "approved", "yes")
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == "yes"
    woke_after = stamps[job_id] - sent
    assert woke_after < 0.5, woke_after  # the polling bound is 30 s
    assert ran == Counter({"asked": 1, "after": 1})


async def test_signals_to_unknown_or_finished_jobs_are_refused(pool, make_scheduler):
    scheduler = await make_scheduler()
    with pytest.raises(JobNotFound):
        await scheduler.signal("no-such-job", "approved")
    job_id = await scheduler.schedule(approval, execution_time=datetime.now(UTC), args=(False,))
    await wait_for_status(pool, job_id, "waiting")
    await scheduler.cancel_job(job_id)
    with pytest.raises(ValueError, match="is cancelled: a finished job takes no signal"):
        await scheduler.signal(job_id, "approved", 1)
    with pytest.raises(TypeError):
        await scheduler.signal(job_id, "", 1)
    with pytest.raises(TypeError):
        await scheduler.signal(job_id, "approved", object())
    with pytest.raises(ValueError):
        await scheduler.signal(job_id, "approved", "nul \x00")
    assert await pool.fetchval("SELECT count(*) FROM workflow_signals") == 0


@workflow
async def two_waits(ctx: WorkflowContext) -> Any:
    await _gate(ctx.job_id).wait()
    first = await ctx.wait_for_signal("vote")
    second = await ctx.wait_for_signal("vote")
    return [first, second]


async def test_the_oldest_signal_wins_and_each_wait_takes_one(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(two_waits, execution_time=datetime.now(UTC))
    for n in range(3):
        await scheduler.signal(job_id, "vote", n)
    await scheduler.signal(job_id, "other", "ignored")
    _gate(job_id).set()
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.result == [0, 1], job.error
    left = await pool.fetch(
        "SELECT name, payload::text AS payload FROM workflow_signals"
        " WHERE job_id = $1 AND consumed_seq IS NULL ORDER BY id",
        job_id,
    )
    assert [(r["name"], r["payload"]) for r in left] == [("vote", "2"), ("other", '"ignored"')]


@workflow
async def reader(ctx: WorkflowContext, count: int) -> list[Any]:
    seen = []
    async for payload in ctx.signals("event"):
        seen.append(payload)
        if len(seen) == count:
            break
    return seen


async def test_a_stream_of_signals_is_read_one_wait_each(pool, make_scheduler):
    scheduler = await make_scheduler(polling_config=NO_POLLING)
    job_id = await scheduler.schedule(reader, execution_time=datetime.now(UTC), args=(12,))
    await wait_for_status(pool, job_id, "waiting")
    for n in range(12):
        await scheduler.signal(job_id, "event", n)
        if n % 4 == 0:
            await asyncio.sleep(0.05)
    job = await scheduler.wait_for(job_id, timeout=15)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == list(range(12))  # sent one after another: taken in order


@workflow
async def impatient(ctx: WorkflowContext, seconds: float, with_default: bool) -> Any:
    if with_default:
        return await ctx.wait_for_signal("late", timeout=seconds, default="gave up")
    try:
        return await ctx.wait_for_signal("late", timeout=timedelta(seconds=seconds))
    except WaitTimeout as exc:
        return f"timeout: {exc.signal}"


@pytest.mark.parametrize("seconds", [0.3, 2.5])
async def test_a_wait_times_out(pool, make_scheduler, seconds):
    scheduler = await make_scheduler()
    started = time.monotonic()
    a = await scheduler.schedule(impatient, execution_time=datetime.now(UTC), args=(seconds, True))
    b = await scheduler.schedule(impatient, execution_time=datetime.now(UTC), args=(seconds, False))
    assert (await scheduler.wait_for(a, timeout=10)).result == "gave up"
    assert (await scheduler.wait_for(b, timeout=10)).result == "timeout: late"
    took = time.monotonic() - started
    assert seconds <= took < seconds + 1.0, took
    # The workflow has finished: a signal now is refused.
    with pytest.raises(ValueError):
        await scheduler.signal(a, "late")


async def test_a_signal_before_a_long_timeout_is_taken(pool, make_scheduler):
    scheduler = await make_scheduler(polling_config=NO_POLLING)
    job_id = await scheduler.schedule(
        impatient, execution_time=datetime.now(UTC), args=(3.0, False)
    )
    await wait_for_status(pool, job_id, "waiting")
    # Past the moment the timer makes it pending (2 s ahead of the timeout).
    await asyncio.sleep(1.5)
    await scheduler.signal(job_id, "late", "just in time")
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.result == "just in time"


async def test_the_sync_client_sends_signals(pool, make_scheduler, dsn):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(approval, execution_time=datetime.now(UTC), args=(False,))
    await wait_for_status(pool, job_id, "waiting")
    with SyncClient(dsn) as client:
        await asyncio.to_thread(client.signal, job_id, "approved", ["sync"])
        with pytest.raises(JobNotFound):
            await asyncio.to_thread(client.signal, "missing", "approved")
    assert (await scheduler.wait_for(job_id, timeout=10)).result == ["sync"]


async def test_the_sync_client_sends_signals_in_bulk(pool, make_scheduler, dsn):
    scheduler = await make_scheduler()
    ids = [
        await scheduler.schedule(approval, execution_time=datetime.now(UTC), args=(False,))
        for _ in range(3)
    ]
    for job_id in ids:
        await wait_for_status(pool, job_id, "waiting")
    with SyncClient(dsn) as client:
        with pytest.raises(JobNotFound):
            await asyncio.to_thread(client.signal_bulk, [(ids[0], "approved"), ("missing", "x")])
        with pytest.raises(TypeError):
            await asyncio.to_thread(client.signal_bulk, 42)
        items = ((job_id, "approved", i) for i, job_id in enumerate(ids))  # a generator
        assert await asyncio.to_thread(client.signal_bulk, items) == 3
    for i, job_id in enumerate(ids):
        assert (await scheduler.wait_for(job_id, timeout=10)).result == i


@workflow
async def racer(ctx: WorkflowContext) -> Any:
    await ctx.step("ready", lambda: _gate(ctx.job_id).set())
    return await ctx.wait_for_signal("go")


async def test_signals_racing_the_park_are_never_lost(pool, make_scheduler):
    """The signal lands while the workflow parks (before, during, after its
    transaction), on two workers without polling: every workflow wakes."""
    first = await make_scheduler(polling_config=NO_POLLING, max_concurrent_jobs=20)
    second = await make_scheduler(polling_config=NO_POLLING, max_concurrent_jobs=20)
    rng = random.Random(7)
    for _ in range(5):
        ids = [await first.schedule(racer, execution_time=datetime.now(UTC)) for _ in range(30)]

        async def send(job_id: str) -> None:
            await asyncio.wait_for(_gate(job_id).wait(), 10)
            await asyncio.sleep(rng.choice([0, 0, 0.0005, 0.001, 0.002, 0.005]))
            await second.signal(job_id, "go", job_id)

        await asyncio.gather(*(send(job_id) for job_id in ids))
        for job_id in ids:
            job = await second.wait_for(job_id, timeout=10)
            assert job.status is JobStatus.COMPLETED, (job.status, job.error)
            assert job.result == job_id
