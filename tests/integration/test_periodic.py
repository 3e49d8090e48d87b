"""@periodic against real PostgreSQL: decoration errors, once per window across
replicas, shared enable/disable, status, triggers, misfire/coalesce, advisory lock,
and a cron job in a time zone whose DST change happens during the test."""

from __future__ import annotations

import asyncio
import importlib
import io
import itertools
import os
import struct
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from pg_scheduler import ConflictResolution, JobPriority, PeriodicJobConfig, periodic
from pg_scheduler.config import UNSET
from pg_scheduler.periodic import CoalescePolicy, window_job_id
from pg_scheduler.periodic.cron import CronError
from pg_scheduler.tasks import default_registry
from tests.support import periodic_tasks
from tests.support.common import wait_until

# The package exports the decorator under the module's name.
periodic_module = importlib.import_module("pg_scheduler.periodic")

# Replicas in one process: fast refresh so changes are seen quickly.
REPLICA = dict(run_periodic_jobs=True)


@pytest.fixture(autouse=True)
def isolated_periodic_registry():
    """@periodic registrations are process-wide: undo this test's."""
    saved = dict(periodic_module._registry)
    periodic_tasks.runs.clear()
    yield
    periodic_module._registry.clear()
    periodic_module._registry.update(saved)


async def job_rows(pool, key: str) -> list:
    return await pool.fetch(
        """SELECT job_id, status, execution_time, result::text AS result, error_message
             FROM scheduled_jobs WHERE task_name = $1 ORDER BY execution_time, job_id""",
        f"periodic:{key}",
    )


def window_of(job_id: str) -> datetime:
    stamp = job_id.rsplit(":", 3)[-3:]
    return datetime.fromisoformat(":".join(stamp).rstrip("Z")).replace(tzinfo=UTC)


# -- decoration ---------------------------------------------------------------------


async def _job() -> None:
    return None


def _sync() -> None:
    return None


async def _needs_argument(x: int) -> None:
    return None


@pytest.mark.parametrize(
    ("kwargs", "func", "error", "message"),
    [
        ({}, _job, ValueError, "exactly one of every= .* or cron="),
        ({"every": timedelta(seconds=1), "cron": "* * * * *"}, _job, ValueError, "exactly one"),
        ({"cron": "61 * * * *"}, _job, CronError, "minute '61': 61 is out of range 0-59"),
        ({"cron": "* * * *"}, _job, CronError, "expected 5 fields"),
        ({"cron": "0 0 31 2 *"}, _job, CronError, "never fires"),
        ({"cron": "0 9 * * *", "timezone": "Mars/Olympus"}, _job, ValueError, "unknown timezone"),
        ({"cron": "0 9 * * *", "timezone": 5}, _job, TypeError, "timezone must be"),
        (
            {"every": timedelta(seconds=1), "timezone": "UTC"},
            _job,
            ValueError,
            "timezone= only applies to cron=",
        ),
        ({"every": 5}, _job, TypeError, "every= must be a timedelta"),
        ({"every": timedelta(0)}, _job, ValueError, "every= must be positive"),
        ({"every": timedelta(seconds=1)}, _sync, TypeError, "needs an async function"),
        ({"every": timedelta(seconds=1)}, _needs_argument, TypeError, "without arguments"),
        ({"every": timedelta(seconds=1), "priority": 5}, _job, TypeError, "JobPriority"),
        ({"every": timedelta(seconds=1), "max_retries": -1}, _job, ValueError, ">= 0"),
        ({"every": timedelta(seconds=1), "dedup_key": ""}, _job, ValueError, "dedup_key="),
        ({"every": timedelta(seconds=1), "coalesce": "newest"}, _job, ValueError, "coalesce="),
        ({"every": timedelta(seconds=1), "jitter": -1}, _job, ValueError, "jitter"),
        (
            {"every": timedelta(seconds=1), "misfire_grace_time": "soon"},
            _job,
            ValueError,
            "misfire_grace_time",
        ),
        ({"every": timedelta(seconds=1), "enabled": "yes"}, _job, TypeError, "enabled="),
    ],
)
def test_invalid_arguments_raise_at_decoration_time(kwargs, func, error, message):
    before = dict(periodic_module._registry)
    with pytest.raises(error, match=message):
        periodic(**kwargs)(func)
    assert periodic_module._registry == before  # nothing registered


