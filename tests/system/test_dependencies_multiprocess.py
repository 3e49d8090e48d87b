"""Declared dependencies across two worker processes, one killed with SIGKILL
midway: 20 chains of 10 jobs, each body recording its start (and end) by the
database's clock. Every node runs and completes, none is lost, and no job
starts before the job it depends on completed; the dependents a completion
took over (started on its worker, in its statement) are among them."""

from __future__ import annotations

import asyncio
import signal
from datetime import UTC, datetime

import pytest

from pg_scheduler import JobSpec, Scheduler, chain
from tests.support import dependency_tasks as t
from tests.support.common import start_cli_worker, wait_until

CHAINS, LENGTH = 20, 10
STEP_SECONDS = 0.05


@pytest.mark.slow
async def test_chains_survive_a_killed_worker_in_order(pool, dsn):
    await pool.execute(t.TABLE)
    await pool.execute("TRUNCATE dep_runs")
    workers = [
        await start_cli_worker(dsn, "tests.support.dependency_tasks:SETTINGS") for _ in range(2)
    ]
    try:

        async def both_up() -> bool:
            return await pool.fetchval("SELECT count(*) FROM scheduler_workers") == 2

        await wait_until(both_up, timeout=30, message="two workers registered")
        now = datetime.now(UTC)
        flows = [
            chain(*(JobSpec(t.step, now, (f"{c}.{i}", STEP_SECONDS)) for i in range(LENGTH)))
            for c in range(CHAINS)
        ]
        specs = [spec for flow in flows for spec in flow]
        ids = await Scheduler(pool).schedule_bulk(specs)  # never started: it only enqueues
        assert len(ids) == CHAINS * LENGTH
        name_of = {job_id: spec.args[0] for job_id, spec in zip(ids, specs, strict=True)}

        async def completed() -> int:
            return await pool.fetchval(
                "SELECT count(*) FROM scheduled_jobs WHERE status = 'completed'"
            )

        async def a_third_done() -> bool:
            return await completed() >= CHAINS * LENGTH // 3

        await wait_until(a_third_done, timeout=60, message="a third of the jobs completed")
        workers[0].send_signal(signal.SIGKILL)
        await workers[0].wait()

        async def all_done() -> bool:
            return await completed() == CHAINS * LENGTH

        await wait_until(all_done, timeout=90, message="every job completed")

        statuses = await pool.fetch("SELECT status, count(*) FROM scheduled_jobs GROUP BY 1")
        assert [tuple(r) for r in statuses] == [("completed", CHAINS * LENGTH)]
        runs = await pool.fetch("SELECT name, started_at, ended_at FROM dep_runs")
        first_start: dict[str, datetime] = {}
        last_end: dict[str, datetime] = {}
        for run in runs:
            name = run["name"]
            if name not in first_start or run["started_at"] < first_start[name]:
                first_start[name] = run["started_at"]
            if run["ended_at"] is not None and (
                name not in last_end or run["ended_at"] > last_end[name]
            ):
                last_end[name] = run["ended_at"]
        assert set(last_end) == set(name_of.values()), "every node ran to its end"
        finished = {
            name_of[r["job_id"]]: r["finished_at"]
            for r in await pool.fetch("SELECT job_id, finished_at FROM scheduled_jobs")
        }
        early = []
        for c in range(CHAINS):
            for i in range(1, LENGTH):
                before, after = f"{c}.{i - 1}", f"{c}.{i}"
                if not (
                    last_end[before] <= first_start[after]
                    and finished[before] <= first_start[after]
                ):
                    early.append((before, after))
        assert early == [], "dependents started before their dependency completed"
        # Most dependents were taken over by their dependency's completion
        # (engine/hand_off.py): started in its statement, on its worker.
        taken_over = await pool.fetchval(
            """SELECT count(*) FROM job_dependencies e
                 JOIN scheduled_jobs p ON p.job_id = e.depends_on
                 JOIN scheduled_jobs d ON d.job_id = e.job_id
                WHERE d.started_at = p.finished_at AND d.worker_id = p.worker_id"""
        )
        assert taken_over > 0
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
