"""Faults of the database itself, on a private embedded PostgreSQL of this module.

The server is restarted (pg_ctl restart -m fast) while 2,000 jobs run over two
worker processes, and a LISTEN backend is frozen with SIGSTOP (a connection
that died silently); neither may disturb the shared test database, so this
module starts its own server.
"""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from pg_scheduler import JobSpec, PollingConfig, Scheduler, chain
from pg_scheduler.store.migrate import migrate
from pg_scheduler.support.reconnect import is_connection_error
from tests.support import fault_tasks
from tests.support.common import wait_until
from tests.support.fault_worker import (
    FAULT,
    RUNS_DDL,
    SLACK,
    WorkerProcess,
    metric,
    restart_postgres,
    start_postgres,
    stop_postgres,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
async def private_server() -> AsyncIterator[Any]:
    pytest.importorskip("pgserver")
    from pg_scheduler.embedded import start

    data_dir = Path(tempfile.mkdtemp(prefix="pgs-fault-")) / "pgdata"
    server = await asyncio.to_thread(start, data_dir, cleanup="delete")
    conn = await asyncpg.connect(server.dsn)
    try:
        await migrate(conn)
        await conn.execute(RUNS_DDL)
    finally:
        await conn.close()
    yield server
    await asyncio.to_thread(server.stop)


@pytest.fixture
async def private(private_server: Any) -> AsyncIterator[tuple[Any, asyncpg.Pool]]:
    """The private server and a pool on it, with the tables emptied."""
    pool = await asyncpg.create_pool(private_server.dsn, min_size=1, max_size=5)
    await pool.execute("TRUNCATE scheduled_jobs, scheduler_workers, fault_runs")
    yield private_server, pool
    await pool.close()


@pytest.fixture
async def spawn_private(
    private_server: Any, tmp_path: Path
) -> AsyncIterator[Callable[..., Awaitable[WorkerProcess]]]:
    started: list[WorkerProcess] = []

    async def start(name: str, **options: Any) -> WorkerProcess:
        worker = await WorkerProcess.start(
            private_server.dsn, tmp_path, name, **{**FAULT, **options}
        )
        started.append(worker)
        return worker

    yield start
    for worker in started:
        await worker.close()
        print(f"----- {worker.name} (pid {worker.proc.pid}) -----\n{worker.log_tail(6000)}")


async def fetchval_or_none(pool: asyncpg.Pool, sql: str, *args: Any) -> Any:
    """None while the server is restarting."""
    try:
        return await pool.fetchval(sql, *args)
    except Exception as exc:
        if is_connection_error(exc):
            return None
        raise


async def test_postgres_restart_loses_no_job(private, spawn_private):
    server, pool = private
    total = 2000
    workers = await asyncio.gather(
        spawn_private("w1", max_concurrent_jobs=40, pool_size=12),
        spawn_private("w2", max_concurrent_jobs=40, pool_size=12),
    )
    await asyncio.gather(*(w.ready() for w in workers))
    producer = Scheduler(pool, **FAULT)
    now = await pool.fetchval("SELECT now()")
    specs = [
        JobSpec(
            func=fault_tasks.quick,
            execution_time=now,
            kwargs={"key": f"job-{i}", "max_sleep": 0.05},
            job_id=f"job-{i}",
        )
        for i in range(total)
    ]
    await producer.schedule_bulk(specs)

    async def some_done() -> bool:
        n = await pool.fetchval("SELECT count(*) FROM scheduled_jobs WHERE status = 'completed'")
        return n >= total // 5

    await wait_until(some_done, timeout=60, interval=0.01, message="a fifth done")
    running = await pool.fetchval("SELECT count(*) FROM scheduled_jobs WHERE status = 'running'")
    began = time.monotonic()
    await asyncio.to_thread(restart_postgres, server)
    downtime = time.monotonic() - began
    metric("restart.pg_ctl_restart_s", downtime)
    metric("restart.running_at_restart", running)
    assert running > 0

    async def all_done() -> bool:
        n = await fetchval_or_none(
            pool, "SELECT count(*) FROM scheduled_jobs WHERE status = 'completed'"
        )
        return n == total

    try:
        await wait_until(all_done, timeout=60, interval=0.1, message="every job completed")
    except AssertionError:
        stuck = await pool.fetch(
            "SELECT job_id, status, worker_id, attempts, rescue_count, error_message,"
            " lease_until - now() AS lease_left FROM scheduled_jobs"
            " WHERE status <> 'completed' LIMIT 20"
        )
        workers_now = await pool.fetch(
            "SELECT worker_id, now() - last_seen AS age FROM scheduler_workers"
        )
        raise AssertionError(
            f"not completed: {[dict(r) for r in stuck]}; workers {workers_now}"
        ) from None
    recovered = time.monotonic() - began
    metric("restart.all_completed_after_restart_s", recovered)
    statuses = dict(await pool.fetch("SELECT status, count(*) FROM scheduled_jobs GROUP BY status"))
    assert statuses == {"completed": total}
    run_counts = await pool.fetch(
        "SELECT job_key, count(*) AS n FROM fault_runs WHERE phase = 'start' GROUP BY job_key"
    )
    assert len(run_counts) == total  # every job really ran
    twice = sum(1 for r in run_counts if r["n"] > 1)
    metric("restart.jobs_run_more_than_once", twice)
    for worker in workers:
        assert worker.proc.returncode is None  # survived the outage
        assert "database unreachable" in worker.log_text() or "claim failed" in worker.log_text()


async def test_postgres_restart_mid_chains_loses_no_job_and_starts_none_early(
    private, spawn_private
):
    """50 chains of 40 over two workers, the server restarted midway: every
    job completes, none starts before the job it depends on completed, and
    dependents were taken over by their dependency's completion (the same
    statement) on both sides of the restart."""
    server, pool = private
    await pool.execute("TRUNCATE job_dependencies")
    chains, length = 50, 40
    workers = await asyncio.gather(
        spawn_private("w1", max_concurrent_jobs=40, pool_size=12),
        spawn_private("w2", max_concurrent_jobs=40, pool_size=12),
    )
    await asyncio.gather(*(w.ready() for w in workers))
    now = await pool.fetchval("SELECT now()")
    specs = [
        spec
        for c in range(chains)
        for spec in chain(
            *(
                JobSpec(
                    func=fault_tasks.quick,
                    execution_time=now,
                    kwargs={"key": f"c{c}-{i}", "max_sleep": 0.02},
                    job_id=f"c{c}-{i}",
                )
                for i in range(length)
            )
        )
    ]
    await Scheduler(pool, **FAULT).schedule_bulk(specs)
    total = chains * length

    async def completed() -> int | None:
        return await fetchval_or_none(
            pool, "SELECT count(*) FROM scheduled_jobs WHERE status = 'completed'"
        )

    async def a_third_done() -> bool:
        return (await completed() or 0) >= total // 3

    await wait_until(a_third_done, timeout=60, interval=0.01, message="a third done")
    taken_before = await pool.fetchval(_TAKEN_OVER)
    await asyncio.to_thread(restart_postgres, server)

    async def all_done() -> bool:
        return await completed() == total

    await wait_until(all_done, timeout=90, interval=0.1, message="every job completed")
    assert await pool.fetchval("SELECT count(DISTINCT job_key) FROM fault_runs") == total
    early = await pool.fetch(
        """SELECT e.depends_on, e.job_id FROM job_dependencies e
             JOIN scheduled_jobs p ON p.job_id = e.depends_on
            WHERE (SELECT min(r.at) FROM fault_runs r
                    WHERE r.job_key = e.job_id AND r.phase = 'start') < p.finished_at"""
    )
    assert [tuple(r) for r in early] == [], "dependents started before their dependency completed"
    taken_after = await pool.fetchval(_TAKEN_OVER) - taken_before
    metric("restart.chains_taken_over_before", taken_before)
    metric("restart.chains_taken_over_after", taken_after)
    assert taken_before > 0 and taken_after > 0


# Edges whose dependent was started by its dependency's completion statement.
_TAKEN_OVER = """
SELECT count(*) FROM job_dependencies e
  JOIN scheduled_jobs p ON p.job_id = e.depends_on
  JOIN scheduled_jobs d ON d.job_id = e.job_id
 WHERE d.started_at = p.finished_at AND d.worker_id = p.worker_id"""


async def test_silently_dead_listen_connection_is_detected_by_health_check(private, spawn_private):
    """A LISTEN backend that stops answering (SIGSTOP: like a half-open TCP link)
    raises nothing; the health check must notice, and polling covers the gap."""
    _server, pool = private
    polling = {"max_interval": 3.0, "idle_start_interval": 0.25, "min_interval": 0.05}
    worker = await spawn_private("frozen", polling=polling)
    await worker.ready()
    await wait_until(lambda: worker.listener_pid is not None, message="listener up")
    frozen = worker.listener_pid
    assert frozen is not None
    producer = Scheduler(pool, **FAULT)
    os.kill(frozen, signal.SIGSTOP)
    try:
        due = await pool.fetchval("SELECT now()")
        job_id = await producer.schedule(
            fault_tasks.tracked, execution_time=due, args=("while-frozen",)
        )

        async def started() -> bool:
            status = await pool.fetchval(
                "SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id
            )
            return status == "completed"

        await wait_until(started, timeout=polling["max_interval"] + 10, message="job done")
        latency = await pool.fetchval(
            "SELECT EXTRACT(EPOCH FROM started_at - created_at)::float8 FROM scheduled_jobs"
            " WHERE job_id = $1",
            job_id,
        )
        metric("frozen_listener.start_latency_s", latency)
        assert latency <= polling["max_interval"] + SLACK
        await wait_until(
            lambda: worker.listener_pid not in (None, frozen), timeout=10, message="re-LISTEN"
        )
        assert "listener health check failed" in worker.log_text()
    finally:
        os.kill(frozen, signal.SIGCONT)
        await pool.fetchval("SELECT pg_terminate_backend($1)", frozen)

    # Notifications work again on the new connection.
    due = await pool.fetchval("SELECT now()")
    job_id = await producer.schedule(fault_tasks.tracked, execution_time=due, args=("after",))
    await wait_until(
        lambda: fetchval_or_none(
            pool, "SELECT status = 'completed' FROM scheduled_jobs WHERE job_id = $1", job_id
        ),
        timeout=10,
        message="job after re-LISTEN",
    )
    latency = await pool.fetchval(
        "SELECT EXTRACT(EPOCH FROM started_at - created_at)::float8 FROM scheduled_jobs"
        " WHERE job_id = $1",
        job_id,
    )
    metric("frozen_listener.after_relisten_latency_s", latency)
    assert latency < 0.75


async def test_outage_longer_than_the_lease_rescues_nothing_from_live_workers(
    private, spawn_private
):
    """When PostgreSQL is gone for longer than the lease, every lease has expired
    by the time it is back; a rescuer that runs before the owners' heartbeats
    must not take the jobs of workers that are alive."""
    server, pool = private
    workers = await asyncio.gather(spawn_private("w1"), spawn_private("w2"))
    await asyncio.gather(*(w.ready() for w in workers))
    producer = Scheduler(pool, **FAULT)
    due = await pool.fetchval("SELECT now()")
    outage = FAULT["lease_duration"] + 1.5
    ids = [
        await producer.schedule(
            fault_tasks.tracked,
            execution_time=due,
            kwargs={"key": f"long-{i}", "seconds": outage + 2.0},
        )
        for i in range(4)
    ]

    async def all_running() -> bool:
        n = await pool.fetchval("SELECT count(*) FROM fault_runs WHERE phase = 'start'")
        return n == len(ids)

    await wait_until(all_running, timeout=20, message="jobs running")
    await asyncio.to_thread(stop_postgres, server)
    await asyncio.sleep(outage)  # the outage itself: nothing to poll
    await asyncio.to_thread(start_postgres, server)

    async def all_settled() -> bool:
        n = await fetchval_or_none(
            pool,
            "SELECT count(*) FROM scheduled_jobs WHERE status IN ('completed', 'failed')",
        )
        return n == len(ids)

    await wait_until(all_settled, timeout=40, interval=0.1, message="jobs settled")
    rows = await pool.fetch("SELECT status, rescue_count FROM scheduled_jobs")
    assert [(r["status"], r["rescue_count"]) for r in rows] == [("completed", 0)] * len(ids)
    starts = await pool.fetchval("SELECT count(*) FROM fault_runs WHERE phase = 'start'")
    assert starts == len(ids)  # each ran once


async def test_cancel_reaches_the_worker_through_the_heartbeat_when_notify_is_lost(
    private, spawn_private
):
    """The cancel NOTIFY never arrives (the LISTEN backend is frozen and the health
    check is slow): the next heartbeat finds the row no longer running here and
    stops the coroutine."""
    _server, pool = private
    worker = await spawn_private("deaf", listener_health_interval=30.0)
    await worker.ready()
    await wait_until(lambda: worker.listener_pid is not None, message="listener up")
    producer = Scheduler(pool, **FAULT)
    due = await pool.fetchval("SELECT now()")
    job_id = await producer.schedule(
        fault_tasks.tracked, execution_time=due, kwargs={"key": "deaf", "seconds": 120}
    )

    async def phase(name: str) -> bool:
        return bool(
            await pool.fetchval(
                "SELECT count(*) FROM fault_runs WHERE job_key = 'deaf' AND phase = $1", name
            )
        )

    await wait_until(lambda: phase("start"), timeout=15, message="job running")
    deaf = worker.listener_pid
    assert deaf is not None
    os.kill(deaf, signal.SIGSTOP)
    try:
        asked = time.monotonic()
        assert await producer.cancel_job(job_id) is True
        await wait_until(lambda: phase("finally"), timeout=10, message="coroutine stopped")
        took = time.monotonic() - asked
        metric("cancel_without_notify.stopped_after_s", took)
        assert took <= FAULT["heartbeat_interval"] + SLACK
        assert "job no longer held by this worker; stopped it" in worker.log_text()
        status = await pool.fetchval("SELECT status FROM scheduled_jobs WHERE job_id = $1", job_id)
        assert status == "cancelled"

        # Its wake-ups are lost too: a new job is still found, by polling.
        due = await pool.fetchval("SELECT now()")
        polled = await producer.schedule(
            fault_tasks.tracked, execution_time=due, kwargs={"key": "deaf-polled"}
        )
        latency_sql = (
            "SELECT EXTRACT(EPOCH FROM started_at - created_at)::float8 FROM scheduled_jobs"
            " WHERE job_id = $1 AND status = 'completed'"
        )
        await wait_until(lambda: pool.fetchval(latency_sql, polled), timeout=15, message="polled")
        latency = await pool.fetchval(latency_sql, polled)
        metric("deaf_listener.polled_start_latency_s", latency)
        assert latency <= PollingConfig().max_interval + SLACK
    finally:
        os.kill(deaf, signal.SIGCONT)
        await pool.fetchval("SELECT pg_terminate_backend($1)", deaf)