def test_decoration_defaults_and_registration():
    @periodic(cron="0 3 * * SUN", timezone="America/New_York", priority=JobPriority.HIGH)
    async def weekly_report() -> str:
        return "done"

    assert weekly_report.__name__ == "weekly_report"  # returned unchanged
    jobs = periodic_module.registered_periodic_jobs()
    [config] = [c for c in jobs.values() if c.func is weekly_report]
    assert config.job_name == "periodic_weekly_report"
    assert config.timezone == ZoneInfo("America/New_York")
    assert config.coalesce is CoalescePolicy.LATEST
    assert config.misfire_grace_time is UNSET and config.jitter is None
    # The 0.2.x derivation of the default key: stable across processes and versions.
    assert len(config.dedup_key) == 16
    again = PeriodicJobConfig(
        weekly_report, cron="0 3 * * SUN", timezone="America/New_York"
    ).dedup_key
    assert again == config.dedup_key
    # The function and the runner its windows route to are both tasks.
    assert default_registry.get(f"{weekly_report.__module__}:{weekly_report.__qualname__}")
    assert default_registry.get(f"periodic:{config.dedup_key}") is not None

    async def other() -> None:
        return None

    # Another function taking over the key replaces it, as 0.2.x does, but loudly.
    with pytest.warns(RuntimeWarning, match="will not run"):
        periodic(every=timedelta(seconds=5), dedup_key=config.dedup_key)(other)
    assert periodic_module.registered_periodic_job(config.dedup_key).func is other


async def test_status_before_start_and_unknown_keys(make_scheduler):
    periodic(every=timedelta(hours=1), dedup_key="quiet")(periodic_tasks.tick)
    scheduler = await make_scheduler(start=False)
    status = scheduler.get_periodic_job_status("quiet")
    assert status["enabled"] is True and status["interval"] == 3600.0
    assert status["misfire_grace_time"] == 300  # the Scheduler's
    assert status["next_run"] is None and status["last_outcome"] is None
    assert scheduler.get_periodic_job_status("nope") is None
    assert scheduler.enable_periodic_job("nope") is False
    assert scheduler.disable_periodic_job("nope") is False
    assert await scheduler.trigger_periodic_job("nope") is None
    assert "quiet" in scheduler.get_periodic_jobs()


# -- once per window -----------------------------------------------------------------


async def test_three_replicas_run_each_window_once(pool, make_scheduler):
    periodic_tasks.declare_tick("replicas", 0.25)
    replicas = [await make_scheduler(**REPLICA) for _ in range(3)]
    started = datetime.now(UTC)
    await asyncio.sleep(2.6)
    stopped = datetime.now(UTC)
    for scheduler in replicas:
        scheduler.disable_periodic_job("replicas")
    await asyncio.sleep(0.5)
    rows = await job_rows(pool, "replicas")
    # Windows enqueued ahead (0.5 s) are cancelled by the disable.
    cancelled = [r for r in rows if r["status"] == "cancelled"]
    assert all(window_of(r["job_id"]) > stopped for r in cancelled)
    rows = [r for r in rows if r["status"] != "cancelled"]
    windows = [window_of(r["job_id"]) for r in rows]
    assert all(r["status"] == "completed" for r in rows), rows
    # A run that starts after the next window has come yields to it
    # (coalesce="latest"); on a loaded machine a 250 ms window can be that late.
    yielded = [r for r in rows if "coalesced" in (r["result"] or "")]
    assert len(yielded) <= 2, yielded
    # Consecutive windows on the epoch-aligned 250 ms grid, each run once.
    assert len(windows) >= 9
    assert all(w.microsecond % 250_000 == 0 for w in windows)
    assert all(b - a == timedelta(milliseconds=250) for a, b in itertools.pairwise(windows))
    assert windows[0] - started < timedelta(milliseconds=600)
    assert len(periodic_tasks.runs["tick"]) == len(windows) - len(yielded)
    # Each ran at (not before) its window.
    for row in rows:
        assert row["execution_time"] == window_of(row["job_id"])


