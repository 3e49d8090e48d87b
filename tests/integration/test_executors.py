"""Plain functions in a thread pool and in spawned processes."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from pg_scheduler import RetryPolicy, Scheduler
from pg_scheduler.api.wiring import stall_guard
from pg_scheduler.tasks import TaskRegistry
from tests.support import sync_tasks
from tests.support.common import job_status, wait_for_status, wait_until

started_at: dict[int, float] = {}


def read_pid(path: Path) -> int | None:
    text = path.read_text() if path.exists() else ""
    return int(text) if text else None


def now() -> datetime:
    return datetime.now(UTC)


async def exec_note_start(n: int) -> None:
    started_at[n] = time.monotonic()


def test_plain_function_without_executor_keeps_the_02x_message() -> None:
    def plain() -> None: ...

    registry = TaskRegistry()
    with pytest.raises(TypeError, match="Expected an async function") as info:
        registry.register(plain)
    assert 'executor="thread"' in str(info.value)
    assert len(registry) == 0


def test_bad_executor_values_raise_at_registration() -> None:
    def plain() -> None: ...

    async def coro() -> None: ...

    registry = TaskRegistry()
    with pytest.raises(ValueError, match="executor"):
        registry.register(plain, executor="fork")
    with pytest.raises(TypeError, match="plain def"):
        registry.register(coro, executor="thread")
    with pytest.raises(ValueError, match="importable"):
        registry.register(plain, executor="process")  # a local function
    assert len(registry) == 0
    assert not hasattr(plain, "__pg_scheduler_executor__")


async def test_pool_sizes_are_validated(pool) -> None:
    with pytest.raises(ValueError, match="thread_pool_size"):
        Scheduler(pool, thread_pool_size=0)
    with pytest.raises(TypeError, match="process_pool_size"):
        Scheduler(pool, process_pool_size="2")
    with pytest.raises(ValueError, match="loop_stall_warning"):
        Scheduler(pool, loop_stall_warning=-1)
    for bad in (0, -1, "60", float("nan"), True):
        with pytest.raises(ValueError, match="loop_stall_limit"):
            Scheduler(pool, loop_stall_limit=bad)
    assert Scheduler(pool).loop_stall_limit == 60.0
    assert Scheduler(pool, heartbeat_threshold=300, lease_duration=90).loop_stall_limit == 90
    assert Scheduler(pool, loop_stall_limit=5).loop_stall_limit == 5


async def test_thread_job_leaves_the_loop_free_for_async_jobs(pool, make_scheduler):
    sync_tasks.sleeping.clear()
    started_at.clear()
    scheduler = await make_scheduler(max_concurrent_jobs=4)
    sync_id = await scheduler.schedule(sync_tasks.sleep_one, execution_time=now())
    await wait_until(sync_tasks.sleeping.is_set, message="thread job to start")
    due: dict[int, float] = {}
    for n in range(5):
        due[n] = time.monotonic()
        job_id = await scheduler.schedule(exec_note_start, execution_time=now(), args=(n,))
        await scheduler.wait_for(job_id, timeout=5)
    # All five ran while the thread job still slept.
    assert await job_status(pool, sync_id) == "running"
    assert max(started_at[n] - due[n] for n in range(5)) < 0.3
    assert (await scheduler.result(sync_id, timeout=5)).startswith("pg_scheduler-job")


async def test_thread_job_cancelled_is_recorded_at_once_and_keeps_its_slot(pool, make_scheduler):
    for event in (sync_tasks.sleeping, sync_tasks.saw_cancel, sync_tasks.release):
        event.clear()
    scheduler = await make_scheduler(max_concurrent_jobs=1)
    job_id = await scheduler.schedule(sync_tasks.wait_for_cancel, execution_time=now())
    await wait_until(sync_tasks.sleeping.is_set, message="thread job to start")
    assert await scheduler.cancel_job(job_id)
    assert await job_status(pool, job_id) == "cancelled"
    # The thread sees the cooperative signal through current_job().
    await wait_until(sync_tasks.saw_cancel.is_set, message="thread to see cancelled()")
    started_at.clear()
    waiting = await scheduler.schedule(exec_note_start, execution_time=now(), args=(99,))
    await wait_until(lambda: not scheduler.worker.running, message="job to leave running")
    # The only slot is still the thread's: the next job is claimed (ahead) but waits.
    await wait_for_status(pool, waiting, "running")
    assert scheduler.worker.slots.active == 1
    assert 99 not in started_at
    sync_tasks.release.set()
    await scheduler.wait_for(waiting, timeout=5)
    assert await job_status(pool, job_id) == "cancelled"


async def test_thread_job_reports_progress_from_its_thread(pool, make_scheduler):
    # set_progress() from a plain def on the thread executor: written while the
    # thread still runs, rate-limited like report_progress, the last value
    # always written; bad values raise in the thread, at the call.
    for gate in (sync_tasks.progress_gate, sync_tasks.progress_halfway):
        gate.clear()
    sync_tasks.progress_end_gate.clear()
    scheduler = await make_scheduler()
    async with scheduler.events("progress", task="sync.progress_steps") as progress:
        job_id = await scheduler.schedule(
            sync_tasks.progress_steps, execution_time=now(), args=(5_000,)
        )
        await wait_until(sync_tasks.progress_halfway.is_set, message="thread to report")
        first = await asyncio.wait_for(progress.__anext__(), 5)
        assert (first.job_id, first.progress) == (job_id, 0.5)
        job = await scheduler.get_job(job_id)
        assert job.status == "running"  # the thread is still at its gate
        assert (job.progress, job.progress_message) == (0.5, "halfway")
        released = time.monotonic()
        sync_tasks.progress_gate.set()
        seen = [first]
        while seen[-1].progress != 1.0:  # the burst's last value comes, as an event
            seen.append(await asyncio.wait_for(progress.__anext__(), 5))
        burst_seconds = time.monotonic() - released
        job = await scheduler.get_job(job_id)
        assert (job.status, job.progress_message) == ("running", "step 5000")
        # 5,000 reports in the burst, written at most four times a second.
        assert 1 <= len(seen) - 1 <= 4 * burst_seconds + 1, (len(seen), burst_seconds)
        sync_tasks.progress_end_gate.set()
        done = await scheduler.wait_for(job_id, timeout=10)
    assert done.result == ["ValueError"] * 3 + ["TypeError"] * 4


async def test_process_job_returns_its_result(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(sync_tasks.sync_add, execution_time=now(), args=(2, 3))
    result = await scheduler.result(job_id, timeout=20)
    assert result["sum"] == 5 and result["pid"] != os.getpid()
    failing = await scheduler.schedule(sync_tasks.sync_boom, execution_time=now())
    await wait_for_status(pool, failing, "failed", timeout=20)
    job = await scheduler.get_job(failing)
    assert "boom in the child" in job.attempt_history[-1].error


async def test_process_job_past_its_timeout_is_killed_and_fails(pool, make_scheduler, tmp_path):
    scheduler = await make_scheduler()
    pid_file: Path = tmp_path / "pid"
    job_id = await scheduler.schedule(
        sync_tasks.sync_hang, execution_time=now(), args=(str(pid_file),), timeout=2.0
    )
    await wait_until(lambda: read_pid(pid_file) is not None, timeout=20)
    pid = read_pid(pid_file)
    assert pid is not None
    await wait_for_status(pool, job_id, "failed", timeout=20)
    job = await scheduler.get_job(job_id)
    assert "timed out after 2 s" in job.attempt_history[-1].error
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped
    assert not scheduler.worker.executor.sync.pids


async def exec_block_loop(seconds: float) -> None:
    time.sleep(seconds)  # noqa: ASYNC251 - the blocking job under test


async def test_watchdog_names_the_job_blocking_the_loop(pool, make_scheduler):
    scheduler = await make_scheduler(loop_stall_warning=0.2)
    with capture_logs() as logs:
        innocent = await scheduler.schedule(sync_tasks.sleep_one, execution_time=now())
        job_id = await scheduler.schedule(exec_block_loop, execution_time=now(), args=(1.0,))
        await scheduler.wait_for(job_id, timeout=10)
        await scheduler.wait_for(innocent, timeout=10)

        def ended() -> bool:
            return any(e["event"] == "event loop stall ended" for e in logs)

        await wait_until(ended, message="stall end to be logged")
    blocked = [e for e in logs if e["event"].startswith("event loop blocked")]
    assert len(blocked) == 1
    warning = blocked[0]
    assert warning["log_level"] == "warning"
    assert job_id in warning["blocking_job"] and "exec_block_loop" in warning["blocking_job"]
    assert "exec_block_loop" in warning["stuck_at"]
    # A thread job is not on the loop: not named.
    assert not any(innocent in name for name in warning["running_jobs"])
    stalled_for = next(e for e in logs if e["event"] == "event loop stall ended")["stalled_for"]
    assert 0.5 < stalled_for < 1.5
    assert scheduler.watchdog is not None and scheduler.watchdog.stalls == 1


async def test_no_watchdog_thread_when_disabled(pool, make_scheduler):
    scheduler = await make_scheduler(loop_stall_warning=None)
    assert scheduler.watchdog is None
    assert not [t for t in threading.enumerate() if t.name == "pg_scheduler-watchdog"]
    enabled = await make_scheduler()
    assert [t for t in threading.enumerate() if t.name == "pg_scheduler-watchdog"]
    await enabled.shutdown()
    assert not [t for t in threading.enumerate() if t.name == "pg_scheduler-watchdog"]


async def test_thread_job_past_its_timeout_fails_at_once_and_frees_its_slot_on_return(
    pool, make_scheduler
):
    for event in (sync_tasks.sleeping, sync_tasks.saw_cancel, sync_tasks.release):
        event.clear()
    scheduler = await make_scheduler(max_concurrent_jobs=1)
    job_id = await scheduler.schedule(sync_tasks.ignore_timeout, execution_time=now(), timeout=0.3)
    await wait_for_status(pool, job_id, "failed")
    # Recorded while the thread still runs; it saw the signal and holds the slot.
    assert not sync_tasks.release.is_set()
    await wait_until(sync_tasks.saw_cancel.is_set, message="thread to see cancelled()")
    job = await scheduler.get_job(job_id)
    assert "timed out after 0.3 s" in job.attempt_history[-1].error
    assert scheduler.worker.slots.active == 1
    sync_tasks.release.set()
    await wait_until(lambda: scheduler.worker.slots.active == 0, message="slot to be freed")
    assert await job_status(pool, job_id) == "failed"


async def test_timed_out_thread_jobs_retry_waits_for_the_old_thread_here(pool, make_scheduler):
    for event in (sync_tasks.sleeping, sync_tasks.release):
        event.clear()
    sync_tasks.overlap.update(active=0, max_active=0, runs=0)
    scheduler = await make_scheduler(max_concurrent_jobs=3)
    job_id = await scheduler.schedule(
        sync_tasks.slow_first_run,
        execution_time=now(),
        timeout=0.3,
        max_retries=1,
        retry_policy=RetryPolicy(base_delay=0, jitter=0),
    )
    await wait_until(sync_tasks.sleeping.is_set, message="first attempt to start")

    async def retry_claimed() -> bool:
        row = await pool.fetchrow(
            "SELECT status, attempts FROM scheduled_jobs WHERE job_id = $1", job_id
        )
        return row["status"] == "running" and row["attempts"] == 2

    # The retry is due at once and claimed by this worker, but waits for the thread.
    await wait_until(retry_claimed, message="retry to be claimed")
    await wait_until(lambda: job_id in scheduler.worker.running, message="retry to be started")
    assert sync_tasks.overlap["runs"] == 1
    assert scheduler.worker.slots.active == 2  # the old thread's slot and the retry's
    sync_tasks.release.set()
    assert await scheduler.result(job_id, timeout=10) == 2
    assert sync_tasks.overlap["max_active"] == 1
    job = await scheduler.get_job(job_id)
    assert [a.outcome for a in job.attempt_history] == ["timed_out", "completed"]
    await wait_until(lambda: not scheduler.worker.executor.lingering, message="linger to clear")


async def exec_noop(n: int) -> int:
    return n


async def test_async_jobs_start_within_50ms_of_due_while_a_thread_sleeps_3s(pool, make_scheduler):
    sync_tasks.sleeping.clear()
    scheduler = await make_scheduler(max_concurrent_jobs=4)
    sync_id = await scheduler.schedule(sync_tasks.sleep_three, execution_time=now())
    await wait_until(sync_tasks.sleeping.is_set, message="thread job to start")
    base = now()
    ids = [
        await scheduler.schedule(
            exec_noop, execution_time=base + timedelta(seconds=0.3 + 0.25 * n), args=(n,)
        )
        for n in range(8)
    ]
    for job_id in ids:
        await scheduler.wait_for(job_id, timeout=10)
    # All due (and run) while the thread job still slept.
    assert await job_status(pool, sync_id) == "running"
    late = await pool.fetch(
        """SELECT EXTRACT(EPOCH FROM started_at - execution_time)::float8 AS late
             FROM scheduled_jobs WHERE job_id = ANY($1::text[])""",
        ids,
    )
    lateness = sorted(r["late"] for r in late)
    print("start lateness (s):", [round(x, 4) for x in lateness])
    # Typically all under 15 ms. On the shared 2-core machine one start in
    # about 30 runs came later than 50 ms (the loop thread not scheduled); a
    # loop blocked by the thread job would make them all 1-2.7 s late.
    assert all(x >= 0 for x in lateness), lateness
    assert sum(x < 0.05 for x in lateness) >= len(lateness) - 1, lateness
    assert max(lateness) < 0.5, lateness
    assert await scheduler.result(sync_id, timeout=10) == "slept"


block_started = threading.Event()


async def exec_block_briefly(seconds: float) -> str:
    block_started.set()
    time.sleep(seconds)  # noqa: ASYNC251 - the blocking job under test
    return "done"


async def test_schedule_returns_before_a_locally_started_job_blocks_the_loop(pool, make_scheduler):
    block_started.clear()
    scheduler = await make_scheduler(loop_stall_warning=None)
    began = time.perf_counter()
    job_id = await scheduler.schedule(exec_block_briefly, execution_time=now(), args=(1.5,))
    returned_after = time.perf_counter() - began
    started_inside_schedule = block_started.is_set()
    # Written already claimed here (the in-process start).
    row = await pool.fetchrow(
        "SELECT status, worker_id FROM scheduled_jobs WHERE job_id = $1", job_id
    )
    print(f"schedule() returned after {returned_after * 1000:.1f} ms")
    # (The read yields to the loop, so the job may have run and completed by now.)
    assert row["status"] in ("running", "completed")
    assert row["worker_id"] == scheduler.worker_id
    assert not started_inside_schedule
    assert returned_after < 0.5
    assert await scheduler.result(job_id, timeout=10) == "done"


stall_gate = asyncio.Event()


async def exec_wait_stall_gate() -> str:
    await stall_gate.wait()
    return "finished"


async def lease_of(pool, job_id: str) -> Any:
    return await pool.fetchval("SELECT lease_until FROM scheduled_jobs WHERE job_id = $1", job_id)


async def test_stall_guard_renews_then_fails_the_blocker_then_gives_up(pool, make_scheduler):
    # The guard driven by hand from a thread, as the watchdog drives it (none runs here).
    stall_gate.clear()
    scheduler = await make_scheduler(loop_stall_warning=None, loop_stall_limit=5)
    blocker = await scheduler.schedule(exec_wait_stall_gate, execution_time=now())
    innocent = await scheduler.schedule(exec_wait_stall_gate, execution_time=now())
    await wait_until(lambda: {blocker, innocent} <= set(scheduler.worker.running))
    guard = stall_guard(scheduler.settings, scheduler.store, scheduler.worker)
    guard.main_loop = asyncio.get_running_loop()
    before = await lease_of(pool, innocent)
    await asyncio.to_thread(guard.tick, 0.1, None, "")  # shorter than heartbeat_interval
    assert guard.renewals == 0
    await asyncio.to_thread(guard.tick, 1.0, None, "")
    assert guard.renewals == 1 and await lease_of(pool, innocent) > before
    running = scheduler.worker.running[blocker]
    await asyncio.to_thread(guard.tick, 5.5, running, "  File x, in exec_wait_stall_gate\n")
    assert guard.failed == [blocker]
    await wait_for_status(pool, blocker, "failed")
    job = await scheduler.get_job(blocker)
    assert job.error.startswith("blocked the event loop for 5.5 s (loop_stall_limit=5 s)")
    assert [a.outcome for a in job.attempt_history] == ["failed"]
    # Its task is stopped on the loop; the innocent job runs on.
    await wait_until(lambda: blocker not in scheduler.worker.running, message="blocker stopped")
    assert innocent in scheduler.worker.running
    renewed = await lease_of(pool, innocent)
    await asyncio.to_thread(guard.tick, 10.0, None, "")  # twice the limit: gives up
    await asyncio.to_thread(guard.tick, 10.5, None, "")
    assert await lease_of(pool, innocent) == renewed
    await asyncio.to_thread(guard.close)
    stall_gate.set()
    assert await scheduler.result(innocent, timeout=5) == "finished"
    assert await job_status(pool, blocker) == "failed"
