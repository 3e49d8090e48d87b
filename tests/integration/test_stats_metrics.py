"""The optional Prometheus exporter serves the figures of stats()."""

from __future__ import annotations

import asyncio
import urllib.request
from datetime import UTC, datetime

import pytest

from pg_scheduler.observe.metrics import MetricsExporter
from tests.support import app_tasks
from tests.support.common import wait_for_status, wait_until


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


async def test_exporter_serves_queue_figures(pool, make_scheduler):
    scheduler = await make_scheduler()
    done = await scheduler.schedule(app_tasks.add, execution_time=datetime.now(UTC), args=(1, 2))
    failed = await scheduler.schedule(app_tasks.boom, execution_time=datetime.now(UTC))
    await wait_for_status(pool, done, "completed")
    await wait_for_status(pool, failed, "failed")
    async with MetricsExporter(scheduler, port=0, addr="127.0.0.1", interval=0.1) as exporter:
        text = await asyncio.to_thread(scrape, exporter.port)
        assert "pg_scheduler_stats_up 1.0" in text
        assert (
            'pg_scheduler_jobs{status="completed",task="tests.support.app_tasks:add"} 1.0' in text
        )
        assert 'pg_scheduler_jobs{status="failed",task="tests.support.app_tasks:boom"} 1.0' in text
        assert 'pg_scheduler_failure_rate{window_seconds="60"} 0.5' in text
        assert 'pg_scheduler_worker_alive{hostname="' in text
        assert f'worker_id="{scheduler.worker_id}"' in text
        assert "pg_scheduler_live_workers 1.0" in text
        assert "pg_scheduler_oldest_pending_age_seconds 0.0" in text
        # The background refresh picks up new rows.
        await pool.execute(
            "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time) "
            "VALUES ('later', 'x', 'mod:x', now() - interval '30 seconds')"
        )
        first = exporter.refreshed_at
        await wait_until(lambda: exporter.refreshed_at != first, message="a refresh")
        text = await asyncio.to_thread(scrape, exporter.port)
        assert 'pg_scheduler_jobs_due{task="mod:x"} 1.0' in text
        age = next(
            line
            for line in text.splitlines()
            if line.startswith("pg_scheduler_oldest_pending_age_seconds ")
        )
        assert 29 < float(age.split()[1]) < 60


async def test_exporter_from_pool_and_bad_arguments(pool):
    async with MetricsExporter(pool, port=0, addr="127.0.0.1") as exporter:
        text = await asyncio.to_thread(scrape, exporter.port)
        assert "pg_scheduler_live_workers 0.0" in text
    with pytest.raises(ValueError, match="port"):
        MetricsExporter(pool, port=70000)
    with pytest.raises(ValueError, match="interval"):
        MetricsExporter(pool, port=0, interval=0)
    with pytest.raises(TypeError):
        MetricsExporter("not a pool", port=0)  # type: ignore[arg-type]
