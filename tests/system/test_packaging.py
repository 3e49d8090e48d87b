"""The wheel ships the migrations (``pg_scheduler/store/migrations``) and ``schema.sql``:
a non-editable install finds them and migrates a fresh database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_install_carries_migrations(tmp_path, dsn):
    wheel_dir = tmp_path / "wheel"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheel_dir.glob("pg_scheduler-*.whl")
    target = tmp_path / "site"
    install = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    shipped = target / "pg_scheduler" / "store" / "migrations"
    source = sorted(p.name for p in (ROOT / "pg_scheduler" / "store" / "migrations").glob("*.sql"))
    assert sorted(p.name for p in shipped.glob("*.sql")) == source
    assert "0001_initial.sql" in source
    assert not (target / "pg_scheduler" / "migrations").exists()  # one place only
    assert (target / "pg_scheduler" / "store" / "schema.sql").is_file()
    assert (target / "pg_scheduler" / "py.typed").is_file()  # typed for its users
    for asset in ("index.html", "app.js", "style.css"):  # the dashboard's, as package data
        assert (target / "pg_scheduler" / "dashboard" / "static" / asset).is_file()
    probe = (
        "import asyncio, asyncpg, sys, pg_scheduler\n"
        "from pg_scheduler.store.migrate import _migrations_dir, load_migrations, migrate\n"
        "print(pg_scheduler.__file__)\n"
        "print(len(load_migrations()))\n"
        "print(_migrations_dir())\n"
        "async def main():\n"
        "    conn = await asyncpg.connect(sys.argv[1])\n"
        "    await migrate(conn)\n"
        "    await conn.close()\n"
        "asyncio.run(main())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    run = subprocess.run(
        [sys.executable, "-c", probe, dsn],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.strip().splitlines()
    assert lines[0].startswith(str(target))
    assert int(lines[1]) == len(source)
    assert Path(lines[2]) == shipped
