"""The workflow of tests/test_workflow_crash.py, run by its worker processes.

Every execution of a step body, a transaction block and a child writes a row
of ``wf_crash_runs`` on its own connection (pid included): the test counts
executions from the database, not from the scheduler under test. Bodies sleep
a random while, so a kill -9 lands in the middle of them.
"""

from __future__ import annotations

import asyncio
import os
import random

import asyncpg

from pg_scheduler import WorkflowContext, task, workflow

DDL = """
CREATE TABLE IF NOT EXISTS wf_crash_runs (
    job_id text NOT NULL, step text NOT NULL, pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS wf_crash_tx (job_id text NOT NULL, pid integer NOT NULL);
"""

_pool: asyncpg.Pool | None = None


async def _record(job_id: str, step: str) -> None:
    global _pool
    if _pool is None:
        _pool = await asyncpg.create_pool(
            os.environ["PG_SCHEDULER_TEST_DB_URL"], min_size=1, max_size=4
        )
    await _pool.execute("INSERT INTO wf_crash_runs VALUES ($1, $2, $3)", job_id, step, os.getpid())


async def body(job_id: str, step: str, longest: float) -> str:
    await _record(job_id, step)
    await asyncio.sleep(random.uniform(0, longest))
    return step


@task(name="wfcrash.child")
async def child(parent: str, n: int) -> int:
    await _record(parent, "child")
    await asyncio.sleep(random.uniform(0, 0.05))
    return n


@workflow(name="wfcrash.five_steps")
async def five_steps(ctx: WorkflowContext, n: int, longest: float) -> int:
    for i in range(5):
        await ctx.step(f"s{i}", body, ctx.job_id, f"s{i}", longest)
        if i == 2:
            async with ctx.transaction("tx") as conn:
                await conn.execute(
                    "INSERT INTO wf_crash_tx VALUES ($1, $2)", ctx.job_id, os.getpid()
                )
                await asyncio.sleep(random.uniform(0, longest / 2))
    await ctx.sleep(0.2)
    got = await ctx.wait(ctx.spawn(child, ctx.job_id, n))
    return n + got
