"""A workflow for the tracing tests: a step, a child, then a wait for a
signal (so it runs twice), then a last step."""

from __future__ import annotations

from pg_scheduler import WorkflowContext, task, workflow


@task(name="otelwf.child")
async def child(n: int) -> int:
    return n * 2


def _add(a: int, b: int) -> int:
    return a + b


@workflow(name="otelwf.flow")
async def flow(ctx: WorkflowContext, n: int) -> int:
    first = await ctx.step("first", _add, n, 1)
    [doubled] = await ctx.gather(ctx.spawn(child, first))
    extra = await ctx.wait_for_signal("go")
    return await ctx.step("last", _add, doubled, extra)
