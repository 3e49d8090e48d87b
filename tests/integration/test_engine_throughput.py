"""The throughput engine: claim-ahead, slots freed before the completion is written."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

from pg_scheduler.store import Completion
from tests.support import app_tasks
from tests.support.common import job_status, wait_for_status, wait_until


def now() -> datetime:
    return datetime.now(UTC)


async def test_prefetched_job_is_handed_back_unstarted_at_shutdown(pool, make_scheduler):
    # One slot, one batch of one: the second job is claimed ahead and waits locally.
    scheduler = await make_scheduler(start=False, max_concurrent_jobs=1, batch_claim_limit=1)
    key = "prefetch-shutdown"
    app_tasks.calls[key].clear()
    app_tasks.calls[key + "-2"].clear()
    t = now() - timedelta(seconds=1)
    first = await scheduler.schedule(app_tasks.sleep_for, execution_time=t, args=(key, 30))
    second = await scheduler.schedule(
        app_tasks.sleep_for, execution_time=t + timedelta(milliseconds=1), args=(key + "-2", 30)
    )
    await scheduler.start()
    await asyncio.wait_for(app_tasks.event(key + ":started").wait(), 10)
    await wait_until(lambda: second in scheduler.worker.state.owned, message="second claimed ahead")
    assert await job_status(pool, second) == "running"

    await scheduler.shutdown(grace_period=0.3)

    # The running job was cancelled and handed back; the prefetched one never started.
    assert app_tasks.calls[key + "-2"] == []
    for job_id in (first, second):
        row = await pool.fetchrow(
            "SELECT status, attempts, worker_id FROM scheduled_jobs WHERE job_id = $1", job_id
        )
        assert row["status"] == "pending" and row["worker_id"] is None
        assert row["attempts"] == 0


async def test_many_quick_jobs_each_complete_once(pool, make_scheduler):
    scheduler = await make_scheduler(max_concurrent_jobs=5, batch_claim_limit=5)
    t = now() - timedelta(seconds=1)
    ids = [
        await scheduler.schedule(app_tasks.add, execution_time=t, args=(i, 1)) for i in range(60)
    ]

    async def all_done() -> bool:
        n = await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE job_id = ANY($1) AND status = 'completed'"
            " AND attempts = 1",
            ids,
        )
        return n == len(ids)

    await wait_until(all_done, message="every job completed once")
    await wait_for_status(pool, ids[-1], "completed")
    assert scheduler.worker.in_flight == 0
    assert scheduler.worker.completer.pending == 0


async def test_large_bulk_uses_copy_and_wakes_workers(pool, make_scheduler):
    from pg_scheduler import JobSpec

    scheduler = await make_scheduler(max_concurrent_jobs=20, batch_claim_limit=20)
    t = now() - timedelta(seconds=1)
    specs = [JobSpec(func=app_tasks.add, execution_time=t, args=(i, 1)) for i in range(250)]
    ids = await scheduler.schedule_bulk(specs, batch_size=200)
    assert len(set(ids)) == 250 and None not in ids

    async def all_done() -> bool:
        n = await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE job_id = ANY($1) AND status = 'completed'",
            ids,
        )
        return n == 250

    await wait_until(all_done, message="bulk jobs completed")
    job = await scheduler.get_job(ids[7])
    assert (
        job.result == 8 and job.task_name == "tests.support.app_tasks:add" and job.job_name == "add"
    )


async def test_batched_completion_keeps_the_lease_guard_and_odd_ids(pool, make_scheduler):
    """One completion statement for many jobs: only rows this worker's attempt
    holds are settled, results land as given, and ids need no escaping by hand."""
    scheduler = await make_scheduler(start=False)
    store = scheduler.store
    odd = ['quote"d', "back\\slash", "ünïcode", "spa ce", "x" * 100]
    when = datetime.now(UTC) - timedelta(seconds=1)
    for job_id in odd:
        await scheduler.schedule(app_tasks.noop, execution_time=when, job_id=job_id)
    claimed = await store.claim("w1", ["tests.support.app_tasks:noop"], 10, 60.0)
    assert {r["job_id"] for r in claimed} == set(odd)
    results = ['{"a": [1, "two"]}', None, '"text with \\"quotes\\""', "3.5", "null"]
    done = [Completion(job_id, 1, result) for job_id, result in zip(odd, results, strict=True)]
    stale = Completion(odd[0], 2, "1")  # an attempt that does not hold the row
    assert await store.complete("w2", done, delete=False) == set()  # not this worker's
    assert await store.complete("w1", [stale], delete=False) == set()
    assert await store.complete("w1", done, delete=False) == set(odd)
    rows = {
        r["job_id"]: r
        for r in await pool.fetch(
            "SELECT job_id, status, result::text AS result FROM scheduled_jobs"
        )
    }
    assert {r["status"] for r in rows.values()} == {"completed"}
    stored = [rows[job_id]["result"] for job_id in odd]
    expected = [None if r in (None, "null") else json.dumps(json.loads(r)) for r in results]
    assert [None if s is None else json.dumps(json.loads(s)) for s in stored] == expected
    # Settled once: a repeat (a retried write whose first answer was lost) changes nothing.
    assert await store.complete("w1", done, delete=False) == set()
