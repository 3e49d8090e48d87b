"""Global limits (max_running, rate_limit) per task and per queue, enforced in the claim."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from pg_scheduler import JobSpec, RateLimit, Scheduler, task
from pg_scheduler.limits import parse_rate_limit
from tests.support import limit_tasks
from tests.support.common import start_cli_worker, wait_until
from tests.support.spans import max_overlap, most_starts_in


async def _runs_table(pool) -> None:
    await pool.execute(
        "CREATE TABLE IF NOT EXISTS limit_runs (n int, pid int, started float8, ended float8)"
    )
    await pool.execute("TRUNCATE limit_runs")


async def _workers(dsn: str, count: int) -> list[asyncio.subprocess.Process]:
    return [await start_cli_worker(dsn, "tests.support.limit_tasks:SETTINGS") for _ in range(count)]


async def _stop(workers: list[asyncio.subprocess.Process]) -> None:
    for w in workers:
        if w.returncode is None:
            w.terminate()
    for w in workers:
        await asyncio.wait_for(w.wait(), 30)


async def _all_registered(pool, count: int) -> None:
    async def registered() -> bool:
        return await pool.fetchval("SELECT count(*) FROM scheduler_workers") >= count

    await wait_until(registered, timeout=60, interval=0.1, message=f"{count} workers")


# -- parsing and bad input ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "count", "period"),
    [("100/m", 100, 60.0), ("5/s", 5, 1.0), ("20/10s", 20, 10.0), (" 3 / h ", 3, 3600.0)],
)
def test_rate_limits_parse(text, count, period):
    assert parse_rate_limit(text) == RateLimit(count, period)


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ("100", ValueError),
        ("0/s", ValueError),
        ("5/w", ValueError),
        ("99999999/s", ValueError),
        (5, TypeError),
        ("1/0s", ValueError),
    ],
)
def test_bad_rate_limits_are_refused(bad, error):
    with pytest.raises(error):
        parse_rate_limit(bad)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_running": 0}, ValueError),
        ({"max_running": True}, TypeError),
        ({"max_running": 2.5}, TypeError),
        ({"rate_limit": "fast"}, ValueError),
    ],
)
async def test_bad_limits_write_nothing(pool, make_scheduler, kwargs, error):
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    with pytest.raises(error):
        await scheduler.configure_task("some.task", **kwargs)
    with pytest.raises(error):
        await scheduler.configure_queue("default", **kwargs)
    with pytest.raises(error):
        task(**kwargs)
    assert await pool.fetchval("SELECT count(*) FROM scheduler_limits") == 0


async def test_configure_list_and_clear(pool, make_scheduler):
    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    await scheduler.configure_task("a.task", max_running=5, rate_limit="100/m")
    await scheduler.configure_queue("reports", max_running=2)
    limits = {(x["scope"], x["name"]): x for x in await scheduler.list_limits()}
    assert limits[("task", "a.task")]["max_running"] == 5
    assert limits[("task", "a.task")]["rate_limit"] == "100/m"
    assert limits[("queue", "reports")]["rate_limit"] is None
    assert limits[("queue", "reports")]["running"] == 0
    await scheduler.configure_task("a.task")  # both None: removed
    assert [x["name"] for x in await scheduler.list_limits()] == ["reports"]


# -- enforcement -----------------------------------------------------------------------


async def test_max_running_holds_across_schedulers_in_one_process(
    pool, make_scheduler, dsn, monkeypatch
):
    await _runs_table(pool)
    monkeypatch.setenv("PG_SCHEDULER_DSN", dsn)
    a = await make_scheduler(max_concurrent_jobs=10, batch_claim_limit=10)
    await make_scheduler(max_concurrent_jobs=10, batch_claim_limit=10)
    now = datetime.now(UTC)
    await a.schedule_bulk([JobSpec(limit_tasks.capped, now, args=(n,)) for n in range(60)])

    async def all_ran() -> bool:
        return await pool.fetchval("SELECT count(*) FROM limit_runs") == 60

    await wait_until(all_ran, timeout=60, message="60 runs")
    spans = [(r["started"], r["ended"]) for r in await pool.fetch("SELECT * FROM limit_runs")]
    assert 2 <= max_overlap(spans) <= 3


async def test_a_limit_set_elsewhere_binds_the_next_claim(pool, make_scheduler, dsn, monkeypatch):
    await _runs_table(pool)
    monkeypatch.setenv("PG_SCHEDULER_DSN", dsn)
    worker = await make_scheduler()
    other = await make_scheduler(start=False)
    await other.configure_task("limits.rated", rate_limit="5/s")
    # No wait: the worker has not re-read the limited set, but the claim
    # statements read scheduler_limits themselves.
    now = datetime.now(UTC)
    await worker.schedule_bulk([JobSpec(limit_tasks.rated, now, args=(n,)) for n in range(12)])

    async def all_ran() -> bool:
        return await pool.fetchval("SELECT count(*) FROM limit_runs") == 12

    await wait_until(all_ran, timeout=30, message="12 runs")
    starts = [r["started"] for r in await pool.fetch("SELECT started FROM limit_runs")]
    assert most_starts_in(starts, 1.0) <= 5
    assert max(starts) - min(starts) >= 2.0  # 12 starts at 5/s need over two windows


@pytest.mark.slow
async def test_max_running_3_across_three_worker_processes(pool, dsn):
    await _runs_table(pool)
    workers = await _workers(dsn, 3)
    try:
        await _all_registered(pool, 3)
        producer = Scheduler(pool, run_periodic_jobs=False)
        now = datetime.now(UTC)
        await producer.schedule_bulk(
            [JobSpec(limit_tasks.capped, now, args=(n,)) for n in range(500)]
        )

        async def all_ran() -> bool:
            return await pool.fetchval("SELECT count(*) FROM limit_runs") == 500

        await wait_until(all_ran, timeout=120, interval=0.2, message="500 runs")
        rows = await pool.fetch("SELECT * FROM limit_runs")
        assert len({r["n"] for r in rows}) == 500
        assert max_overlap([(r["started"], r["ended"]) for r in rows]) <= 3
        assert len({r["pid"] for r in rows}) >= 2  # the limit was shared, not one worker's
    finally:
        await _stop(workers)


@pytest.mark.slow
async def test_rate_limit_20_per_second_across_two_worker_processes(pool, dsn):
    await _runs_table(pool)
    setter = Scheduler(pool, run_periodic_jobs=False)
    await setter.initialize_db()
    await setter.configure_task("limits.rated", rate_limit="20/s")
    workers = await _workers(dsn, 2)
    try:
        await _all_registered(pool, 2)
        now = datetime.now(UTC)
        await setter.schedule_bulk([JobSpec(limit_tasks.rated, now, args=(n,)) for n in range(100)])

        async def all_ran() -> bool:
            return await pool.fetchval("SELECT count(*) FROM limit_runs") == 100

        await wait_until(all_ran, timeout=60, interval=0.2, message="100 runs")
        starts = [r["started"] for r in await pool.fetch("SELECT started FROM limit_runs")]
        assert most_starts_in(starts, 1.0) <= 20
        assert max(starts) - min(starts) >= 4.0  # 100 starts at 20/s: at least 4 s
    finally:
        await _stop(workers)


# -- the command line --------------------------------------------------------------------


async def test_cli_sets_lists_and_clears_limits(pool, dsn, make_scheduler):
    from tests.integration.test_cli_ops import cli

    await (await make_scheduler(start=False)).initialize_db()
    # --force: neither name is known to the database yet (no worker, no job).
    done = await cli(
        dsn, "limits", "set", "task", "mail.send", "--rate-limit", "100/m", "--json", "--force"
    )
    assert done.code == 0, done.err
    assert done.json()["rate_limit"] == "100/m"
    done = await cli(dsn, "limits", "set", "queue", "reports", "--max-running", "3", "--force")
    assert done.code == 0, done.err
    listing = await cli(dsn, "limits", "list", "--json")
    assert {(r["scope"], r["name"]) for r in listing.json()} == {
        ("task", "mail.send"),
        ("queue", "reports"),
    }
    assert "reports" in (await cli(dsn, "limits", "list")).out
    bad = await cli(dsn, "limits", "set", "task", "mail.send", "--rate-limit", "lots")
    assert bad.code == 1 and "rate_limit" in bad.err
    assert (await cli(dsn, "limits", "clear", "task", "mail.send")).code == 0
    assert (await cli(dsn, "limits", "clear", "task", "mail.send")).code == 1
    assert await pool.fetchval("SELECT count(*) FROM scheduler_limits") == 1


async def test_stats_and_status_show_limits(pool, dsn, make_scheduler):
    from tests.integration.test_cli_ops import cli

    scheduler = await make_scheduler(start=False)
    await scheduler.initialize_db()
    await scheduler.configure_queue("reports", max_running=2, rate_limit="10/s")
    stats = await scheduler.stats()
    assert [(x.scope, x.name, x.max_running, x.rate_limit) for x in stats.limits] == [
        ("queue", "reports", 2, "10/s")
    ]
    status = await cli(dsn, "status", "--json")
    assert status.json()["limits"][0]["name"] == "reports"
    assert "Limits" in (await cli(dsn, "status")).out


async def test_queue_limit_binds_every_task_of_the_queue(pool, make_scheduler, dsn, monkeypatch):
    await _runs_table(pool)
    monkeypatch.setenv("PG_SCHEDULER_DSN", dsn)
    worker = await make_scheduler(max_concurrent_jobs=10, batch_claim_limit=10)
    await worker.configure_queue("slow", max_running=2)
    now = datetime.now(UTC)
    specs = [JobSpec(limit_tasks.rated, now, args=(n,), queue="slow") for n in range(20)]
    specs += [JobSpec(limit_tasks.rated, now, args=(100 + n,)) for n in range(20)]
    await worker.schedule_bulk(specs)

    async def all_ran() -> bool:
        return await pool.fetchval("SELECT count(*) FROM limit_runs") == 40

    await wait_until(all_ran, timeout=60, message="40 runs")
    rows = await pool.fetch("SELECT * FROM limit_runs")
    slow = [(r["started"], r["ended"]) for r in rows if r["n"] < 100]
    assert max_overlap(slow) <= 2
    assert len(rows) == 40
