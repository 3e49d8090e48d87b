"""Tasks for the dashboard tests."""

from __future__ import annotations

import asyncio

from pg_scheduler import current_job, task

#: Jobs of ``gated`` wait for this (set it to let them finish).
gate = asyncio.Event()


@task(name="dash.echo")
async def echo(value: object) -> object:
    return value


@task(name="dash.boom")
async def boom(text: str) -> None:
    raise ValueError(f"boom: {text}")


@task(name="dash.gated")
async def gated(n: int) -> int:
    await current_job().report_progress(0.5, "waiting at the gate")
    await gate.wait()
    return n


@task(name="dash.span_id")
async def span_id() -> str:
    from opentelemetry import trace

    return format(trace.get_current_span().get_span_context().span_id, "016x")
