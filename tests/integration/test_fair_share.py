"""Weighted fair share between keys (migration 0018): the order of starts in
one worker, priority first, weights, bad input writing nothing, the
operator's view."""

from __future__ import annotations

import math
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from pg_scheduler import JobPriority, JobSpec, SyncClient, task
from pg_scheduler.store import QueueStore
from tests.support.common import wait_until

# Starts in the order the job bodies ran, as (tenant, n).
STARTS: list[tuple[str, int]] = []


@task(name="fair_tests.work")
async def work(tenant: str, n: int) -> None:
    STARTS.append((tenant, n))


@task(name="fair_tests.by_tenant", fair_share_key=lambda tenant, n: tenant)
async def by_tenant(tenant: str, n: int) -> None:
    STARTS.append((tenant, n))


@pytest.fixture(autouse=True)
def _fresh_starts() -> None:
    STARTS.clear()


def _specs(tenant: str, count: int, **options: Any) -> list[JobSpec]:
    past = datetime.now(UTC) - timedelta(seconds=5)
    return [
        JobSpec(work, past, (tenant, n), fair_share_key=tenant, **options) for n in range(count)
    ]


async def _drained(pool, count: int) -> None:
    async def done() -> bool:
        return len(STARTS) >= count

    await wait_until(done, timeout=60, interval=0.02, message=f"{count} starts")


async def _scheduler(make_scheduler, **options: Any):
    return await make_scheduler(start=False, max_concurrent_jobs=4, batch_claim_limit=4, **options)


async def test_a_small_tenant_is_served_within_the_first_claims(pool, make_scheduler):
    scheduler = await _scheduler(make_scheduler)
    await scheduler.initialize_db()
    await scheduler.schedule_bulk(_specs("big", 3000))
    await scheduler.schedule_bulk(_specs("small", 20))
    await scheduler.start()
    await _drained(pool, 3020)
    order = [t for t, _ in STARTS]
    last_small = max(i for i, t in enumerate(order) if t == "small")
    # Equal weights: the small tenant's 20 jobs start alternating with the
    # big one's, all within the first 40 starts (a claim's rounding aside).
    assert last_small < 48, last_small
    assert Counter(order[:40])["small"] >= 18


async def test_weights_share_the_starts(pool, make_scheduler):
    scheduler = await _scheduler(make_scheduler)
    await scheduler.initialize_db()
    await scheduler.schedule_bulk(_specs("light", 600, fair_share_weight=1))
    await scheduler.schedule_bulk(_specs("heavy", 600, fair_share_weight=3))
    await scheduler.start()
    await _drained(pool, 1200)
    first = Counter(t for t, _ in STARTS[:400])
    assert abs(first["heavy"] / 400 - 0.75) <= 0.075, first


async def test_a_weight_set_per_key_wins(pool, make_scheduler):
    scheduler = await _scheduler(make_scheduler)
    await scheduler.initialize_db()
    await scheduler.set_fair_share_weight("light", 4)
    await scheduler.schedule_bulk(_specs("light", 600, fair_share_weight=1))
    await scheduler.schedule_bulk(_specs("heavy", 600, fair_share_weight=1))
    await scheduler.start()
    await _drained(pool, 1200)
    first = Counter(t for t, _ in STARTS[:400])
    assert abs(first["light"] / 400 - 0.8) <= 0.08, first
    busiest = {r["fair_share_key"]: r for r in await scheduler.fair_share()}
    assert busiest["light"]["weight"] == 4
    await scheduler.set_fair_share_weight("light", None)
    assert await pool.fetchval("SELECT count(*) FROM scheduler_fair_share_weights") == 0


