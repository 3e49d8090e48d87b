"""The library logs through stdlib ``logging`` loggers named ``pg_scheduler.*``:
left unconfigured, warnings reach stderr (Python's last-resort handler) and
nothing reaches stdout; an application that configures logging gets the
library's lines through its own handlers."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support.common import child_env


def run_app(dsn: str, mode: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.logging_app", mode],
        env=child_env(dsn),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done


def test_unconfigured_logging_writes_warnings_to_stderr_and_nothing_to_stdout(dsn, pool):
    done = run_app(dsn, "unconfigured")
    assert done.stdout == ""
    assert "no worker has registered" in done.stderr
    assert "task=nobody.registered:this" in done.stderr
    # Below WARNING stays quiet until the application configures logging.
    assert "job completed" not in done.stderr and "job started" not in done.stderr


def test_an_app_that_configures_logging_gets_the_librarys_lines(dsn, pool):
    done = run_app(dsn, "basicConfig")
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert records and all(r["logger"].startswith("pg_scheduler.") for r in records)
    warnings = [r for r in records if r["level"] == "WARNING"]
    assert any(
        "no worker has registered" in r["message"] and "nobody.registered:this" in r["message"]
        for r in warnings
    ), records
    # basicConfig(level=INFO) asked for INFO: the job's own lines arrive too.
    assert any(r["level"] == "INFO" for r in records), records
    # Its handler took them all: nothing went to the last-resort handler.
    assert "no worker has registered" not in done.stderr
