"""A debounced job claimed ahead into a worker's buffer (migration 0019's index
holds its key there, as scope "pending" does): a call that meets it waits,
never rewriting a row the worker has read. Handed back unstarted, the job
takes the waiting call's arguments (the burst goes on); started, the call
begins the next burst. Real workers, real claims."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest

from tests.support import handback_tasks as tasks
from tests.support.common import wait_for_status, wait_until

KEY = "reindex:42"


@pytest.fixture(autouse=True)
def fresh_tasks() -> None:
    tasks.reset()


@pytest.fixture
async def other_pool(dsn: str):
    p = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    yield p
    await p.close()


async def keyed(pool) -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT job_id, status, claimed_ahead, task_data::text AS data, execution_time"
        " FROM scheduled_jobs WHERE dedupe_key = $1 ORDER BY created_at",
        KEY,
    )


async def debounced(scheduler, name: str) -> str:
    return await scheduler.schedule(tasks.hold, args=(name,), dedupe_key=KEY, debounce=0.2)


async def claimed_ahead_behind_a_blocker(pool, worker) -> str:
    """The worker's only slot held by a blocker; the burst's job, due, claimed
    ahead behind it (running in the database, waiting in the buffer)."""
    await worker.schedule(tasks.hold, args=("blocker",))
    await asyncio.wait_for(tasks.began("blocker").wait(), 10)
    holder = await debounced(worker, "first")

    async def ahead() -> bool:
        rows = await keyed(pool)
        return rows[0]["status"] == "running" and rows[0]["claimed_ahead"]

    await wait_until(ahead, message="the debounced job claimed ahead")
    return holder


async def test_handed_back_unstarted_it_takes_the_waiting_calls_arguments(
    pool, other_pool, make_scheduler
):
    worker = await make_scheduler(max_concurrent_jobs=1, batch_claim_limit=1)
    producer = await make_scheduler(start=False, db_pool=other_pool)
    holder = await claimed_ahead_behind_a_blocker(pool, worker)
    # The worker hands its buffer back after max_buffer_wait (1 s); the call
    # meets the claimed row first and waits for that.
    joined = await asyncio.wait_for(debounced(producer, "second"), 30)
    assert joined == holder
    [row] = await keyed(pool)
    assert row["status"] == "pending" and json.loads(row["data"])["args"] == ["second"]
    tasks.gate("second").set()
    tasks.gate("blocker").set()
    await wait_for_status(pool, holder, "completed", timeout=20)
    assert tasks.runs["second"] == 1 and tasks.runs["first"] == 0


async def test_started_from_the_buffer_the_waiting_call_begins_the_next_burst(
    pool, other_pool, make_scheduler
):
    worker = await make_scheduler(max_concurrent_jobs=1, batch_claim_limit=1)
    worker.worker.handback.max_buffer_wait = 3600.0  # it starts from the buffer
    producer = await make_scheduler(start=False, db_pool=other_pool)
    holder = await claimed_ahead_behind_a_blocker(pool, worker)
    call = asyncio.ensure_future(debounced(producer, "second"))
    tasks.gate("blocker").set()  # its slot frees: the buffered job starts
    await asyncio.wait_for(tasks.began("first").wait(), 10)
    successor = await asyncio.wait_for(call, 30)
    assert successor != holder
    rows = {r["job_id"]: r for r in await keyed(pool)}
    assert json.loads(rows[holder]["data"])["args"] == ["first"]
    assert json.loads(rows[successor]["data"])["args"] == ["second"]
    tasks.gate("first").set()
    tasks.gate("second").set()
    await wait_for_status(pool, holder, "completed", timeout=20)
    await wait_for_status(pool, successor, "completed", timeout=20)
    assert tasks.runs["first"] == 1 and tasks.runs["second"] == 1