async def test_disable_on_one_replica_stops_every_replica_and_enable_resumes(pool, make_scheduler):
    periodic_tasks.declare_tick("toggle", 0.2)
    a = await make_scheduler(**REPLICA)
    b = await make_scheduler(**REPLICA)
    await wait_until(lambda: len(periodic_tasks.runs["tick"]) >= 3, timeout=5, message="runs")

    assert a.disable_periodic_job("toggle") is True  # synchronous, returns at once
    assert a.get_periodic_job_status("toggle")["enabled"] is False  # here: at once
    await wait_until(
        lambda: b.get_periodic_job_status("toggle")["enabled"] is False,
        timeout=1.5,
        message="the other replica to see the change",
    )
    assert (
        await pool.fetchval("SELECT enabled FROM periodic_jobs WHERE dedup_key = 'toggle'") is False
    )
    assert not b.get_periodic_jobs()["toggle"].enabled
    disabled_at = datetime.now(UTC)
    await asyncio.sleep(0.3)  # a run enqueued just before may still finish
    count = len(periodic_tasks.runs["tick"])
    await asyncio.sleep(1.2)
    assert len(periodic_tasks.runs["tick"]) == count
    late = [r for r in await job_rows(pool, "toggle") if window_of(r["job_id"]) > disabled_at]
    assert all(r["status"] == "cancelled" for r in late), late

    assert await b.set_periodic_job_enabled("toggle", True) is True  # stored on return
    assert await pool.fetchval("SELECT enabled FROM periodic_jobs WHERE dedup_key = 'toggle'")
    await wait_until(lambda: len(periodic_tasks.runs["tick"]) >= count + 2, timeout=5)
    resumed = [r for r in await job_rows(pool, "toggle") if window_of(r["job_id"]) > disabled_at]
    # No catch-up for the time it was off: the first window after re-enabling is next.
    completed = [window_of(r["job_id"]) for r in resumed if r["status"] == "completed"]
    assert completed and completed[0] > disabled_at + timedelta(seconds=1.5)


async def test_runtime_change_survives_restart_until_the_code_default_changes(pool, make_scheduler):
    periodic_tasks.declare_tick("sticky", 3600)
    a = await make_scheduler(**REPLICA)
    assert await a.set_periodic_job_enabled("sticky", False)
    await a.shutdown()
    b = await make_scheduler(**REPLICA)
    await wait_until(lambda: b.get_periodic_job_status("sticky")["next_run"] is None or True)
    await b.periodic.fetch_status("sticky")
    assert b.get_periodic_job_status("sticky")["enabled"] is False  # still off
    await b.shutdown()
    # The code now declares enabled=False, then True again: the code's change wins.
    periodic(every=timedelta(hours=1), dedup_key="sticky", enabled=False)(periodic_tasks.tick)
    periodic(every=timedelta(hours=1), dedup_key="sticky", enabled=True)(periodic_tasks.tick)
    await b.periodic.register([periodic_module._registry["sticky"]])
    assert (
        await pool.fetchval("SELECT enabled FROM periodic_jobs WHERE dedup_key = 'sticky'") is False
    )
    periodic(every=timedelta(hours=1), dedup_key="sticky", enabled=False)(periodic_tasks.tick)
    await b.periodic.register([periodic_module._registry["sticky"]])
    periodic(every=timedelta(hours=1), dedup_key="sticky", enabled=True)(periodic_tasks.tick)
    await b.periodic.register([periodic_module._registry["sticky"]])
    assert await pool.fetchval("SELECT enabled FROM periodic_jobs WHERE dedup_key = 'sticky'")


# -- status and triggers ----------------------------------------------------------------


async def test_status_shows_next_and_last_run_and_outcome_from_any_replica(pool, make_scheduler):
    failing = [True]

    @periodic(every=timedelta(milliseconds=400), dedup_key="flaky-status")
    async def flaky() -> str:
        if failing[0]:
            raise RuntimeError("planned failure")
        return "ok"

    runner = await make_scheduler(**REPLICA)
    observer = await make_scheduler(start=False)  # never runs it, only reads status
    await wait_until(
        lambda: runner.get_periodic_job_status("flaky-status")["last_outcome"] == "failed",
        timeout=5,
    )

    seen: list[dict] = []

    async def observed(outcome: str) -> bool:
        seen.append(await observer.periodic.fetch_status("flaky-status"))
        return seen[-1]["last_outcome"] == outcome

    # Read between two windows (a new window's run is "running" for a moment).
    await wait_until(lambda: observed("failed"), timeout=3)
    status = seen[-1]
    assert status["last_error"] == "RuntimeError: planned failure"
    assert status["last_window"] is not None and status["last_run"] >= status["last_window"]
    assert status["last_job_id"] == window_job_id("flaky-status", status["last_window"])
    assert status["next_run"] > status["last_window"]
    assert status["state_read_at"] >= status["last_run"]

    failing[0] = False
    await wait_until(
        lambda: runner.get_periodic_job_status("flaky-status")["last_outcome"] == "completed",
        timeout=5,
    )
    await wait_until(lambda: observed("completed"), timeout=3)
    status = seen[-1]
    assert status["last_error"] is None and status["last_finished_at"] >= status["last_run"]
    assert status["schedule"] == "every 0.4s" and status["coalesce"] == "latest"


