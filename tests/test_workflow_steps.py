"""Workflow steps: recorded once, replayed afterwards; a code change against a
record is an error; a step's own retries; duplicate names."""

from __future__ import annotations

import json
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import wait_until

from pg_scheduler import (
    JobStatus,
    RetryPolicy,
    StepFailed,
    StepRetry,
    WorkflowContext,
    workflow,
)

FAST_RETRY = RetryPolicy(base_delay=0.01, factor=1.0, max_delay=0.01, jitter=0.0)

# Side effects of step bodies, counted here (the test's process runs the worker).
ran: Counter[str] = Counter()
flags: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _reset() -> None:
    ran.clear()
    flags.clear()


def fetch(user_id: int) -> dict[str, Any]:
    ran["fetch"] += 1
    return {"id": user_id, "tags": ("a", "b")}  # a tuple: comes back as a list


async def greet(profile: dict[str, Any]) -> str:
    ran["greet"] += 1
    return f"hello {profile['id']}"


@workflow
async def onboard(ctx: WorkflowContext, user_id: int) -> dict[str, Any]:
    profile = await ctx.step("fetch", fetch, user_id)
    greeting = await ctx.step("greet", greet, profile)
    if flags.pop("crash_after_greet", False):
        raise RuntimeError("crash after greet")
    total = 0
    for n in range(3):
        total += await ctx.step("add", lambda n=n: ran.update(["add"]) or n, key=n)
    return {"profile": profile, "greeting": greeting, "total": total}


async def _finished(scheduler: Any, job_id: str, timeout: float = 15.0) -> Any:
    return await scheduler.wait_for(job_id, timeout=timeout)


async def _steps(pool: Any, job_id: str) -> list[Any]:
    return await pool.fetch(
        "SELECT seq, kind, name, key, status, result::text AS result, attempts"
        " FROM workflow_steps WHERE job_id = $1 ORDER BY seq",
        job_id,
    )


async def test_steps_run_once_and_are_replayed_after_a_failed_attempt(pool, make_scheduler):
    scheduler = await make_scheduler()
    flags["crash_after_greet"] = True
    job_id = await scheduler.schedule(
        onboard,
        execution_time=datetime.now(UTC),
        args=(42,),
        max_retries=2,
        retry_policy=FAST_RETRY,
    )
    job = await _finished(scheduler, job_id)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == {
        "profile": {"id": 42, "tags": ["a", "b"]},
        "greeting": "hello 42",
        "total": 3,
    }
    # Two runs of the workflow; each step body ran once.
    assert job.attempts == 2
    assert ran == Counter({"fetch": 1, "greet": 1, "add": 3})
    steps = await _steps(pool, job_id)
    assert [(s["seq"], s["kind"], s["name"], s["key"], s["status"]) for s in steps] == [
        (1, "step", "fetch", "", "completed"),
        (2, "step", "greet", "", "completed"),
        (3, "step", "add", "0", "completed"),
        (4, "step", "add", "1", "completed"),
        (5, "step", "add", "2", "completed"),
    ]
    assert json.loads(steps[0]["result"]) == {"id": 42, "tags": ["a", "b"]}


@workflow
async def reorderable(ctx: WorkflowContext) -> str:
    await ctx.step("first", lambda: ran.update(["first"]))
    if flags.get("new_code"):
        await ctx.step("renamed", lambda: ran.update(["renamed"]))
    else:
        await ctx.step("second", lambda: ran.update(["second"]))
    if flags.pop("fail_once", False):
        raise RuntimeError("fail once")
    return "done"


async def test_code_that_no_longer_matches_its_record_fails_without_a_retry(pool, make_scheduler):
    scheduler = await make_scheduler()
    flags["fail_once"] = True
    job_id = await scheduler.schedule(
        reorderable,
        execution_time=datetime.now(UTC),
        max_retries=5,
        retry_policy=RetryPolicy(base_delay=0.5, factor=1.0, max_delay=0.5, jitter=0.0),
    )

    async def failed_once() -> bool:
        job = await scheduler.get_job(job_id)
        return job is not None and job.retry_count == 1

    await wait_until(failed_once, message="the first attempt to fail")
    flags["new_code"] = True  # the code changes while the workflow waits for its retry
    job = await _finished(scheduler, job_id)
    assert job.status is JobStatus.FAILED
    assert job.error.startswith("WorkflowMismatch: step 2 of this workflow was recorded as step")
    assert "'second'" in job.error and "'renamed'" in job.error
    assert job.retry_count == 1  # the mismatch itself was not retried
    assert ran == Counter({"first": 1, "second": 1})


@workflow
async def shortened(ctx: WorkflowContext) -> str:
    await ctx.step("one", lambda: ran.update(["one"]))
    if not flags.get("new_code"):
        await ctx.step("two", lambda: ran.update(["two"]))
        if flags.pop("fail_once", False):
            raise RuntimeError("fail once")
    return "done"


