"""The operations commands against real PostgreSQL: output and exit codes."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
import structlog

from pg_scheduler.cli import main, ops
from pg_scheduler.store.housekeeping import VACUUM_LOCK_KEY
from tests.support import app_tasks
from tests.support.common import (
    child_pythonpath,
    job_status,
    wait_for_status,
    wait_until,
    with_database,
)


@pytest.fixture(autouse=True)
def _keep_test_logging(monkeypatch):
    # In-process runs share structlog with the schedulers of the test: do not
    # reconfigure it from another thread. (test_entry_point_exit_codes runs the
    # real command, logging setup included.)
    monkeypatch.setattr(ops, "configure_logging", lambda args: None)
    # ...and keep the schedulers' log lines out of the stdout we capture.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.__stderr__))
    yield
    structlog.reset_defaults()


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


def _run(argv: list[str]) -> Result:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 1
    return Result(code, out.getvalue(), err.getvalue())


async def cli(dsn: str, *argv: str) -> Result:
    """Run ``pg-scheduler --dsn DSN ARGV`` in-process (on its own event loop, in a thread)."""
    return await asyncio.to_thread(_run, ["--dsn", dsn, "--log-level", "warning", *argv])


async def add_job(
    pool,
    status: str,
    *,
    task: str = "tests.support.app_tasks:add",
    job_id: str | None = None,
    due: timedelta = timedelta(0),
    finished_ago: timedelta | None = None,
    error: str | None = None,
    traceback: str | None = None,
    worker_id: str | None = None,
) -> str:
    job_id = job_id or f"job-{uuid.uuid4().hex[:8]}"
    final = status in ("completed", "failed", "cancelled", "expired")
    finished = finished_ago if finished_ago is not None else (timedelta(0) if final else None)
    await pool.execute(
        """
        INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,
                                    finished_at, error_message, error_traceback, attempts,
                                    worker_id, task_data)
        VALUES ($1, split_part($2, ':', 2), $2, now() + $3::interval, $4,
                CASE WHEN $5::interval IS NULL THEN NULL ELSE now() - $5::interval END,
                $6, $7, CASE WHEN $4 = 'pending' THEN 0 ELSE 1 END, $8,
                '{"args": [1, 2], "kwargs": {}}'::jsonb)
        """,
        job_id,
        task,
        due,
        status,
        finished,
        error,
        traceback,
        worker_id,
    )
    return job_id


# -- status ----------------------------------------------------------------------------


async def test_status_table_and_json(pool, dsn, make_scheduler):
    empty = await cli(dsn, "status")
    assert empty.code == 0, empty.err
    assert "0 due" in empty.out and "No workers registered." in empty.out

    scheduler = await make_scheduler()
    await add_job(pool, "pending", task="mod:waiting", due=timedelta(minutes=-2))
    await add_job(pool, "pending", task="mod:waiting", due=timedelta(hours=1))
    await add_job(pool, "failed", task="mod:waiting", error="ValueError: x")
    await add_job(pool, "completed", task="mod:other")

    table = await cli(dsn, "status")
    assert table.code == 0, table.err
    assert "1 due (oldest waiting 2.0m), 1 scheduled" in table.out
    assert "Jobs by task" in table.out and "Workers" in table.out
    assert "Finished recently" in table.out
    waiting = next(line for line in table.out.splitlines() if "mod:waiting" in line)
    # due, scheduled, running, waiting, completed, failed, cancelled, expired
    assert [c for c in waiting.split() if c != "│"][1:] == ["1", "1", "0", "0", "0", "1", "0", "0"]
    assert scheduler.worker_id in table.out and "alive" in table.out
    assert "50.0%" in table.out  # failure rate: 1 failed of 2 finished

    data = (await cli(dsn, "status", "--json")).json()
    assert data["counts"]["pending"] == 2 and data["due"] == 1
    assert data["live_workers"] == 1
    assert data["workers"][0]["worker_id"] == scheduler.worker_id
    assert data["windows"][0]["failure_rate"] == 0.5


# -- jobs --------------------------------------------------------------------------------


async def test_jobs_list_and_filters(pool, dsn):
    failed = await add_job(pool, "failed", task="mod:a", error="RuntimeError: nope\nmore")
    old_failed = await add_job(pool, "failed", task="mod:a", finished_ago=timedelta(days=3))
    done = await add_job(pool, "completed", task="mod:b")
    pending = await add_job(pool, "pending", task="mod:b", due=timedelta(hours=2))

    listing = await cli(dsn, "jobs")
    assert listing.code == 0, listing.err
    for job_id in (failed, old_failed, done, pending):
        assert job_id in listing.out
    assert "RuntimeError: nope" in listing.out and "more" not in listing.out
    # Most recently changed first: the future one leads.
    assert listing.out.index(pending) < listing.out.index(failed) < listing.out.index(old_failed)

    only_failed = (await cli(dsn, "jobs", "--status", "failed", "--json")).json()
    assert {j["job_id"] for j in only_failed} == {failed, old_failed}
    assert {j["error"] for j in only_failed} == {"RuntimeError: nope\nmore", None}

    recent = (await cli(dsn, "jobs", "--status", "failed", "--since", "1h", "--json")).json()
    assert [j["job_id"] for j in recent] == [failed]
    before = (await cli(dsn, "jobs", "--until", "1d", "--json")).json()
    assert [j["job_id"] for j in before] == [old_failed]
    iso = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    assert len((await cli(dsn, "jobs", "--since", iso, "--json")).json()) == 3

    by_task = (await cli(dsn, "jobs", "--task", "mod:b", "--json")).json()
    assert {j["job_id"] for j in by_task} == {done, pending}
    statuses = ("--status", "completed", "--status", "pending")
    assert len((await cli(dsn, "jobs", *statuses, "--json")).json()) == 2

    limited = await cli(dsn, "jobs", "--limit", "1")
    assert limited.code == 0 and "(first 1; use --limit for more)" in limited.out

    none = await cli(dsn, "jobs", "--task", "nothing")
    assert none.code == 0 and "No jobs match." in none.out


async def test_jobs_show_one_with_error_and_traceback(pool, dsn):
    trace = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: [bad]'
    job_id = await add_job(pool, "failed", error="ValueError: [bad]", traceback=trace)
    shown = await cli(dsn, "jobs", job_id)
    assert shown.code == 0, shown.err
    assert job_id in shown.out and "failed" in shown.out
    assert "ValueError: [bad]" in shown.out
    assert "traceback" in shown.out and 'File "x.py", line 1' in shown.out
    assert "[1, 2]" in shown.out  # args

    data = (await cli(dsn, "jobs", job_id, "--json")).json()
    assert data["job_id"] == job_id and data["traceback"] == trace and data["args"] == [1, 2]


async def test_jobs_show_the_batch_a_job_ran_in(pool, dsn):
    batch = str(uuid.uuid4())
    first, second = [await add_job(pool, "completed") for _ in range(2)]
    plain = await add_job(pool, "completed")
    alone = await add_job(pool, "failed", error="ValueError: bounced")
    await pool.execute(
        "INSERT INTO scheduler_batches (batch_id, task_name, queue, batch_size, job_ids)"
        " VALUES ($1, 't', 'default', 2, $2::text[])",
        batch,
        [first, second],
    )
    await pool.execute(
        "INSERT INTO scheduler_batches (batch_id, task_name, queue, batch_size, job_ids)"
        " VALUES (gen_random_uuid(), 't', 'default', 1, ARRAY[$1])",
        alone,
    )
    shown = await cli(dsn, "jobs", first)
    assert shown.code == 0, shown.err
    [line] = [row for row in shown.out.splitlines() if row.split()[:1] == ["batch"]]
    assert line.split(maxsplit=1)[1].strip() == f"{batch} (2 jobs)"
    single = await cli(dsn, "jobs", alone)
    assert single.code == 0 and "(1 job)" in single.out
    unmarked = await cli(dsn, "jobs", plain)
    assert unmarked.code == 0 and not any(
        row.split()[:1] == ["batch"] for row in unmarked.out.splitlines()
    )

    data = (await cli(dsn, "jobs", first, "--json")).json()
    assert (data["batch_id"], data["batch_size"]) == (batch, 2)
    data = (await cli(dsn, "jobs", plain, "--json")).json()
    assert (data["batch_id"], data["batch_size"]) == (None, None)
    # The jobs of one batch, listed.
    listed = (await cli(dsn, "jobs", "--batch", batch, "--json")).json()
    assert sorted(j["job_id"] for j in listed) == sorted([first, second])
    assert {(j["batch_id"], j["batch_size"]) for j in listed} == {(batch, 2)}
    other = (await cli(dsn, "jobs", "--batch", str(uuid.uuid4()), "--json")).json()
    assert other == []
    bad = await cli(dsn, "jobs", "--batch", "nope")
    assert bad.code == 2 and "not a batch id" in bad.err
    both = await cli(dsn, "jobs", first, "--batch", batch)
    assert both.code == 2 and "cannot be combined" in both.err
    # The first job retried in a later batch: that batch is its own now.
    later = str(uuid.uuid4())
    await pool.execute(
        "INSERT INTO scheduler_batches (batch_id, task_name, queue, started_at, batch_size,"
        " job_ids) VALUES ($1, 't', 'default', now() + interval '1 second', 1, ARRAY[$2])",
        later,
        first,
    )
    data = (await cli(dsn, "jobs", first, "--json")).json()
    assert (data["batch_id"], data["batch_size"]) == (later, 1)
    listed = (await cli(dsn, "jobs", "--batch", batch, "--json")).json()
    assert [j["job_id"] for j in listed] == [second]
    listed = (await cli(dsn, "jobs", "--batch", later, "--json")).json()
    assert [(j["job_id"], j["batch_id"]) for j in listed] == [(first, later)]


async def test_jobs_bad_arguments(dsn):
    unknown = await cli(dsn, "jobs", "no-such-job")
    assert unknown.code == 1 and "no job with id 'no-such-job'" in unknown.err
    bad_time = await cli(dsn, "jobs", "--since", "yesterday-ish")
    assert bad_time.code == 2 and "neither a duration" in bad_time.err
    bad_status = await cli(dsn, "jobs", "--status", "exploded")
    assert bad_status.code == 2 and "invalid choice" in bad_status.err
    bad_limit = await cli(dsn, "jobs", "--limit", "0")
    assert bad_limit.code == 2 and "must be > 0" in bad_limit.err
    mixed = await cli(dsn, "jobs", "some-id", "--status", "failed")
    assert mixed.code == 2 and "cannot be combined" in mixed.err


# -- retry ---------------------------------------------------------------------------------


async def test_retry_one_failed_job_runs_again(pool, dsn, make_scheduler):
    key = f"retry-{uuid.uuid4().hex[:6]}"
    app_tasks.calls[key].clear()
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(
        app_tasks.fail_times, execution_time=datetime.now(UTC), args=(key, 1)
    )
    await wait_for_status(pool, job_id, "failed")

    result = await cli(dsn, "retry", job_id)
    assert result.code == 0, result.err
    assert f"retried 1 job(s): {job_id}" in result.out
    await wait_for_status(pool, job_id, "completed")
    job = await scheduler.get_job(job_id)
    assert job.attempts == 2 and job.result == "ok"

    again = await cli(dsn, "retry", job_id)
    assert again.code == 1
    assert f"job '{job_id}' is completed; only failed, cancelled, expired" in again.err


async def test_retry_all_failed_by_task(pool, dsn):
    a1 = await add_job(pool, "failed", task="mod:a")
    a2 = await add_job(pool, "failed", task="mod:a")
    b1 = await add_job(pool, "failed", task="mod:b")
    done = await add_job(pool, "completed", task="mod:a")
    result = await cli(dsn, "retry", "--failed", "--task", "mod:a", "--json", "--yes")
    assert result.code == 0, result.err
    assert sorted(result.json()["retried"]) == sorted([a1, a2])
    rows = await pool.fetch(
        "SELECT job_id, status, finished_at, execution_time <= now() AS due FROM scheduled_jobs"
    )
    state = {r["job_id"]: (r["status"], r["finished_at"] is None, r["due"]) for r in rows}
    assert state[a1] == state[a2] == ("pending", True, True)
    assert state[b1][0] == "failed" and state[done][0] == "completed"
    rest = await cli(dsn, "retry", "--failed", "-y")
    assert rest.code == 0 and rest.out.strip() == f"retried 1 job(s): {b1}"
    nothing = await cli(dsn, "retry", "--failed")
    assert nothing.code == 0 and nothing.out.strip() == "retried 0 job(s)"


async def test_retry_bad_arguments(pool, dsn):
    cancelled = await add_job(pool, "cancelled")
    mixed = await cli(dsn, "retry", "no-such-job", cancelled)
    assert mixed.code == 1
    assert "no job with id 'no-such-job'" in mixed.err
    assert await job_status(pool, cancelled) == "pending"  # the valid one still retried
    neither = await cli(dsn, "retry")
    assert neither.code == 2 and "give JOB_ID(s) or --failed" in neither.err
    both = await cli(dsn, "retry", cancelled, "--failed")
    assert both.code == 2
    task_alone = await cli(dsn, "retry", cancelled, "--task", "x")
    assert task_alone.code == 2 and "--task only goes with --failed" in task_alone.err


# -- cancel --------------------------------------------------------------------------------


async def test_cancel_pending_then_errors(pool, dsn):
    job_id = await add_job(pool, "pending", due=timedelta(hours=1))
    result = await cli(dsn, "cancel", job_id)
    assert result.code == 0 and result.out.strip() == f"cancelled {job_id}"
    assert await job_status(pool, job_id) == "cancelled"
    again = await cli(dsn, "cancel", job_id)
    assert again.code == 1 and "is already cancelled" in again.err
    unknown = await cli(dsn, "cancel", "no-such-job", "--json")
    assert unknown.code == 1 and "no job with id 'no-such-job'" in unknown.err
    assert unknown.out == ""
    missing = await cli(dsn, "cancel")
    assert missing.code == 2


async def test_cancel_running_job_stops_it_on_its_worker(pool, dsn, make_scheduler):
    key = f"cancel-{uuid.uuid4().hex[:6]}"
    app_tasks.calls[key].clear()
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(
        app_tasks.sleep_for, execution_time=datetime.now(UTC), args=(key, 30)
    )
    await wait_until(lambda: "start" in app_tasks.calls[key], message="job started")
    result = await cli(dsn, "cancel", job_id, "--json")
    assert result.code == 0 and result.json() == {"cancelled": job_id}
    await wait_until(lambda: "finally" in app_tasks.calls[key], message="coroutine cancelled")
    assert await job_status(pool, job_id) == "cancelled"


# -- vacuum --------------------------------------------------------------------------------


async def test_vacuum_default_and_chosen_policies(pool, dsn):
    old = await add_job(pool, "completed", finished_ago=timedelta(days=2))
    fresh = await add_job(pool, "completed")
    failed = await add_job(pool, "failed", finished_ago=timedelta(days=2))
    result = await cli(dsn, "vacuum", "--yes")
    assert result.code == 0, result.err
    assert "Deleted" in result.out and "completed" in result.out
    remaining = {r["job_id"] for r in await pool.fetch("SELECT job_id FROM scheduled_jobs")}
    assert remaining == {fresh, failed}

    chosen = await cli(
        dsn,
        "vacuum",
        "--completed",
        "immediate",
        "--failed",
        "keep:0",
        "--json",
        "--track-metrics",
        "--yes",
    )
    assert chosen.code == 0, chosen.err
    assert chosen.json() == {"deleted": {"completed": 1, "failed": 1, "cancelled": 0, "expired": 0}}
    assert old not in remaining
    stats = await pool.fetchrow("SELECT * FROM vacuum_stats WHERE stat_date = CURRENT_DATE")
    assert stats["deleted_completed"] == 1 and stats["worker_id"].startswith("cli-")


async def test_vacuum_busy_and_bad_policy(pool, dsn):
    async with pool.acquire() as conn:
        assert await conn.fetchval("SELECT pg_try_advisory_lock($1)", VACUUM_LOCK_KEY)
        try:
            busy = await cli(dsn, "vacuum")
        finally:
            await conn.execute("SELECT pg_advisory_unlock($1)", VACUUM_LOCK_KEY)
    assert busy.code == 3 and "another process is vacuuming" in busy.err
    bad = await cli(dsn, "vacuum", "--completed", "sometimes")
    assert bad.code == 2 and "is not a policy" in bad.err
    negative = await cli(dsn, "vacuum", "--failed", "days:-1")
    assert negative.code == 2


# -- errors shared by every command --------------------------------------------------------


async def test_database_errors_are_one_line(dsn, server_dsn):
    refused = await cli("postgresql://nobody@127.0.0.1:1/none", "status")
    assert refused.code == 1 and refused.err.startswith("error: cannot connect to PostgreSQL")
    name = f"pgs_empty_{uuid.uuid4().hex[:6]}"
    admin = await asyncpg.connect(server_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        empty_db = with_database(server_dsn, name)
        missing = await cli(empty_db, "jobs")
        assert missing.code == 1 and "run `pg-scheduler migrate`" in missing.err
    finally:
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()


def test_entry_point_exit_codes(dsn):
    env = {**os.environ, "PG_SCHEDULER_DSN": dsn}
    command = [sys.executable, "-m", "pg_scheduler.cli"]
    ok = subprocess.run([*command, "status", "--json"], env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "counts" in json.loads(ok.stdout)
    unknown = subprocess.run([*command, "jobs", "nope"], env=env, capture_output=True, text=True)
    assert unknown.returncode == 1 and unknown.stderr.strip() == "error: no job with id 'nope'"
    usage = subprocess.run([*command, "retry"], env=env, capture_output=True, text=True)
    assert usage.returncode == 2


# -- periodic ------------------------------------------------------------------------------


async def add_periodic(pool, key: str, name: str, enabled: bool = True) -> None:
    await pool.execute(
        """
        INSERT INTO periodic_jobs (dedup_key, job_name, task_name, schedule, enabled,
                                   code_enabled, next_run)
        VALUES ($1, $2, 'periodic:' || $1, 'every 3600s', $3, true, now() + interval '1 hour')
        """,
        key,
        name,
        enabled,
    )


async def test_periodic_list_enable_disable(pool, dsn):
    empty = await cli(dsn, "periodic", "list")
    assert empty.code == 0 and "No periodic jobs stored" in empty.out
    await add_periodic(pool, "key-a", "report")
    await add_periodic(pool, "key-b", "cleanup", enabled=False)
    await add_periodic(pool, "key-c", "cleanup")

    listing = await cli(dsn, "periodic", "list")
    assert listing.code == 0, listing.err
    assert "key-a" in listing.out and "every 3600s" in listing.out
    row_b = next(line for line in listing.out.splitlines() if "key-b" in line)
    assert "NO" in row_b

    disabled = await cli(dsn, "periodic", "disable", "report")  # by unique job name
    assert disabled.code == 0 and disabled.out.strip() == "disabled report (key-a)"
    assert (
        await pool.fetchval("SELECT enabled FROM periodic_jobs WHERE dedup_key = 'key-a'") is False
    )
    enabled = await cli(dsn, "periodic", "enable", "key-b", "--json")
    assert enabled.code == 0 and enabled.json()["enabled"] is True
    data = (await cli(dsn, "periodic", "list", "--json")).json()
    assert {r["dedup_key"]: r["enabled"] for r in data} == {
        "key-a": False,
        "key-b": True,
        "key-c": True,
    }

    unknown = await cli(dsn, "periodic", "enable", "nope")
    assert unknown.code == 1 and "no periodic job with dedup key or job name 'nope'" in unknown.err
    ambiguous = await cli(dsn, "periodic", "disable", "cleanup")
    assert ambiguous.code == 1 and "ambiguous" in ambiguous.err and "key-b" in ambiguous.err
    no_action = await cli(dsn, "periodic")
    assert no_action.code == 2
    no_key = await cli(dsn, "periodic", "enable")
    assert no_key.code == 2


def test_periodic_trigger_needs_the_app(dsn):
    env = {**os.environ, "PG_SCHEDULER_DSN": dsn, "PYTHONPATH": child_pythonpath()}
    command = [sys.executable, "-m", "pg_scheduler.cli", "--log-level", "warning", "periodic"]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*command, *args], env=env, capture_output=True, text=True)

    async def store_row() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("DELETE FROM periodic_jobs WHERE dedup_key = 'cli-ops-hourly'")
            await conn.execute(
                """
                INSERT INTO periodic_jobs (dedup_key, job_name, task_name, schedule)
                VALUES ('cli-ops-hourly', 'cli_ops_hourly', 'periodic:cli-ops-hourly',
                        'every 3600s')
                """
            )
        finally:
            await conn.close()

    asyncio.run(store_row())
    without = run("trigger", "cli-ops-hourly")
    assert without.returncode == 2 and "pass --app MODULE" in without.stderr
    triggered = run(
        "trigger", "cli_ops_hourly", "--app", "tests.support.cli_ops_periodic_app", "--json"
    )
    assert triggered.returncode == 0, triggered.stderr
    job_id = json.loads(triggered.stdout)["job_id"]
    assert "cli-ops-hourly" in job_id

    async def job_row() -> asyncpg.Record:
        conn = await asyncpg.connect(dsn)
        try:
            return await conn.fetchrow(
                "SELECT status, task_name, execution_time <= now() AS due "
                "FROM scheduled_jobs WHERE job_id = $1",
                job_id,
            )
        finally:
            await conn.close()

    row = asyncio.run(job_row())
    assert row["status"] == "pending" and row["due"]
    assert row["task_name"] == "periodic:cli-ops-hourly"


def test_metrics_command_serves_until_interrupted(dsn):
    import signal
    import urllib.request

    env = {**os.environ, "PG_SCHEDULER_DSN": dsn}
    command = [sys.executable, "-m", "pg_scheduler.cli", "--log-level", "warning", "metrics"]
    missing = subprocess.run(command, env=env, capture_output=True, text=True)
    assert missing.returncode == 2 and "--port" in missing.stderr
    server = subprocess.Popen(
        [*command, "--port", "0", "--addr", "127.0.0.1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = server.stdout.readline()
        assert line.startswith("serving metrics on http://127.0.0.1:"), server.stderr.read()
        url = line.split()[-1]
        with urllib.request.urlopen(url, timeout=5) as response:
            assert "pg_scheduler_stats_up 1.0" in response.read().decode()
    finally:
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=10) == 0
