"""The short paths of parked workflows: a signal completes the wait's record
itself; ``signal_bulk`` sends many, all or none; a child's end counts its
parked parent down (``workflow_waits``) and keeps its outcome on its own row,
copied onto the spawn step only when the row goes or is reopened; runs that
start together for the first time read their records in one statement;
resumed runs take theirs from their claim."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from pg_scheduler import (
    JobFailed,
    JobNotFound,
    JobSpec,
    JobStatus,
    PollingConfig,
    WorkflowContext,
    task,
    workflow,
)
from pg_scheduler.store.workflow_sql import RESUME_COLUMNS, RESUME_MOST
from pg_scheduler.store.workflows import WorkflowStore
from pg_scheduler.workflows.runner import workflow_store
from tests.support.common import wait_for_status, wait_until

ran: Counter[str] = Counter()
gates: dict[str, asyncio.Event] = {}

NO_POLLING = PollingConfig(idle_start_interval=30.0, max_interval=30.0)


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()
    gates.clear()


def _now() -> datetime:
    return datetime.now(UTC)


@workflow(name="fast.approval")
async def approval(ctx: WorkflowContext, tag: str) -> Any:
    ran[f"start {tag}"] += 1
    first = await ctx.wait_for_signal("go")
    second = await ctx.wait_for_signal("go")
    return [first, second]


@task(name="fast.kid")
async def kid(i: int) -> int:
    gate = gates.get(f"kid {i}")
    if gate is not None:
        await gate.wait()
    if i < 0:
        raise ValueError(f"negative: {i}")
    ran["kid"] += 1
    return i * 10


@workflow(name="fast.family")
async def family(ctx: WorkflowContext, items: list[int]) -> Any:
    first = ctx.spawn(kid, items[0])
    await ctx.step("between", lambda: ran.update(["between"]))
    rest = [ctx.spawn(kid, i) for i in items[1:]]
    results = await ctx.gather(first, *rest, return_exceptions=True)
    ran["gathered"] += 1
    return [r if not isinstance(r, Exception) else type(r).__name__ for r in results]


async def _wait_parked(pool: asyncpg.Pool, job_id: str) -> None:
    async def parked() -> bool:
        status = await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id)
        return status == "waiting"

    await wait_until(parked, message=f"{job_id} parked")


async def test_a_signal_completes_the_parked_wait_record_itself(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(approval, execution_time=_now(), args=("a",))
    await _wait_parked(pool, job_id)
    await scheduler.shutdown()  # nobody runs it: the record must be the signal's own write
    await scheduler.signal(job_id, "go", {"n": 1})
    row = await pool.fetchrow(
        "SELECT s.status, s.result::text AS result, j.status AS job_status, j.wait_kind"
        "  FROM workflow_steps s JOIN scheduled_jobs j ON j.job_id = s.job_id"
        " WHERE s.job_id = $1 AND s.kind = 'signal' ORDER BY s.seq LIMIT 1",
        job_id,
    )
    assert dict(row) == {
        "status": "completed",
        "result": '{"payload": {"n": 1}}',
        "job_status": "pending",
        "wait_kind": None,
    }
    # The resumed run replays that record and parks on the second wait.
    worker = await make_scheduler()
    await _wait_parked(pool, job_id)
    await worker.signal(job_id, "go", None)
    job = await worker.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == [{"n": 1}, None]


async def test_signal_bulk_wakes_every_waiting_workflow_in_one_call(pool, make_scheduler):
    scheduler = await make_scheduler(polling_config=NO_POLLING)
    ids = [
        await scheduler.schedule(approval, execution_time=_now(), args=(str(i),)) for i in range(20)
    ]
    for job_id in ids:
        await _wait_parked(pool, job_id)
    # Two for each: the first wakes its wait, the second is kept for the next one.
    items = [(job_id, "go", i) for i, job_id in enumerate(ids)]
    items += [(job_id, "go", 100 + i) for i, job_id in enumerate(ids)]
    woken = await scheduler.signal_bulk(items)
    assert woken == 20
    for i, job_id in enumerate(ids):
        job = await scheduler.wait_for(job_id, timeout=10)
        assert job.status is JobStatus.COMPLETED, job.error
        assert job.result == [i, 100 + i]
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM workflow_signals WHERE job_id = ANY($1) AND consumed_seq IS NULL",
            ids,
        )
        == 0
    )


async def test_signal_bulk_is_all_or_nothing(pool, make_scheduler):
    scheduler = await make_scheduler()
    live = await scheduler.schedule(approval, execution_time=_now(), args=("live",))
    await _wait_parked(pool, live)
    done = await scheduler.schedule(approval, execution_time=_now(), args=("done",))
    await _wait_parked(pool, done)
    await scheduler.signal_bulk([(done, "go", 1), (done, "go", 2)])
    await wait_for_status(pool, done, "completed")

    async def signals() -> int:
        return await pool.fetchval("SELECT count(*) FROM workflow_signals")

    before = await signals()
    with pytest.raises(JobNotFound, match="no-such-job"):
        await scheduler.signal_bulk([(live, "go", 1), ("no-such-job", "go")])
    with pytest.raises(ValueError, match="completed: a finished job takes no signal"):
        await scheduler.signal_bulk([(live, "go", 1), (done, "go")])
    bad_items: list[Any] = [
        "not a list",
        [(live,)],
        [(live, "go", 1, 2)],
        [(live, "")],
        [(live, 7)],
        [(None, "go")],
        [(live, "go", object())],
        [(live, "go", 1), (live, "go", {1: float("nan")})],
    ]
    for bad in bad_items:
        with pytest.raises((TypeError, ValueError)):
            await scheduler.signal_bulk(bad)
    assert await signals() == before
    assert await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", live) == (
        "waiting"
    )
    assert await scheduler.signal_bulk([]) == 0


async def test_signal_bulk_in_the_callers_transaction_takes_effect_only_on_commit(
    pool, make_scheduler
):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(approval, execution_time=_now(), args=("tx",))
    await _wait_parked(pool, job_id)
    async with pool.acquire() as conn:
        tx = conn.transaction()
        await tx.start()
        assert await scheduler.signal_bulk([(job_id, "go", "x")], connection=conn) == 1
        assert conn.is_in_transaction()  # not ended by the library
        await tx.rollback()
    assert (
        await pool.fetchval("SELECT count(*) FROM workflow_signals WHERE job_id = $1", job_id) == 0
    )
    assert await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id) == (
        "waiting"
    )
    async with pool.acquire() as conn, conn.transaction():
        await scheduler.signal_bulk([(job_id, "go", "y"), (job_id, "go", "z")], connection=conn)
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.result == ["y", "z"]


async def test_a_parent_wakes_when_its_last_child_ends_and_reads_each_outcome(pool, make_scheduler):
    scheduler = await make_scheduler(polling_config=NO_POLLING)
    # A step between the first spawn and the rest: the span counted holds only
    # spawn steps, not that step.
    for i in (1, 2, 3):
        gates[f"kid {i}"] = asyncio.Event()
    job_id = await scheduler.schedule(family, execution_time=_now(), args=([0, 1, 2, -1, 3],))
    await _wait_parked(pool, job_id)
    left = await pool.fetchval("SELECT wait_left FROM workflow_waits WHERE job_id = $1", job_id)
    assert left is not None and 3 <= left <= 5
    for i in (1, 2):
        gates[f"kid {i}"].set()
    await wait_until(lambda: ran["kid"] >= 3, message="three children")
    assert await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id) == (
        "waiting"
    )
    gates["kid 3"].set()
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == [0, 10, 20, "JobFailed", 30]
    assert ran["gathered"] == 1 and ran["between"] == 1


async def test_an_outcome_survives_its_child_rows_deletion_and_retry(pool, make_scheduler):
    """Each child's outcome read by the parent stays what it first was: the
    rows deleted or retried after their end, before the parent resumes."""
    scheduler = await make_scheduler()
    gates["kid 2"] = asyncio.Event()
    job_id = await scheduler.schedule(family, execution_time=_now(), args=([1, -5, 2],))
    await _wait_parked(pool, job_id)
    children = {
        r["parent_seq"]: r["job_id"]
        for r in await pool.fetch(
            "SELECT job_id, parent_seq FROM scheduled_jobs WHERE parent_job_id = $1", job_id
        )
    }
    ended = sorted(children)[:2]  # kid 1 completed, kid -5 failed
    for seq in ended:
        await wait_until(
            lambda seq=seq: _is_final(pool, children[seq]), message=f"child at {seq} ended"
        )
    # The completed child's row deleted (retention), the failed one reopened
    # by hand: both outcomes are copied onto their spawn steps first.
    await pool.execute("DELETE FROM scheduled_jobs WHERE job_id = $1", children[ended[0]])
    await pool.execute(
        "UPDATE scheduled_jobs SET status = 'pending', execution_time = now() + interval '1 hour'"
        " WHERE job_id = $1",
        children[ended[1]],
    )
    copied = await pool.fetch(
        "SELECT seq, status, result -> 'outcome' ->> 'status' AS outcome FROM workflow_steps"
        " WHERE job_id = $1 AND seq = ANY($2) ORDER BY seq",
        job_id,
        ended,
    )
    assert [(r["status"], r["outcome"]) for r in copied] == [
        ("completed", "completed"),
        ("completed", "failed"),
    ]
    gates["kid 2"].set()
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == [10, "JobFailed", 20]


async def _is_final(pool: asyncpg.Pool, job_id: str) -> bool:
    status = await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id)
    return status in ("completed", "failed")


async def test_a_failed_child_raises_job_failed_at_the_gather(make_scheduler):
    @workflow(name="fast.strict")
    async def strict(ctx: WorkflowContext) -> Any:
        return await ctx.gather(ctx.spawn(kid, 1), ctx.spawn(kid, -2))

    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(strict, execution_time=_now())
    with pytest.raises(JobFailed, match="negative: -2"):
        await scheduler.result(job_id, timeout=10)


@pytest.fixture
def loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The size of each statement the loader sends (runs whose records the
    claim did not return)."""
    statements: list[int] = []
    original = WorkflowStore.load_many

    async def counted(self: WorkflowStore, db: Any, job_ids: Any) -> Any:
        statements.append(len(job_ids))
        return await original(self, db, job_ids)

    monkeypatch.setattr(WorkflowStore, "load_many", counted)
    return statements


