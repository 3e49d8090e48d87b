"""Per-key concurrency, rate and order (concurrency keys, migration 0017)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from pg_scheduler import JobPriority, JobSpec, RetryPolicy, task
from pg_scheduler.sync_client import SyncClient
from tests.support import key_tasks
from tests.support.common import wait_until
from tests.support.key_runs import finished, spans, spans_by_key
from tests.support.spans import max_overlap, most_starts_in

# -- concurrency ---------------------------------------------------------------------


async def test_max_running_per_key_holds_each_key_and_the_call_overrides_the_task(
    pool, make_scheduler, runs
):
    scheduler = await make_scheduler(max_concurrent_jobs=20, batch_claim_limit=20)
    for n in range(12):
        await scheduler.schedule(key_tasks.hold, args=("a", n, 0.05))  # the task's key and 2
        await scheduler.schedule(key_tasks.hold, args=("b", n, 0.05), max_running_per_key=1)
        await scheduler.schedule(key_tasks.hold, args=("x", n, 0.05), concurrency_key="c")
    await finished(pool, 36)
    assert max_overlap(await spans(pool, "a")) == 2
    assert max_overlap(await spans(pool, "b")) == 1
    # Key "c" (the call's) holds jobs recorded under "x": 2 at most.
    assert max_overlap(await spans(pool, "x")) == 2
    stored = await pool.fetch(
        "SELECT DISTINCT concurrency_key, max_running_per_key FROM scheduled_jobs ORDER BY 1, 2"
    )
    assert [tuple(r) for r in stored] == [("a", 2), ("b", 1), ("c", 2)]


async def test_with_many_keys_claims_visit_a_list_and_hold_every_limit(pool, make_scheduler, runs):
    from pg_scheduler.engine import keyed

    keys = keyed.LIST_MIN + 50
    scheduler = await make_scheduler(start=False, max_concurrent_jobs=20, batch_claim_limit=20)
    await scheduler.initialize_db()
    visited: list[int] = []
    real = scheduler.worker.keyed.store.claim

    async def claim(*args, **kwargs):  # records whether each claim was given a list
        visited.append(len(kwargs.get("listed") or ()))
        return await real(*args, **kwargs)

    scheduler.worker.keyed.store.claim = claim
    await scheduler.schedule_bulk(
        [
            JobSpec(key_tasks.step, args=(f"m{k}", n, 0.01), concurrency_key=f"m{k}",
                    max_running_per_key=1)
            for n in range(4)
            for k in range(keys)
        ]
    )  # fmt: skip
    await scheduler.start()  # its first look finds the keys
    await finished(pool, keys * 4, timeout=60)
    assert any(visited), "no claim visited a list of keys"
    by_key = await spans_by_key(pool)
    assert len(by_key) == keys and all(len(v) == 4 for v in by_key.values())
    assert max(max_overlap(v) for v in by_key.values()) == 1


async def test_a_new_urgent_key_waits_at_most_a_list_for_its_turn(pool, make_scheduler, runs):
    from pg_scheduler.engine import keyed

    keys = keyed.LIST_MIN + 50
    scheduler = await make_scheduler(start=False, max_concurrent_jobs=20, batch_claim_limit=20)
    await scheduler.initialize_db()
    await scheduler.schedule_bulk(
        [
            JobSpec(key_tasks.step, args=(f"b{k}", n, 0.08), concurrency_key=f"b{k}",
                    max_running_per_key=1)
            for n in range(4)
            for k in range(keys)
        ]
    )  # fmt: skip
    await scheduler.start()  # its first look finds the keys: claims visit lists
    # The backlog runs for 150 x 4 x 0.08 / 20 = 2.4 s at least.
    await wait_until(
        lambda: pool.fetchval("SELECT count(*) > 40 FROM key_runs"), timeout=30, interval=0.02
    )
    urgent = await scheduler.schedule(
        key_tasks.step,
        args=("urgent", 0),
        concurrency_key="urgent",
        priority=JobPriority.CRITICAL,
    )
    await finished(pool, keys * 4 + 1, timeout=60)
    waited = await pool.fetchval(
        "SELECT extract(epoch FROM started_at - created_at) FROM scheduled_jobs WHERE job_id = $1",
        urgent,
    )
    # Seen by the next list at the latest (LIST_TTL), not after the backlog.
    assert waited < keyed.LIST_TTL + 1.0
    later = await pool.fetchval(
        "SELECT count(*) FROM scheduled_jobs WHERE concurrency_key LIKE 'b%'"
        " AND started_at > (SELECT started_at FROM scheduled_jobs WHERE job_id = $1)",
        urgent,
    )
    assert later > 0


async def test_keys_do_not_hold_each_other_or_plain_jobs(pool, make_scheduler, runs):
    scheduler = await make_scheduler(max_concurrent_jobs=20, batch_claim_limit=20)
    jobs = [
        JobSpec(key_tasks.step, args=(f"k{i}", 0, 0.3), concurrency_key=f"k{i}") for i in range(6)
    ]
    jobs += [JobSpec(key_tasks.step, args=("plain", n, 0.3)) for n in range(6)]
    await scheduler.schedule_bulk(jobs)
    await finished(pool, 12)
    everything = await pool.fetch("SELECT started, ended FROM key_runs")
    # Twelve jobs of 0.3 s with 20 slots: they ran together, not one key after another.
    assert max_overlap([(r["started"], r["ended"]) for r in everything]) >= 10


async def test_an_expired_lease_frees_its_keys_slot(pool, make_scheduler, runs):
    """A running row whose worker vanished holds its key until the rescuer
    returns it to pending; then the key's next job runs."""
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    first = await scheduler.schedule(
        key_tasks.step, args=("r", 0), concurrency_key="r", max_running_per_key=1
    )
    await scheduler.schedule(
        key_tasks.step, args=("r", 1), concurrency_key="r", max_running_per_key=1
    )
    # A dead worker's claim: running, its lease already over.
    await pool.execute(
        "UPDATE scheduled_jobs SET status = 'running', worker_id = 'gone', attempts = 1,"
        " started_at = now(), lease_until = now() - interval '1 second' WHERE job_id = $1",
        first,
    )
    await scheduler.start()
    await finished(pool, 2)
    assert sorted(r["n"] for r in await pool.fetch("SELECT n FROM key_runs")) == [0, 1]