async def test_trigger_runs_once_now_without_moving_the_windows(pool, make_scheduler):
    periodic_tasks.declare_tick("manual", 3600)
    scheduler = await make_scheduler(**REPLICA)
    await wait_until(
        lambda: scheduler.get_periodic_job_status("manual")["next_run"] is not None, timeout=3
    )
    next_run = scheduler.get_periodic_job_status("manual")["next_run"]
    job_id = await scheduler.trigger_periodic_job("manual")
    assert job_id.startswith("manual_periodic:manual:")
    await wait_until(lambda: len(periodic_tasks.runs["tick"]) == 1, timeout=5)
    status = await scheduler.periodic.fetch_status("manual")
    assert status["last_job_id"] == job_id and status["last_window"] is None
    assert status["next_run"] == next_run  # the regular windows are untouched
    await wait_until(
        lambda: scheduler.get_periodic_job_status("manual")["last_outcome"] == "completed",
        timeout=3,
    )
    await asyncio.sleep(0.3)
    assert len(periodic_tasks.runs["tick"]) == 1
    # A disabled job can still be run by hand.
    scheduler.disable_periodic_job("manual")
    assert await scheduler.trigger_periodic_job("manual")
    await wait_until(lambda: len(periodic_tasks.runs["tick"]) == 2, timeout=5)


# -- misfires and coalescing after an outage -----------------------------------------------


@pytest.mark.parametrize(
    ("coalesce", "expected_runs", "expected_coalesced"),
    [
        ("latest", ["F"], ["F-3h"]),
        # A later window may be enqueued while F-3h is being claimed; it then
        # yields at run time: coalesced either way, never run.
        ("earliest", ["F-3h"], None),
        ("all", ["F-3h", "F-2h", "F-1h", "F"], []),
    ],
)
async def test_outage_follows_misfire_grace_and_coalesce(
    pool, make_scheduler, coalesce, expected_runs, expected_coalesced
):
    # Hourly job; every replica "was down" from before F-2h until now (F is the
    # latest window). The window F-3h had been enqueued before the outage and is
    # still pending; so is F-6h, older than the grace time.
    db_now = await pool.fetchval("SELECT now()")
    latest = db_now.replace(minute=0, second=0, microsecond=0)
    grace = (db_now - latest).total_seconds() + 3.5 * 3600  # F-3h..F are within it
    config_kwargs = dict(every=timedelta(hours=1), dedup_key="outage", coalesce=coalesce)
    periodic(**config_kwargs, misfire_grace_time=grace)(periodic_tasks.tick)
    config = periodic_module._registry["outage"]
    label = {f"F-{n}h" if n else "F": latest - timedelta(hours=n) for n in range(7)}

    setup = await make_scheduler(start=False)
    await setup.periodic.register([config])
    await pool.execute(
        "UPDATE periodic_jobs SET next_run = $1 WHERE dedup_key = 'outage'", label["F-2h"]
    )
    for name in ("F-3h", "F-6h"):
        window = label[name]
        row = setup.periodic.new_row(config, window_job_id("outage", window), window, window)
        await setup.periodic.jobs.insert(pool, [row], ConflictResolution.RAISE)

    await make_scheduler(**REPLICA)

    async def settled() -> bool:
        rows = await job_rows(pool, "outage")
        return bool(rows) and all(r["status"] not in ("pending", "running") for r in rows)

    await wait_until(settled, timeout=10, message="catch-up runs to finish")
    await asyncio.sleep(0.3)
    rows = {window_of(r["job_id"]): r for r in await job_rows(pool, "outage")}
    order = list(label)

    def windows(predicate) -> list[str]:
        return sorted(
            (name for name, w in label.items() if w in rows and predicate(rows[w])),
            key=order.index,
        )

    ran = windows(lambda r: r["status"] == "completed" and "skipped" not in (r["result"] or ""))
    assert ran == sorted(expected_runs, key=order.index)
    assert len(periodic_tasks.runs["tick"]) == len(expected_runs)
    # Coalesced away: cancelled while pending, or skipped if a worker had already
    # claimed it (workers start claiming before the enqueuer's first pass).
    coalesced = windows(lambda r: r["status"] == "cancelled" or "coalesced" in (r["result"] or ""))
    if expected_coalesced is None:
        assert set(coalesced) <= {"F-2h", "F-1h", "F"}
    else:
        assert coalesced == expected_coalesced
    assert windows(lambda r: r["status"] == "expired") == ["F-6h"]  # past the grace time
    status = await pool.fetchrow("SELECT next_run FROM periodic_jobs WHERE dedup_key = 'outage'")
    assert status["next_run"] == latest + timedelta(hours=1)


