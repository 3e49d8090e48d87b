"""Fault injection against real PostgreSQL, with workers in their own processes.

kill -9 mid-job, a killed LISTEN backend, a worker frozen by SIGSTOP until its
job was rescued, cancellation of a running job, graceful and forced shutdown.
Timings: heartbeat_threshold=2 s, lease=3 s, rescue every 0.5 s (FAULT below).
Measured figures are printed as ``FAULT-METRIC`` lines (see them with ``-s``).
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from tests.support.common import wait_for_status, wait_until
from tests.support.fault_worker import FAULT, RUNS_DDL, SLACK, WorkerProcess, metric

pytestmark = pytest.mark.slow


Spawn = Callable[..., Awaitable[WorkerProcess]]


def now() -> datetime:
    return datetime.now(UTC)


@pytest.fixture
async def runs_table(pool: asyncpg.Pool) -> None:
    await pool.execute(RUNS_DDL)
    await pool.execute("TRUNCATE fault_runs")


@pytest.fixture
async def spawn(dsn: str, tmp_path: Path, runs_table: None) -> AsyncIterator[Spawn]:
    """Start worker subprocesses; every one is killed at the end of the test."""
    started: list[WorkerProcess] = []

    async def start(name: str, *, cli: bool = False, **options: Any) -> WorkerProcess:
        settings = options if cli else {**FAULT, **options}
        worker = await WorkerProcess.start(dsn, tmp_path, name, cli=cli, **settings)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        await worker.close()
        # Shown by pytest only when the test failed.
        print(f"----- {worker.name} (pid {worker.proc.pid}) -----\n{worker.log_tail(6000)}")


@pytest.fixture
async def producer(make_scheduler: Callable[..., Awaitable[Any]]) -> Any:
    """A scheduler that only enqueues and cancels (never started: it runs nothing)."""
    return await make_scheduler(start=False)


async def enqueue(producer: Any, task: str, max_retries: int = 0, **kwargs: Any) -> str:
    """Schedule a fault task by name: this process never registers the fault tasks,
    so no scheduler left running in it by another test can take their jobs."""
    return await producer.schedule_job(task, now(), {"kwargs": kwargs}, max_retries=max_retries)


async def runs(pool: asyncpg.Pool, key: str, phase: str = "start") -> list[asyncpg.Record]:
    return await pool.fetch(
        "SELECT pid, at FROM fault_runs WHERE job_key = $1 AND phase = $2 ORDER BY at",
        key,
        phase,
    )


async def job_row(pool: asyncpg.Pool, job_id: str) -> asyncpg.Record:
    return await pool.fetchrow(
        """SELECT status, worker_id, attempts, rescue_count, result::text AS result,
                  error_message, started_at, finished_at, created_at,
                  EXTRACT(EPOCH FROM finished_at)::float8 AS finished_epoch,
                  EXTRACT(EPOCH FROM started_at - created_at)::float8 AS start_latency
             FROM scheduled_jobs WHERE job_id = $1""",
        job_id,
    )


async def running_on(pool: asyncpg.Pool, job_id: str, worker: WorkerProcess) -> bool:
    row = await job_row(pool, job_id)
    return row is not None and row["status"] == "running" and row["worker_id"] == worker.worker_id


# -- (a) kill -9 mid-job --------------------------------------------------------------


async def test_kill_9_mid_job_is_rescued_and_completed_elsewhere(pool, spawn, producer):
    first, second = await asyncio.gather(spawn("first"), spawn("second"))
    await asyncio.gather(first.ready(), second.ready())
    job_id = await enqueue(producer, "fault.tracked", key="kill9", seconds=0.05, first_seconds=120)
    await wait_until(lambda: runs(pool, "kill9"), timeout=15, message="first run to start")
    row = await job_row(pool, job_id)
    victim, survivor = (first, second) if row["worker_id"] == first.worker_id else (second, first)
    assert row["worker_id"] == victim.worker_id

    killed_at = time.time()
    victim.send(signal.SIGKILL)
    assert await victim.wait() == -signal.SIGKILL

    bound = FAULT["heartbeat_threshold"] + FAULT["rescue_interval"]
    await wait_for_status(pool, job_id, "completed", timeout=bound + 10)
    row = await job_row(pool, job_id)
    assert row["worker_id"] == survivor.worker_id
    assert row["attempts"] == 2 and row["rescue_count"] == 1
    # The rescue is in the attempt history; a completed job has no error.
    assert row["error_message"] is None
    rescued = await pool.fetchrow(
        "SELECT outcome, error, worker_id FROM job_attempts WHERE job_id = $1", job_id
    )
    assert rescued["outcome"] == "rescued" and rescued["worker_id"] == victim.worker_id
    assert "rescued from worker " + victim.worker_id in rescued["error"]
    started = await runs(pool, "kill9")
    assert [r["pid"] for r in started] == [victim.proc.pid, survivor.proc.pid]
    rerun_started = started[1]["at"].timestamp() - killed_at
    completed = row["finished_epoch"] - killed_at
    metric("kill9.rerun_started_after_kill_s", rerun_started)
    metric("kill9.completed_after_kill_s", completed)
    assert rerun_started <= bound + SLACK, rerun_started
    assert completed <= bound + SLACK + 0.5, completed


# -- (c) the LISTEN connection is killed ----------------------------------------------------


async def test_killed_listen_connection_falls_back_to_polling_and_relistens(pool, spawn, producer):
    polling = {"max_interval": 3.0, "idle_start_interval": 0.25, "min_interval": 0.05}
    worker = await spawn("listener", polling=polling)
    await worker.ready()
    await wait_until(lambda: worker.listener_pid is not None, message="listener up")
    old_pid = worker.listener_pid
    # Let the worker go idle (sleeping on notifications, up to max_interval).
    warm = await enqueue(producer, "fault.tracked", key="warm")
    await wait_for_status(pool, warm, "completed", timeout=15)

    assert await pool.fetchval("SELECT pg_terminate_backend($1)", old_pid)
    during = await enqueue(producer, "fault.tracked", key="during")
    await wait_for_status(pool, during, "completed", timeout=polling["max_interval"] + 10)
    latency = (await job_row(pool, during))["start_latency"]
    metric("listener_killed.start_latency_s", latency)
    assert latency <= polling["max_interval"] + SLACK, latency

    await wait_until(
        lambda: worker.listener_pid not in (None, old_pid), timeout=10, message="re-LISTEN"
    )
    latencies = []
    for i in range(3):
        job_id = await enqueue(producer, "fault.tracked", key=f"after-{i}")
        await wait_for_status(pool, job_id, "completed", timeout=10)
        latencies.append((await job_row(pool, job_id))["start_latency"])
    metric("listener_back.start_latency_max_s", max(latencies))
    # Far below max_interval (3 s): woken by NOTIFY, not by polling.
    assert max(latencies) < 0.75, latencies
    assert "listener connection lost" in worker.log_text()


# -- (d) a stale worker resumes after its job was rescued ----------------------------------


@pytest.mark.parametrize("outcome", ["fail", "complete"])
async def test_stale_worker_cannot_overwrite_rescued_outcome(pool, spawn, producer, outcome):
    stale = await spawn("stale")
    await stale.ready()
    job_id = await enqueue(
        producer,
        "fault.stale",
        key="stale",
        first_seconds=0.8,
        fail=outcome == "fail",
        max_retries=1,  # the stale failure would put it back to pending
    )
    await wait_until(lambda: runs(pool, "stale"), timeout=15, message="first run")
    stale.send(signal.SIGSTOP)
    assert await running_on(pool, job_id, stale)

    rescuer = await spawn("rescuer")
    await rescuer.ready()
    await wait_for_status(pool, job_id, "completed", timeout=20)
    settled = await job_row(pool, job_id)
    assert settled["worker_id"] == rescuer.worker_id
    assert settled["attempts"] == 2 and settled["rescue_count"] == 1
    assert '"run": 2' in settled["result"]

    stale.send(signal.SIGCONT)
    # The stale worker notices one way or the other: its write is refused by the
    # lease guard, or its heartbeat finds the job gone and stops it first.
    markers = ("outcome not written", "job no longer held by this worker")
    await wait_until(
        lambda: any(m in stale.log_text() for m in markers),
        timeout=10,
        message="stale worker to give up the job",
    )
    # Give any further write from it time to land, then compare.
    await asyncio.sleep(FAULT["heartbeat_interval"] * 3)
    after = await job_row(pool, job_id)
    assert dict(after) == dict(settled)
    assert len(await runs(pool, "stale")) == 2
    path = "guard" if markers[0] in stale.log_text() else "heartbeat"
    print(f"FAULT-NOTE stale.{outcome}.refused_by={path}")


# -- (e) cancelling a running job ---------------------------------------------------------------


async def test_cancel_stops_the_running_coroutine_in_its_worker(pool, spawn, producer):
    worker = await spawn("cancel")
    await worker.ready()
    job_id = await enqueue(producer, "fault.tracked", key="cancel", seconds=120)
    await wait_until(lambda: runs(pool, "cancel"), timeout=15, message="job to start")
    assert await running_on(pool, job_id, worker)

    asked = time.time()
    assert await producer.cancel_job(job_id) is True
    await wait_until(lambda: runs(pool, "cancel", "finally"), timeout=5, message="finally")
    stopped = (await runs(pool, "cancel", "finally"))[0]["at"].timestamp() - asked
    metric("cancel.finally_ran_after_s", stopped)
    assert stopped < 1.0 + SLACK, stopped
    row = await job_row(pool, job_id)
    assert row["status"] == "cancelled"
    await wait_until(lambda: "job stopped" in worker.log_text(), timeout=5, message="log")
    assert await producer.cancel_job(job_id) is False
    assert len(await runs(pool, "cancel")) == 1


# -- (f) graceful and forced shutdown ---------------------------------------------------------


async def _three_long_jobs(pool: asyncpg.Pool, producer: Any, prefix: str) -> list[str]:
    ids = [
        await enqueue(
            producer, "fault.tracked", key=f"{prefix}-{i}", seconds=0.05, first_seconds=120
        )
        for i in range(3)
    ]

    async def all_started() -> bool:
        n = await pool.fetchval(
            "SELECT count(*) FROM fault_runs WHERE job_key LIKE $1 AND phase = 'start'",
            prefix + "-%",
        )
        return n == 3

    await wait_until(all_started, timeout=20, message="three jobs running")
    return ids


async def _released_then_finished_elsewhere(
    pool: asyncpg.Pool, ids: list[str], stopped: WorkerProcess, other: WorkerProcess
) -> None:
    for job_id in ids:
        await wait_for_status(pool, job_id, "completed", timeout=20)
        row = await job_row(pool, job_id)
        assert row["worker_id"] == other.worker_id
        # The interrupted run did not consume an attempt.
        assert row["attempts"] == 1 and row["rescue_count"] == 0
    rows = await pool.fetch("SELECT job_key, phase, pid FROM fault_runs ORDER BY at")
    finals = [r for r in rows if r["phase"] == "finally" and r["pid"] == stopped.proc.pid]
    assert len(finals) == 3  # each cancelled coroutine's finally ran


async def test_sigterm_hands_running_jobs_back_after_grace(pool, spawn, producer):
    grace = 1.0
    leaving = await spawn("leaving", cli=True, cli_args=["--grace", grace])
    await wait_until(
        lambda: pool.fetchval("SELECT count(*) FROM scheduler_workers"),
        timeout=20,
        message="CLI worker registered",
    )
    ids = await _three_long_jobs(pool, producer, "graceful")
    staying = await spawn("staying")
    await staying.ready()

    asked = time.monotonic()
    leaving.send(signal.SIGTERM)
    assert await leaving.wait(timeout=grace + 15) == 0
    took = time.monotonic() - asked
    metric("sigterm.exit_after_s", took)
    assert grace <= took <= grace + 10
    assert "job handed back at shutdown" in leaving.log_text()
    await _released_then_finished_elsewhere(pool, ids, leaving, staying)
    # It unregistered itself: nothing left for the rescuer to do.
    live = await pool.fetch("SELECT worker_id FROM scheduler_workers")
    assert [r["worker_id"] for r in live] == [staying.worker_id]


async def test_second_signal_forces_the_hand_back(pool, spawn, producer):
    leaving = await spawn("forced", cli=True, cli_args=["--grace", 60])
    await wait_until(
        lambda: pool.fetchval("SELECT count(*) FROM scheduler_workers"),
        timeout=20,
        message="CLI worker registered",
    )
    ids = await _three_long_jobs(pool, producer, "forced")
    staying = await spawn("staying")
    await staying.ready()

    leaving.send(signal.SIGTERM)
    await wait_until(
        lambda: "shutting down gracefully" in leaving.log_text(), timeout=10, message="1st"
    )
    assert leaving.proc.returncode is None  # still inside its 60 s grace
    asked = time.monotonic()
    leaving.send(signal.SIGTERM)
    assert await leaving.wait(timeout=15) == 0
    took = time.monotonic() - asked
    metric("forced.exit_after_s", took)
    assert took < 5.0
    await _released_then_finished_elsewhere(pool, ids, leaving, staying)
