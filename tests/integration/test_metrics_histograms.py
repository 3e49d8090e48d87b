"""Per-job Prometheus histograms and outcome counters, recorded by the engine."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx
import pytest
from prometheus_client import CollectorRegistry

from pg_scheduler import RetryPolicy
from pg_scheduler.observe import instrument
from pg_scheduler.observe.metrics import MetricsExporter, disable_job_metrics, enable_job_metrics
from tests.support import dashboard_tasks
from tests.support.common import wait_for_status, wait_until

FAST_RETRY = RetryPolicy(base_delay=0.01, factor=1, max_delay=0.01, jitter=0)


def now() -> datetime:
    return datetime.now(UTC)


@pytest.fixture
def registry():
    reg = CollectorRegistry()
    metrics = enable_job_metrics(reg)
    yield reg
    disable_job_metrics(metrics)
    assert metrics not in instrument.observers


def sample(registry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_duration_wait_and_outcomes_per_task(registry, pool, make_scheduler):
    scheduler = await make_scheduler()
    ok = await scheduler.schedule(dashboard_tasks.echo, execution_time=now(), args=(1,))
    bad = await scheduler.schedule(
        dashboard_tasks.boom,
        execution_time=now(),
        args=("x",),
        max_retries=1,
        retry_policy=FAST_RETRY,
    )
    await wait_for_status(pool, ok, "completed")
    await wait_for_status(pool, bad, "failed")
    echo = {"task": "dash.echo", "queue": "default"}
    boom = {"task": "dash.boom", "queue": "default"}
    # The failed attempt is recorded after its row is written: poll briefly.
    await wait_until(
        lambda: sample(registry, "pg_scheduler_job_outcomes_total", **boom, outcome="failed") == 1,
        message="the failed outcome to be counted",
    )
    assert sample(registry, "pg_scheduler_job_outcomes_total", **echo, outcome="completed") == 1
    assert sample(registry, "pg_scheduler_job_outcomes_total", **boom, outcome="retried") == 1
    assert sample(registry, "pg_scheduler_job_duration_seconds_count", **echo) == 1
    assert sample(registry, "pg_scheduler_job_duration_seconds_count", **boom) == 2
    assert sample(registry, "pg_scheduler_job_wait_seconds_count", **boom) == 2
    # A job run at once waited well under a minute; the bucket says so.
    assert sample(registry, "pg_scheduler_job_wait_seconds_bucket", **echo, le="60.0") == 1
    assert 0 <= sample(registry, "pg_scheduler_job_duration_seconds_sum", **echo) < 5


async def test_wait_is_measured_from_the_due_time(registry, pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    # Due 30 s ago: the wait recorded is at least that.
    job_id = await scheduler.schedule(
        dashboard_tasks.echo, execution_time=now() - timedelta(seconds=30), args=(2,)
    )
    await scheduler.start()
    await wait_for_status(pool, job_id, "completed")
    labels = {"task": "dash.echo", "queue": "default"}
    await wait_until(lambda: sample(registry, "pg_scheduler_job_wait_seconds_count", **labels) == 1)
    assert sample(registry, "pg_scheduler_job_wait_seconds_sum", **labels) >= 29
    assert sample(registry, "pg_scheduler_job_wait_seconds_bucket", **labels, le="25.0") == 0


async def test_a_cancelled_run_is_counted(registry, pool, make_scheduler):
    dashboard_tasks.gate.clear()
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(dashboard_tasks.gated, execution_time=now(), args=(1,))
    await wait_for_status(pool, job_id, "running")
    assert await scheduler.cancel_job(job_id)
    labels = {"task": "dash.gated", "queue": "default", "outcome": "cancelled"}
    await wait_until(lambda: sample(registry, "pg_scheduler_job_outcomes_total", **labels) == 1)


async def test_nothing_is_recorded_once_disabled(pool, make_scheduler):
    reg = CollectorRegistry()
    metrics = enable_job_metrics(reg)
    assert enable_job_metrics(reg) is metrics  # one recorder per registry
    disable_job_metrics(metrics)
    assert instrument.observers == ()
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(dashboard_tasks.echo, execution_time=now(), args=(3,))
    await wait_for_status(pool, job_id, "completed")
    assert reg.get_sample_value(
        "pg_scheduler_job_duration_seconds_count", {"task": "dash.echo", "queue": "default"}
    ) in (None, 0.0)


async def test_the_exporter_of_a_scheduler_serves_the_histograms(pool, make_scheduler):
    scheduler = await make_scheduler()
    async with MetricsExporter(scheduler, port=0, addr="127.0.0.1", interval=60) as exporter:
        job_id = await scheduler.schedule(dashboard_tasks.echo, execution_time=now(), args=(4,))
        await wait_for_status(pool, job_id, "completed")
        async with httpx.AsyncClient() as http:

            async def served() -> bool:
                text = (await http.get(f"http://127.0.0.1:{exporter.port}/metrics")).text
                return (
                    'pg_scheduler_job_outcomes_total{outcome="completed",queue="default",'
                    'task="dash.echo"} 1.0'
                    in text
                    and "pg_scheduler_job_wait_seconds_bucket" in text
                    and "pg_scheduler_stats_up 1.0" in text  # the gauges are still there
                )

            await wait_until(served, message="the histograms on /metrics")
    assert instrument.observers == ()
    # A pool has no jobs of its own: no job metrics by default.
    assert MetricsExporter(pool, port=0).job_metrics is False