async def test_outage_default_runs_only_the_latest_window_once(pool, make_scheduler):
    # Defaults: coalesce="latest", grace = the Scheduler's misfire_grace_time.
    db_now = await pool.fetchval("SELECT now()")
    latest = db_now.replace(minute=0, second=0, microsecond=0)
    periodic(every=timedelta(hours=1), dedup_key="outage-default")(periodic_tasks.tick)
    config = periodic_module._registry["outage-default"]
    setup = await make_scheduler(start=False)
    await setup.periodic.register([config])
    await pool.execute(
        "UPDATE periodic_jobs SET next_run = $1 WHERE dedup_key = 'outage-default'",
        latest - timedelta(hours=48),
    )
    await make_scheduler(misfire_grace_time=7200, **REPLICA)
    await wait_until(lambda: len(periodic_tasks.runs["tick"]) == 1, timeout=5)
    await asyncio.sleep(0.5)
    rows = await job_rows(pool, "outage-default")
    assert [(window_of(r["job_id"]), r["status"]) for r in rows] == [(latest, "completed")]
    assert len(periodic_tasks.runs["tick"]) == 1  # no burst of 48 stale runs


# -- jitter -------------------------------------------------------------------------------


async def test_jitter_delays_each_run_but_never_past_the_next_window(pool, make_scheduler):
    periodic(every=timedelta(milliseconds=300), dedup_key="jittery", jitter=5)(periodic_tasks.tick)
    await make_scheduler(**REPLICA)
    await wait_until(lambda: len(periodic_tasks.runs["tick"]) >= 6, timeout=6)
    rows = [r for r in await job_rows(pool, "jittery") if r["status"] == "completed"]
    delays = [(r["execution_time"] - window_of(r["job_id"])).total_seconds() for r in rows]
    assert all(0 <= d < 0.3 for d in delays), delays
    assert len({round(d, 3) for d in delays}) > 1  # actually random


# -- advisory lock ---------------------------------------------------------------------------


async def test_advisory_lock_never_lets_a_job_overlap_itself(pool, make_scheduler):
    @periodic(every=timedelta(milliseconds=300), dedup_key="exclusive", use_advisory_lock=True)
    async def slow() -> str:
        await periodic_tasks.record("slow", 0.8)
        return "done"

    replicas = [await make_scheduler(**REPLICA) for _ in range(2)]
    # While a run holds it, the lock is a transaction-level advisory lock: its
    # session is idle *in transaction*, not merely idle.
    await wait_until(
        lambda: pool.fetchval(
            """SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
                WHERE l.locktype = 'advisory' AND l.granted
                  AND a.state = 'idle in transaction'"""
        ),
        timeout=5,
        message="the lock to be held",
    )
    await wait_until(lambda: len(periodic_tasks.runs["slow"]) >= 3, timeout=8)
    for scheduler in replicas:
        scheduler.disable_periodic_job("exclusive")
    await asyncio.sleep(1.0)
    spans = sorted(periodic_tasks.runs["slow"])
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, "two runs overlapped"
    results = [r["result"] for r in await job_rows(pool, "exclusive") if r["status"] == "completed"]
    assert any("skipped" in (r or "") for r in results)  # windows that found it held
    status = await replicas[0].periodic.fetch_status("exclusive")
    assert status["last_outcome"] in ("completed", "skipped")
    assert await pool.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'") == 0


# -- cron in a time zone, across a DST change happening now ------------------------------------


def zone_with_change(key: str, at: int, before: int, after: int) -> ZoneInfo:
    """A TZif zone whose UTC offset changes from ``before`` to ``after`` seconds at
    epoch second ``at``: a DST change on demand."""
    types = struct.pack(">lBB", before, 0, 0) + struct.pack(">lBB", after, 1, 4)
    names = b"STD\x00DST\x00"

    def block(fmt: str) -> bytes:
        counts = struct.pack(">6l", 0, 0, 0, 1, 2, len(names))
        return b"TZif2" + bytes(15) + counts + struct.pack(fmt, at) + b"\x01" + types + names

    return ZoneInfo.from_file(io.BytesIO(block(">l") + block(">q") + b"\n\n"), key=key)


