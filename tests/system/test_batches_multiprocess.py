"""Batch tasks across two worker processes, one killed with SIGKILL mid-batch:
every job completes, none is lost, the killed worker's batch comes back
through the rescuer (lease expiry) and runs again, and no job runs again
after it completed."""

from __future__ import annotations

import asyncio
import signal
from datetime import UTC, datetime

import pytest

from pg_scheduler import JobSpec, Scheduler
from tests.support import batch_tasks as t
from tests.support.common import start_cli_worker, wait_until

JOBS = 400


@pytest.mark.slow
async def test_a_killed_worker_loses_no_job_of_its_batches(pool, dsn):
    await pool.execute(t.TABLE)
    await pool.execute("TRUNCATE batch_runs")
    workers = [await start_cli_worker(dsn, "tests.support.batch_tasks:SETTINGS") for _ in range(2)]
    try:

        async def both_up() -> bool:
            return await pool.fetchval("SELECT count(*) FROM scheduler_workers") == 2

        await wait_until(both_up, timeout=30, message="two workers registered")
        now = datetime.now(UTC)
        ids = await Scheduler(pool).schedule_bulk(
            [JobSpec(t.record, now, (n,)) for n in range(JOBS)]
        )
        victim = workers[0].pid

        async def victim_mid_batch() -> bool:
            # A batch of the victim's has started and not finished.
            return bool(
                await pool.fetchval(
                    "SELECT count(*) FROM scheduled_jobs j JOIN batch_runs r USING (job_id)"
                    " WHERE j.status = 'running' AND r.pid = $1",
                    victim,
                )
            )

        await wait_until(victim_mid_batch, timeout=60, message="the victim runs a batch")
        workers[0].send_signal(signal.SIGKILL)
        await workers[0].wait()

        async def all_done() -> bool:
            return (
                await pool.fetchval(
                    "SELECT count(*) FROM scheduled_jobs WHERE status = 'completed'"
                )
                == JOBS
            )

        await wait_until(all_done, timeout=120, message="every job completed")
        rows = await pool.fetch(
            "SELECT job_id, status, result::int AS result, finished_at, rescue_count"
            " FROM scheduled_jobs"
        )
        assert len(rows) == JOBS
        by_id = {r["job_id"]: r for r in rows}
        assert [by_id[job_id]["result"] for job_id in ids] == list(range(JOBS))
        # The killed worker's batch ran again elsewhere (rescued, not lost).
        assert any(r["rescue_count"] > 0 for r in rows)
        runs = await pool.fetch("SELECT job_id, pid, started_at FROM batch_runs")
        assert {r["job_id"] for r in runs} == set(ids)
        late = [r["job_id"] for r in runs if r["started_at"] > by_id[r["job_id"]]["finished_at"]]
        assert late == [], "a job ran again after it completed"
        # A job ran twice only if the killed worker had it.
        twice: dict[str, set[int]] = {}
        for r in runs:
            twice.setdefault(r["job_id"], set()).add(r["pid"])
        again = [job_id for job_id, pids in twice.items() if len(pids) > 1]
        assert all(victim in twice[job_id] for job_id in again)
    finally:
        for worker in workers:
            if worker.returncode is None:
                worker.send_signal(signal.SIGTERM)
        for worker in workers:
            try:
                await asyncio.wait_for(worker.wait(), 30)
            except TimeoutError:
                worker.kill()
                await worker.wait()
