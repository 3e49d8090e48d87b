"""The workflow of tests/system/test_workflow_restart.py, run by its worker
processes (``tests.support.workflow_worker``).

A step, a transaction, a wait for a signal, four children gathered, a sleep
and a last step. Every execution of a step body and of a child writes a row
of ``wf_restart_runs`` (pid included) on its own small pool, retried while
PostgreSQL restarts, once per execution: the test counts executions from the
database.
"""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from datetime import timedelta

import asyncpg

from pg_scheduler import WorkflowContext, task, workflow
from pg_scheduler.support.reconnect import is_connection_error

DDL = """
CREATE TABLE IF NOT EXISTS wf_restart_runs (
    token uuid PRIMARY KEY, job_id text NOT NULL, step text NOT NULL, pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS wf_restart_tx (job_id text NOT NULL, pid integer NOT NULL);
"""

_pool: asyncpg.Pool | None = None


async def _record(job_id: str, step: str) -> None:
    """One row per execution: an insert retried after its answer was lost (it
    may have committed) does not count the execution twice."""
    global _pool
    token = uuid.uuid4()
    for _ in range(600):
        try:
            if _pool is None:
                _pool = await asyncpg.create_pool(
                    os.environ["PG_SCHEDULER_TEST_DB_URL"], min_size=1, max_size=4
                )
            await _pool.execute(
                "INSERT INTO wf_restart_runs (token, job_id, step, pid) VALUES ($1, $2, $3, $4)"
                " ON CONFLICT (token) DO NOTHING",
                token,
                job_id,
                step,
                os.getpid(),
            )
            return
        except Exception as exc:
            if not is_connection_error(exc):
                raise
            await asyncio.sleep(0.05)
    raise RuntimeError("the database did not come back within 30 s")


async def body(job_id: str, step: str) -> str:
    await _record(job_id, step)
    await asyncio.sleep(random.uniform(0, 0.3))
    return step


@task(name="wfrestart.child")
async def child(parent: str, i: int) -> int:
    await _record(parent, f"child{i}")
    await asyncio.sleep(random.uniform(0, 0.1))
    return i


@workflow(name="wfrestart.mixed")
async def mixed(ctx: WorkflowContext, n: int) -> int:
    await ctx.step("a", body, ctx.job_id, "a")
    async with ctx.transaction("tx") as conn:
        await conn.execute("INSERT INTO wf_restart_tx VALUES ($1, $2)", ctx.job_id, os.getpid())
        await asyncio.sleep(random.uniform(0, 0.1))
    got = await ctx.wait_for_signal("go", timeout=timedelta(minutes=5))
    kids = await ctx.gather(*[ctx.spawn(child, ctx.job_id, i) for i in range(4)])
    await ctx.sleep(0.3)
    await ctx.step("b", body, ctx.job_id, "b")
    return n + sum(kids) + got["v"]
