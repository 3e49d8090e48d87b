"""The workflow of the crash scenario (``crash.py``), imported by it and by each
worker process (``crash_worker.py``) under this one module name.

Five steps: four counted steps and one ``ctx.transaction()`` step. Each run of
a counted step's body inserts a row into ``wf_step_runs`` on a connection of
its own (committed at once, whatever happens to the workflow next); the
transaction step inserts its row into ``wf_tx_rows`` in the step's own
transaction. Each body sleeps up to ``STEP_SLEEP`` seconds, so kills land
inside steps and transactions, not only between them.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any

from pg_scheduler import WorkflowContext, workflow

POOL: Any = None  # an asyncpg pool of the worker's, set by crash_worker.py
STEP_SLEEP = 0.0

DDL = """
CREATE TABLE IF NOT EXISTS wf_step_runs (
    key  text NOT NULL,
    step integer NOT NULL,
    pid  integer NOT NULL,
    at   timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS wf_step_runs_key ON wf_step_runs (key, step);
CREATE TABLE IF NOT EXISTS wf_tx_rows (
    key   text NOT NULL,
    value integer NOT NULL,
    pid   integer NOT NULL,
    at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS wf_tx_rows_key ON wf_tx_rows (key);
"""

TX_STEP = 3  # the transaction step's place among the five


def expected(base: int) -> int:
    """What ``crash_wf(key, base)`` returns."""
    return base + 1 + 2 + 4 + 5


async def counted_step(key: str, step: int, value: int) -> int:
    await POOL.execute(
        "INSERT INTO wf_step_runs (key, step, pid) VALUES ($1, $2, $3)", key, step, os.getpid()
    )
    if STEP_SLEEP:
        await asyncio.sleep(random.uniform(0, STEP_SLEEP))
    return value + step


@workflow(name="wfbench.crash")
async def crash_wf(ctx: WorkflowContext, key: str, base: int) -> int:
    value = await ctx.step("one", counted_step, key, 1, base)
    value = await ctx.step("two", counted_step, key, 2, value)
    async with ctx.transaction() as conn:
        await conn.execute(
            "INSERT INTO wf_tx_rows (key, value, pid) VALUES ($1, $2, $3)",
            key,
            value,
            os.getpid(),
        )
        if STEP_SLEEP:
            await asyncio.sleep(random.uniform(0, STEP_SLEEP))
    value = await ctx.step("four", counted_step, key, 4, value)
    return await ctx.step("five", counted_step, key, 5, value)