async def test_first_runs_starting_together_read_their_records_in_few_statements(
    pool, make_scheduler, loads
):
    scheduler = await make_scheduler(max_concurrent_jobs=50, batch_claim_limit=50)
    await scheduler.shutdown()  # the 40 are claimed together, not one by one as they come
    ids = await scheduler.schedule_bulk(
        [JobSpec(func=approval, execution_time=_now(), args=(str(i),)) for i in range(40)]
    )
    scheduler = await make_scheduler(max_concurrent_jobs=50, batch_claim_limit=50)
    for job_id in ids:
        await _wait_parked(pool, job_id)
    assert sum(loads) == 40
    assert len(loads) < 40 / 2, loads


async def test_resumed_runs_take_their_records_from_their_claim(pool, make_scheduler, loads):
    scheduler = await make_scheduler(max_concurrent_jobs=50, batch_claim_limit=50)
    ids = [
        await scheduler.schedule(approval, execution_time=_now(), args=(str(i),)) for i in range(40)
    ]
    for job_id in ids:
        await _wait_parked(pool, job_id)
    loads.clear()
    await scheduler.signal_bulk([(job_id, "go", 1) for job_id in ids])
    for job_id in ids:
        await _wait_parked(pool, job_id)  # each at its second wait: the first replayed
    await scheduler.signal_bulk([(job_id, "go", 2) for job_id in ids])
    for job_id in ids:
        assert await scheduler.result(job_id, timeout=10) == [1, 2]
    assert loads == []
    assert all(ran[f"start {i}"] == 3 for i in range(40)), ran


