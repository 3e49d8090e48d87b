"""Every job transition logs through structlog with the documented fields."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from structlog.testing import capture_logs

from pg_scheduler import JobSpec, RetryPolicy, VacuumConfig, VacuumPolicy
from tests.support import app_tasks
from tests.support.common import wait_for_status, wait_until

FIELDS = ("job_id", "task", "worker_id", "attempt")


def events_of(logs: list[dict], job_id: str) -> dict[str, dict]:
    return {e["event_type"]: e for e in logs if e.get("job_id") == job_id and "event_type" in e}


async def test_transitions_carry_job_task_worker_attempt_duration(pool, make_scheduler):
    now = datetime.now(UTC)
    with capture_logs() as logs:
        scheduler = await make_scheduler(
            vacuum_enabled=True,
            vacuum_config=VacuumConfig(completed=VacuumPolicy.never(), interval_minutes=60),
        )
        ok = await scheduler.schedule(app_tasks.add, execution_time=now, args=(1, 2))
        flaky = await scheduler.schedule(
            app_tasks.boom,
            execution_time=now,
            max_retries=1,
            retry_policy=RetryPolicy(base_delay=0.05, jitter=0),
        )
        late = await scheduler.schedule(
            app_tasks.noop, execution_time=now - timedelta(seconds=30), misfire_grace_time=1
        )
        later = await scheduler.schedule(app_tasks.noop, execution_time=now + timedelta(hours=1))
        await scheduler.schedule_bulk([JobSpec(func=app_tasks.noop, execution_time=now)])
        await wait_for_status(pool, ok, "completed")
        await wait_for_status(pool, flaky, "failed")
        await wait_for_status(pool, late, "expired")
        assert await scheduler.cancel_job(later)
        await wait_until(
            lambda: any(e.get("event_type") == "vacuum" for e in logs), message="vacuum log"
        )

    done = events_of(logs, ok)
    assert {"scheduled", "claimed", "started", "completed"} <= done.keys()
    for name in ("claimed", "started", "completed"):
        assert all(done[name][f] is not None for f in FIELDS), done[name]
    assert done["completed"]["duration"] >= 0 and done["completed"]["attempt"] == 1

    failing = events_of(logs, flaky)
    assert failing["retried"]["attempt"] == 1 and failing["retried"]["duration"] >= 0
    assert failing["failed"]["attempt"] == 2 and "boom" in failing["failed"]["error"]
    assert all(failing["failed"][f] is not None for f in FIELDS)

    expired = events_of(logs, late)["expired"]
    assert (
        expired["worker_id"] == scheduler.worker_id
        and expired["task"] == "tests.support.app_tasks:noop"
    )
    assert events_of(logs, later)["cancelled"]["job_id"] == later
    assert any(e.get("event_type") == "scheduled" and e.get("bulk") for e in logs)
    vacuum = next(e for e in logs if e.get("event_type") == "vacuum")
    assert vacuum["worker_id"] == scheduler.worker_id and "duration" in vacuum
