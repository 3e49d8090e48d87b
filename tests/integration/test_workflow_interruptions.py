"""A workflow whose own statement loses its connection to the database (a
restart, a failover, a network fault) is handed back, not failed: the next
run replays it from its records. The connection is cut from inside the
server (``pg_terminate_backend``) at a chosen point: in a transaction block,
between two of its statements (from another connection), at its commit, and
in a park waiting for the row's lock. Counted as a rescue,
so a run that cuts its own connection every time ends failed, not looping."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import asyncpg
import pytest

from pg_scheduler import JobStatus, WorkflowContext, workflow
from tests.support.common import proxy_detached, wait_until

ran: Counter[str] = Counter()
#: How many more runs cut their connection, by what is cut.
cuts: Counter[str] = Counter()

_KILL_SELF = "SELECT pg_terminate_backend(pg_backend_pid())"


@pytest.fixture(autouse=True)
async def _tables(pool: asyncpg.Pool) -> None:
    ran.clear()
    cuts.clear()
    gate.clear()
    await pool.execute(
        """
        CREATE TABLE IF NOT EXISTS wf_cut_effects (job_id text, what text);
        CREATE TABLE IF NOT EXISTS wf_cut_at_commit (job_id text);
        CREATE OR REPLACE FUNCTION wf_cut_at_commit() RETURNS trigger
            LANGUAGE plpgsql AS $$
        BEGIN
            PERFORM pg_terminate_backend(pg_backend_pid());
            PERFORM pg_sleep(5);  -- the termination lands here, before the commit
            RETURN NULL;
        END $$;
        DROP TRIGGER IF EXISTS wf_cut_at_commit ON wf_cut_at_commit;
        CREATE CONSTRAINT TRIGGER wf_cut_at_commit AFTER INSERT ON wf_cut_at_commit
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION wf_cut_at_commit();
        """
    )


async def _step(what: str) -> str:
    ran[what] += 1
    return what


@workflow(name="cut.in_block")
async def cut_in_block(ctx: WorkflowContext) -> str:
    await ctx.step("before", _step, "before")
    async with ctx.transaction("tx") as conn:
        ran["block"] += 1
        await conn.execute("INSERT INTO wf_cut_effects VALUES ($1, 'tx')", ctx.job_id)
        if cuts["block"] > 0:
            cuts["block"] -= 1
            await conn.execute(_KILL_SELF)
    await ctx.step("after", _step, "after")
    return "done"


@workflow(name="cut.between")
async def cut_between(ctx: WorkflowContext) -> str:
    """The block's connection closes between two of its statements (a restart
    while the block waits on something else): asyncpg detaches the pooled
    connection's proxy, and the next statement on it is refused as "released
    back to the pool", not as a lost connection."""
    async with ctx.transaction("tx") as conn:
        ran["block"] += 1
        await conn.execute("INSERT INTO wf_cut_effects VALUES ($1, 'tx')", ctx.job_id)
        if cuts["between"] > 0:
            cuts["between"] -= 1
            pid = conn.get_server_pid()
            other = await asyncpg.connect(os.environ["PG_SCHEDULER_TEST_DB_URL"])
            try:
                await other.execute("SELECT pg_terminate_backend($1)", pid)
            finally:
                await other.close()
            await wait_until(lambda: proxy_detached(conn), timeout=10, message="the proxy detached")
        await conn.execute("INSERT INTO wf_cut_effects VALUES ($1, 'after')", ctx.job_id)
    return "done"


async def _charge(conn: asyncpg.Connection, job_id: str) -> int:
    ran["charge"] += 1
    await conn.execute("INSERT INTO wf_cut_effects VALUES ($1, 'charge')", job_id)
    if cuts["commit"] > 0:
        cuts["commit"] -= 1
        await conn.execute("INSERT INTO wf_cut_at_commit VALUES ($1)", job_id)
    return 1250


@workflow(name="cut.at_commit")
async def cut_at_commit(ctx: WorkflowContext) -> int:
    await ctx.step("before", _step, "before")
    return await ctx.transaction_step("charge", lambda conn: _charge(conn, ctx.job_id))


#: Opened by the test once it holds the row's lock (set: no gate).
gate: dict[str, asyncio.Event] = {}


@workflow(name="cut.in_park")
async def cut_in_park(ctx: WorkflowContext) -> Any:
    await ctx.step("before", _step, "before")
    if "park" in gate:
        await gate["park"].wait()
    return await ctx.wait_for_signal("go")


async def _effects(pool: asyncpg.Pool, job_id: str) -> list[str]:
    rows = await pool.fetch(
        "SELECT what FROM wf_cut_effects WHERE job_id = $1 ORDER BY what", job_id
    )
    return [r["what"] for r in rows]


