"""Tasks and workflows for the tests of whole-workflow operations: each
counts its runs in this process, and fails while its name is in ``failing``."""

from __future__ import annotations

import asyncio
from collections import Counter

from pg_scheduler import WorkflowContext, task, workflow

#: Names whose runs (of ``node``, of ``staged``'s ``charge`` step) raise.
failing: set[str] = set()
#: Runs per name (jobs) or per step name (workflows).
runs: Counter[str] = Counter()
#: ``held`` jobs wait for this.
release = asyncio.Event()


def reset() -> None:
    failing.clear()
    runs.clear()
    release.clear()


@task(name="wfops.node")
async def node(name: str) -> str:
    runs[name] += 1
    if name in failing:
        raise RuntimeError(f"{name} failed on purpose")
    return name


@task(name="wfops.held")
async def held(name: str) -> str:
    runs[name] += 1
    await release.wait()
    return name


def _step(name: str, value: int) -> int:
    runs[name] += 1
    if name in failing:
        raise RuntimeError(f"step {name} failed on purpose")
    return value


@workflow(name="wfops.staged")
async def staged(ctx: WorkflowContext, n: int) -> int:
    a = await ctx.step("reserve", _step, "reserve", n)
    b = await ctx.step("charge", _step, "charge", a + 1)
    return await ctx.step("ship", _step, "ship", b + 1)


@workflow(name="wfops.parent")
async def parent(ctx: WorkflowContext, names: list[str]) -> list[str]:
    await ctx.step("plan", _step, "plan", 0)
    return await ctx.gather(*[ctx.spawn(held, n) for n in names])
