"""Orphaned work is shown as such and can be removed: due jobs whose task no
live worker has registered, and stored periodic jobs no live process
declares (``status``, ``stats()``, ``pg-scheduler orphans [--delete]``);
periodic jobs are shown by name beside their key."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import timedelta

from tests.integration.test_cli_ops import _keep_test_logging, add_job, cli  # noqa: F401
from tests.support.common import child_env

SERVED = "served.task"


async def live_worker(pool, *tasks: str, seen_ago: float = 0.0) -> None:
    """A worker's row as its heartbeat writes it, listing ``tasks``."""
    await pool.execute(
        """INSERT INTO scheduler_workers (worker_id, hostname, pid, max_concurrent, tasks,
                                          last_seen)
           VALUES ('w-' || md5(random()::text), 'host', 1, 4, $1::text[],
                   now() - make_interval(secs => $2))""",
        list(tasks),
        seen_ago,
    )


async def periodic_job(pool, key: str, name: str, windows: int = 0) -> None:
    await pool.execute(
        """INSERT INTO periodic_jobs (dedup_key, job_name, task_name, schedule, next_run)
           VALUES ($1, $2, 'periodic:' || $1, 'every 60s', now() + interval '1 minute')""",
        key,
        name,
    )
    for i in range(windows):
        await add_job(
            pool, "pending", task=f"periodic:{key}", job_id=f"periodic:{key}:{i}", due=timedelta(0)
        )


async def scene(pool) -> dict[str, str]:
    """A live worker serving SERVED and periodic job "kept"; work of a task nobody
    runs (due and not yet due), and a periodic job nobody declares with windows."""
    await live_worker(pool, SERVED, "periodic:kept")
    await live_worker(pool, "gone.task", seen_ago=3600)  # dead: does not count
    ids = {
        "orphan": await add_job(pool, "pending", task="app:gone.task"),
        "orphan2": await add_job(pool, "pending", task="app:gone.task"),
        "future": await add_job(pool, "pending", task="app:gone.task", due=timedelta(hours=1)),
        "served": await add_job(pool, "pending", task=SERVED),
        "failed": await add_job(pool, "failed", task="app:gone.task"),
    }
    await periodic_job(pool, "f27ac4c8cbdeb614", "periodic_cleanup", windows=2)
    await periodic_job(pool, "kept", "kept_job")
    return ids


async def test_stats_and_status_show_orphaned_work(pool, dsn, make_scheduler):
    await scene(pool)
    scheduler = await make_scheduler(start=False)
    stats = await scheduler.stats()
    assert [(o.task_name, o.due) for o in stats.orphaned_jobs] == [
        ("app:gone.task", 2),
        ("periodic:f27ac4c8cbdeb614", 2),
    ]
    assert stats.orphaned_jobs[1].periodic_name == "periodic_cleanup"
    assert [(p.dedup_key, p.pending) for p in stats.orphaned_periodic] == [("f27ac4c8cbdeb614", 2)]
    assert stats.label("periodic:f27ac4c8cbdeb614") == (
        "periodic_cleanup (periodic:f27ac4c8cbdeb614)"
    )
    status = await cli(dsn, "status")
    assert status.code == 0, status.err
    assert "Orphaned jobs" in status.out and "Orphaned periodic jobs" in status.out
    assert "periodic_cleanup (periodic:f27ac4c8cbdeb614)" in status.out
    assert "pg-scheduler orphans --delete" in status.out
    as_json = (await cli(dsn, "status", "--json")).json()
    assert as_json["orphaned_periodic"][0]["job_name"] == "periodic_cleanup"
    assert as_json["periodic_names"]["periodic:kept"] == "kept_job"


async def test_nothing_orphaned_says_so(pool, dsn):
    await live_worker(pool, SERVED)
    await add_job(pool, "pending", task=SERVED)
    status = await cli(dsn, "status")
    assert "Orphaned" not in status.out
    listing = await cli(dsn, "orphans")
    assert listing.code == 0 and "Nothing orphaned" in listing.out