# -- priority ------------------------------------------------------------------------


@pytest.mark.parametrize("keyed_first", [True, False])
async def test_priority_orders_keyed_and_plain_work(pool, make_scheduler, runs, keyed_first):
    scheduler = await make_scheduler(start=False, max_concurrent_jobs=1, batch_claim_limit=1)
    await scheduler.initialize_db()
    urgent, later = (JobPriority.HIGH, JobPriority.LOW)
    keyed = urgent if keyed_first else later
    plain = later if keyed_first else urgent
    specs = [JobSpec(key_tasks.step, args=("plain", n), priority=plain) for n in range(4)]
    specs += [
        JobSpec(key_tasks.step, args=("keyed", n), priority=keyed, concurrency_key=f"k{n}")
        for n in range(4)
    ]
    await scheduler.schedule_bulk(specs)
    await scheduler.start()
    await finished(pool, 8)
    order = [r["key"] for r in await pool.fetch("SELECT key FROM key_runs ORDER BY started")]
    first = "keyed" if keyed_first else "plain"
    assert order[:4] == [first] * 4


# -- ordered -------------------------------------------------------------------------


async def test_ordered_jobs_run_one_at_a_time_in_enqueue_order_across_retries(
    pool, make_scheduler, runs
):
    scheduler = await make_scheduler(max_concurrent_jobs=10, batch_claim_limit=10)
    await scheduler.initialize_db()
    # Job 2 fails twice before it succeeds; priorities do not reorder a key.
    for n in range(8):
        await scheduler.schedule(
            key_tasks.step,
            args=("o", n, 0.01, 2 if n == 2 else 0),
            concurrency_key="o",
            ordered=True,
            max_retries=3,
            retry_policy=RetryPolicy(base_delay=0.1, jitter=0),
            priority=JobPriority.HIGH if n % 2 else JobPriority.LOW,
        )
    await finished(pool, 8)
    rows = await pool.fetch("SELECT n, started, ended, failed FROM key_runs ORDER BY started")
    assert [r["n"] for r in rows] == [0, 1, 2, 2, 2, 3, 4, 5, 6, 7]
    assert max_overlap([(r["started"], r["ended"]) for r in rows]) == 1
    assert await pool.fetchval("SELECT bool_and(max_running_per_key = 1) FROM scheduled_jobs")


