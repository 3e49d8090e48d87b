"""pgbouncer in transaction mode: a real pgbouncer (Debian package) before the test database."""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import asyncpg
import pytest

from pg_scheduler import JobSpec, PollingConfig, Scheduler
from tests.support import app_tasks, bouncer_tasks
from tests.support.common import FAST, start_cli_worker, wait_for_status, wait_until

PGBOUNCER = shutil.which("pgbouncer") or (
    "/usr/sbin/pgbouncer" if os.path.exists("/usr/sbin/pgbouncer") else None
)
pytestmark = pytest.mark.skipif(
    PGBOUNCER is None, reason="pgbouncer is not installed (Debian: apt-get install -y pgbouncer)"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_as(host: str) -> str | None:
    """pgbouncer refuses to run as root: as root, switch (-u) to the owner of
    the server's socket directory (it can reach the socket), else to postgres."""
    if os.geteuid() != 0:
        return None
    if host.startswith("/"):
        return pwd.getpwuid(os.stat(host).st_uid).pw_name
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name).pw_name
        except KeyError:
            continue
    pytest.skip("running as root and no unprivileged user to run pgbouncer as")


@pytest.fixture(scope="module")
def bouncer_dsn(dsn: str) -> Iterator[str]:
    """A pgbouncer (pool_mode=transaction) in front of the test database; its DSN."""
    parts = urlsplit(dsn)
    query = parse_qs(parts.query)
    host = query.get("host", [parts.hostname or "127.0.0.1"])[0]
    port = parts.port or int(query.get("port", ["5432"])[0])
    user = parts.username or "postgres"
    database = parts.path.lstrip("/")
    listen = _free_port()
    workdir = Path(tempfile.mkdtemp(prefix="pgs-bouncer-"))
    (workdir / "userlist.txt").write_text(f'"{user}" "{parts.password or ""}"\n')
    (workdir / "pgbouncer.ini").write_text(
        f"""
[databases]
{database} = host={host} port={port} dbname={database}
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen}
unix_socket_dir =
auth_type = trust
auth_file = {workdir / "userlist.txt"}
pool_mode = transaction
max_client_conn = 500
default_pool_size = 20
ignore_startup_parameters = extra_float_digits
"""
    )
    command = [PGBOUNCER, str(workdir / "pgbouncer.ini")]
    run_as = _run_as(host)
    if run_as is not None:
        shutil.chown(workdir, run_as)
        for f in workdir.iterdir():
            shutil.chown(f, run_as)
        command[1:1] = ["-u", run_as]
    log = open(workdir / "pgbouncer.log", "wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    url = f"postgresql://{user}@127.0.0.1:{listen}/{database}"

    async def ready() -> bool:
        try:
            conn = await asyncpg.connect(url, statement_cache_size=0, timeout=2)
        except (OSError, asyncpg.PostgresError):
            return proc.poll() is not None  # exited: stop waiting, fail below
        await conn.close()
        return True

    asyncio.run(wait_until(ready, timeout=15, message="pgbouncer to accept connections"))
    if proc.poll() is not None:
        log.close()
        raise RuntimeError(f"pgbouncer exited: {(workdir / 'pgbouncer.log').read_text()[-2000:]}")
    yield url
    proc.terminate()
    proc.wait(10)
    log.close()
    shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
async def bouncer_pool(bouncer_dsn: str) -> AsyncIterator[asyncpg.Pool]:
    p = await asyncpg.create_pool(bouncer_dsn, min_size=2, max_size=10, statement_cache_size=0)
    yield p
    await p.close()


async def test_a_caching_pool_is_refused_in_pgbouncer_mode(bouncer_dsn):
    p = await asyncpg.create_pool(bouncer_dsn, min_size=0, max_size=2)
    try:
        with pytest.raises(ValueError, match="statement_cache_size=0"):
            Scheduler(p, pgbouncer=True)
    finally:
        await p.close()


@pytest.mark.slow
async def test_two_cli_workers_through_pgbouncer_run_each_job_exactly_once(
    pool, bouncer_pool, bouncer_dsn
):
    await pool.execute("CREATE TABLE IF NOT EXISTS bouncer_runs (n int, pid int)")
    await pool.execute("TRUNCATE bouncer_runs")
    workers = [
        await start_cli_worker(bouncer_dsn, "tests.support.bouncer_tasks:SETTINGS", "--pgbouncer")
        for _ in range(2)
    ]
    try:
        # Both workers registered before any job exists, so both take part even
        # on a loaded machine where one could otherwise drain everything alone.
        async def both_registered() -> bool:
            return await pool.fetchval("SELECT count(*) FROM scheduler_workers") >= 2

        await wait_until(both_registered, timeout=60, interval=0.1, message="two workers")
        # Enqueued through pgbouncer too, by a Scheduler that never starts.
        producer = Scheduler(bouncer_pool, pgbouncer=True, run_periodic_jobs=False)
        now = datetime.now(UTC)
        specs = [JobSpec(bouncer_tasks.record, now, args=(n,)) for n in range(1000)]
        ids = await producer.schedule_bulk(specs, batch_size=250)
        assert len(set(ids)) == 1000

        async def all_completed() -> bool:
            return (
                await pool.fetchval(
                    "SELECT count(*) FROM scheduled_jobs WHERE status = 'completed'"
                )
                == 1000
            )

        await wait_until(all_completed, timeout=90, interval=0.2, message="1,000 completions")
        runs = await pool.fetchrow(
            "SELECT count(*) AS runs, count(DISTINCT n) AS jobs, count(DISTINCT pid) AS pids"
            " FROM bouncer_runs"
        )
        assert runs["jobs"] == 1000  # none lost
        assert runs["runs"] == 1000  # none ran twice
        assert runs["pids"] == 2  # both workers took part
    finally:
        for w in workers:
            if w.returncode is None:
                w.send_signal(2)
        errors = [(await w.communicate())[1].decode() for w in workers]
    assert all(w.returncode == 0 for w in workers), [e[-2000:] for e in errors]
    # No statement failed behind the pooler (prepared statements, locks, SET).
    assert not [e for e in errors if "Error" in e], [e[-2000:] for e in errors]


async def test_schedule_get_cancel_through_pgbouncer_without_listen(bouncer_pool, pool):
    scheduler = Scheduler(bouncer_pool, pgbouncer=True, **FAST)
    scheduler.register_task(app_tasks.add)
    await scheduler.start()
    try:
        assert not scheduler.listener.live  # no LISTEN through the pooler
        now = datetime.now(UTC)
        done = await scheduler.schedule(app_tasks.add, execution_time=now, args=(2, 3))
        await wait_for_status(pool, done, "completed")
        assert (await scheduler.get_job(done)).result == 5
        later = await scheduler.schedule(
            app_tasks.add, execution_time=now + timedelta(hours=1), args=(1, 1)
        )
        assert (await scheduler.get_job(later)).status == "pending"
        assert await scheduler.cancel_job(later)
        assert (await scheduler.get_job(later)).status == "cancelled"
        # Due soon, written pending (not started locally): picked up by polling.
        soon = await scheduler.schedule(
            app_tasks.add, execution_time=now + timedelta(seconds=1.5), args=(4, 4)
        )
        await wait_for_status(pool, soon, "completed")
        assert await scheduler.run_vacuum() is not None
    finally:
        await scheduler.shutdown(grace_period=1.0)
    # Nothing session-level was left on the server connections behind the pooler.
    leftovers = await pool.fetchval(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
    )
    assert leftovers == 0


async def test_listen_dsn_carries_wake_ups_past_pgbouncer(bouncer_pool, pool, dsn):
    # Polling every 60 s at most: a job found within seconds was found by NOTIFY.
    slow_polls = PollingConfig(max_interval=60, idle_start_interval=60)
    scheduler = Scheduler(
        bouncer_pool, pgbouncer=True, listen_dsn=dsn, polling_config=slow_polls, **FAST
    )
    scheduler.register_task(app_tasks.add)
    await scheduler.start()
    try:
        await wait_until(lambda: scheduler.listener.live, message="listener on the direct DSN")
        # Inserted directly by someone else: only the NOTIFY (or a poll) finds it.
        job_id = "bouncer-notify"
        await pool.execute(
            "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, task_data)"
            " VALUES ($1, $2, $2, now(), $3::jsonb)",
            job_id,
            scheduler.registry.names()[0],
            '{"args": [20, 22], "kwargs": {}}',
        )
        await wait_for_status(pool, job_id, "completed", timeout=10)
    finally:
        await scheduler.shutdown(grace_period=1.0)


async def test_vacuum_behind_pgbouncer_uses_transaction_locks(bouncer_pool, pool):
    scheduler = Scheduler(bouncer_pool, pgbouncer=True, run_periodic_jobs=False)
    await pool.execute(
        "INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status,"
        " finished_at) VALUES ('old-done', 'n', 't', now(), 'completed', now() - interval '2 days')"
    )
    # Another replica (a direct session) vacuums: this round is skipped.
    async with pool.acquire() as other:
        assert await scheduler.vacuum_store.try_lock(other)
        try:
            assert await scheduler.run_vacuum() == {}
        finally:
            await scheduler.vacuum_store.unlock(other)
    assert (await scheduler.run_vacuum())["completed"] == 1
    held = await pool.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'")
    assert held == 0  # nothing left on the server connections behind pgbouncer
