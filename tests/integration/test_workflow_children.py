"""Children: spawned once under replay, gathered with the parent parked, a
child's failure as JobFailed (also on replay), the cancel policy (children
end with their parent unless detached), and wake-ups never lost to a race
between a child's end and its parent's park."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from pg_scheduler import (
    JobCancelled,
    JobFailed,
    JobPriority,
    JobStatus,
    PollingConfig,
    RetryPolicy,
    WorkflowContext,
    task,
    workflow,
)
from pg_scheduler.enums import PRIORITY_DB_VALUE_OF
from pg_scheduler.store import Completion, Store
from tests.support.common import wait_for_status, wait_until

FAST_RETRY = RetryPolicy(base_delay=0.01, factor=1.0, max_delay=0.01, jitter=0.0)
NO_POLLING = PollingConfig(idle_start_interval=30.0, max_interval=30.0)
ran: Counter[str] = Counter()
flags: dict[str, Any] = {}
gate = asyncio.Event()


@pytest.fixture(autouse=True)
def _reset() -> None:
    global gate
    ran.clear()
    flags.clear()
    gate = asyncio.Event()  # of this test's event loop


@task
async def score(x: int) -> int:
    ran["score"] += 1
    if flags.get("gated"):
        await gate.wait()
    return x * x


@task
async def explode(message: str) -> None:
    ran["explode"] += 1
    raise ValueError(message)


@task
async def linger(name: str) -> str:
    ran[f"linger {name}"] += 1
    await gate.wait()
    ran[f"lingered {name}"] += 1
    return name


@workflow
async def fan_out(ctx: WorkflowContext, n: int) -> Any:
    ran["parent runs"] += 1
    results = await ctx.gather(*[ctx.spawn(score, x) for x in range(n)])
    if flags.pop("fail_once", False):
        raise RuntimeError("after the gather")
    return results


async def test_gather_parks_the_parent_until_every_child_ended(pool, make_scheduler):
    scheduler = await make_scheduler(max_concurrent_jobs=10)
    flags["gated"] = True
    job_id = await scheduler.schedule(fan_out, execution_time=datetime.now(UTC), args=(5,))
    await wait_for_status(pool, job_id, "waiting")
    job = await scheduler.get_job(job_id)
    assert job.wait_kind == "children"
    children = await pool.fetch(
        "SELECT job_id, parent_job_id, parent_seq, status FROM scheduled_jobs"
        " WHERE parent_job_id = $1 ORDER BY parent_seq",
        job_id,
    )
    assert [c["parent_seq"] for c in children] == [1, 2, 3, 4, 5]
    await wait_until(lambda: ran["score"] == 5, message="the children to start")
    assert (await scheduler.get_job(job_id)).status is JobStatus.WAITING
    gate.set()
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == [0, 1, 4, 9, 16]
    assert ran["parent runs"] == 2  # parked once, woken once: by the last child
    child = await scheduler.get_job(children[0]["job_id"])
    assert child.parent_job_id == job_id and child.result == 0


async def test_spawns_are_written_once_whatever_the_runs(pool, make_scheduler):
    scheduler = await make_scheduler()
    flags["fail_once"] = True
    job_id = await scheduler.schedule(
        fan_out,
        execution_time=datetime.now(UTC),
        args=(3,),
        max_retries=1,
        retry_policy=FAST_RETRY,
    )
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == [0, 1, 4]
    assert ran["score"] == 3  # each child ran once
    count = await pool.fetchval(
        "SELECT count(*) FROM scheduled_jobs WHERE parent_job_id = $1", job_id
    )
    assert count == 3


@workflow
async def fragile(ctx: WorkflowContext) -> Any:
    ok = ctx.spawn(score, 3)
    bad = await ctx.spawn(explode, "boom")
    outcome: dict[str, Any] = {"ok": await ctx.wait(ok)}
    try:
        await ctx.wait(bad)
    except JobFailed as exc:
        outcome["failed"] = [exc.job.job_id == bad.job_id, exc.error]
    outcome["gathered"] = [
        repr(r) if isinstance(r, Exception) else r
        for r in await ctx.gather(ok, bad, return_exceptions=True)
    ]
    if flags.pop("fail_once", False):
        raise RuntimeError("replay the failure")
    return outcome


async def test_a_child_failure_raises_job_failed_in_the_parent_also_on_replay(pool, make_scheduler):
    scheduler = await make_scheduler()
    flags["fail_once"] = True
    job_id = await scheduler.schedule(
        fragile, execution_time=datetime.now(UTC), max_retries=1, retry_policy=FAST_RETRY
    )
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result["ok"] == 9
    assert job.result["failed"] == [True, "ValueError: boom"]
    assert job.result["gathered"][0] == 9
    assert job.result["gathered"][1].startswith("JobFailed(")
    assert ran["explode"] == 1 and ran["score"] == 1


@workflow(queue="wfq")
async def placed(ctx: WorkflowContext) -> list[str]:
    a = ctx.spawn(score, 1)
    b = ctx.spawn(score, 2, priority=JobPriority.CRITICAL, queue="other")
    await ctx.gather(a)
    return [a.job_id, b.job_id]


async def test_children_take_the_parents_queue_and_priority_unless_given(pool, make_scheduler):
    scheduler = await make_scheduler(queues=["wfq", "default"])
    job_id = await scheduler.schedule(
        placed, execution_time=datetime.now(UTC), priority=JobPriority.HIGH
    )
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED, job.error
    rows = {
        r["job_id"]: (r["queue"], r["priority"])
        for r in await pool.fetch(
            "SELECT job_id, queue, priority FROM scheduled_jobs WHERE parent_job_id = $1",
            job_id,
        )
    }
    a, b = job.result
    assert rows[a] == ("wfq", 3)
    # Not awaited and not detached: cancelled when the parent completed.
    assert rows[b] == ("other", 1)
    assert (await scheduler.get_job(b)).status is JobStatus.CANCELLED


@workflow
async def supervisor(ctx: WorkflowContext) -> Any:
    attached = ctx.spawn(linger, "attached")
    ctx.spawn(linger, "detached", detached=True)
    return await ctx.wait(attached)


async def test_cancelling_a_parent_cancels_its_children_but_not_detached_ones(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(supervisor, execution_time=datetime.now(UTC))
    await wait_for_status(pool, job_id, "waiting")
    await wait_until(lambda: ran["linger attached"] == ran["linger detached"] == 1)
    kids = {
        r["task_data"]: r["job_id"]
        for r in await pool.fetch(
            "SELECT job_id, task_data->'args'->>0 AS task_data FROM scheduled_jobs"
            " WHERE parent_job_id = $1",
            job_id,
        )
    }
    assert await scheduler.cancel_job(job_id)
    await wait_for_status(pool, kids["attached"], "cancelled")
    attached = await scheduler.get_job(kids["attached"])
    assert f"its parent job {job_id} ended (cancelled)" in attached.error
    # The running child's coroutine was stopped (its cancel NOTIFY).
    await wait_until(lambda: kids["attached"] not in scheduler.worker.running)
    gate.set()
    detached = await scheduler.wait_for(kids["detached"], timeout=10)
    assert detached.status is JobStatus.COMPLETED and detached.result == "detached"
    assert ran["lingered attached"] == 0
    with pytest.raises(JobCancelled):
        await scheduler.result(kids["attached"])


@workflow
async def quick_parent(ctx: WorkflowContext, n: int) -> int:
    return sum(await ctx.gather(*[ctx.spawn(score, n) for _ in range(2)]))


async def test_child_ends_racing_the_parents_park_never_lose_the_wake_up(pool, make_scheduler):
    """Children end on another worker while their parent parks; no polling."""
    first = await make_scheduler(polling_config=NO_POLLING, max_concurrent_jobs=20)
    second = await make_scheduler(polling_config=NO_POLLING, max_concurrent_jobs=20)
    for round_ in range(5):
        ids = [
            await first.schedule(quick_parent, execution_time=datetime.now(UTC), args=(n,))
            for n in range(30)
        ]
        for n, job_id in enumerate(ids):
            job = await second.wait_for(job_id, timeout=15)
            assert job.status is JobStatus.COMPLETED, (round_, job.status, job.error)
            assert job.result == 2 * n * n


async def test_children_ending_between_the_first_read_and_the_lock_are_seen(
    pool, make_scheduler, monkeypatch
):
    """A wait reads its children's ends once without the family lock, then
    under it only the children not yet ended: ends committed between the two
    reads are found there (the parent finishes without parking; a park would
    wait for ends already counted by no one, and never wake)."""
    from pg_scheduler.store.workflows import WorkflowStore

    flags["gated"] = True
    original = WorkflowStore.spawned_ended
    calls: list[int] = []

    async def between(self: WorkflowStore, db: Any, job_id: str, seqs: Any) -> Any:
        rows = await original(self, db, job_id, seqs)
        calls.append(len(rows))
        if len(calls) == 1:  # the read without the lock: now the children end
            gate.set()

            async def all_completed() -> bool:
                return (
                    await pool.fetchval(
                        "SELECT count(*) FROM scheduled_jobs"
                        " WHERE parent_job_id = $1 AND status = 'completed'",
                        job_id,
                    )
                    == 4
                )

            await wait_until(all_completed, timeout=15, message="the children completed")
        return rows

    monkeypatch.setattr(WorkflowStore, "spawned_ended", between)
    scheduler = await make_scheduler(max_concurrent_jobs=10)
    job_id = await scheduler.schedule(fan_out, execution_time=datetime.now(UTC), args=(4,))
    job = await scheduler.wait_for(job_id, timeout=20)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == [0, 1, 4, 9]
    assert calls == [0, 4]  # nothing ended at the first read; all four under the lock
    assert ran["parent runs"] == 1  # never parked
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM workflow_steps WHERE job_id = $1 AND kind = 'wait'"
            " AND status = 'completed'",
            job_id,
        )
        == 1
    )


async def test_a_fan_out_of_many_children_wakes_the_parent_once(pool, make_scheduler):
    scheduler = await make_scheduler(max_concurrent_jobs=50, batch_claim_limit=50)
    job_id = await scheduler.schedule(fan_out, execution_time=datetime.now(UTC), args=(500,))
    job = await scheduler.wait_for(job_id, timeout=60)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == [x * x for x in range(500)]
    assert ran["parent runs"] == 2
    assert ran["score"] == 500
    # The wait's record keeps its children as runs of steps, not 500 numbers.
    record = await pool.fetchrow(
        "SELECT status, result::text AS result FROM workflow_steps"
        " WHERE job_id = $1 AND kind = 'wait'",
        job_id,
    )
    assert (record["status"], json.loads(record["result"])) == (
        "completed",
        {"children": 500, "spans": [[1, 500]]},
    )


@workflow
async def sub_workflow(ctx: WorkflowContext, n: int) -> int:
    await ctx.sleep(0.2)
    got = await ctx.wait(ctx.spawn(score, n))
    ran["sub done"] += 1
    return got + 1


@workflow
async def grandparent(ctx: WorkflowContext) -> list[int]:
    return await ctx.gather(*[ctx.spawn(sub_workflow, n) for n in range(3)])


async def test_a_child_can_be_a_workflow(pool, make_scheduler):
    scheduler = await make_scheduler()
    job = await scheduler.wait_for(
        await scheduler.schedule(grandparent, execution_time=datetime.now(UTC)), timeout=15
    )
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == [1, 2, 5]
    assert ran["sub done"] == 3


@workflow
async def waits_long(ctx: WorkflowContext) -> Any:
    return await ctx.wait(ctx.spawn(sub_workflow, 1))


async def test_cancelling_a_parent_reaches_its_parked_grandchildren(pool, make_scheduler):
    scheduler = await make_scheduler()
    flags["gated"] = True
    job_id = await scheduler.schedule(waits_long, execution_time=datetime.now(UTC))
    await wait_until(lambda: ran["score"] == 1, message="the grandchild to start")
    tree = await pool.fetch(
        "SELECT job_id, parent_job_id, status FROM scheduled_jobs WHERE job_id <> $1", job_id
    )
    assert len(tree) == 2
    assert await scheduler.cancel_job(job_id)

    async def all_cancelled() -> bool:
        rows = await pool.fetch("SELECT status FROM scheduled_jobs")
        return {r["status"] for r in rows} == {"cancelled"}

    await wait_until(all_cancelled, message="the whole tree to be cancelled")
    gate.set()


@workflow
async def keeps_results(ctx: WorkflowContext) -> None:
    flags["results"] = await ctx.gather(*[ctx.spawn(score, x) for x in (2, 3)])


async def test_with_immediate_deletion_a_childs_result_is_not_kept(pool, make_scheduler):
    from pg_scheduler import VacuumConfig, VacuumPolicy, VacuumTrigger

    scheduler = await make_scheduler(
        vacuum_enabled=True,
        vacuum_config=VacuumConfig(completed=VacuumPolicy(trigger=VacuumTrigger.IMMEDIATE)),
    )
    await scheduler.schedule(keeps_results, execution_time=datetime.now(UTC))
    await wait_until(lambda: "results" in flags, timeout=10, message="the parent's resume")
    # Each child's row (and result) was deleted by its completion: None.
    assert flags["results"] == [None, None]

    async def gone() -> bool:
        return await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0

    # The parent completed too (deleted at once), and its records with it.
    await wait_until(gone, message="every row deleted on completion")
    assert await pool.fetchval("SELECT count(*) FROM workflow_steps") == 0
    assert ran["score"] == 2


@task
async def brief() -> str:
    await asyncio.sleep(0.3)
    return "brief"


@workflow(timeout=1.5)
async def near_deadline(ctx: WorkflowContext) -> str:
    return await ctx.wait(ctx.spawn(brief))


async def test_a_parent_parked_near_its_deadline_is_woken_by_its_child(pool, make_scheduler):
    # The deadline is within the timer's lookahead: the park leaves the row
    # pending, due at the deadline; the child's end makes it due at once.
    scheduler = await make_scheduler()
    job = await scheduler.wait_for(
        await scheduler.schedule(near_deadline, execution_time=datetime.now(UTC)), timeout=10
    )
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == "brief"


@workflow
async def fan_elsewhere(ctx: WorkflowContext, n: int) -> Any:
    return await ctx.gather(*[ctx.spawn(score, x, queue="elsewhere") for x in range(n)])


@pytest.mark.parametrize("last", ["complete", "complete_unlocked", "earlier_version"])
async def test_every_statement_that_completes_children_counts_their_parent_down(
    pool, make_scheduler, dsn, last
):
    """The completer's statement counts a batch of children down at once (one
    update of the parent's count, not one per child); the statement that
    writes a batch apart does too; a completion as a worker of an earlier
    version writes it (a plain UPDATE, on a connection that never ran this
    version's statements) is counted by the row trigger."""
    scheduler = await make_scheduler(queues=["default"])  # the children stay unclaimed
    job_id = await scheduler.schedule(fan_elsewhere, execution_time=datetime.now(UTC), args=(4,))
    await wait_for_status(pool, job_id, "waiting")
    children = [
        r["job_id"]
        for r in await pool.fetch(
            "SELECT job_id FROM scheduled_jobs WHERE parent_job_id = $1 ORDER BY parent_seq",
            job_id,
        )
    ]
    assert len(children) == 4
    await pool.execute(
        "UPDATE scheduled_jobs SET status = 'running', worker_id = 'w1', attempts = 1,"
        " started_at = now() WHERE job_id = ANY($1::text[])",
        children,
    )
    store = Store(pool)
    first = [Completion(c, 1, str(x * x)) for x, c in enumerate(children[:3])]
    assert await store.complete("w1", first, False) == set(children[:3])
    left = "SELECT wait_left FROM workflow_waits WHERE job_id = $1"
    assert await pool.fetchval(left, job_id) == 1
    assert (await scheduler.get_job(job_id)).status is JobStatus.WAITING
    if last == "complete":
        assert await store.complete("w1", [Completion(children[3], 1, "9")], False) == {children[3]}
    elif last == "complete_unlocked":
        written = await store.complete_unlocked("w1", [Completion(children[3], 1, "9")], False)
        assert written == ({children[3]}, set())
    else:
        fresh = await asyncpg.connect(dsn)
        try:
            await fresh.execute(
                "UPDATE scheduled_jobs SET status = 'completed', result = '9'::jsonb,"
                " finished_at = now() WHERE job_id = $1 AND status = 'running'",
                children[3],
            )
        finally:
            await fresh.close()
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == [0, 1, 4, 9]


@task(concurrency_key=lambda x: f"mod{x % 3}", max_running_per_key=5)
async def keyed_square(x: int) -> int:
    return x * x


@workflow
async def mixed_spawns(ctx: WorkflowContext, n: int) -> Any:
    plain = [ctx.spawn(score, x) for x in range(n)]
    urgent = ctx.spawn(score, n, priority=JobPriority.CRITICAL)
    after = ctx.spawn(score, n + 1)
    keyed = [ctx.spawn(keyed_square, x) for x in range(n)]
    return await ctx.gather(*plain, urgent, after, *keyed)


async def test_spawns_of_one_function_keep_their_own_options_and_keys(pool, make_scheduler):
    """A spawn with no option reuses what an earlier spawn of its function
    decided; one with options, or of a task whose key depends on the
    arguments, decides afresh each time."""
    scheduler = await make_scheduler(max_concurrent_jobs=20)
    job_id = await scheduler.schedule(mixed_spawns, args=(6,))
    job = await scheduler.wait_for(job_id, timeout=20)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == [x * x for x in range(8)] + [x * x for x in range(6)]
    rows = await pool.fetch(
        "SELECT task_name, priority, concurrency_key, task_data::text AS data"
        "  FROM scheduled_jobs WHERE parent_job_id = $1 ORDER BY parent_seq",
        job_id,
    )
    assert len(rows) == 14
    normal, critical = (
        PRIORITY_DB_VALUE_OF[JobPriority.NORMAL],
        PRIORITY_DB_VALUE_OF[JobPriority.CRITICAL],
    )
    assert [r["priority"] for r in rows[:8]] == [normal] * 6 + [critical, normal]
    assert all(r["concurrency_key"] is None for r in rows[:8])
    assert [r["concurrency_key"] for r in rows[8:]] == [f"mod{x % 3}" for x in range(6)]


@workflow
async def bool_retries(ctx: WorkflowContext) -> Any:
    first = ctx.spawn(score, 1)  # a spawn with no option: decided once for score
    ctx.spawn(score, 2, max_retries=False)  # equal to 0, but not an int
    return await ctx.wait(first)


async def test_a_spawn_option_equal_to_its_default_is_still_checked(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(bool_retries)
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.FAILED
    assert "max_retries" in (job.error or ""), job.error
    assert (
        await pool.fetchval("SELECT count(*) FROM scheduled_jobs WHERE parent_job_id = $1", job_id)
        == 0
    )