async def test_cron_in_a_time_zone_across_a_live_dst_change(pool, make_scheduler):
    change = int(time.time()) + 5
    forward = zone_with_change("Test/Forward", change, 0, 4)  # 4 s of wall time skipped
    back = zone_with_change("Test/Back", change, 4, 0)  # 4 s of wall time repeated
    # Fixed-time jobs (minute and hour fields are numbers) at a wall time 2 s
    # after the change, as read in each zone.
    wall = datetime.fromtimestamp(change + 2, UTC)
    expr = f"{wall.minute} {wall.hour} * * * {wall.second}"
    periodic(cron=expr, timezone=forward, dedup_key="dst-forward")(periodic_tasks.tick)
    periodic(cron=expr, timezone=back, dedup_key="dst-back")(periodic_tasks.tick)
    await make_scheduler(**REPLICA)
    change_at = datetime.fromtimestamp(change, UTC)
    await wait_until(
        lambda: datetime.now(UTC) > change_at + timedelta(seconds=3.5), timeout=12, interval=0.2
    )
    await asyncio.sleep(0.3)
    forward_rows = await job_rows(pool, "dst-forward")
    back_rows = await job_rows(pool, "dst-back")
    # Skipped wall time: once, right after the jump.
    assert [(window_of(r["job_id"]), r["status"]) for r in forward_rows] == [
        (change_at, "completed")
    ]
    # Repeated wall time: once, on its first occurrence (2 s before the change),
    # not again on the second (2 s after).
    assert [(window_of(r["job_id"]), r["status"]) for r in back_rows] == [
        (change_at - timedelta(seconds=2), "completed")
    ]
    assert len(periodic_tasks.runs["tick"]) == 2


async def test_sync_enable_disable_from_another_thread(pool, make_scheduler):
    periodic_tasks.declare_tick("threaded", 3600)
    scheduler = await make_scheduler(**REPLICA)

    async def stored_enabled() -> bool | None:
        return await pool.fetchval("SELECT enabled FROM periodic_jobs WHERE dedup_key = 'threaded'")

    await wait_until(lambda: stored_enabled(), timeout=3, message="the job's row")
    assert await asyncio.to_thread(scheduler.disable_periodic_job, "threaded") is True
    await wait_until(lambda: _is(stored_enabled(), False), timeout=2, message="stored")
    assert await asyncio.to_thread(scheduler.enable_periodic_job, "threaded") is True
    await wait_until(lambda: _is(stored_enabled(), True), timeout=2, message="stored")


async def _is(value, expected) -> bool:
    return (await value) is expected


async def test_migration_retires_pending_windows_of_0_2_x(server_dsn):
    import asyncpg

    from pg_scheduler.store.migrate import migrate
    from tests.integration.test_migrations import LEGACY_SCHEMA
    from tests.support.common import with_database

    name = f"pgs_periodic_legacy_{os.getpid()}"
    admin = await asyncpg.connect(server_dsn)
    await admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    conn = await asyncpg.connect(with_database(server_dsn, name))
    try:
        await conn.execute(LEGACY_SCHEMA)
        # 0.2.x: the next window of a periodic job (routed to its wrapper
        # "periodic_tick"), a manual run (routed to the function itself) and a
        # finished window.
        await conn.execute(
            """INSERT INTO scheduled_jobs (job_id, job_name, execution_time, status) VALUES
               ('periodic:0123456789abcdef:28911111', 'periodic_tick', now(), 'pending'),
               ('manual_periodic:0123456789abcdef:ab12cd34', 'tick', now(), 'pending'),
               ('periodic:0123456789abcdef:28911110', 'periodic_tick', now(), 'completed')"""
        )
        await migrate(conn)
        rows = {
            r["job_id"].split(":")[0] + ":" + r["job_id"].split(":")[-1]: r
            for r in await conn.fetch("SELECT job_id, status, error_message FROM scheduled_jobs")
        }
        assert rows["periodic:28911111"]["status"] == "cancelled"
        assert "superseded" in rows["periodic:28911111"]["error_message"]
        assert rows["manual_periodic:ab12cd34"]["status"] == "pending"
        assert rows["periodic:28911110"]["status"] == "completed"
        assert await conn.fetchval("SELECT to_regclass('periodic_jobs') IS NOT NULL")
    finally:
        await conn.close()
        admin = await asyncpg.connect(server_dsn)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