async def _rescues(pool: asyncpg.Pool, job_id: str) -> tuple[int, list[str]]:
    count = await pool.fetchval("SELECT rescue_count FROM scheduled_jobs WHERE job_id = $1", job_id)
    rows = await pool.fetch(
        "SELECT error FROM job_attempts WHERE job_id = $1 AND outcome = 'rescued'", job_id
    )
    return count, [r["error"] for r in rows]


async def test_a_connection_cut_in_a_transaction_block_hands_the_run_back(pool, make_scheduler):
    scheduler = await make_scheduler()
    cuts["block"] = 1
    job_id = await scheduler.schedule(cut_in_block, execution_time=datetime.now(UTC))
    job = await scheduler.wait_for(job_id, timeout=20)
    # No retry was allowed (max_retries 0): a failed attempt would have ended it.
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == "done"
    # The block ran again (its first transaction never committed); the step
    # recorded before it did not.
    assert ran == Counter({"before": 1, "block": 2, "after": 1})
    assert await _effects(pool, job_id) == ["tx"]
    count, errors = await _rescues(pool, job_id)
    assert count == 1
    assert len(errors) == 1 and "connection to the database was lost under the run" in errors[0]


async def test_a_connection_closed_between_two_statements_of_a_block_hands_the_run_back(
    pool, make_scheduler
):
    scheduler = await make_scheduler()
    cuts["between"] = 1
    job_id = await scheduler.schedule(cut_between, execution_time=datetime.now(UTC))
    job = await scheduler.wait_for(job_id, timeout=20)
    assert job.status is JobStatus.COMPLETED, job.error
    assert ran == Counter({"block": 2})
    assert await _effects(pool, job_id) == ["after", "tx"]
    count, errors = await _rescues(pool, job_id)
    assert count == 1
    assert len(errors) == 1 and "connection to the database was lost under the run" in errors[0]


async def test_a_connection_cut_at_the_commit_is_settled_by_the_replay(pool, make_scheduler):
    scheduler = await make_scheduler()
    cuts["commit"] = 1
    job_id = await scheduler.schedule(cut_at_commit, execution_time=datetime.now(UTC))
    job = await scheduler.wait_for(job_id, timeout=20)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == 1250
    # The first commit was cut off before it happened: the replay found no
    # record and ran the transaction step again; its write exists once.
    assert ran == Counter({"before": 1, "charge": 2})
    assert await _effects(pool, job_id) == ["charge"]
    assert await pool.fetchval("SELECT count(*) FROM wf_cut_at_commit") == 0
    assert (await _rescues(pool, job_id))[0] == 1


async def test_a_run_that_cuts_its_connection_every_time_ends_failed(pool, make_scheduler):
    scheduler = await make_scheduler(max_rescues=2)
    cuts["block"] = 100
    job_id = await scheduler.schedule(cut_in_block, execution_time=datetime.now(UTC))
    job = await scheduler.wait_for(job_id, timeout=30)
    assert job.status is JobStatus.FAILED
    assert "gave up" in (job.error or "") and "max_rescues=2" in (job.error or ""), job.error
    # Three runs (two rescues, then the give-up), none of them committed.
    assert ran["block"] == 3 and cuts["block"] == 97
    assert await _effects(pool, job_id) == []
    assert (await _rescues(pool, job_id))[0] == 3


async def test_a_park_cut_while_it_waits_for_the_row_lock_hands_the_run_back(pool, make_scheduler):
    scheduler = await make_scheduler()
    gate["park"] = asyncio.Event()
    job_id = await scheduler.schedule(cut_in_park, execution_time=datetime.now(UTC))

    # Once the step is recorded, the run waits at the gate before its park.
    async def recorded() -> bool:
        count = await pool.fetchval("SELECT count(*) FROM workflow_steps WHERE job_id = $1", job_id)
        return count == 1

    await wait_until(recorded, timeout=10, message="the step recorded")
    async with pool.acquire() as holder:
        tx = holder.transaction()
        await tx.start()
        # The row locked, the gate opened: the park's lock waits on it.
        await holder.execute("SELECT 1 FROM scheduled_jobs WHERE job_id = $1 FOR UPDATE", job_id)
        gate["park"].set()

        async def waiting_backend() -> int | None:
            return await pool.fetchval(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND pid <> $1"
                " AND query LIKE '%workflow_deadline%FOR UPDATE%' LIMIT 1",
                holder.get_server_pid(),
            )

        await wait_until(waiting_backend, timeout=10, message="the park waiting for the lock")
        # The park's lock of its row (workflow_sql._LOCK_RUN) waits on it.
        assert await pool.fetchval("SELECT pg_terminate_backend($1)", await waiting_backend())
        await tx.rollback()

    async def parked() -> bool:
        status = await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id)
        return status == "waiting"

    await wait_until(parked, timeout=15, message="the next run parked")
    assert (await _rescues(pool, job_id))[0] == 1
    await scheduler.signal(job_id, "go", {"ok": True})
    job = await scheduler.wait_for(job_id, timeout=15)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == {"ok": True}
    assert ran == Counter({"before": 1})
