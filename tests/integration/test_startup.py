"""Start-up: the claim prepared beside the schema check, nothing left behind."""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg
import pytest

from pg_scheduler import Scheduler

# The schema tests' database (two migrated schemas), its owner and a bare role.
from tests.integration.test_schema import WORKER_GRANTS, A, as_role, db, owner, role  # noqa: F401
from tests.support import app_tasks
from tests.support.common import FAST, wait_until


async def test_a_failed_start_leaves_no_connection_held(owner, db, role):  # noqa: F811
    await owner.execute(WORKER_GRANTS.format(schema=A, role=role))
    await owner.execute(f"REVOKE UPDATE ON {A}.scheduled_jobs FROM {role}")
    # Large enough that the claim loop keeps a connection of its own (warmed at start).
    pool = await asyncpg.create_pool(as_role(db, role), min_size=1, max_size=8)
    try:
        scheduler = Scheduler(pool, schema=A, **FAST)
        with pytest.raises(PermissionError):
            await scheduler.start()
        assert not scheduler.is_running
        assert not scheduler.listener.started
        assert pool.get_idle_size() == pool.get_size()
    finally:
        await pool.close()


async def test_the_first_claim_runs_a_due_job_on_a_warmed_connection(pool, make_scheduler):
    producer = await make_scheduler(start=False)
    job_id = await producer.schedule(app_tasks.add, execution_time=datetime.now(UTC), args=(1, 2))
    worker = await make_scheduler()
    # The warm-up kept the claim loop's connection (pool max_size >= 6) and read the flags.
    assert worker.worker.connection._conn is not None or not worker.worker.connection.enabled
    await wait_until(
        lambda: _status_is(pool, job_id, "completed"), timeout=10, message="first job done"
    )


async def _status_is(pool, job_id: str, status: str) -> bool:
    found = await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id)
    return found == status