async def test_orphans_lists_and_deletes_only_what_no_live_worker_serves(pool, dsn):
    ids = await scene(pool)
    listing = await cli(dsn, "orphans", "--json")
    assert listing.code == 0, listing.err
    found = listing.json()
    assert {o["task_name"] for o in found["jobs"]} == {
        "app:gone.task",
        "periodic:f27ac4c8cbdeb614",
    }
    assert [p["dedup_key"] for p in found["periodic"]] == ["f27ac4c8cbdeb614"]
    # A destructive action never runs silently without a terminal.
    refused = await cli(dsn, "orphans", "--delete")
    assert refused.code == 2 and "--yes" in refused.err
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs") == 7

    deleted = await cli(dsn, "orphans", "--delete", "--yes")
    assert deleted.code == 0, deleted.err
    assert deleted.out.strip() == (
        "deleted 2 orphaned job(s) and 1 periodic job(s) with 2 pending window(s)"
    )
    left = {r["job_id"] for r in await pool.fetch("SELECT job_id FROM scheduled_jobs")}
    # Not yet due, served, or finished: not orphaned, kept.
    assert left == {ids["future"], ids["served"], ids["failed"]}
    assert await pool.fetchval("SELECT array_agg(dedup_key) FROM periodic_jobs") == ["kept"]
    assert (await cli(dsn, "orphans", "--json")).json() == {"jobs": [], "periodic": []}


async def test_orphans_by_name(pool, dsn):
    await scene(pool)
    only = await cli(dsn, "orphans", "periodic_cleanup", "--delete", "--yes", "--json")
    assert only.code == 0, only.err
    assert only.json() == {
        "deleted_jobs": 0,
        "deleted_periodic": ["f27ac4c8cbdeb614"],
        "deleted_windows": 2,
    }
    assert (
        await pool.fetchval("SELECT count(*) FROM scheduled_jobs WHERE task_name = 'app:gone.task'")
        == 4
    )
    missing = await cli(dsn, "orphans", "no.such", "--delete", "--yes")
    assert missing.code == 1 and "nothing orphaned among no.such" in missing.err


async def test_a_worker_that_starts_is_not_orphaned(pool, make_scheduler):
    """A worker's own heartbeat row is what counts: once it runs, its task is served
    (the job waits in a paused queue, so it stays due while the worker runs)."""
    from tests.support import app_tasks

    job_id = await add_job(pool, "pending", task="tests.support.app_tasks:add")
    await pool.execute("UPDATE scheduled_jobs SET queue = 'held' WHERE job_id = $1", job_id)
    await pool.execute("INSERT INTO scheduler_queues (name, paused) VALUES ('held', true)")
    producer = await make_scheduler(start=False)
    orphaned = (await producer.stats()).orphaned_jobs
    assert [(o.task_name, o.queue) for o in orphaned] == [("tests.support.app_tasks:add", "held")]
    worker = await make_scheduler(start=False)
    worker.register_task(app_tasks.add)
    await worker.start()
    assert (await producer.stats()).orphaned_jobs == []
    assert await pool.fetchval("SELECT status FROM scheduled_jobs") == "pending"


async def test_the_demo_leaves_nothing_waiting_for_a_worker(pool, dsn):
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "pg_scheduler.cli", "demo", "--seconds", "4"],
        env=child_env(dsn),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    unfinished = await pool.fetchval(
        "SELECT count(*) FROM scheduled_jobs WHERE status IN ('pending', 'running')"
    )
    assert unfinished == 0
    assert await pool.fetchval("SELECT count(*) FROM periodic_jobs") == 0
    # What finished stays to be looked at.
    assert await pool.fetchval("SELECT count(*) FROM scheduled_jobs WHERE status = 'completed'")
    assert (await cli(dsn, "orphans", "--json")).json() == {"jobs": [], "periodic": []}
