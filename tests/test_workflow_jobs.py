"""A workflow among jobs: REPLACE makes a new run (its old records go) but
never touches a parked workflow; a parked workflow holds its dedupe key;
deleting a workflow's row takes its records and signals with it."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import pytest
from conftest import wait_for_status, wait_until

from pg_scheduler import ConflictResolution, JobStatus, WorkflowContext, workflow

ran: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()


@workflow
async def counted(ctx: WorkflowContext, label: str) -> str:
    await ctx.step("one", lambda: ran.update([f"one {label}"]))
    await ctx.step("two", lambda: ran.update([f"two {label}"]))
    return label


async def test_replacing_a_finished_workflow_starts_it_afresh(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(
        counted, execution_time=datetime.now(UTC), args=("a",), job_id="wf-replace"
    )
    assert (await scheduler.wait_for(job_id, timeout=10)).result == "a"
    await scheduler.schedule(
        counted,
        execution_time=datetime.now(UTC),
        args=("b",),
        job_id="wf-replace",
        conflict_resolution=ConflictResolution.REPLACE,
    )
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.result == "b", job.error
    # The new run ran its steps: nothing of the old one was replayed.
    assert ran == Counter({"one a": 1, "two a": 1, "one b": 1, "two b": 1})
    rows = await pool.fetch(
        "SELECT name, attempts FROM workflow_steps WHERE job_id = $1 ORDER BY seq", job_id
    )
    assert [(r["name"], r["attempts"]) for r in rows] == [("one", 1), ("two", 1)]


@workflow(dedupe_key="approval-42")
async def keyed_approval(ctx: WorkflowContext) -> object:
    return await ctx.wait_for_signal("approved")


async def test_a_parked_workflow_keeps_its_dedupe_key_and_is_never_replaced(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(keyed_approval, execution_time=datetime.now(UTC))
    await wait_for_status(pool, job_id, "waiting")
    with pytest.raises(ValueError, match="approval-42"):
        await scheduler.schedule(keyed_approval, execution_time=datetime.now(UTC))
    holder = await scheduler.schedule(
        keyed_approval,
        execution_time=datetime.now(UTC),
        conflict_resolution=ConflictResolution.IGNORE,
    )
    assert holder == job_id
    replaced = await scheduler.schedule(
        keyed_approval,
        execution_time=datetime.now(UTC),
        conflict_resolution=ConflictResolution.REPLACE,
    )
    assert replaced == job_id
    assert (await scheduler.get_job(job_id)).status is JobStatus.WAITING
    await scheduler.signal(job_id, "approved", "ok")
    assert (await scheduler.wait_for(job_id, timeout=10)).result == "ok"


async def test_deleting_a_workflow_takes_its_records_and_signals(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(keyed_approval, execution_time=datetime.now(UTC))
    await wait_for_status(pool, job_id, "waiting")
    await scheduler.signal(job_id, "other", 1)
    assert await pool.fetchval("SELECT count(*) FROM workflow_steps") == 1
    await pool.execute("DELETE FROM scheduled_jobs WHERE job_id = $1", job_id)
    assert await pool.fetchval("SELECT count(*) FROM workflow_steps") == 0
    assert await pool.fetchval("SELECT count(*) FROM workflow_signals") == 0


@workflow
async def everything(ctx: WorkflowContext) -> object:
    await ctx.sleep(0.1)
    child = await ctx.wait(ctx.spawn(_child, 2))
    signal = await ctx.wait_for_signal("go")
    return [child, signal]


async def _child(n: int) -> int:
    return n * 10


async def test_workflows_in_their_own_schema(pool, make_scheduler):
    schema = "wf_schema"
    await pool.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    scheduler = await make_scheduler(schema=schema)
    try:
        job_id = await scheduler.schedule(everything, execution_time=datetime.now(UTC))

        async def parked_on_signal() -> bool:
            return (
                await pool.fetchval(
                    f"SELECT wait_kind FROM {schema}.scheduled_jobs WHERE job_id = $1", job_id
                )
                == "signal"
            )

        await wait_until(parked_on_signal, message="the park on the signal")
        await scheduler.signal(job_id, "go", "went")
        job = await scheduler.wait_for(job_id, timeout=10)
        assert job.result == [20, "went"], job.error
        assert await pool.fetchval("SELECT count(*) FROM public.workflow_steps") == 0
    finally:
        await scheduler.shutdown()
        await pool.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
