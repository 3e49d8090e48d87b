"""``pg-scheduler dashboard`` and the read-only CLI commands on a hot-standby
streaming replica: a primary and its replica started here (pgserver's
PostgreSQL binaries), jobs scheduled on the primary and read on the replica;
actions answer a clear refusal and write nothing; nothing tries LISTEN."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx
import pytest

from pg_scheduler import Scheduler
from pg_scheduler.dashboard import dashboard_app
from pg_scheduler.store.migrate import migrate
from tests.support import dashboard_tasks
from tests.support.common import child_env, wait_until
from tests.support.dashboard_support import free_port
from tests.support.replica import Pair, binaries_missing

MISSING = binaries_missing()
pytestmark = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

TOKEN = "replica-token"
JOBS = 5
# What the replica's server log would say had anything tried to write or LISTEN.
REFUSALS = ("during recovery", "read-only transaction")


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    servers = Pair()
    try:
        servers.start()
        yield servers
    finally:
        servers.stop()


@pytest.fixture(scope="module")
async def jobs(pair: Pair) -> AsyncIterator[list[str]]:
    """JOBS pending jobs (due in an hour) and one failed job, scheduled on the
    primary and replayed on the replica; their ids, the failed one last."""
    primary = await asyncpg.create_pool(pair.primary_dsn, min_size=1, max_size=2)
    try:
        async with primary.acquire() as conn:
            await migrate(conn)
        producer = Scheduler(primary, run_periodic_jobs=False, vacuum_enabled=False)
        later = datetime.now(UTC) + timedelta(hours=1)
        ids = [
            await producer.schedule(dashboard_tasks.echo, execution_time=later, args=(n,))
            for n in range(JOBS + 1)
        ]
        await primary.execute(
            "UPDATE scheduled_jobs SET status = 'failed', error_message = 'boom',"
            " finished_at = now() WHERE job_id = $1",
            ids[-1],
        )
        target = await primary.fetchval("SELECT pg_current_wal_lsn()")
    finally:
        await primary.close()
    replica = await asyncpg.connect(pair.replica_dsn)
    try:

        async def replayed() -> bool:
            return bool(
                await replica.fetchval("SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn", target)
            )

        await wait_until(replayed, timeout=60, interval=0.05, message="the replica to replay")
    finally:
        await replica.close()
    yield ids


def replica_log(pair: Pair) -> str:
    return (pair.replica / "server.log").read_text(errors="replace")


async def test_the_replica_is_a_standby_with_the_primarys_jobs(pair, jobs):
    conn = await asyncpg.connect(pair.replica_dsn)
    try:
        assert await conn.fetchval("SELECT pg_is_in_recovery()") is True
        assert await conn.fetchval("SELECT status FROM pg_stat_wal_receiver") == "streaming"
        seen = await conn.fetch(
            "SELECT job_id, status FROM scheduled_jobs WHERE job_id = ANY($1)", jobs
        )
        assert {r["job_id"]: r["status"] for r in seen} == {
            **{job_id: "pending" for job_id in jobs[:-1]},
            jobs[-1]: "failed",
        }
    finally:
        await conn.close()


async def test_dashboard_reads_the_replica_and_refuses_actions(pair, jobs):
    port = free_port()
    before = replica_log(pair)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pg_scheduler.cli",
        "--dsn",
        pair.replica_dsn,
        "dashboard",
        "--port",
        str(port),
        "--token",
        TOKEN,
        env=child_env(pair.replica_dsn),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert f"http://127.0.0.1:{port}/" in line
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            config = (await http.get("/api/config")).json()
            assert config["replica"] is True and config["read_only"] is True

            overview = await http.get("/api/overview")
            assert overview.status_code == 200, overview.text
            assert overview.json()["counts"]["pending"] == JOBS
            assert overview.json()["counts"]["failed"] == 1

            listed = await http.get("/api/jobs", params={"limit": "50"})
            assert listed.status_code == 200, listed.text
            assert {j["job_id"] for j in listed.json()["jobs"]} == set(jobs)

            one = await http.get("/api/job", params={"id": jobs[0]})
            assert one.status_code == 200, one.text
            assert one.json()["status"] == "pending"

            for name in ("workers", "queues", "periodic", "workflows"):
                read = await http.get(f"/api/{name}")
                assert read.status_code == 200, (name, read.text)

            for page in ("/", "/jobs", f"/job?id={jobs[0]}", "/queues"):
                shell = await http.get(page)
                assert shell.status_code == 200
                assert 'data-replica="true"' in shell.text

            # Live updates: no LISTEN on a standby; the stream says at once
            # that the page polls.
            async with http.stream("GET", "/api/stream") as stream:
                first = await asyncio.wait_for(anext(stream.aiter_text()), 10)
            assert '"live": false' in first

            headers = {"X-Dashboard-Token": TOKEN}
            actions = {
                "cancel": {"job_id": jobs[0]},
                "retry": {"job_id": jobs[-1]},
                "pause": {"queue": "default"},
                "trigger": {"key": "nothing"},
            }
            for name, body in actions.items():
                refused = await http.post(f"/api/action/{name}", json=body, headers=headers)
                assert refused.status_code == 409, (name, refused.text)
                assert "actions need the primary" in refused.json()["error"]
        proc.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(proc.wait(), 30)
        err = (await proc.stderr.read()).decode()
        assert code == 0, err
        assert "Traceback" not in err and "listener" not in err, err
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    # Nothing was written: the primary still has the jobs as they were.
    primary = await asyncpg.connect(pair.primary_dsn)
    try:
        rows = await primary.fetch(
            "SELECT job_id, status FROM scheduled_jobs WHERE job_id = ANY($1)", jobs
        )
        assert sorted(r["status"] for r in rows) == ["failed"] + ["pending"] * JOBS
        assert await primary.fetchval("SELECT count(*) FROM scheduler_queues WHERE paused") == 0
    finally:
        await primary.close()
    # And nothing tried to: no write or LISTEN reached the standby.
    added = replica_log(pair)[len(before) :]
    assert not [r for r in REFUSALS if r in added], added[-3000:]


async def cli(dsn: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "pg_scheduler.cli",
        "--dsn",
        dsn,
        *args,
        env=child_env(dsn),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_read_only_cli_commands_on_the_replica(pair, jobs):
    for command in (
        ("status",),
        ("jobs", "--json"),
        ("jobs", jobs[0]),
        ("periodic", "list"),
        ("queues", "list"),
        ("limits", "list"),
        ("orphans",),
        ("workflows", "list"),
    ):
        code, out, err = await cli(pair.replica_dsn, *command)
        assert code == 0, (command, out, err)
        assert "Traceback" not in err, (command, err)
    code, out, _err = await cli(pair.replica_dsn, "jobs", "--json")
    assert all(job_id in out for job_id in jobs)
    # A writing command says what to do, in one line.
    code, _out, err = await cli(pair.replica_dsn, "cancel", jobs[0])
    assert code == 1
    assert "read replica" in err and "primary" in err and "Traceback" not in err, err


async def test_a_write_refused_by_a_read_only_role_answers_409(pair, jobs):
    """Not a standby, but every transaction read-only: the action reaches the
    database, which refuses it; the answer is the same clear 409."""
    pool = await asyncpg.create_pool(
        pair.primary_dsn,
        min_size=1,
        max_size=2,
        server_settings={"default_transaction_read_only": "on"},
    )
    app = dashboard_app(pool, token=TOKEN)
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://dash"
        ) as http:
            assert (await http.get("/api/config")).json()["replica"] is False
            refused = await http.post(
                "/api/action/cancel",
                json={"job_id": jobs[0]},
                headers={"X-Dashboard-Token": TOKEN},
            )
        assert refused.status_code == 409, refused.text
        assert "actions need the primary" in refused.json()["error"]
    finally:
        await app.state.dashboard.close()
        await pool.close()
    conn = await asyncpg.connect(pair.primary_dsn)
    try:
        assert (
            await conn.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", jobs[0])
            == "pending"
        )
    finally:
        await conn.close()
