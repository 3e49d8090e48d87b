"""A queue's key defaults (``queue_keys``) and keys on workflow children
(``ctx.spawn(concurrency_key=..., fair_share_key=...)``): the keys and limits
are written on each job's row, field by field the call's, else the task's,
else the queue's, and the keyed claim holds them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from pg_scheduler import JobSpec, JobStatus, WorkflowContext, queue_keys, task, workflow
from pg_scheduler.enqueue import queue_keys as declared
from pg_scheduler.sync_client import SyncClient
from tests.support import key_tasks
from tests.support.key_runs import finished, spans
from tests.support.spans import max_overlap

KEY_COLUMNS = (
    "SELECT concurrency_key, max_running_per_key, rate_count_per_key, rate_period_per_key,"
    " key_ordered, fair_share_key, fair_share_weight FROM scheduled_jobs WHERE job_id = $1"
)


@pytest.fixture(autouse=True)
def _no_declarations() -> Iterator[None]:
    declared.DECLARED.clear()
    yield
    declared.DECLARED.clear()


async def columns(pool, job_id: str) -> tuple[Any, ...]:
    return tuple(await pool.fetchrow(KEY_COLUMNS, job_id))


def tenant(key: str, n: int, *rest: Any, **kwargs: Any) -> str:
    return f"tenant-{key}"


# -- a queue's defaults ---------------------------------------------------------------


async def test_a_queues_key_and_limits_apply_on_every_way_in(pool, dsn, make_scheduler):
    queue_keys("qk", concurrency_key=tenant, max_running_per_key=3, rate_limit_per_key="10/s")
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    expected = ("tenant-a", 3, 10, 1.0, False, None, None)
    one = await scheduler.schedule(key_tasks.step, args=("a", 0), queue="qk")
    assert await columns(pool, one) == expected
    [bulk] = await scheduler.schedule_bulk([JobSpec(key_tasks.step, args=("a", 1), queue="qk")])
    assert await columns(pool, bulk) == expected
    named = await scheduler.schedule_job("keys.step", task_data={"args": ["a", 2]}, queue="qk")
    assert await columns(pool, named) == expected
    with SyncClient(dsn) as client:
        synced = client.schedule(key_tasks.step, args=("a", 3), queue="qk")
    assert await columns(pool, synced) == expected
    # Another queue: no key.
    plain = await scheduler.schedule(key_tasks.step, args=("a", 4), queue="elsewhere")
    assert await columns(pool, plain) == (None, None, None, None, False, None, None)


async def test_the_call_then_the_task_win_over_the_queue_field_by_field(pool, make_scheduler):
    queue_keys("qk", concurrency_key="queue-key", max_running_per_key=5, rate_limit_per_key="9/m")
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    # The call's key and limit; the queue's rate.
    called = await scheduler.schedule(
        key_tasks.step, args=("a", 0), queue="qk", concurrency_key="mine", max_running_per_key=1
    )
    assert await columns(pool, called) == ("mine", 1, 9, 60.0, False, None, None)
    # keys.hold's own key (its first argument) and limit (2); the queue's rate.
    tasked = await scheduler.schedule(key_tasks.hold, args=("h", 0), queue="qk")
    assert await columns(pool, tasked) == ("h", 2, 9, 60.0, False, None, None)
    # A job the call gives a fair share key takes no concurrency key from its queue.
    fair = await scheduler.schedule(key_tasks.step, args=("a", 1), queue="qk", fair_share_key="t")
    assert await columns(pool, fair) == (None, None, None, None, False, "t", None)


async def test_a_queues_limits_alone_bind_its_keyed_jobs_only(pool, make_scheduler):
    queue_keys("qk", max_running_per_key=1, ordered=True)
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    keyed = await scheduler.schedule(key_tasks.step, args=("a", 0), queue="qk", concurrency_key="k")
    assert await columns(pool, keyed) == ("k", 1, None, None, True, None, None)
    plain = await scheduler.schedule(key_tasks.step, args=("a", 1), queue="qk")
    assert await columns(pool, plain) == (None, None, None, None, False, None, None)


async def test_a_queues_fair_share_key_and_weight(pool, make_scheduler):
    queue_keys("qf", fair_share_key=tenant, fair_share_weight=2)
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    job = await scheduler.schedule(key_tasks.step, args=("b", 0), queue="qf")
    assert await columns(pool, job) == (None, None, None, None, False, "tenant-b", 2.0)
    heavier = await scheduler.schedule(
        key_tasks.step, args=("b", 1), queue="qf", fair_share_weight=5
    )
    assert (await columns(pool, heavier))[5:] == ("tenant-b", 5.0)
    # A job the call gives a concurrency key takes no fair share key from its queue.
    keyed = await scheduler.schedule(key_tasks.step, args=("b", 2), queue="qf", concurrency_key="k")
    assert await columns(pool, keyed) == ("k", None, None, None, False, None, None)


async def test_the_keyed_claim_holds_a_queues_limit(pool, make_scheduler, runs):
    queue_keys(
        "qk", concurrency_key=lambda key, n, hold=0.0, fail_first=0: key, max_running_per_key=1
    )
    scheduler = await make_scheduler(max_concurrent_jobs=20, batch_claim_limit=20)
    for n in range(8):
        for key in ("a", "b"):
            await scheduler.schedule(key_tasks.step, args=(key, n, 0.03), queue="qk")
    await finished(pool, 16)
    assert max_overlap(await spans(pool, "a")) == 1
    assert max_overlap(await spans(pool, "b")) == 1
    # Ran side by side: the two keys did not hold each other.
    assert max_overlap(await spans(pool, "a") + await spans(pool, "b")) == 2


BAD_DECLARATIONS = [
    ({"concurrency_key": 7}, TypeError),
    ({"concurrency_key": ""}, ValueError),
    ({"concurrency_key": "k", "max_running_per_key": 0}, ValueError),
    ({"concurrency_key": "k", "max_running_per_key": -1}, ValueError),
    ({"concurrency_key": "k", "rate_limit_per_key": "ten a second"}, ValueError),
    ({"concurrency_key": "k", "rate_limit_per_key": 10}, TypeError),
    ({"concurrency_key": "k", "ordered": "yes"}, TypeError),
    ({"concurrency_key": "k", "ordered": True, "max_running_per_key": 2}, ValueError),
    ({"concurrency_key": "k", "fair_share_key": "t"}, ValueError),
    ({"fair_share_weight": 2}, ValueError),
    ({"fair_share_key": "t", "fair_share_weight": 0}, ValueError),
]


@pytest.mark.parametrize(("kwargs", "error"), BAD_DECLARATIONS)
def test_a_bad_declaration_raises_and_changes_nothing(kwargs, error) -> None:
    queue_keys("qk", concurrency_key="kept")
    with pytest.raises(error):
        queue_keys("qk", **kwargs)
    assert declared.of("qk").concurrency_key == "kept"
    with pytest.raises(ValueError):
        queue_keys("not a queue name!", concurrency_key="k")
    queue_keys("qk")  # no option: the queue's defaults removed
    assert declared.of("qk") is None


def refuses(key: str, n: int, *rest: Any) -> str:
    raise LookupError("no tenant")


def not_a_str(key: str, n: int, *rest: Any) -> int:
    return n


@pytest.mark.parametrize(("func", "error"), [(refuses, ValueError), (not_a_str, TypeError)])
async def test_a_bad_queue_key_function_raises_at_the_call_and_writes_nothing(
    pool, make_scheduler, func, error
):
    queue_keys("qk", concurrency_key=func)
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    with pytest.raises(error, match="concurrency_key function of queue 'qk'"):
        await scheduler.schedule(key_tasks.step, args=("a", 0), queue="qk")
    with pytest.raises(error, match="concurrency_key function of queue 'qk'"):
        await scheduler.schedule_bulk(
            [
                JobSpec(key_tasks.step, args=("a", 1)),
                JobSpec(key_tasks.step, args=("a", 2), queue="qk"),
            ]
        )
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


# -- workflow children ----------------------------------------------------------------


@task(name="qk.child", queue="kids")
async def child(key: str, n: int, hold: float = 0.0) -> int:
    await key_tasks.record(key, n, __import__("time").time(), hold)
    return n


@workflow(name="qk.fan_out")
async def fan_out(ctx: WorkflowContext, count: int) -> list[Any]:
    keyed = [
        ctx.spawn(child, "one", n, 0.03, concurrency_key="one", max_running_per_key=1)
        for n in range(count)
    ]
    by_queue = [ctx.spawn(child, "q", n, 0.03) for n in range(count)]  # the queue's key
    fair = [ctx.spawn(child, "f", n, fair_share_key="tenant-f") for n in range(2)]
    tasked = [ctx.spawn(key_tasks.hold, "h", n, 0.03) for n in range(count)]  # the task's key
    return await ctx.gather(*keyed, *by_queue, *fair, *tasked)


async def test_children_carry_their_keys_and_the_keyed_claim_holds_them(pool, make_scheduler, runs):
    queue_keys(
        "kids", concurrency_key=lambda key, n, hold=0.0: f"kids-{key}", max_running_per_key=1
    )
    scheduler = await make_scheduler(max_concurrent_jobs=20, batch_claim_limit=20)
    job_id = await scheduler.schedule(fan_out, args=(6,))
    job = await scheduler.wait_for(job_id, timeout=30)
    assert job.status is JobStatus.COMPLETED, job.error
    assert job.result == [*range(6), *range(6), 0, 1, *range(6)]
    rows = await pool.fetch(
        "SELECT concurrency_key, max_running_per_key, fair_share_key, count(*) AS n"
        "  FROM scheduled_jobs WHERE parent_job_id = $1"
        " GROUP BY 1, 2, 3 ORDER BY 1 NULLS LAST",
        job_id,
    )
    assert [tuple(r) for r in rows] == [
        ("h", 2, None, 6),
        ("kids-q", 1, None, 6),
        ("one", 1, None, 6),
        (None, None, "tenant-f", 2),
    ]
    assert max_overlap(await spans(pool, "one")) == 1
    assert max_overlap(await spans(pool, "q")) == 1
    assert max_overlap(await spans(pool, "h")) <= 2


@workflow(name="qk.bad_spawn")
async def bad_spawn(ctx: WorkflowContext) -> None:
    ctx.spawn(child, "x", 0, concurrency_key="k", max_running_per_key=0)


async def test_a_bad_key_on_a_spawn_fails_the_workflow_and_writes_no_child(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(bad_spawn)
    job = await scheduler.wait_for(job_id, timeout=10)
    assert job.status is JobStatus.FAILED
    assert "max_running_per_key must be 1..1000000" in job.error
    assert (
        await pool.fetchval("SELECT count(*) FROM scheduled_jobs WHERE parent_job_id = $1", job_id)
        == 0
    )


# -- seeing a job's keys --------------------------------------------------------------


async def test_get_job_the_cli_and_the_dashboard_show_a_jobs_keys(pool, dsn, make_scheduler):
    import httpx

    from pg_scheduler.dashboard import dashboard_app
    from tests.integration.test_cli_ops import cli

    queue_keys("qf", fair_share_key=tenant, fair_share_weight=2)
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    keyed = await scheduler.schedule(
        key_tasks.step,
        args=("a", 0),
        concurrency_key="acct-7",
        max_running_per_key=3,
        rate_limit_per_key="10/m",
    )
    ordered = await scheduler.schedule(
        key_tasks.step, args=("a", 1), concurrency_key="acct-8", ordered=True
    )
    fair = await scheduler.schedule(key_tasks.step, args=("b", 2), queue="qf")
    plain = await scheduler.schedule(key_tasks.step, args=("c", 3))

    job = await scheduler.get_job(keyed)
    assert job is not None
    assert (job.concurrency_key, job.max_running_per_key, job.rate_limit_per_key) == (
        "acct-7",
        3,
        "10/m",
    )
    assert not job.ordered and job.fair_share_key is None
    job = await scheduler.get_job(ordered)
    assert job is not None and (job.concurrency_key, job.ordered, job.max_running_per_key) == (
        "acct-8",
        True,
        1,
    )
    job = await scheduler.get_job(fair)
    assert job is not None and (job.fair_share_key, job.fair_share_weight) == ("tenant-b", 2.0)
    assert job.concurrency_key is None
    job = await scheduler.get_job(plain)
    assert job is not None and (job.concurrency_key, job.fair_share_key) == (None, None)

    def line(out: str, field: str) -> str | None:
        found = [r for r in out.splitlines() if r.strip().startswith(field)]
        return found[0].strip()[len(field) :].strip() if found else None

    shown = (await cli(dsn, "jobs", keyed)).out
    assert line(shown, "concurrency key") == "acct-7 (3 at once, 10/m)"
    assert line((await cli(dsn, "jobs", ordered)).out, "concurrency key") == "acct-8 (ordered)"
    assert line((await cli(dsn, "jobs", fair)).out, "fair share key") == "tenant-b (weight 2)"
    unkeyed = (await cli(dsn, "jobs", plain)).out
    assert line(unkeyed, "concurrency key") is None and line(unkeyed, "fair share key") is None
    data = (await cli(dsn, "jobs", keyed, "--json")).json()
    assert (data["concurrency_key"], data["rate_limit_per_key"]) == ("acct-7", "10/m")

    app = dashboard_app(pool)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://dash"
    ) as client:
        data = (await client.get(f"/api/job?id={keyed}")).json()
        assert (data["concurrency_key"], data["max_running_per_key"]) == ("acct-7", 3)
        data = (await client.get(f"/api/job?id={fair}")).json()
        assert (data["fair_share_key"], data["fair_share_weight"]) == ("tenant-b", 2.0)
    await app.state.dashboard.close()
