"""A first run's failures end in one line naming what failed and what to do,
never a traceback: no server at the DSN, no embedded PostgreSQL without a DSN,
a role missing USAGE on the schema or SELECT on the migrations table (which
``start()`` raises as the documented PermissionError, naming the grant)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from pg_scheduler import Scheduler

# The schema tests' database (two migrated schemas), its owner and a bare role.
from tests.integration.test_schema import WORKER_GRANTS, A, as_role, db, owner, role  # noqa: F401
from tests.support.common import FAST, child_env


def cli(dsn: str, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pg_scheduler.cli", *argv],
        env=env or child_env(dsn),
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1, done.stderr
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


@pytest.mark.parametrize("command", [["worker", "tests.support.app_tasks"], ["status"]])
def test_a_refused_connection_is_one_line_naming_host_and_port(dsn, command):
    done = cli(dsn, "--dsn", "postgresql://nobody@127.0.0.1:1/nothing", *command)
    line = one_line(done)
    assert line.startswith("error: cannot connect to PostgreSQL at 127.0.0.1:1")
    assert "connection refused" in line and "--dsn" in line


@pytest.fixture
def without_pgserver(tmp_path: Path, dsn: str) -> dict[str, str]:
    """An environment where ``import pgserver`` fails, and no DSN is set."""
    shadow = tmp_path / "pgserver"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'pgserver'\")\n")
    env = child_env(dsn)
    del env["PG_SCHEDULER_DSN"]
    env["PYTHONPATH"] = f"{tmp_path}:{env['PYTHONPATH']}"
    return env


@pytest.mark.parametrize("command", [["status"], ["demo", "--seconds", "1"], ["dashboard"]])
def test_no_dsn_and_no_embedded_extra_is_one_line(dsn, without_pgserver, command):
    line = one_line(cli(dsn, *command, env=without_pgserver))
    assert "embedded PostgreSQL is not installed" in line
    assert "PG_SCHEDULER_DSN" in line and "pip install -e '.[embedded]'" in line


async def test_start_names_usage_on_the_schema_before_reading_migrations(owner, db, role):  # noqa: F811
    pool = await asyncpg.create_pool(as_role(db, role), min_size=1, max_size=4)
    try:
        scheduler = Scheduler(pool, schema=A, **FAST)
        # With no grant at all, both are named.
        expected = rf"{role} lacks USAGE on schema {A}, SELECT on {A}\.pg_scheduler_migrations;"
        with pytest.raises(PermissionError, match=expected):
            await scheduler.start()
        assert not scheduler.is_running
    finally:
        await pool.close()
    done = cli(db, "--dsn", as_role(db, role), "--schema", A, "worker", "tests.support.app_tasks")
    line = one_line(done)
    assert f"lacks USAGE on schema {A}" in line and "the worker did not start" in line
    assert "grant them" in line


async def test_start_names_select_on_the_migrations_table(owner, db, role):  # noqa: F811
    await owner.execute(WORKER_GRANTS.format(schema=A, role=role))
    await owner.execute(f"REVOKE SELECT ON {A}.pg_scheduler_migrations FROM {role}")
    pool = await asyncpg.create_pool(as_role(db, role), min_size=1, max_size=4)
    try:
        scheduler = Scheduler(pool, schema=A, **FAST)
        with pytest.raises(
            PermissionError, match=rf"lacks SELECT on {A}\.pg_scheduler_migrations;"
        ):
            await scheduler.start()
    finally:
        await pool.close()
    done = cli(db, "--dsn", as_role(db, role), "--schema", A, "worker", "tests.support.app_tasks")
    assert f"SELECT on {A}.pg_scheduler_migrations" in one_line(done)


def test_the_fastapi_example_falls_back_to_the_embedded_database(tmp_path_factory):
    """Without $PG_SCHEDULER_DSN the example starts (or attaches to) the embedded
    PostgreSQL, as the Quick start does, and runs a job on it."""
    import shutil
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="pgs-home-"))
    try:
        env = child_env("unused")
        del env["PG_SCHEDULER_DSN"]
        env["XDG_DATA_HOME"] = str(home)
        script = (
            "from fastapi.testclient import TestClient\n"
            "import time\n"
            "from examples.fastapi_app import app\n"
            "with TestClient(app) as client:\n"
            "    job = client.post('/emails', params={'recipient': 'a@b'}).json()['job_id']\n"
            "    deadline = time.monotonic() + 30\n"
            "    while client.get(f'/jobs/{job}').json()['status'] != 'completed':\n"
            "        assert time.monotonic() < deadline\n"
            "        time.sleep(0.05)\n"
            "print('completed')\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=180
        )
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.strip() == "completed"
        assert (home / "pg-scheduler" / "pgdata" / "PG_VERSION").is_file()
    finally:
        shutil.rmtree(home, ignore_errors=True)