@task(name="fast.plus")
async def plus(i: int) -> int:
    ran["plus"] += 1
    return i + 1


@workflow(name="fast.mixed")
async def mixed(ctx: WorkflowContext) -> Any:
    one = await ctx.step("one", plus, 1)
    kids = await ctx.gather(ctx.spawn(kid, 3), ctx.spawn(kid, -4), return_exceptions=True)
    got = await ctx.wait_for_signal("go")
    return [one, [k if not isinstance(k, Exception) else str(k) for k in kids], got]


async def test_the_claim_returns_the_records_the_loader_reads(pool, make_scheduler):
    """A resumed run's records come with its claim (store/workflow_sql.py
    RESUME_COLUMNS); they must be what the loader reads for the same row:
    a completed step, spawn steps still waiting whose children's rows are
    final (one completed, one failed), a signal's completed wait."""
    scheduler = await make_scheduler(max_concurrent_jobs=10, batch_claim_limit=10)
    job_id = await scheduler.schedule(mixed, execution_time=_now())
    await _wait_parked(pool, job_id)

    async def at_the_signal() -> bool:
        kind = await pool.fetchval(
            "SELECT wait_kind FROM scheduled_jobs WHERE job_id = $1 AND status = 'waiting'",
            job_id,
        )
        return kind == "signal"

    await wait_until(at_the_signal, message="parked on the signal")
    await scheduler.shutdown()
    await scheduler.signal(job_id, "go", {"n": 1})
    store = scheduler.store
    [loaded] = (await workflow_store(store).load_many(pool, [job_id])).values()
    kinds = [(step[1], step[4], step[10]) for step in loaded.steps]
    assert ("spawn", "waiting", "completed") in kinds, kinds
    assert ("spawn", "waiting", "failed") in kinds, kinds
    assert ("signal", "completed", None) in kinds, kinds
    [row] = await store.claim("w-compare", ["fast.mixed"], 1, 60.0)
    assert row["job_id"] == job_id
    assert [tuple(step) for step in json.loads(row["resume_steps"])] == loaded.steps
    assert tuple(row["resume"])[:2] == (loaded.incarnation, loaded.deadline)
    # A row that never started carries none: its run asks the loader.
    fresh = await scheduler.schedule(mixed, execution_time=_now())
    [row] = await store.claim("w-compare", ["fast.mixed"], 1, 60.0)
    assert (row["job_id"], row["resume"], row["resume_steps"]) == (fresh, None, None)


