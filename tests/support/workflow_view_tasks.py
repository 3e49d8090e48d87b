"""Workflows and tasks for the tests of the workflow views (dashboard, CLI, stats)."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from pg_scheduler import WorkflowContext, task, workflow

#: Children of ``fan_out`` wait for this (set it to let them finish).
gate = asyncio.Event()

#: A result longer than a view shows of it.
LONG = "x" * 2000


@task(name="wfv.child")
async def child(n: int) -> int:
    await gate.wait()
    if n < 0:
        raise ValueError(f"negative: {n}")
    return n * 10


@task(name="wfv.quick")
async def quick(n: int) -> int:
    return n


def _double(n: int) -> int:
    return n * 2


@workflow(name="wfv.sleeper")
async def sleeper(ctx: WorkflowContext, n: int) -> str:
    await ctx.step("double", _double, n)
    await ctx.step("describe", lambda: {"text": LONG})
    await ctx.sleep(timedelta(hours=2))
    return "woke"


@workflow(name="wfv.approval")
async def approval(ctx: WorkflowContext, order: str) -> Any:
    await ctx.step("reserve", lambda: {"order": order})
    return await ctx.wait_for_signal("approved", timeout=timedelta(days=7))


@workflow(name="wfv.fan_out")
async def fan_out(ctx: WorkflowContext, numbers: list[int]) -> list[Any]:
    await ctx.step("plan", lambda: numbers)
    handles = [ctx.spawn(child, n) for n in numbers]
    return await ctx.gather(*handles, return_exceptions=True)


@workflow(name="wfv.many_steps")
async def many_steps(ctx: WorkflowContext, steps: int, children: int) -> int:
    total = 0
    for n in range(steps):
        total += await ctx.step("add", _double, n, key=n)
    handles = [ctx.spawn(quick, n) for n in range(children)]
    return total + sum(await ctx.gather(*handles))
