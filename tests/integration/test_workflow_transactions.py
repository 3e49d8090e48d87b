"""Transaction steps: the writes and the checkpoint commit together, exactly
once, also when runs of one workflow race (a stale run and its successor)."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from pg_scheduler import JobStatus, RetryPolicy, WorkflowContext, workflow
from pg_scheduler.store.workflows import Lease, WorkflowStore
from pg_scheduler.workflows.errors import LeaseLost
from pg_scheduler.workflows.replay import Replay
from pg_scheduler.workflows.run import RunState
from pg_scheduler.workflows.transactions import TransactionStep, transaction_step
from tests.support.common import wait_until

FAST_RETRY = RetryPolicy(base_delay=0.01, factor=1.0, max_delay=0.01, jitter=0.0)
ran: Counter[str] = Counter()
flags: dict[str, Any] = {}


@pytest.fixture(autouse=True)
async def _effects(pool: asyncpg.Pool) -> None:
    ran.clear()
    flags.clear()
    await pool.execute("CREATE TABLE IF NOT EXISTS wf_effects (job_id text, what text)")


async def _effects_of(pool: asyncpg.Pool, job_id: str) -> list[str]:
    rows = await pool.fetch("SELECT what FROM wf_effects WHERE job_id = $1 ORDER BY what", job_id)
    return [r["what"] for r in rows]


async def _charge(conn: asyncpg.Connection, job_id: str) -> int:
    ran["charge"] += 1
    await conn.execute("INSERT INTO wf_effects VALUES ($1, 'charged')", job_id)
    return 1250


@workflow
async def billing(ctx: WorkflowContext, user: int) -> Any:
    async with ctx.transaction() as conn:
        ran["body"] += 1
        await conn.execute("INSERT INTO wf_effects VALUES ($1, 'welcomed')", ctx.job_id)
    amount = await ctx.transaction_step("charge", lambda conn: _charge(conn, ctx.job_id))
    if flags.pop("fail_once", False):
        raise RuntimeError("after the transactions")
    return {"user": user, "amount": amount}


async def test_transaction_writes_commit_once_across_runs(pool, make_scheduler):
    scheduler = await make_scheduler()
    flags["fail_once"] = True
    job_id = await scheduler.schedule(
        billing,
        execution_time=datetime.now(UTC),
        args=(7,),
        max_retries=1,
        retry_policy=FAST_RETRY,
    )
    job = await scheduler.wait_for(job_id, timeout=15)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == {"user": 7, "amount": 1250}
    assert job.attempts == 2
    # The block ran in both runs, its writes committed once; the transaction
    # step's function ran once.
    assert ran == Counter({"body": 2, "charge": 1})
    assert await _effects_of(pool, job_id) == ["charged", "welcomed"]
    kinds = await pool.fetch(
        "SELECT kind, name, result::text AS result FROM workflow_steps WHERE job_id = $1"
        " ORDER BY seq",
        job_id,
    )
    assert [(k["kind"], k["name"], k["result"]) for k in kinds] == [
        ("transaction", "transaction", None),
        ("transaction", "charge", "1250"),
    ]


@workflow
async def failing_body(ctx: WorkflowContext) -> str:
    try:
        async with ctx.transaction("risky") as conn:
            await conn.execute("INSERT INTO wf_effects VALUES ($1, 'half')", ctx.job_id)
            raise ValueError("inside the block")
    except ValueError:
        pass
    async with ctx.transaction("safe") as conn:
        await conn.execute("INSERT INTO wf_effects VALUES ($1, 'whole')", ctx.job_id)
    return "ok"


async def test_a_block_that_raises_rolls_back_and_records_nothing(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(failing_body, execution_time=datetime.now(UTC))
    job = await scheduler.wait_for(job_id, timeout=15)
    assert job.status is JobStatus.COMPLETED, job.error
    assert await _effects_of(pool, job_id) == ["whole"]
    names = await pool.fetch("SELECT name FROM workflow_steps WHERE job_id = $1", job_id)
    # The failed block took its place (seq 1) but wrote no record there.
    assert [r["name"] for r in names] == ["safe"]


async def _running_row(pool: asyncpg.Pool, job_id: str, worker: str) -> None:
    await pool.execute(
        "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,"
        " worker_id, attempts, started_at)"
        " VALUES ($1, 'race', 'tests:race', now(), 'running', $2, 1, now())",
        job_id,
        worker,
    )


def _run(pool: asyncpg.Pool, job_id: str, worker: str) -> RunState:
    from pg_scheduler.tasks import TaskRegistry

    return RunState(
        WorkflowStore(pool),
        Lease(job_id, worker, 1),
        Replay([]),
        incarnation=0,
        db_now=datetime.now(UTC),
        deadline=None,
        queue="default",
        priority=5,
        registry=TaskRegistry(),
        lookahead=2.0,
    )


async def _race_round(pool: asyncpg.Pool, job_id: str, racers: int) -> None:
    await _running_row(pool, job_id, "w1")
    runs = [_run(pool, job_id, "w1") for _ in range(racers)]
    entered = 0
    all_in = asyncio.Event()

    async def race(run: RunState, index: int) -> None:
        nonlocal entered
        async with TransactionStep(run, "pay", "") as conn:
            await conn.execute("INSERT INTO wf_effects VALUES ($1, $2)", job_id, f"r{index}")
            entered += 1
            if entered == racers:
                all_in.set()
            await asyncio.wait_for(all_in.wait(), 10)  # every body inside its transaction

    await asyncio.gather(*(race(run, i) for i, run in enumerate(runs)))
    effects = await _effects_of(pool, job_id)
    assert len(effects) == 1, effects
    records = await pool.fetch("SELECT seq FROM workflow_steps WHERE job_id = $1", job_id)
    assert [r["seq"] for r in records] == [1]
    # Every run now knows the place as recorded (a replay from here on).
    assert all(run.replay.records[1].status == "completed" for run in runs)

    async def pay(conn: asyncpg.Connection, index: int) -> str:
        await conn.execute("INSERT INTO wf_effects VALUES ($1, $2)", job_id, f"s{index}")
        return f"s{index}"

    results = await asyncio.gather(
        *(
            transaction_step(run, "settle", "", lambda c, i=i: pay(c, i))
            for i, run in enumerate(runs)
        )
    )
    assert len(set(results)) == 1  # all got the one committed result
    assert len(await _effects_of(pool, job_id)) == 2


@pytest.mark.parametrize("racers", [2, 5])
async def test_racing_runs_commit_a_transaction_step_exactly_once(pool, racers):
    """Runs that each believe they hold the job (a stale one and its successor)
    reach the same transaction at once: one commits; the others' writes roll
    back, and they go on with the committed record."""
    for round_ in range(10):
        await _race_round(pool, f"race-{racers}-{round_}", racers)


async def test_a_run_that_lost_its_job_commits_nothing(pool):
    job_id = "stale-run"
    await _running_row(pool, job_id, "w1")
    stale = _run(pool, job_id, "w1")
    with pytest.raises(LeaseLost):
        async with TransactionStep(stale, "pay", "") as conn:
            await conn.execute("INSERT INTO wf_effects VALUES ($1, 'stale')", job_id)
            # Meanwhile the job was rescued and claimed by another worker.
            await pool.execute(
                "UPDATE scheduled_jobs SET worker_id = 'w2', attempts = 2 WHERE job_id = $1",
                job_id,
            )
    assert await _effects_of(pool, job_id) == []
    assert await pool.fetchval("SELECT count(*) FROM workflow_steps") == 0
    # The run is over: every later call stops it again.
    with pytest.raises(LeaseLost):
        async with TransactionStep(stale, "again", ""):
            pass


@workflow
async def lost_midway(ctx: WorkflowContext) -> str:
    async with ctx.transaction("first") as conn:
        await conn.execute("INSERT INTO wf_effects VALUES ($1, 'first')", ctx.job_id)
    flags["reached"] = True
    await wait_until(lambda: flags.get("stolen"), timeout=10)
    async with ctx.transaction("second") as conn:
        await conn.execute("INSERT INTO wf_effects VALUES ($1, 'second')", ctx.job_id)
    return "ok"


async def test_a_worker_whose_job_was_taken_stops_its_workflow_writing_nothing(
    pool, make_scheduler
):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(lost_midway, execution_time=datetime.now(UTC))
    await wait_until(lambda: flags.get("reached"), message="the first transaction")
    await pool.execute(
        "UPDATE scheduled_jobs SET worker_id = 'elsewhere', attempts = attempts + 1"
        " WHERE job_id = $1",
        job_id,
    )
    flags["stolen"] = True

    async def gone() -> bool:
        return job_id not in scheduler.worker.running

    await wait_until(gone, message="the run to stop")
    assert await _effects_of(pool, job_id) == ["first"]
    row = await pool.fetchrow(
        "SELECT status, worker_id FROM scheduled_jobs WHERE job_id = $1", job_id
    )
    assert (row["status"], row["worker_id"]) == ("running", "elsewhere")