@workflow(name="fast.wide")
async def wide(ctx: WorkflowContext, n: int) -> Any:
    return sum(await ctx.gather(*[ctx.spawn(kid, i) for i in range(n)]))


async def test_a_run_with_more_records_than_a_claim_returns_reads_them_itself(
    pool, make_scheduler, loads
):
    """A parent of RESUME_MOST + 20 children: the claim that resumes it
    returns one record past the bound; the run reads all of them itself."""
    n = RESUME_MOST + 20
    gates["kid 0"] = asyncio.Event()  # the parent parks before its children are over
    scheduler = await make_scheduler(max_concurrent_jobs=50, batch_claim_limit=50)
    job_id = await scheduler.schedule(wide, execution_time=_now(), args=(n,))
    await _wait_parked(pool, job_id)
    gates["kid 0"].set()
    assert await scheduler.result(job_id, timeout=30) == sum(i * 10 for i in range(n))
    resumed = [size for size in loads if size == 1]
    assert len(resumed) >= 2, loads  # the first run's read and the resumed run's
    steps = await pool.fetchval("SELECT count(*) FROM workflow_steps WHERE job_id = $1", job_id)
    assert steps > RESUME_MOST + 1  # a spawn step per child, and the wait's record


async def test_signal_bulk_on_a_connection_outside_a_transaction_is_one_transaction(
    pool, make_scheduler
):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(approval, execution_time=_now(), args=("conn",))
    await _wait_parked(pool, job_id)
    async with pool.acquire() as conn:
        with pytest.raises(JobNotFound):
            await scheduler.signal_bulk([(job_id, "go", 1), ("missing", "go")], connection=conn)
        assert not conn.is_in_transaction()
        assert await scheduler.signal_bulk([(job_id, "go", 1), (job_id, "go", 2)], connection=conn)
        assert not conn.is_in_transaction()
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.result == [1, 2]


def _buffers(plan: Any) -> int:
    node = plan[0]["Plan"]
    return int(node.get("Shared Hit Blocks", 0)) + int(node.get("Shared Read Blocks", 0))


async def test_the_records_read_looks_children_up_by_id_whatever_the_statistics(
    pool, make_scheduler
):
    """Statistics taken while no row was final, then thousands of final rows:
    the loader's read, the claim's read of a parked parent's records and the
    park's read of its ended children still look each waiting child up by its
    id, not compare it with every final row."""
    gates["kid 7"] = asyncio.Event()
    scheduler = await make_scheduler(max_concurrent_jobs=10, batch_claim_limit=10)
    job_id = await scheduler.schedule(family, execution_time=_now(), args=([7, 7, 7],))
    await _wait_parked(pool, job_id)
    await scheduler.shutdown(grace_period=0.1)
    await pool.execute("ANALYZE scheduled_jobs; ANALYZE workflow_steps")
    await pool.execute(
        "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,"
        " task_data, finished_at)"
        " SELECT 'done-' || g, 'fast.kid', 'fast.kid', now(), 'completed', '{}', now()"
        " FROM generate_series(1, 5000) g"
    )
    store = workflow_store(scheduler.store)
    loads = await pool.fetchval(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + store._load_many, [job_id]
    )
    claims = await pool.fetchval(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT "
        + RESUME_COLUMNS
        + " FROM scheduled_jobs j WHERE j.job_id = $1",
        job_id,
    )
    ended = await pool.fetchval(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + store._spawned_ended,
        job_id,
        list(range(1, 10)),
    )
    # By id: a few pages an index descent each; all final rows: hundreds.
    for plan in (loads, claims, ended):
        assert _buffers(json.loads(plan)) < 100, plan