async def test_priority_comes_before_fairness(pool, make_scheduler):
    scheduler = await _scheduler(make_scheduler)
    await scheduler.initialize_db()
    await scheduler.schedule_bulk(_specs("big", 500))
    await scheduler.schedule_bulk(_specs("urgent", 10, priority=JobPriority.CRITICAL))
    past = datetime.now(UTC) - timedelta(seconds=5)
    await scheduler.schedule_bulk(
        [JobSpec(work, past, ("plain", n), priority=JobPriority.HIGH) for n in range(10)]
    )
    await scheduler.schedule_bulk(
        [JobSpec(work, past, ("plain-low", n), priority=JobPriority.LOW) for n in range(10)]
    )
    await scheduler.start()
    await _drained(pool, 530)
    order = [t for t, _ in STARTS]
    # Claims are of 4 and start 4 at once: the CRITICAL keyed jobs first,
    # then the HIGH unkeyed ones, then the rest; LOW unkeyed after every NORMAL.
    assert set(order[:8]) == {"urgent"} or Counter(order[:12])["urgent"] == 10, order[:12]
    assert Counter(order[:24])["plain"] == 10, order[:24]
    assert set(order[-10:]) == {"plain-low"}


async def test_unkeyed_work_shares_as_one_more_key(pool, make_scheduler):
    scheduler = await _scheduler(make_scheduler)
    await scheduler.initialize_db()
    past = datetime.now(UTC) - timedelta(seconds=5)
    await scheduler.schedule_bulk([JobSpec(work, past, ("plain", n)) for n in range(400)])
    await scheduler.schedule_bulk(_specs("a", 400))
    await scheduler.start()
    await _drained(pool, 800)
    first = Counter(t for t, _ in STARTS[:200])
    assert abs(first["a"] - 100) <= 12, first


async def test_a_task_level_key_function_and_the_record(pool, make_scheduler):
    scheduler = await _scheduler(make_scheduler)
    await scheduler.initialize_db()
    past = datetime.now(UTC) - timedelta(seconds=5)
    for n in range(30):
        await scheduler.schedule(by_tenant, execution_time=past, args=("t1", n))
    await scheduler.schedule(by_tenant, execution_time=past, args=("t2", 0))
    assert await pool.fetchval("SELECT count(DISTINCT fair_share_key) FROM scheduled_jobs") == 2
    await scheduler.start()
    await _drained(pool, 31)
    assert [t for t, _ in STARTS[:8]].count("t2") == 1
    recent = {r["fair_share_key"]: r for r in await scheduler.fair_share()}
    assert recent["t1"]["recent_starts"] > 10
    assert recent["t1"]["waiting"] == 0


async def test_a_keyed_job_enqueued_later_wakes_the_worker(pool, make_scheduler):
    scheduler = await make_scheduler()
    await scheduler.schedule(work, args=("late", 1), fair_share_key="late")
    await scheduler.schedule(
        work, args=("later", 2), fair_share_key="later", delay=timedelta(seconds=0.5)
    )
    await _drained(pool, 2)
    assert [t for t, _ in STARTS] == ["late", "later"]


# -- bad input ---------------------------------------------------------------------

BAD_CALLS = [
    ({"fair_share_key": 5}, TypeError),
    ({"fair_share_key": ""}, ValueError),
    ({"fair_share_key": "a\x00b"}, ValueError),
    ({"fair_share_key": "t", "fair_share_weight": 0}, ValueError),
    ({"fair_share_key": "t", "fair_share_weight": -1}, ValueError),
    ({"fair_share_key": "t", "fair_share_weight": math.nan}, ValueError),
    ({"fair_share_key": "t", "fair_share_weight": math.inf}, ValueError),
    ({"fair_share_key": "t", "fair_share_weight": "2"}, TypeError),
    ({"fair_share_key": "t", "fair_share_weight": True}, TypeError),
    ({"fair_share_weight": 2}, ValueError),
]


@pytest.mark.parametrize(("options", "error"), BAD_CALLS)
async def test_bad_input_writes_nothing(pool, make_scheduler, dsn, options, error):
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    with pytest.raises(error):
        await scheduler.schedule(work, args=("x", 1), **options)
    with pytest.raises(error):
        await scheduler.schedule_bulk(
            [JobSpec(work, None, ("x", 0)), JobSpec(work, None, ("x", 1), **options)]
        )
    client = SyncClient(dsn)
    try:
        with pytest.raises(error):
            client.schedule(work, args=("x", 2), **options)
    finally:
        client.close()
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


def _raises(tenant: str, n: int) -> str:
    raise KeyError(tenant)


