"""The ``pg-scheduler`` command: migrate, demo, worker argument errors."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from pg_scheduler.cli.run import load_app


@pytest.fixture
def data_home() -> Iterator[Path]:
    """An $XDG_DATA_HOME outside pytest's tmp_path: as root, pgserver runs PostgreSQL as
    another user, and a concurrent pytest session resets its base temp dir to 0700."""
    path = Path(tempfile.mkdtemp(prefix="pgs-home-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


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


def demo_rows(out: str) -> list[list[str]]:
    """The demo table's rows, split into job, status, attempt, ms and the rest."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["job", "status"])
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append(line.split(None, 4))
    return rows


def test_demo_shows_every_kind_of_job(dsn):
    result = cli("demo", "--seconds", "7", dsn=dsn)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    rows = demo_rows(out)
    # One name per job, the periodic one included; no log lines inside the table.
    assert {r[0] for r in rows} == {"greet", "flaky", "heartbeat"}, out
    assert result.stderr == "" and "[warning" not in out and "[info" not in out
    completed = [r for r in rows if r[1] == "completed"]
    # Durations in milliseconds with one decimal, never in scientific notation.
    assert completed and all(re.fullmatch(r"\d+\.\d", r[3]) for r in completed), out
    assert "e-0" not in out
    assert any(r[0] == "greet" and r[4] == '"hello, Ada"' for r in completed)
    assert any(
        r[:3] == ["flaky", "pending", "1"] and "will retry: ConnectionError" in r[4] for r in rows
    )
    assert any(r[0] == "flaky" and r[4] == '"succeeded on attempt 3"' for r in completed)
    assert any(r[0] == "heartbeat" for r in completed)  # the periodic job ran
    assert any(r[4] == '"hello, later"' for r in completed)  # the delayed job ran
    tail = out.split("demo: done")[1]
    assert "pg-scheduler status --watch" in tail
    # The next commands as they can be typed here: the virtualenv's path
    # when pg-scheduler is not what the shell finds.
    typed = re.search(r"^\s+(\S*pg-scheduler) dashboard$", tail, re.M)
    assert typed is not None, tail
    assert shutil.which(typed[1]) is not None, typed[1]


def test_worker_argument_errors():
    with pytest.raises(SystemExit, match="cannot import 'no_such_module_xyz'"):
        load_app("no_such_module_xyz")
    with pytest.raises(SystemExit, match="has no attribute 'NOPE'"):
        load_app("tests.support.app_tasks:NOPE")
    with pytest.raises(SystemExit, match="function taking no arguments"):
        load_app("tests.support.app_tasks:record")
    with pytest.raises(SystemExit, match="must be a dict"):
        load_app("tests.support.mp_tasks:_pool")
    assert load_app("tests.support.mp_tasks:SETTINGS")["max_concurrent_jobs"] == 20
    result = cli("worker")
    assert result.returncode == 2 and "MODULE[:ATTR]" in result.stderr


def test_help_lists_commands():
    result = cli("--help")
    assert result.returncode == 0
    for command in ("worker", "migrate", "demo"):
        assert command in result.stdout


def test_demo_without_a_dsn_uses_the_embedded_database(data_home):
    env = {k: v for k, v in os.environ.items() if k != "PG_SCHEDULER_DSN"}
    env["XDG_DATA_HOME"] = str(data_home)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pg_scheduler.cli",
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
    assert any(r[:2] == ["greet", "completed"] for r in demo_rows(result.stdout))
    # The data stays in the per-user directory for the next run.
    assert (data_home / "pg-scheduler" / "pgdata" / "PG_VERSION").is_file()
