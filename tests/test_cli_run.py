"""The ``pg-scheduler`` command: migrate, demo, worker argument errors."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pg_scheduler.cli.run import load_app


def cli(*args: str, dsn: str | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if dsn:
        env["PG_SCHEDULER_DSN"] = dsn
    return subprocess.run(
        [sys.executable, "-m", "pg_scheduler.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_migrate_reports_up_to_date(dsn):
    result = cli("migrate", dsn=dsn)
    assert result.returncode == 0, result.stderr
    assert "schema is up to date" in result.stdout


def test_demo_shows_every_kind_of_job(dsn):
    result = cli("--log-level", "warning", "demo", "--seconds", "7", dsn=dsn)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "greet            completed" in out
    assert "flaky            pending    attempt 1  ConnectionError" in out  # failed, will retry
    assert "succeeded on attempt 3" in out  # ...and retried to success
    assert "demo_heartbeat   completed" in out  # the periodic job ran
    assert '"hello, later"' in out  # the delayed job ran
    assert out.rstrip().endswith("demo: done")


def test_worker_argument_errors():
    with pytest.raises(SystemExit, match="cannot import 'no_such_module_xyz'"):
        load_app("no_such_module_xyz")
    with pytest.raises(SystemExit, match="has no attribute 'NOPE'"):
        load_app("app_tasks:NOPE")
    with pytest.raises(SystemExit, match="function taking no arguments"):
        load_app("app_tasks:record")
    with pytest.raises(SystemExit, match="must be a dict"):
        load_app("mp_tasks:_pool")
    assert load_app("mp_tasks:SETTINGS")["max_concurrent_jobs"] == 20
    result = cli("worker")
    assert result.returncode == 2 and "MODULE[:ATTR]" in result.stderr


def test_help_lists_commands():
    result = cli("--help")
    assert result.returncode == 0
    for command in ("worker", "migrate", "demo"):
        assert command in result.stdout


def test_demo_without_a_dsn_uses_the_embedded_database(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PG_SCHEDULER_DSN"}
    env["XDG_DATA_HOME"] = str(tmp_path)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pg_scheduler.cli",
            "--log-level",
            "warning",
            "demo",
            "--seconds",
            "3",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "greet            completed" in result.stdout
    # The data stays in the per-user directory for the next run.
    assert (tmp_path / "pg-scheduler" / "pgdata" / "PG_VERSION").is_file()