@pytest.mark.parametrize(
    ("key_function", "error"),
    [(_raises, ValueError), (lambda tenant, n: n, TypeError), (lambda tenant, n: "", ValueError)],
)
async def test_a_bad_key_function_writes_nothing(pool, make_scheduler, key_function, error):
    @task(name=f"fair_tests.bad_{error.__name__}_{id(key_function)}", fair_share_key=key_function)
    async def keyed(tenant: str, n: int) -> None: ...

    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    with pytest.raises(error):
        await scheduler.schedule(keyed, args=("x", 1))
    with pytest.raises(error):
        await scheduler.schedule_bulk(
            [JobSpec(work, None, ("x", 0)), JobSpec(keyed, None, ("x", 1))]
        )
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"fair_share_key": 5}, TypeError),
        ({"fair_share_key": "t", "fair_share_weight": 0}, ValueError),
        ({"fair_share_weight": 2}, ValueError),
        ({"fair_share_key": "t", "max_running": 2}, ValueError),
    ],
)
def test_bad_task_options_are_refused(options, error):
    with pytest.raises(error):
        task(**options)(work)


@pytest.mark.parametrize(
    ("key", "weight", "error"),
    [(None, 2, TypeError), (5, 2, TypeError), ("t", 0, ValueError), ("t", "x", TypeError)],
)
async def test_bad_weights_per_key_write_nothing(pool, make_scheduler, key, weight, error):
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    with pytest.raises(error):
        await scheduler.set_fair_share_weight(key, weight)
    assert await pool.fetchval("SELECT count(*) FROM scheduler_fair_share_weights") == 0


# -- the operator's view -------------------------------------------------------------


async def test_the_cli_lists_the_busiest_keys_and_sets_weights(
    pool, make_scheduler, dsn, monkeypatch
):
    from pg_scheduler.cli import ops
    from tests.integration.test_cli_ops import cli

    # In-process runs share structlog with the test's schedulers (see test_cli_ops.py).
    monkeypatch.setattr(ops, "configure_logging", lambda args: None)

    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    await scheduler.schedule_bulk(_specs("busy", 30))
    await scheduler.schedule_bulk(_specs("quiet", 3))
    listed = await cli(dsn, "fair-share", "list", "--json")
    assert listed.code == 0, listed.err
    rows = {r["fair_share_key"]: r for r in listed.json()}
    assert rows["busy"]["waiting"] == 30 and rows["busy"]["due"] == 30
    assert rows["quiet"]["running"] == 0 and rows["quiet"]["weight"] is None
    shown = await cli(dsn, "fair-share", "weight", "quiet", "5")
    assert shown.code == 0, shown.err
    assert (
        await pool.fetchval(
            "SELECT weight FROM scheduler_fair_share_weights WHERE fair_share_key = 'quiet'"
        )
        == 5
    )
    table = await cli(dsn, "fair-share", "list")
    assert "quiet" in table.out and "busy" in table.out
    bad = await cli(dsn, "fair-share", "weight", "quiet", "0")
    assert bad.code != 0 and "greater than 0" in bad.err + bad.out
    assert (await cli(dsn, "fair-share", "clear", "quiet")).code == 0
    assert await pool.fetchval("SELECT count(*) FROM scheduler_fair_share_weights") == 0
    assert (await cli(dsn, "fair-share", "clear", "quiet")).code != 0


async def test_replace_on_a_dedupe_key_takes_the_new_key_and_weight(pool, make_scheduler):
    from pg_scheduler import ConflictResolution

    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    later = timedelta(hours=1)
    await scheduler.schedule(work, args=("a", 1), delay=later, dedupe_key="d", fair_share_key="a")
    await scheduler.schedule(
        work,
        args=("b", 1),
        delay=later,
        dedupe_key="d",
        fair_share_key="b",
        fair_share_weight=2,
        conflict_resolution=ConflictResolution.REPLACE,
    )
    row = await pool.fetchrow("SELECT fair_share_key, fair_share_weight FROM scheduled_jobs")
    assert (row["fair_share_key"], row["fair_share_weight"]) == ("b", 2)