async def test_returning_before_recorded_steps_is_a_mismatch(pool, make_scheduler):
    scheduler = await make_scheduler()
    flags["fail_once"] = True
    job_id = await scheduler.schedule(
        shortened,
        execution_time=datetime.now(UTC),
        max_retries=1,
        retry_policy=RetryPolicy(base_delay=0.5, factor=1.0, max_delay=0.5, jitter=0.0),
    )

    async def failed_once() -> bool:
        job = await scheduler.get_job(job_id)
        return job is not None and job.retry_count == 1

    await wait_until(failed_once, message="the first attempt to fail")
    flags["new_code"] = True
    job = await _finished(scheduler, job_id)
    assert job.status is JobStatus.FAILED
    assert "WorkflowMismatch: the workflow returned after 1 step(s) but 1 more" in job.error


def flaky() -> str:
    ran["flaky"] += 1
    if ran["flaky"] < 3:
        raise ConnectionError(f"try {ran['flaky']}")
    return "ok"


def broken() -> str:
    ran["broken"] += 1
    raise ValueError("always")


@workflow
async def retrying(ctx: WorkflowContext) -> Any:
    value = await ctx.step("flaky", flaky, retry=StepRetry(max_attempts=3, initial_delay=0.01))
    try:
        await ctx.step("broken", broken, retry=StepRetry(max_attempts=2, initial_delay=0.01))
    except StepFailed as exc:
        return {"value": value, "failed": exc.step, "attempts": exc.attempts, "error": exc.error}
    return "unreachable"


async def test_a_step_retries_on_its_own_policy_and_then_raises_step_failed(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(retrying, execution_time=datetime.now(UTC))
    job = await _finished(scheduler, job_id)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == {
        "value": "ok",
        "failed": "broken",
        "attempts": 2,
        "error": "ValueError: always",
    }
    assert ran == Counter({"flaky": 3, "broken": 2})
    steps = await _steps(pool, job_id)
    assert [(s["name"], s["status"], s["attempts"]) for s in steps] == [
        ("flaky", "completed", 3),
        ("broken", "failed", 2),
    ]


@workflow
async def failing_step(ctx: WorkflowContext) -> str:
    await ctx.step("before", lambda: ran.update(["before"]))
    await ctx.step("broken", broken, retry=StepRetry(max_attempts=2, initial_delay=0.0))
    return "unreachable"


async def test_an_unhandled_step_failure_retries_the_workflow_and_reruns_only_that_step(
    pool, make_scheduler
):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(
        failing_step, execution_time=datetime.now(UTC), max_retries=1, retry_policy=FAST_RETRY
    )
    job = await _finished(scheduler, job_id)
    assert job.status is JobStatus.FAILED
    assert job.error.startswith("StepFailed: step broken failed after 2 attempt(s)")
    # Two workflow attempts: the first step once, the failed one twice per attempt.
    assert ran == Counter({"before": 1, "broken": 4})
    steps = await _steps(pool, job_id)
    assert [(s["name"], s["status"], s["attempts"]) for s in steps] == [
        ("before", "completed", 1),
        ("broken", "failed", 4),
    ]


@workflow
async def duplicated(ctx: WorkflowContext) -> None:
    await ctx.step("same", lambda: 1)
    await ctx.step("same", lambda: 2)


async def test_two_steps_with_one_name_fail_the_job_without_a_retry(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(
        duplicated, execution_time=datetime.now(UTC), max_retries=3, retry_policy=FAST_RETRY
    )
    job = await _finished(scheduler, job_id)
    assert job.status is JobStatus.FAILED
    assert "DuplicateStep" in job.error and "key=" in job.error
    assert job.retry_count == 0


async def test_bad_step_arguments_raise_at_the_call(pool, make_scheduler):
    @workflow(name="tests.bad_step_args")
    async def bad(ctx: WorkflowContext, case: str) -> str:
        try:
            if case == "name":
                await ctx.step("", lambda: 1)
            elif case == "retry":
                await ctx.step("x", lambda: 1, retry=3)
            elif case == "key":
                await ctx.step("x", lambda: 1, key=1.5)
        except (TypeError, ValueError) as exc:
            return type(exc).__name__
        return "no error"

    scheduler = await make_scheduler()
    for case, expected in (("name", "TypeError"), ("retry", "TypeError"), ("key", "TypeError")):
        assert await scheduler.run(bad, case) == expected
    with pytest.raises(ValueError):
        StepRetry(max_attempts=0)
    with pytest.raises(TypeError):
        workflow(lambda ctx: None)


@workflow
async def swallowing(ctx: WorkflowContext) -> str:
    await ctx.step("same", lambda: 1)
    try:
        await ctx.step("same", lambda: 2)
    except Exception:
        pass  # the workflow's code swallows the error: the run still ends with it
    return "swallowed"


async def test_a_swallowed_duplicate_still_fails_the_job(pool, make_scheduler):
    scheduler = await make_scheduler()
    job = await _finished(
        scheduler, await scheduler.schedule(swallowing, execution_time=datetime.now(UTC))
    )
    assert job.status is JobStatus.FAILED
    assert "DuplicateStep" in job.error
