"""@periodic over a @workflow: each window is a workflow run (its start
recorded once, as a step, so a window that parks does not start again)."""

from __future__ import annotations

import importlib
from collections import Counter
from datetime import timedelta

import pytest
from conftest import wait_until

from pg_scheduler import WorkflowContext, periodic, workflow

periodic_module = importlib.import_module("pg_scheduler.periodic")
ran: Counter[str] = Counter()


@pytest.fixture(autouse=True)
def isolated_periodic_registry():
    saved = dict(periodic_module._registry)
    ran.clear()
    yield
    periodic_module._registry.clear()
    periodic_module._registry.update(saved)


async def _tick() -> str:
    ran["tick"] += 1
    return "ticked"


@workflow
async def nightly(ctx: WorkflowContext) -> str:
    await ctx.step("tick", _tick)
    await ctx.sleep(0.3)  # parks: the window resumes, it does not start again
    await ctx.step("tock", lambda: ran.update(["tock"]))
    return "done"


async def test_a_periodic_workflow_runs_each_window_as_a_workflow(pool, make_scheduler):
    periodic(every=timedelta(seconds=1), dedup_key="wf-nightly")(nightly)
    scheduler = await make_scheduler(run_periodic_jobs=True)

    async def two_windows_done() -> bool:
        rows = await pool.fetch(
            "SELECT status, result::text AS result FROM scheduled_jobs WHERE task_name = $1"
            " AND status = 'completed'",
            "periodic:wf-nightly",
        )
        return len(rows) >= 2

    await wait_until(two_windows_done, timeout=15, message="two windows")
    scheduler.disable_periodic_job("wf-nightly")
    rows = await pool.fetch(
        "SELECT j.job_id, j.result::text AS result, count(s.seq) AS steps"
        "  FROM scheduled_jobs j JOIN workflow_steps s ON s.job_id = j.job_id"
        " WHERE j.task_name = $1 AND j.status = 'completed' GROUP BY j.job_id, j.result",
        "periodic:wf-nightly",
    )
    assert len(rows) >= 2
    # periodic:start, tick, sleep, tock: every window's steps once.
    assert {r["steps"] for r in rows} == {4}
    assert {r["result"] for r in rows} == {'"done"'}
    status = await scheduler.fetch_periodic_job_status("wf-nightly")
    assert status is not None and status["last_outcome"] in ("completed", "waiting", "running")
    assert ran["tock"] >= 2 and ran["tick"] >= ran["tock"]


def test_use_advisory_lock_is_refused_for_a_workflow():
    with pytest.raises(ValueError, match="cannot apply to a workflow"):
        periodic(every=timedelta(seconds=1), dedup_key="wf-locked", use_advisory_lock=True)(nightly)