async def test_an_ordered_job_that_fails_for_good_or_is_cancelled_lets_the_next_run(
    pool, make_scheduler, runs
):
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    later = datetime.now(UTC) + timedelta(hours=1)
    held = await scheduler.schedule(
        key_tasks.step, args=("p", 0), execution_time=later, concurrency_key="p", ordered=True
    )
    await scheduler.schedule(
        key_tasks.step, args=("p", 1, 0.0, 1), concurrency_key="p", ordered=True
    )
    await scheduler.schedule(key_tasks.step, args=("p", 2), concurrency_key="p", ordered=True)
    await scheduler.start()
    # The head is not due: the rest of the key waits behind it.
    await _still_waiting(pool, 2)
    assert await scheduler.cancel_job(held)
    # Job 1 fails for good (no retries), then job 2 runs.
    await finished(pool, 3)
    rows = await pool.fetch("SELECT n, failed FROM key_runs ORDER BY started")
    assert [(r["n"], r["failed"]) for r in rows] == [(1, True), (2, False)]


async def _still_waiting(pool, count: int) -> None:
    """Nothing of the key runs for a while (bounded: a claim loop turns many times)."""
    for _ in range(20):
        assert await pool.fetchval("SELECT count(*) FROM key_runs") == 0
        assert (
            await pool.fetchval("SELECT count(*) FROM scheduled_jobs WHERE status = 'pending'")
            == count + 1
        )
        await asyncio.sleep(0.05)


# -- rate ----------------------------------------------------------------------------


async def test_rate_limit_per_key_spaces_the_starts(pool, make_scheduler, runs):
    scheduler = await make_scheduler(max_concurrent_jobs=20, batch_claim_limit=20)
    await scheduler.schedule_bulk(
        [
            JobSpec(key_tasks.step, args=(key, n), concurrency_key=key, rate_limit_per_key="4/s")
            for n in range(10)
            for key in ("r1", "r2")
        ]
    )
    await finished(pool, 20, timeout=30)
    for key in ("r1", "r2"):
        starts = [s for s, _ in await spans(pool, key)]
        assert most_starts_in(starts, 1.0) <= 4
        assert max(starts) - min(starts) >= 2.0  # 10 starts at 4/s take over 2 s
    assert await pool.fetchval("SELECT count(*) FROM scheduler_key_starts") <= 20


# -- bad input -----------------------------------------------------------------------


def _key_of_nothing(**kwargs: object) -> str:
    raise LookupError("no key")


@task(name="keys.bad_key_function", concurrency_key=_key_of_nothing)
async def bad_key_function(n: int = 0) -> None: ...


@task(name="keys.not_a_string", concurrency_key=lambda n=0: n)
async def not_a_string(n: int = 0) -> None: ...


BAD_CALLS = [
    ({"concurrency_key": 5}, TypeError),
    ({"concurrency_key": ""}, ValueError),
    ({"concurrency_key": "k", "max_running_per_key": 0}, ValueError),
    ({"concurrency_key": "k", "max_running_per_key": -1}, ValueError),
    ({"concurrency_key": "k", "max_running_per_key": 1.5}, TypeError),
    ({"concurrency_key": "k", "max_running_per_key": True}, TypeError),
    ({"concurrency_key": "k", "rate_limit_per_key": "10/x"}, ValueError),
    ({"concurrency_key": "k", "rate_limit_per_key": "0/s"}, ValueError),
    ({"concurrency_key": "k", "rate_limit_per_key": "-1/s"}, ValueError),
    ({"concurrency_key": "k", "rate_limit_per_key": "abc"}, ValueError),
    ({"concurrency_key": "k", "rate_limit_per_key": 10}, TypeError),
    ({"concurrency_key": "k", "ordered": True, "max_running_per_key": 2}, ValueError),
    ({"concurrency_key": "k", "ordered": "yes"}, TypeError),
    ({"max_running_per_key": 2}, ValueError),  # limits without a key
    ({"ordered": True}, ValueError),
]


