"""pg_scheduler.testing for workflows: a workflow run to its end inline, its
sleeps and timeouts passed by a virtual clock, signals sent when it waits, a
crash right after a step (the rescuer's statement, then the real replay), and
run until parked; the documentation's example test runs here too."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

import pg_scheduler.testing as testing
from pg_scheduler import JobStatus, RetryPolicy, WorkflowContext, task, workflow
from pg_scheduler.testing import (
    VirtualClock,
    WorkflowStuck,
    rescue_job,
    resume_workflow,
    run_until_crash,
    run_until_parked,
    run_workflow,
)
from pg_scheduler.workflows.run import CRASH_AFTER
from tests.support.common import wait_for_status

ran: Counter[str] = Counter()


@pytest.fixture(autouse=True)
async def _effects(pool: asyncpg.Pool) -> None:
    ran.clear()
    await pool.execute("CREATE TABLE IF NOT EXISTS kit_effects (job_id text, what text)")


def fetch(user_id: int) -> dict[str, Any]:
    ran["fetch"] += 1
    return {"id": user_id, "items": ["a", "bb"]}


@task
async def score(item: str) -> int:
    ran[f"score {item}"] += 1
    return len(item)


@workflow(timeout=timedelta(days=30))
async def onboard(ctx: WorkflowContext, user_id: int) -> dict[str, Any]:
    profile = await ctx.step("fetch", fetch, user_id)  # 1
    async with ctx.transaction() as conn:  # 2
        await conn.execute("INSERT INTO kit_effects VALUES ($1, 'welcomed')", ctx.job_id)
    await ctx.sleep(timedelta(days=3))  # 3
    approved = await ctx.wait_for_signal(  # 4
        "approved", timeout=timedelta(days=7), default=None
    )
    if approved is None:
        return {"approved": None}
    scores = await ctx.gather(*[ctx.spawn(score, i) for i in profile["items"]])  # 5, 6, 7
    await ctx.step("notify", lambda: ran.update(["notify"]))  # 8
    return {"approved": approved, "scores": scores}


ONBOARD_STEPS = 8


async def _steps(pool: asyncpg.Pool, job_id: str) -> list[tuple[int, str, str]]:
    rows = await pool.fetch(
        "SELECT seq, kind, status FROM workflow_steps WHERE job_id = $1 ORDER BY seq", job_id
    )
    return [(r["seq"], r["kind"], r["status"]) for r in rows]


async def _effects_of(pool: asyncpg.Pool, job_id: str) -> list[str]:
    rows = await pool.fetch("SELECT what FROM kit_effects WHERE job_id = $1", job_id)
    return [r["what"] for r in rows]


# -- run_workflow ---------------------------------------------------------------------


async def test_run_workflow_takes_a_workflow_through_sleep_signal_and_children(
    pool, make_scheduler
):
    scheduler = await make_scheduler(start=False)
    clock = VirtualClock(scheduler)
    began = datetime.now(UTC)
    job = await run_workflow(scheduler, onboard, 42, signals={"approved": "ann"}, clock=clock)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == {"approved": "ann", "scores": [1, 2]}
    assert ran == Counter({"fetch": 1, "score a": 1, "score bb": 1, "notify": 1})
    assert await _effects_of(pool, job.job_id) == ["welcomed"]
    # The real path: every place recorded, the sleep parked (its run is not an
    # attempt), the signal sent while it waited, the children run as jobs (a
    # spawn's outcome stays on its child's row, the step waiting, until the
    # row goes).
    assert [s[1:] for s in await _steps(pool, job.job_id)] == [
        ("step", "completed"),
        ("transaction", "completed"),
        ("sleep", "completed"),
        ("signal", "completed"),
        ("spawn", "waiting"),
        ("spawn", "waiting"),
        ("wait", "completed"),
        ("step", "completed"),
    ]
    assert job.attempts == 1 and job.rescue_count == 0
    children = await pool.fetch(
        "SELECT status FROM scheduled_jobs WHERE parent_job_id = $1", job.job_id
    )
    assert [c["status"] for c in children] == ["completed", "completed"]
    # Three days passed for the workflow, none for the test.
    took = datetime.now(UTC) - began
    assert took < timedelta(seconds=30)
    assert timedelta(days=3) - took <= clock.elapsed <= timedelta(days=3)


async def test_without_its_signal_the_wait_times_out_after_its_virtual_week(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    clock = VirtualClock(scheduler)
    job = await run_workflow(scheduler, onboard, 7, clock=clock)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == {"approved": None}
    assert timedelta(days=10, minutes=-1) < clock.elapsed <= timedelta(days=10)
    steps = await pool.fetch(
        "SELECT result FROM workflow_steps WHERE job_id = $1 AND kind = 'signal'", job.job_id
    )
    assert [s["result"] for s in steps] == ['{"timeout": true}']


@workflow
async def waits_forever(ctx: WorkflowContext) -> Any:
    await ctx.step("before", lambda: ran.update(["before"]))
    return await ctx.wait_for_signal("go")


async def test_a_signal_wait_with_no_timeout_and_no_signal_is_stuck(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    with pytest.raises(WorkflowStuck, match="waits for signal 'go' with no timeout") as caught:
        await run_workflow(scheduler, waits_forever, signals={"other": 1})
    job = caught.value.job
    assert (job.status, job.wait_kind, job.wait_for) == (JobStatus.WAITING, "signal", "go")
    # Given the signal, the same job ends; signals given as pairs.
    job = await resume_workflow(scheduler, job.job_id, signals=[("go", {"n": 1})])
    assert job.status is JobStatus.COMPLETED and job.result == {"n": 1}
    assert ran == Counter({"before": 1})


@workflow
async def forever(ctx: WorkflowContext) -> None:
    for n in range(1_000_000):
        await ctx.sleep(timedelta(hours=1))
        await ctx.step("tick", lambda: ran.update(["tick"]), key=n)


async def test_a_workflow_that_never_ends_is_stuck_after_max_parks(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    clock = VirtualClock(scheduler)
    with pytest.raises(WorkflowStuck, match="parked more than 5 times") as caught:
        await run_workflow(scheduler, forever, clock=clock, max_parks=5)
    assert caught.value.job.status is JobStatus.WAITING
    assert ran == Counter({"tick": 5})
    assert timedelta(hours=5, minutes=-1) < clock.elapsed <= timedelta(hours=5)


@workflow
async def stream(ctx: WorkflowContext) -> list[Any]:
    seen = []
    async for event in ctx.signals("event"):
        if event is None:
            return seen
        seen.append(event)
    return seen


async def test_several_signals_of_one_name_are_sent_in_order_one_per_wait(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    job = await run_workflow(
        scheduler, stream, signals=[("event", 1), ("event", [2]), ("event", None)]
    )
    assert job.status is JobStatus.COMPLETED and job.result == [1, [2]]


@workflow(timeout=timedelta(days=1))
async def late(ctx: WorkflowContext) -> str:
    await ctx.step("start", lambda: ran.update(["start"]))
    await ctx.sleep(timedelta(days=2))
    ran["woke"] += 1
    return "never"


async def test_the_clock_brings_a_workflow_to_its_deadline(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    clock = VirtualClock(scheduler)
    job = await run_workflow(scheduler, late, clock=clock)
    assert job.status is JobStatus.FAILED
    assert job.error.startswith("WorkflowTimeout")
    assert ran == Counter({"start": 1})
    assert timedelta(hours=23) < clock.elapsed <= timedelta(days=1)


@workflow
async def napper(ctx: WorkflowContext, seconds: float) -> str:
    await ctx.step("before", lambda: ran.update(["before"]))
    await ctx.sleep(seconds)
    await ctx.step("after", lambda: ran.update(["after"]))
    return "rested"


async def test_a_short_sleep_parks_pending_and_passes_at_once(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    job_id = await scheduler.schedule(napper, execution_time=datetime.now(UTC), args=(1.5,))
    job = await run_until_parked(scheduler, job_id)
    # Within the timer's lookahead: pending, due at its end; not an attempt.
    assert job.status is JobStatus.PENDING and job.attempts == 0
    assert job.execution_time > datetime.now(UTC)
    assert ran == Counter({"before": 1})
    job = await run_until_parked(scheduler, job_id)  # too early: parks again
    assert job.status is JobStatus.PENDING and ran == Counter({"before": 1})
    clock = VirtualClock(scheduler)
    job = await resume_workflow(scheduler, job_id, clock=clock)
    assert job.status is JobStatus.COMPLETED and job.result == "rested"
    assert ran == Counter({"before": 1, "after": 1})
    assert timedelta(0) < clock.elapsed <= timedelta(seconds=1.5)


@workflow
async def flaky(ctx: WorkflowContext) -> str:
    await ctx.step("once", lambda: ran.update(["once"]))
    await ctx.sleep(timedelta(hours=1))
    ran["attempt"] += 1
    if ran["attempt"] == 1:
        raise RuntimeError("first attempt fails")
    return "ok"


async def test_a_failed_attempt_is_retried_at_once_and_replays(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    job = await run_workflow(scheduler, flaky)
    assert job.status is JobStatus.FAILED  # no retries allowed
    job_id = await scheduler.schedule(
        flaky,
        execution_time=datetime.now(UTC),
        max_retries=1,
        retry_policy=RetryPolicy(base_delay=3600, jitter=0),
    )
    ran.clear()
    job = await resume_workflow(scheduler, job_id)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.attempts == 2 and ran == Counter({"once": 1, "attempt": 2})


@workflow
async def child_napper(ctx: WorkflowContext, name: str) -> str:
    await ctx.sleep(timedelta(days=1))
    await ctx.step("done", lambda: ran.update([f"child {name}"]))
    return name


@workflow
async def parent(ctx: WorkflowContext) -> list[str]:
    return await ctx.gather(ctx.spawn(child_napper, "x"), ctx.spawn(child_napper, "y"))


async def test_children_that_are_workflows_run_inline_on_the_same_clock(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    clock = VirtualClock(scheduler)
    job = await run_workflow(scheduler, parent, clock=clock)
    assert job.status is JobStatus.COMPLETED and job.result == ["x", "y"]
    assert ran == Counter({"child x": 1, "child y": 1})
    # The first child's advance moved the second's sleep too: one day in all.
    assert timedelta(days=1, minutes=-1) < clock.elapsed <= timedelta(days=1)


# -- the virtual clock ------------------------------------------------------------------


async def test_the_clock_wakes_a_sleeper_only_once_its_time_has_passed(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    clock = VirtualClock(scheduler)
    job_id = await scheduler.schedule(onboard, execution_time=datetime.now(UTC), args=(5,))
    job = await run_until_parked(scheduler, job_id)
    assert (job.status, job.wait_kind) == (JobStatus.WAITING, "sleep")
    first_wake = job.wake_at
    assert await clock.advance(timedelta(days=2, hours=23)) == 0
    job = await run_until_parked(scheduler, job_id)  # not yet: nothing runs
    assert (job.status, job.wait_kind) == (JobStatus.WAITING, "sleep")
    assert job.wake_at == first_wake - timedelta(days=2, hours=23)
    assert await clock.advance(3600) == 1
    assert (await scheduler.get_job(job_id)).status is JobStatus.PENDING
    job = await run_until_parked(scheduler, job_id)
    assert (job.status, job.wait_kind, job.wait_for) == (JobStatus.WAITING, "signal", "approved")
    assert job.wake_at is not None
    await scheduler.signal(job_id, "approved", "bob")
    job = await run_until_parked(scheduler, job_id)
    assert (job.status, job.wait_kind) == (JobStatus.WAITING, "children")
    job = await resume_workflow(scheduler, job_id, clock=clock)
    assert job.status is JobStatus.COMPLETED and job.result["approved"] == "bob"
    assert clock.elapsed == timedelta(days=3)
    assert ran == Counter({"fetch": 1, "score a": 1, "score bb": 1, "notify": 1})


async def test_the_clock_wakes_workflows_for_a_started_schedulers_workers(pool, make_scheduler):
    scheduler = await make_scheduler()
    clock = VirtualClock(scheduler)
    job_id = await scheduler.schedule(onboard, execution_time=datetime.now(UTC), args=(9,))
    await wait_for_status(pool, job_id, "waiting")
    # Woken by the clock's statement (or by this Scheduler's own timer, which
    # runs the same one, if it came between the shift and that statement); it
    # is waiting again only once a worker ran it to its next park.
    await clock.advance(timedelta(days=3))
    await wait_for_status(pool, job_id, "waiting")
    job = await scheduler.get_job(job_id)
    assert (job.wait_kind, job.wait_for) == ("signal", "approved")
    await clock.advance(timedelta(days=7))
    job = await scheduler.wait_for(job_id, timeout=15)
    assert job.status is JobStatus.COMPLETED and job.result == {"approved": None}
    assert ran == Counter({"fetch": 1})


async def test_the_clock_makes_a_job_due_later_due_now(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    clock = VirtualClock(scheduler)
    later = datetime.now(UTC) + timedelta(days=1)
    job_id = await scheduler.schedule(score, execution_time=later, args=("abc",))
    await clock.advance(timedelta(hours=1))
    job = await scheduler.get_job(job_id)
    assert job.execution_time == later - timedelta(hours=1)
    await clock.advance(timedelta(days=2))
    job = await scheduler.get_job(job_id)
    assert job.execution_time <= datetime.now(UTC)  # due now, not a day in the past
    assert job.execution_time > datetime.now(UTC) - timedelta(minutes=1)


# -- crashes ----------------------------------------------------------------------------


async def test_a_crash_stops_the_run_right_after_the_step_and_the_rescue_replays_it(
    pool, make_scheduler
):
    scheduler = await make_scheduler(start=False)
    job_id = await scheduler.schedule(onboard, execution_time=datetime.now(UTC), args=(3,))
    job = await run_until_crash(scheduler, job_id, 2, signals={"approved": "cy"})
    # As a kill -9 leaves it: running, held by the dead run's worker, the
    # transaction of step 2 committed, nothing of step 3 done.
    assert job.status is JobStatus.RUNNING
    assert job.worker_id == scheduler.worker_id and job.lease_until is not None
    assert await _steps(pool, job_id) == [(1, "step", "completed"), (2, "transaction", "completed")]
    assert await _effects_of(pool, job_id) == ["welcomed"]
    assert ran == Counter({"fetch": 1})
    assert job_id not in CRASH_AFTER
    with pytest.raises(RuntimeError, match="rescue_job"):
        await run_until_parked(scheduler, job_id)

    job = await rescue_job(scheduler, job_id)
    assert job.status is JobStatus.PENDING and job.worker_id is None
    assert job.rescue_count == 1
    assert job.attempt_history[-1].outcome == "rescued"
    assert "lease expired" in (job.attempt_history[-1].error or "")
    job = await resume_workflow(scheduler, job_id, signals={"approved": "cy"})
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == {"approved": "cy", "scores": [1, 2]}
    assert ran == Counter({"fetch": 1, "score a": 1, "score bb": 1, "notify": 1})
    assert await _effects_of(pool, job_id) == ["welcomed"]
    assert [a.outcome for a in job.attempt_history] == ["rescued", "completed"]


@pytest.mark.parametrize("step", range(1, ONBOARD_STEPS + 1))
async def test_a_crash_after_any_step_runs_no_step_body_twice(pool, make_scheduler, step):
    scheduler = await make_scheduler(start=False)
    job = await run_workflow(
        scheduler, onboard, 1, signals={"approved": "dee"}, crash_after_step=step
    )
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == {"approved": "dee", "scores": [1, 2]}
    assert job.rescue_count == 1
    assert ran == Counter({"fetch": 1, "score a": 1, "score bb": 1, "notify": 1})
    assert await _effects_of(pool, job.job_id) == ["welcomed"]


@workflow
async def leaky(ctx: WorkflowContext) -> str:
    await ctx.step("charge", lambda: ran.update(["charge"]))
    ran["email"] += 1  # not in a step: not checkpointed
    await ctx.step("receipt", lambda: ran.update(["receipt"]))
    return "done"


async def test_a_side_effect_outside_a_step_is_counted_twice_by_a_crash(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    job = await run_workflow(scheduler, leaky)
    assert ran == Counter({"charge": 1, "email": 1, "receipt": 1})  # no crash: all once
    ran.clear()
    job = await run_workflow(scheduler, leaky, crash_after_step=1)
    assert job.status is JobStatus.COMPLETED
    # The step bodies ran once; the code between them ran in the killed run
    # and again in the replay: the crash test catches it.
    assert ran == Counter({"charge": 1, "email": 2, "receipt": 1})


async def test_a_crash_after_the_last_step_leaves_the_result_unwritten(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    job_id = await scheduler.schedule(leaky, execution_time=datetime.now(UTC))
    job = await run_until_crash(scheduler, job_id, 2)
    assert job.status is JobStatus.RUNNING and job.result is None
    assert ran == Counter({"charge": 1, "email": 1, "receipt": 1})
    await rescue_job(scheduler, job_id)
    job = await resume_workflow(scheduler, job_id)
    assert job.status is JobStatus.COMPLETED and job.result == "done"
    assert ran == Counter({"charge": 1, "email": 2, "receipt": 1})


async def test_a_crash_point_past_the_workflows_end_is_an_error(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    job_id = await scheduler.schedule(leaky, execution_time=datetime.now(UTC))
    with pytest.raises(ValueError, match="ended \\(completed\\) before its run was past step 3"):
        await run_until_crash(scheduler, job_id, 3)
    assert job_id not in CRASH_AFTER
    with pytest.raises(ValueError, match="completed, not running"):
        await rescue_job(scheduler, job_id)


# -- bad input ----------------------------------------------------------------------------


async def test_a_task_this_scheduler_cannot_run_is_an_error_not_a_loop(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    job_id = await scheduler.schedule(leaky, execution_time=datetime.now(UTC))
    await pool.execute(
        "UPDATE scheduled_jobs SET task_name = 'elsewhere:unknown' WHERE job_id = $1", job_id
    )
    with pytest.raises(LookupError, match="'elsewhere:unknown' is not registered"):
        await resume_workflow(scheduler, job_id)
    assert (await scheduler.get_job(job_id)).status is JobStatus.PENDING
    assert ran == Counter()


async def test_bad_input_is_refused_before_anything_is_written(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    with pytest.raises(TypeError, match="not a @workflow"):
        await run_workflow(scheduler, score, "a")
    with pytest.raises(TypeError, match="signals must be"):
        await run_workflow(scheduler, onboard, 1, signals="approved")
    with pytest.raises(TypeError, match="not JSON-serializable"):
        await run_workflow(scheduler, onboard, 1, signals={"approved": object()})
    with pytest.raises(ValueError, match="crash_after_step must be >= 1"):
        await run_workflow(scheduler, onboard, 1, crash_after_step=0)
    with pytest.raises(TypeError, match="crash_after_step must be an int"):
        await run_workflow(scheduler, onboard, 1, crash_after_step=True)
    other = VirtualClock(await make_scheduler(start=False))
    with pytest.raises(ValueError, match="another Scheduler"):
        await run_workflow(scheduler, onboard, 1, clock=other)
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0
    clock = VirtualClock(scheduler)
    with pytest.raises(ValueError, match=">= 0"):
        await clock.advance(-1)
    with pytest.raises(TypeError, match="timedelta or seconds"):
        await clock.advance("1 day")
    assert clock.elapsed == timedelta(0)
    started = await make_scheduler()
    with pytest.raises(RuntimeError, match="not started"):
        await run_workflow(started, onboard, 1)
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


# -- the documentation's example -------------------------------------------------------------

PAGE = Path(__file__).resolve().parents[2] / "docs" / "workflows.md"


def _readme_example() -> str:
    """The example test of a workflow in docs/workflows.md: the block that starts
    with its file name."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    found = [b for b in blocks if b.startswith("# test_trial.py")]
    assert len(found) == 1, "the documentation's workflow test example"
    return found[0]


async def test_the_readme_example_test_passes(pool, server_dsn, tmp_path, monkeypatch):
    path = tmp_path / "readme_workflow_example.py"
    path.write_text(_readme_example())
    spec = importlib.util.spec_from_file_location("readme_workflow_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "readme_workflow_example", module)
    spec.loader.exec_module(module)
    # Its databases on the server of this test run (not a second embedded one).
    monkeypatch.setattr(testing, "_embedded_dsn", lambda: server_dsn)
    tests = [getattr(module, name) for name in vars(module) if name.startswith("test_")]
    assert len(tests) == 5
    for test in tests:
        await test()