async def test_keyed_jobs_no_worker_serves_are_reported(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    await scheduler.schedule_job(
        "fair_tests.nobody_runs_this", task_data={"args": ["x"]}, fair_share_key="t"
    )
    await scheduler.schedule_job("fair_tests.nobody_runs_this", task_data={"args": ["y"]})
    stats = await scheduler.stats()
    assert [(o.task_name, o.due) for o in stats.orphaned_jobs] == [
        ("fair_tests.nobody_runs_this", 2)
    ]
    inventory = await scheduler.load_task_functions()
    assert inventory.unknown == {"fair_tests.nobody_runs_this": 2}


async def test_a_paused_queue_holds_its_keyed_jobs(pool, make_scheduler):
    scheduler = await _scheduler(make_scheduler)
    await scheduler.initialize_db()
    await scheduler.pause_queue("held")
    await scheduler.schedule_bulk(_specs("paused", 5, queue="held"))
    await scheduler.schedule_bulk(_specs("free", 5))
    await scheduler.start()
    await _drained(pool, 5)
    assert {t for t, _ in STARTS} == {"free"}
    assert (
        await pool.fetchval(
            "SELECT count(*) FROM scheduled_jobs WHERE status = 'pending' AND queue = 'held'"
        )
        == 5
    )
    await scheduler.resume_queue("held")
    await _drained(pool, 10)
    assert Counter(t for t, _ in STARTS) == {"free": 5, "paused": 5}


async def test_the_oldest_due_wait_counts_keyed_jobs(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    await scheduler.schedule_bulk(_specs("t", 3))
    stats = await scheduler.stats()
    assert stats.oldest_pending_age is not None and stats.oldest_pending_age >= 4
    by_queue = await QueueStore(pool, "public").oldest_due_by_queue()
    assert by_queue["default"] >= 4


async def test_a_job_takes_a_concurrency_key_or_a_fair_share_key_not_both(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    before = await pool.fetchval("SELECT count(*) FROM scheduled_jobs")
    with pytest.raises(ValueError, match="not both"):
        await scheduler.schedule(work, args=("a", 1), fair_share_key="a", concurrency_key="acct")
    with pytest.raises(ValueError, match="not both"):  # the task's key and the call's
        await scheduler.schedule(by_tenant, args=("a", 1), concurrency_key="acct")
    with pytest.raises(ValueError, match="not both"):
        await scheduler.schedule_bulk(
            [
                JobSpec(work, datetime.now(UTC), ("a", 1)),
                JobSpec(
                    work, datetime.now(UTC), ("b", 2), fair_share_key="b", concurrency_key="acct"
                ),
            ]
        )
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == before


async def test_stats_the_cli_and_the_dashboard_show_each_keys_share(
    pool, make_scheduler, dsn, monkeypatch
):
    import httpx

    from pg_scheduler.cli import ops
    from pg_scheduler.dashboard import dashboard_app
    from tests.integration.test_cli_ops import cli

    monkeypatch.setattr(ops, "configure_logging", lambda args: None)
    scheduler = await _scheduler(make_scheduler)
    await scheduler.initialize_db()
    await scheduler.schedule_bulk(_specs("light", 600, fair_share_weight=1))
    await scheduler.schedule_bulk(_specs("heavy", 600, fair_share_weight=3))
    before = {f.key: f for f in (await scheduler.stats()).fair_share}
    assert (before["light"].waiting, before["light"].due, before["light"].running) == (600, 600, 0)
    assert before["heavy"].recent_starts == 0 and before["heavy"].share == 0

    await scheduler.start()
    await _drained(pool, 400)
    await scheduler.shutdown(grace_period=1.0)
    stats = await scheduler.stats()
    shares = {f.key: f for f in stats.fair_share}
    assert set(shares) == {"light", "heavy"}
    assert math.isclose(sum(f.share for f in shares.values()), 1.0)
    # Starts went 3:1 while both had work: the share says so.
    assert 0.6 < shares["heavy"].share < 0.9, shares
    assert shares["heavy"].waiting + shares["light"].waiting == 1200 - len(STARTS)

    shown = await cli(dsn, "status")
    assert shown.code == 0, shown.err
    assert "Fair share keys" in shown.out and "heavy" in shown.out

    app = dashboard_app(pool)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://dash"
    ) as client:
        page = (await client.get("/api/queues")).json()
    await app.state.dashboard.close()
    listed = {f["key"]: f for f in page["fair_share"]}
    assert set(listed) == {"light", "heavy"}
    assert 0.6 < listed["heavy"]["share"] < 0.9