@pytest.mark.parametrize(("kwargs", "error"), BAD_CALLS)
async def test_bad_key_options_raise_at_the_call_and_write_nothing(
    pool, dsn, make_scheduler, kwargs, error
):
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    with pytest.raises(error):
        await scheduler.schedule(key_tasks.step, args=("k", 0), **kwargs)
    with pytest.raises(error):
        await scheduler.schedule_bulk(
            [
                JobSpec(key_tasks.step, args=("k", 1)),
                JobSpec(key_tasks.step, args=("k", 0), **kwargs),
            ]
        )
    with pytest.raises(error):
        await scheduler.schedule_job("keys.step", task_data={"args": ["k", 0]}, **kwargs)
    with SyncClient(dsn) as client, pytest.raises(error):
        client.schedule(key_tasks.step, args=("k", 0), **kwargs)
    if "concurrency_key" in kwargs:  # a task's limits may wait for the call's key
        with pytest.raises(error):
            task(**{"name": "keys.never", **kwargs})
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


@pytest.mark.parametrize(
    ("func", "error"), [(bad_key_function, ValueError), (not_a_string, TypeError)]
)
async def test_a_bad_key_function_raises_at_the_call_and_writes_nothing(
    pool, make_scheduler, func, error
):
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    with pytest.raises(error, match="concurrency_key function"):
        await scheduler.schedule(func, kwargs={"n": 1})
    with pytest.raises(error, match="concurrency_key function"):
        await scheduler.schedule_bulk([JobSpec(key_tasks.step, args=("k", 0)), JobSpec(func)])
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 0


# -- the operator's views ------------------------------------------------------------


async def test_stats_cli_and_dashboard_show_the_busiest_keys(pool, dsn, make_scheduler):
    import httpx

    from pg_scheduler.dashboard import dashboard_app
    from tests.integration.test_cli_ops import cli

    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    await scheduler.schedule_bulk(
        [
            JobSpec(
                key_tasks.step, args=("a", n), concurrency_key="acct-1", rate_limit_per_key="5/s"
            )
            for n in range(3)
        ]
        + [JobSpec(key_tasks.step, args=("b", 0), concurrency_key="acct-2", ordered=True)]
    )
    await pool.execute(
        "UPDATE scheduled_jobs SET status = 'running', worker_id = 'w', lease_until = now()"
        " + interval '1 minute' WHERE job_id = (SELECT job_id FROM scheduled_jobs"
        " WHERE concurrency_key = 'acct-1' LIMIT 1)"
    )
    stats = await scheduler.stats()
    first = stats.keys[0]
    assert (first.key, first.running, first.waiting) == ("acct-1", 1, 2)
    assert first.rate_limit_per_key == "5/s" and first.started_in_window == 0
    assert (stats.keys[1].key, stats.keys[1].ordered, stats.keys[1].max_running_per_key) == (
        "acct-2",
        True,
        1,
    )
    listed = await cli(dsn, "limits", "keys", "--json")
    assert listed.code == 0, listed.err
    assert [k["key"] for k in listed.json()] == ["acct-1", "acct-2"]
    assert "acct-2" in (await cli(dsn, "limits", "list")).out
    app = dashboard_app(pool)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://dash"
    ) as client:
        page = (await client.get("/api/queues")).json()
    await app.state.dashboard.close()
    assert [k["key"] for k in page["keys"]] == ["acct-1", "acct-2"]


async def test_keys_through_a_callers_dbapi_connection(pool, dsn):
    """SyncClient(connection=...) writes the key columns as the pool does,
    one row and a bulk (the statements with a dependency too)."""
    psycopg = pytest.importorskip("psycopg")
    with psycopg.connect(dsn, autocommit=True) as conn, SyncClient(dsn) as client:
        first = client.schedule(
            key_tasks.step, args=("d", 0), connection=conn, concurrency_key="d", ordered=True
        )
        client.schedule_bulk(
            [
                JobSpec(key_tasks.step, args=("d", 1), concurrency_key="d", ordered=True),
                JobSpec(
                    key_tasks.step,
                    args=("d", 2),
                    concurrency_key="d",
                    max_running_per_key=1,
                    rate_limit_per_key="3/m",
                    depends_on=[first],
                ),
            ],
            connection=conn,
        )
    rows = await pool.fetch(
        "SELECT concurrency_key, max_running_per_key, rate_count_per_key, rate_period_per_key,"
        " key_ordered, key_seq IS NOT NULL AS numbered FROM scheduled_jobs ORDER BY key_seq"
    )
    assert [tuple(r) for r in rows] == [
        ("d", 1, None, None, True, True),
        ("d", 1, None, None, True, True),
        ("d", 1, 3, 60.0, False, False),  # only an ordered key's jobs are numbered
    ]
