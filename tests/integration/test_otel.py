"""OpenTelemetry: a span per job run, parented on the span that scheduled it."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from pg_scheduler import RetryPolicy
from pg_scheduler.observe import instrument
from pg_scheduler.observe.otel import TRACE_KEY, disable_tracing, enable_tracing
from tests.support import dashboard_tasks
from tests.support.common import wait_for_status


def now() -> datetime:
    return datetime.now(UTC)


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    enable_tracing(provider)
    yield provider, exporter
    disable_tracing()
    assert instrument.observers == () and instrument.trace_injector is None


async def run_spans(exporter, task: str, count: int = 1) -> list:
    """The ended run spans of ``task`` once there are ``count`` of them: a
    completed run's span ends just after its completion is written, so the
    row can be final a moment before the span is exported."""
    deadline = time.monotonic() + 10
    while True:
        runs = [s for s in exporter.get_finished_spans() if s.name == f"run {task}"]
        if len(runs) >= count or time.monotonic() > deadline:
            return runs
        await asyncio.sleep(0.01)


async def test_the_run_span_is_a_child_of_the_scheduling_span(spans, pool, make_scheduler, caplog):
    provider, exporter = spans
    scheduler = await make_scheduler()
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("handle request") as parent:
        job_id = await scheduler.schedule(dashboard_tasks.span_id, execution_time=now())
    stored = await pool.fetchval("SELECT task_data FROM scheduled_jobs WHERE job_id = $1", job_id)
    assert TRACE_KEY in stored
    job = await scheduler.wait_for(job_id, timeout=10)
    [run] = await run_spans(exporter, "dash.span_id")
    # The span stops being current in the job's own task, not in the completer's.
    assert not [r for r in caplog.records if r.name.startswith("opentelemetry")]
    assert run.kind is SpanKind.CONSUMER
    assert run.context.trace_id == parent.get_span_context().trace_id
    assert run.parent is not None and run.parent.span_id == parent.get_span_context().span_id
    assert run.attributes["pg_scheduler.job_id"] == job_id
    assert run.attributes["pg_scheduler.outcome"] == "completed"
    # The run span is current inside the job: spans the job opens are its children.
    assert job.result == format(run.context.span_id, "016x")
    assert job.args == [] and job.kwargs == {}  # the reserved key is not an argument


async def test_without_a_current_span_nothing_is_stored(spans, pool, make_scheduler):
    _provider, exporter = spans
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(dashboard_tasks.echo, execution_time=now(), args=(1,))
    await wait_for_status(pool, job_id, "completed")
    stored = await pool.fetchval("SELECT task_data FROM scheduled_jobs WHERE job_id = $1", job_id)
    assert TRACE_KEY not in stored
    [run] = await run_spans(exporter, "dash.echo")
    assert run.parent is None


async def test_failed_attempts_are_error_spans(spans, pool, make_scheduler):
    _provider, exporter = spans
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(
        dashboard_tasks.boom,
        execution_time=now(),
        args=("x",),
        max_retries=1,
        retry_policy=RetryPolicy(base_delay=0.01, factor=1, max_delay=0.01, jitter=0),
    )
    await wait_for_status(pool, job_id, "failed")
    runs = await run_spans(exporter, "dash.boom", count=2)
    assert sorted(r.attributes["pg_scheduler.outcome"] for r in runs) == ["failed", "retried"]
    assert all(r.status.status_code is StatusCode.ERROR for r in runs)
    assert sorted(r.attributes["pg_scheduler.attempt"] for r in runs) == [1, 2]


async def test_bulk_schedule_carries_the_context_too(spans, pool, make_scheduler):
    from pg_scheduler import JobSpec

    provider, _exporter = spans
    scheduler = await make_scheduler(start=False)
    with provider.get_tracer("test").start_as_current_span("batch"):
        ids = await scheduler.schedule_bulk(
            [JobSpec(dashboard_tasks.echo, args=(n,), execution_time=now()) for n in range(3)]
        )
    rows = await pool.fetch("SELECT task_data FROM scheduled_jobs WHERE job_id = ANY($1)", ids)
    assert len(rows) == 3 and all(TRACE_KEY in r["task_data"] for r in rows)


async def test_a_workflow_is_one_trace_with_its_steps_runs_and_children(
    spans, pool, make_scheduler
):
    from tests.support import otel_workflow_tasks as wf

    _provider, exporter = spans
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(wf.flow, args=(1,))  # no current span
    await wait_for_status(pool, job_id, "waiting")
    await scheduler.signal(job_id, "go", 10)
    assert await scheduler.result(job_id, timeout=10) == 14
    # It ran two or three times: at the start, maybe after its child, after the signal.
    deadline = time.monotonic() + 10
    while not any(
        r.attributes["pg_scheduler.outcome"] == "completed"
        for r in await run_spans(exporter, "otelwf.flow")
    ):
        assert time.monotonic() < deadline, "the last run's span never ended"
        await asyncio.sleep(0.01)
    runs = await run_spans(exporter, "otelwf.flow")
    assert len(runs) >= 2
    [child] = await run_spans(exporter, "otelwf.child")
    finished = exporter.get_finished_spans()
    [root] = [s for s in finished if s.name == "schedule otelwf.flow"]
    steps = {s.name: s for s in finished if s.name.startswith("step ")}
    assert set(steps) == {"step first", "step last"}  # each ran once; replays make no span
    trace_id = root.context.trace_id
    assert {s.context.trace_id for s in [*runs, child, *steps.values()]} == {trace_id}
    assert all(r.parent.span_id == root.context.span_id for r in runs)
    run_ids = {r.context.span_id for r in runs}
    assert child.parent.span_id in run_ids and steps["step first"].parent.span_id in run_ids
    assert steps["step last"].attributes["pg_scheduler.step"] == "last"
    # The child's row carries the context, so a worker in another process joins the trace.
    [child_data] = await pool.fetch(
        "SELECT task_data FROM scheduled_jobs WHERE parent_job_id = $1", job_id
    )
    assert format(trace_id, "032x") in child_data["task_data"]


async def test_a_graph_scheduled_in_one_call_is_one_trace(spans, pool, make_scheduler):
    from pg_scheduler import JobSpec, chain, group

    _provider, exporter = spans
    scheduler = await make_scheduler()
    flow = chain(
        JobSpec(dashboard_tasks.echo, now(), (1,)),
        group(
            JobSpec(dashboard_tasks.echo, now(), (2,)), JobSpec(dashboard_tasks.echo, now(), (3,))
        ),
    )
    ids = await scheduler.schedule_bulk(flow)
    for job_id in ids:
        await scheduler.wait_for(job_id, timeout=10)
    runs = await run_spans(exporter, "dash.echo", count=3)
    [root] = [s for s in exporter.get_finished_spans() if s.name == "schedule graph"]
    assert {r.context.trace_id for r in runs} == {root.context.trace_id}
    assert {r.parent.span_id for r in runs} == {root.context.span_id}
    # Independent jobs in one call, without a span: no trace is made up for them.
    plain = await scheduler.schedule_bulk([JobSpec(dashboard_tasks.echo, now(), (4,))])
    stored = await pool.fetchval("SELECT task_data FROM scheduled_jobs WHERE job_id = $1", plain[0])
    assert TRACE_KEY not in stored
