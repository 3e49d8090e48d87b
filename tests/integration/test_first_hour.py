"""A new user's first hour: a quiet library, and the README's Quick start as written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def data_home() -> Iterator[Path]:
    """An $XDG_DATA_HOME outside pytest's tmp_path: as root, pgserver runs PostgreSQL as
    another user, and a concurrent pytest session resets its base temp dir to 0700."""
    path = Path(tempfile.mkdtemp(prefix="pgs-home-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


ROOT = Path(__file__).resolve().parents[2]

# An application that never configures logging: ten jobs, plus one job of a
# task nobody runs, checked for three times.
QUIET_APP = textwrap.dedent(
    """
    import asyncio, os, sys
    from datetime import UTC, datetime

    import asyncpg
    from pg_scheduler import Scheduler, task

    @task(name="quiet.double")
    async def double(x: int) -> int:
        return 2 * x

    async def main() -> None:
        pool = await asyncpg.create_pool(os.environ["APP_DSN"])
        scheduler = Scheduler(pool, heartbeat_interval=0.2, rescue_interval=0.3)
        await scheduler.start()
        try:
            now = datetime.now(UTC)
            ids = [
                await scheduler.schedule(double, execution_time=now, args=(i,))
                for i in range(10)
            ]
            for _ in range(2):
                await scheduler.load_task_functions()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while True:
                jobs = [await scheduler.get_job(i) for i in ids]
                if all(j.status.value == "completed" for j in jobs):
                    break
                if loop.time() > deadline:
                    sys.exit("jobs did not complete: " + repr([j.status for j in jobs]))
                await asyncio.sleep(0.05)
        finally:
            await scheduler.shutdown()
            await pool.close()

    asyncio.run(main())
    """
)


def run_app(code: str, dsn: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "APP_DSN": dsn, "PYTHONPATH": str(ROOT)}
    env.pop("PG_SCHEDULER_DSN", None)
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


async def test_unconfigured_app_prints_nothing_for_ten_jobs(pool, dsn):
    result = run_app(QUIET_APP, dsn)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == "" and result.stderr == ""


async def test_no_live_worker_warning_once_per_process(pool, dsn):
    await pool.execute(
        """INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,
                                       task_data)
           VALUES ('orphan-1', 'nobody', 'nobody.runs:this', now(), 'pending',
                   '{"args": [], "kwargs": {}}'::jsonb)"""
    )
    result = run_app(QUIET_APP, dsn)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert "no live worker" in lines[0] and "nobody.runs:this" in lines[0]


# -- the README's Quick start, verbatim ------------------------------------------------------


def quick_start_code() -> str:
    """The first ``python`` code block under "## Quick start" in README.md."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```python\n", 1)[1].split("\n```", 1)[0] + "\n"


EXPECTED = "sent 'Welcome!' to user@example.com\n"


def run_quick_start(tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    script = tmp_path / "quickstart.py"
    script.write_text(quick_start_code())
    return subprocess.run(
        [sys.executable, str(script)],
        env={**env, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_quick_start_runs_as_written(tmp_path, pool, dsn):
    code = quick_start_code()
    assert "asyncio.run(main())" in code and "Event().wait()" not in code
    assert "await scheduler.result(job_id" in code  # awaited, not polled
    result = run_quick_start(tmp_path, {**os.environ, "PG_SCHEDULER_DSN": dsn})
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == EXPECTED and result.stderr == ""


def test_quick_start_without_a_dsn_uses_the_embedded_database(tmp_path, data_home):
    env = {k: v for k, v in os.environ.items() if k != "PG_SCHEDULER_DSN"}
    env["XDG_DATA_HOME"] = str(data_home)
    result = run_quick_start(tmp_path, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == EXPECTED
    # The same data directory as the CLI's, and the server stopped with the script.
    pgdata = data_home / "pg-scheduler" / "pgdata"
    assert (pgdata / "PG_VERSION").is_file()
    from pg_scheduler.embedded import is_running

    assert not is_running(pgdata)
