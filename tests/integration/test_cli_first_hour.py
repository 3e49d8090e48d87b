"""The operations CLI: options anywhere, --watch, one JSON shape per job,
unwrapped ids, dry runs and confirmations, the embedded DSN, tables without rich."""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import asyncpg
import pytest

from tests.integration.test_cli_ops import _keep_test_logging, _run, add_job, cli  # noqa: F401


@pytest.fixture
def data_home() -> Iterator[Path]:
    """An $XDG_DATA_HOME outside pytest's tmp_path: as root, pgserver runs PostgreSQL as
    another user, and a concurrent pytest session resets its base temp dir to 0700."""
    path = Path(tempfile.mkdtemp(prefix="pgs-home-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


ROOT = Path(__file__).resolve().parents[2]


async def run(*argv: str):
    return await asyncio.to_thread(_run, list(argv))


def assert_iso_utc(value: str) -> None:
    assert value.endswith("Z"), value
    assert datetime.fromisoformat(value).utcoffset() == timedelta(0)


# -- global options -----------------------------------------------------------------------


async def test_global_options_after_the_command(pool, dsn):
    await add_job(pool, "failed", task="mod:after")
    after = await run("status", "--json", "--dsn", dsn, "--log-level", "warning")
    assert after.code == 0, after.err
    assert after.json()["counts"]["failed"] == 1
    nested = await run("periodic", "list", "--json", "--dsn", dsn, "--schema", "public")
    assert nested.code == 0, nested.err and nested.json() == []
    before = await run("--dsn", dsn, "jobs", "--json")
    assert before.code == 0 and len(before.json()) == 1
    # A value after the command is used, not a default: a bad DSN there must fail.
    refused = await run("--dsn", dsn, "status", "--dsn", "postgresql://nobody@127.0.0.1:1/x")
    assert refused.code == 1 and refused.err.startswith("error: cannot connect to PostgreSQL")


# -- status --watch -----------------------------------------------------------------------


async def test_status_watch_redraws_then_stops(pool, dsn):
    await add_job(pool, "pending", task="mod:watched")
    frames = await cli(dsn, "status", "--watch", "--interval", "0.05", "--iterations", "3")
    assert frames.code == 0, frames.err
    assert frames.out.count("Jobs by task") == 3
    # Each frame lists it twice: by task, and as orphaned (due, and no worker runs it).
    assert frames.out.count("Orphaned jobs") == 3 and frames.out.count("mod:watched") == 6
    lines = await cli(dsn, "status", "--watch", "--json", "--interval", "0.05", "--iterations", "2")
    assert lines.code == 0, lines.err
    documents = [json.loads(line) for line in lines.out.splitlines()]
    assert len(documents) == 2 and all(d["counts"]["pending"] == 1 for d in documents)
    bad = await cli(dsn, "status", "--watch", "--interval", "0")
    assert bad.code == 2 and "must be > 0" in bad.err


def test_status_watch_ends_cleanly_on_ctrl_c(dsn):
    env = {**os.environ, "PG_SCHEDULER_DSN": dsn, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-m", "pg_scheduler.cli", "status", "--watch", "--interval", "0.1"],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # Synchronise on output: two frames drawn means the watch loop is running.
        seen = 0
        deadline = time.monotonic() + 30
        while seen < 2:
            line = process.stdout.readline()
            assert line and time.monotonic() < deadline, "no frames"
            seen += "Jobs by task" in line
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, err
    assert "Traceback" not in err


# -- JSON and tables ----------------------------------------------------------------------


async def test_one_json_shape_per_job(pool, dsn):
    job_id = await add_job(pool, "failed", task="mod:shape", error="ValueError: x")
    listing = (await cli(dsn, "jobs", "--json")).json()
    detail = (await cli(dsn, "jobs", job_id, "--json")).json()
    assert listing == [detail]
    assert detail["priority"] == "normal" and detail["status"] == "failed"
    assert detail["error"] == "ValueError: x" and detail["args"] == [1, 2]
    for key in ("execution_time", "created_at", "finished_at"):
        assert_iso_utc(detail[key])
    status = (await cli(dsn, "status", "--json")).json()
    assert_iso_utc(status["taken_at"])


async def test_job_ids_are_never_wrapped(pool, dsn, monkeypatch):
    long_id = "a-rather-long-job-identifier-0123456789abcdef"
    await add_job(pool, "failed", task="mod:narrow", job_id=long_id, error="E: " + "x" * 80)
    monkeypatch.setenv("COLUMNS", "50")
    table = await cli(dsn, "jobs")
    assert table.code == 0, table.err
    assert any(long_id in line for line in table.out.splitlines()), table.out
    assert "normal" in table.out  # the priority, by name


def _without_rich(argv: list[str], dsn: str) -> subprocess.CompletedProcess:
    code = (
        "import sys; sys.modules['rich'] = None\n"
        "from pg_scheduler.cli import main\n"
        f"sys.exit(main({argv!r}))"
    )
    env = {**os.environ, "PG_SCHEDULER_DSN": dsn, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )


async def test_status_and_jobs_without_rich(pool, dsn):
    job_id = await add_job(pool, "failed", task="mod:plain", error="RuntimeError: plain")
    status = await asyncio.to_thread(_without_rich, ["status"], dsn)
    assert status.returncode == 0, status.stderr
    assert "Jobs by task" in status.stdout and "│" not in status.stdout
    row = next(line for line in status.stdout.splitlines() if line.startswith("mod:plain"))
    assert row.split()[1:] == ["0", "0", "0", "0", "0", "1", "0", "0"]
    listing = await asyncio.to_thread(_without_rich, ["jobs"], dsn)
    assert listing.returncode == 0, listing.stderr
    header, rule, line = listing.stdout.splitlines()[:3]
    assert header.split()[:3] == ["job", "id", "task"] and set(rule) <= {"-", " "}
    assert line.split()[:3] == [job_id, "mod:plain", "failed"]
    detail = await asyncio.to_thread(_without_rich, ["jobs", job_id], dsn)
    assert detail.returncode == 0, detail.stderr
    assert f"job id      {job_id}" in detail.stdout and "RuntimeError: plain" in detail.stdout
    assert "[bold]" not in detail.stdout


# -- dry runs and confirmations -------------------------------------------------------------


async def _ids(pool) -> set[str]:
    return {r["job_id"] for r in await pool.fetch("SELECT job_id FROM scheduled_jobs")}


class _Terminal(io.StringIO):
    """stdin as a person at a terminal who types ``answer``."""

    def isatty(self) -> bool:
        return True


async def test_vacuum_dry_run_and_confirmation(pool, dsn, monkeypatch):
    await add_job(pool, "completed", finished_ago=timedelta(days=2))
    await add_job(pool, "failed", finished_ago=timedelta(days=10))
    keep = await add_job(pool, "completed")
    before = await _ids(pool)

    dry = await cli(dsn, "vacuum", "--dry-run", "--json")
    assert dry.code == 0, dry.err
    assert dry.json()["would_delete"] == {"completed": 1, "failed": 1, "cancelled": 0, "expired": 0}
    table = await cli(dsn, "vacuum", "--dry-run", "--completed", "immediate")
    assert "Would delete" in table.out and await _ids(pool) == before

    refused = await cli(dsn, "vacuum")  # stdin is not a terminal, no --yes
    assert refused.code == 2 and "refusing without confirmation" in refused.err
    assert "--yes" in refused.err and refused.out == ""
    assert await _ids(pool) == before

    monkeypatch.setattr(sys, "stdin", _Terminal("n\n"))
    declined = await cli(dsn, "vacuum")
    assert declined.code == 2 and "aborted" in declined.err
    assert "delete 2 finished job(s) (1 completed, 1 failed)? [y/N]" in declined.err
    assert await _ids(pool) == before

    monkeypatch.setattr(sys, "stdin", _Terminal("y\n"))
    accepted = await cli(dsn, "vacuum", "--json")
    assert accepted.code == 0, accepted.err
    assert accepted.json()["deleted"]["completed"] == 1
    assert await _ids(pool) == {keep}


async def test_retry_failed_needs_confirmation(pool, dsn):
    failed = await add_job(pool, "failed", task="mod:r")
    dry = await cli(dsn, "retry", "--failed", "--dry-run", "--json")
    assert dry.code == 0 and dry.json() == {"would_retry": [failed], "dry_run": True}
    refused = await cli(dsn, "retry", "--failed")
    assert refused.code == 2 and "refusing without confirmation" in refused.err
    assert await pool.fetchval("SELECT status FROM scheduled_jobs") == "failed"
    one = await cli(dsn, "retry", failed)  # a named job needs no confirmation
    assert one.code == 0 and await pool.fetchval("SELECT status FROM scheduled_jobs") == "pending"


# -- pg-scheduler dsn -------------------------------------------------------------------------


def test_dsn_prints_the_embedded_database(data_home):
    env = {k: v for k, v in os.environ.items() if k != "PG_SCHEDULER_DSN"}
    env["XDG_DATA_HOME"] = str(data_home)
    command = [sys.executable, "-m", "pg_scheduler.cli"]
    try:
        first = subprocess.run(
            [*command, "dsn"], env=env, capture_output=True, text=True, timeout=120
        )
        assert first.returncode == 0, first.stderr
        dsn = first.stdout.strip()
        assert dsn.startswith("postgresql://") and len(first.stdout.splitlines()) == 1
        assert (data_home / "pg-scheduler" / "pgdata" / "PG_VERSION").is_file()

        async def query() -> int:
            conn = await asyncpg.connect(dsn)  # still running after the command exited
            try:
                return await conn.fetchval("SELECT 1")
            finally:
                await conn.close()

        assert asyncio.run(query()) == 1
        # Another command on the embedded database leaves the server running.
        migrate = subprocess.run(
            [*command, "migrate"], env=env, capture_output=True, text=True, timeout=120
        )
        assert migrate.returncode == 0, migrate.stderr
        again = subprocess.run(
            [*command, "dsn"], env=env, capture_output=True, text=True, timeout=120
        )
        assert again.stdout == first.stdout
        assert asyncio.run(query()) == 1
    finally:
        stop = subprocess.run(
            [*command, "dsn", "--stop"], env=env, capture_output=True, text=True, timeout=120
        )
    assert stop.returncode == 0, stop.stderr
    from pg_scheduler.embedded import is_running

    assert not is_running(data_home / "pg-scheduler" / "pgdata")
