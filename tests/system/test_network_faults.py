"""Half-open connections: the path between a worker and PostgreSQL black-holed
(bytes dropped, nothing closed) through ``tests/support/tcp_proxy.py``, then healed with
the old connections still dead, as behind a NAT that lost its state.

The worker (its own process) reaches the database only through the proxy;
the job bodies record their runs, and the test reads the database, directly.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.support.common import wait_until
from tests.support.fault_worker import (
    FAULT,
    ROOT,
    RUNS_DDL,
    SLACK,
    WorkerProcess,
    metric,
    subprocess_env,
)
from tests.support.net_app import OPTIONS as CLI_NET_OPTIONS
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow

# The worker's statement bound in these tests, and leases long enough that an
# outage of a few seconds expires none of them: every job must run once.
STATEMENT_TIMEOUT = 1.0
NET = {
    **FAULT,
    "heartbeat_threshold": 30.0,
    "lease_duration": 30.0,
    "statement_timeout": STATEMENT_TIMEOUT,
}
OUTAGE = 2.0
# docs/failure-model.md: a worker resumes within two statement bounds after
# the path heals (one for a statement on a dead connection, one for a
# connection opened during the outage), plus a heartbeat and a reconnect.
RESUME_BOUND = 2 * STATEMENT_TIMEOUT + FAULT["heartbeat_interval"] + 1.0


Spawn = Callable[..., Awaitable[WorkerProcess]]


@pytest.fixture
async def spawn(
    dsn: str, proxy: TcpProxy, pool: asyncpg.Pool, tmp_path: Path
) -> AsyncIterator[Spawn]:
    """Start a worker whose scheduler connects through the proxy (its job
    bodies record their runs directly)."""
    await pool.execute(RUNS_DDL)
    await pool.execute("TRUNCATE fault_runs")
    started: list[WorkerProcess] = []

    async def start(name: str, *, cli: bool = False, **options: Any) -> WorkerProcess:
        env = subprocess_env(dsn)
        if cli:
            env["PG_SCHEDULER_DSN"] = proxy.dsn_for(dsn)
            argv = [
                sys.executable,
                "-c",
                "import sys; from pg_scheduler.cli import main; sys.exit(main())",
                "--log-level",
                "debug",
                "worker",
                "tests.support.net_app:OPTIONS",
                *(str(a) for a in options.pop("cli_args", [])),
            ]
        else:
            env["PG_SCHEDULER_WORKER_DB_URL"] = proxy.dsn_for(dsn)
            argv = [sys.executable, "-m", "tests.support.fault_worker", json.dumps(options)]
        log_path = tmp_path / f"{name}.log"
        with log_path.open("wb") as log_file:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdout=asyncio.subprocess.PIPE,
                stderr=log_file,
                env=env,
                cwd=str(ROOT),
                start_new_session=True,
            )
        worker = WorkerProcess(proc, log_path, name)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        await worker.close()
        print(f"----- {worker.name} (pid {worker.proc.pid}) -----\n{worker.log_tail(6000)}")


async def enqueue(pool: asyncpg.Pool, producer: Any, key: str, seconds: float) -> str:
    return await producer.schedule_job(
        "fault.tracked", datetime.now(UTC), {"kwargs": {"key": key, "seconds": seconds}}
    )


@pytest.fixture
async def producer(make_scheduler: Callable[..., Awaitable[Any]]) -> Any:
    """Enqueues only (never started: it runs nothing)."""
    return await make_scheduler(start=False)


async def starts(pool: asyncpg.Pool, key: str) -> int:
    return await pool.fetchval(
        "SELECT count(*) FROM fault_runs WHERE job_key = $1 AND phase = 'start'", key
    )


async def statuses(pool: asyncpg.Pool, ids: list[str]) -> dict[str, asyncpg.Record]:
    rows = await pool.fetch(
        "SELECT job_id, status, worker_id, rescue_count FROM scheduled_jobs WHERE job_id = ANY($1)",
        ids,
    )
    return {r["job_id"]: r for r in rows}


# 10: the claim loop and the completion writer hold connections of their own;
# 5: every statement takes one from the pool.
@pytest.mark.parametrize("pool_size", [10, 5])
async def test_worker_resumes_after_its_connections_stay_black_holed(
    pool, spawn, proxy, producer, pool_size
):
    worker = await spawn("cut-off", **{**NET, "pool_size": pool_size})
    worker_id = await worker.ready()
    keys = [f"net-{i}" for i in range(4)]
    # Running across the outage: they finish while it lasts, and their
    # completions must be written once it is over.
    ids = [await enqueue(pool, producer, key, OUTAGE + 0.5) for key in keys]

    async def all_running_here() -> bool:
        rows = await statuses(pool, ids)
        return len(rows) == len(ids) and all(
            r["status"] == "running" and r["worker_id"] == worker_id for r in rows.values()
        )

    await wait_until(all_running_here, timeout=20, message="jobs running on the worker")
    proxy.black_hole()
    await asyncio.sleep(OUTAGE)  # the outage itself, not a synchronisation
    healed_at = await pool.fetchval("SELECT now()")
    proxy.heal()
    healed = time.monotonic()

    async def heartbeat_after_heal() -> bool:
        return bool(
            await pool.fetchval(
                "SELECT last_seen > $2 FROM scheduler_workers WHERE worker_id = $1",
                worker_id,
                healed_at,
            )
        )

    await wait_until(
        heartbeat_after_heal, timeout=RESUME_BOUND * SLACK + 5, message="a heartbeat after heal"
    )
    metric("net.heartbeat_after_heal_s", time.monotonic() - healed)

    async def all_completed() -> bool:
        rows = await statuses(pool, ids)
        return all(r["status"] == "completed" for r in rows.values())

    await wait_until(all_completed, timeout=RESUME_BOUND * SLACK + 5, message="completions")
    metric("net.completed_after_heal_s", time.monotonic() - healed)
    # It claims and completes new work too.
    fresh = await enqueue(pool, producer, "net-fresh", 0.0)
    await wait_until(
        lambda: all_completed_one(pool, fresh, worker_id),
        timeout=RESUME_BOUND * SLACK + 5,
        message="a job scheduled after the heal",
    )
    metric("net.new_job_after_heal_s", time.monotonic() - healed)
    # No lease expired: every job ran exactly once, on this worker, never rescued.
    for key in [*keys, "net-fresh"]:
        assert await starts(pool, key) == 1, key
    rows = await statuses(pool, ids)
    assert all(r["rescue_count"] == 0 and r["worker_id"] == worker_id for r in rows.values())
    assert worker.proc.returncode is None


async def all_completed_one(pool: asyncpg.Pool, job_id: str, worker_id: str) -> bool:
    row = await pool.fetchrow(
        "SELECT status, worker_id FROM scheduled_jobs WHERE job_id = $1", job_id
    )
    return row is not None and row["status"] == "completed" and row["worker_id"] == worker_id


async def test_sigterm_during_an_outage_exits_within_its_bound(pool, spawn, proxy, producer):
    grace = 1.0
    leaving = await spawn("leaving", cli=True, cli_args=["--grace", grace])
    await wait_until(
        lambda: pool.fetchval("SELECT count(*) FROM scheduler_workers"),
        timeout=20,
        message="CLI worker registered",
    )
    job = await enqueue(pool, producer, "net-long", 60.0)

    async def running() -> bool:
        return await pool.fetchval(
            "SELECT status = 'running' FROM scheduled_jobs WHERE job_id = $1", job
        )

    await wait_until(running, timeout=20, message="the long job running")
    proxy.black_hole()
    asked = time.monotonic()
    leaving.send(signal.SIGTERM)
    statement = CLI_NET_OPTIONS["statement_timeout"]
    # cli/run.py: grace + 3 statement bounds + 5 s, then every connection is cut.
    bound = grace + 3 * statement + 5.0 + statement
    await leaving.wait(timeout=bound * SLACK + 5)
    took = time.monotonic() - asked
    metric("net.sigterm_exit_after_s", took)
    assert took <= bound * SLACK
    # Nothing lost: the row still says running on the gone worker (nothing
    # could be written); its lease expires and another worker runs it.
    row = await pool.fetchrow("SELECT status, worker_id FROM scheduled_jobs WHERE job_id = $1", job)
    assert row["status"] in ("running", "pending"), dict(row)
