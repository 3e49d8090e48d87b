"""Awaiting results across processes, attempt history, events, job context."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from pg_scheduler import (
    JobCancelled,
    JobFailed,
    JobNotFound,
    JobSpec,
    RetryPolicy,
    current_job,
)
from tests.support import results_tasks
from tests.support.common import ROOT, wait_for_status, wait_until

FAST_RETRY = RetryPolicy(base_delay=0.01, factor=1, max_delay=0.01, jitter=0)


def now() -> datetime:
    return datetime.now(UTC)


class Worker:
    """A worker subprocess running results_tasks (stdin closed: it shuts down)."""

    def __init__(self, proc: asyncio.subprocess.Process, worker_id: str) -> None:
        self.proc = proc
        self.worker_id = worker_id
        self.errors: list[bytes] = []
        self._drain = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self.proc.stderr is not None
        async for line in self.proc.stderr:
            self.errors.append(line)

    @classmethod
    async def start(cls, dsn: str) -> Worker:
        env = {**os.environ, "PG_SCHEDULER_DSN": dsn, "PYTHONPATH": str(ROOT)}
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.support.results_worker",
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        assert proc.stderr is not None
        line = b""
        while not line.startswith(b"ready "):
            line = await asyncio.wait_for(proc.stderr.readline(), 60)
            assert line, "worker exited before it was ready"
        return cls(proc, line.split()[1].decode())

    async def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 20)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        await self._drain


@pytest.fixture
async def remote_worker(dsn, pool):
    worker = await Worker.start(dsn)
    yield worker
    await worker.stop()


async def test_wait_for_in_another_process_wakes_within_50ms(pool, make_scheduler, remote_worker):
    # Process A: this one, a Scheduler never started (it only enqueues and waits).
    client = await make_scheduler(start=False)
    latencies = []
    for n in range(20):
        job_id = await client.schedule(
            results_tasks.echo, execution_time=now() + timedelta(milliseconds=200), args=(n,)
        )
        job = await client.wait_for(job_id, timeout=20)
        returned = datetime.now(UTC)
        assert job.status == "completed" and job.result == n
        assert job.worker_id == remote_worker.worker_id
        latencies.append((returned - job.finished_at).total_seconds())
    # Woken by the completion's event: the median within 50 ms, and none as
    # late as a poll would be (0.5 s at the soonest, 5 s while events flow).
    # A stall of a loaded machine may delay one sample past 50 ms; a poll
    # would delay them all.
    assert statistics.median(latencies) < 0.05, latencies
    assert max(latencies) < 0.4, latencies


async def test_result_raises_job_failed_with_the_remote_traceback(
    pool, make_scheduler, remote_worker
):
    client = await make_scheduler(start=False)
    job_id = await client.schedule(results_tasks.boom, execution_time=now(), args=("kaboom",))
    with pytest.raises(JobFailed) as raised:
        await client.result(job_id, timeout=20)
    failure = raised.value
    assert failure.job.job_id == job_id and failure.job.status == "failed"
    assert failure.error.startswith("ValueError: kaboom in pid ")
    assert f"pid {os.getpid()}" not in failure.error  # raised in the worker process
    assert "in boom" in failure.traceback and "ValueError" in failure.traceback
    assert await client.run(results_tasks.echo, {"a": [1, 2]}) == {"a": [1, 2]}


async def test_unknown_job_and_timeout(pool, make_scheduler):
    client = await make_scheduler(start=False)
    with pytest.raises(JobNotFound):
        await client.wait_for("no-such-job", timeout=5)
    assert issubclass(JobNotFound, LookupError)
    job_id = await client.schedule(results_tasks.echo, execution_time=now() + timedelta(hours=1))
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await client.wait_for(job_id, timeout=0.2)
    assert time.monotonic() - started < 2


async def test_a_thousand_waiters_share_one_connection(dsn, pool, make_scheduler):
    app = f"pgs-waiters-{os.getpid()}"
    client_pool = await asyncpg.create_pool(
        dsn, min_size=4, max_size=4, server_settings={"application_name": app}
    )
    try:
        client = await make_scheduler(start=False, db_pool=client_pool)
        specs = [JobSpec(results_tasks.echo, now(), args=(n,)) for n in range(1000)]
        ids = await client.schedule_bulk(specs)

        async def connections() -> int:
            return await pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app
            )

        before = await connections()
        assert before == 4
        waiters = [asyncio.create_task(client.wait_for(i, timeout=60)) for i in ids]
        hub = client.events_hub
        await wait_until(lambda: len(hub._waiters) == 1000, timeout=30, message="1000 waiters")
        assert await connections() <= before + 1
        worker = await make_scheduler(max_concurrent_jobs=100, batch_claim_limit=100)
        assert worker.is_running
        jobs = await asyncio.wait_for(asyncio.gather(*waiters), 60)
        assert sorted(j.result for j in jobs) == list(range(1000))
        assert await connections() <= before + 1
    finally:
        await client.shutdown()
        await client_pool.close()


async def test_failing_twice_then_succeeding_keeps_three_attempts(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(
        results_tasks.fail_until,
        execution_time=now(),
        args=(3,),
        max_retries=5,
        retry_policy=FAST_RETRY,
    )
    job = await scheduler.wait_for(job_id, timeout=20)
    assert job.status == "completed" and job.result == "ok"
    assert job.error is None and job.traceback is None
    history = job.attempt_history
    assert [(a.attempt, a.outcome) for a in history] == [
        (1, "failed"),
        (2, "failed"),
        (3, "completed"),
    ]
    assert history[0].error == "RuntimeError: attempt 1 failed on purpose"
    assert "fail_until" in history[1].traceback
    assert all(a.worker_id == scheduler.worker_id and a.started_at for a in history)
    # Retention: the history goes with its job.
    await pool.execute("DELETE FROM scheduled_jobs WHERE job_id = $1", job_id)
    assert await pool.fetchval("SELECT count(*) FROM job_attempts") == 0


async def test_cancelled_running_attempt_is_kept(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(results_tasks.wait_cancel, execution_time=now(), args=("x",))
    await wait_for_status(pool, job_id, "running")
    assert await scheduler.cancel_job(job_id)
    with pytest.raises(JobCancelled):
        await scheduler.result(job_id, timeout=10)
    job = await scheduler.get_job(job_id)
    assert [(a.attempt, a.outcome) for a in job.attempt_history] == [(1, "cancelled")]


async def test_first_attempt_completion_writes_no_history(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(results_tasks.echo, execution_time=now(), args=(1,))
    job = await scheduler.wait_for(job_id, timeout=10)
    assert [(a.attempt, a.outcome) for a in job.attempt_history] == [(1, "completed")]
    assert await pool.fetchval("SELECT count(*) FROM job_attempts") == 0


async def test_current_job_inside_and_outside(pool, make_scheduler):
    with pytest.raises(RuntimeError, match="outside"):
        current_job()
    scheduler = await make_scheduler()
    at = now()
    job_id = await scheduler.schedule(results_tasks.context, execution_time=at)
    seen = await scheduler.result(job_id, timeout=10)
    assert seen["job_id"] == job_id and seen["attempt"] == 1
    assert seen["task"] == "results.context" and seen["queue"] == "default"
    assert datetime.fromisoformat(seen["scheduled_at"]) == at
    assert seen["cancelled"] is False


async def test_progress_is_rate_limited_and_the_last_value_written(pool, make_scheduler):
    scheduler = await make_scheduler()
    async with scheduler.events("progress", task="results.progress_storm") as progress:
        job_id = await scheduler.schedule(
            results_tasks.progress_storm, execution_time=now(), args=(10_000, 1.0)
        )
        job = await scheduler.wait_for(job_id, timeout=20)
        assert job.result == 10_000
        # The latest value is written, at most a quarter of a second after the job ended.
        await wait_until(
            lambda: _progress_is(scheduler, job_id, 1.0), timeout=5, message="final progress"
        )
        job = await scheduler.get_job(job_id)
        assert job.progress_message == "step 10000"
        seconds = (job.finished_at - job.started_at).total_seconds()
        writes = progress._queue.qsize()
    assert 2 <= writes <= 4 * seconds + 2, (writes, seconds)


async def test_set_progress_from_async_code_is_written_without_an_await(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(results_tasks.progress_no_wait, execution_time=now())
    assert (await scheduler.wait_for(job_id, timeout=10)).result == "returned"
    await wait_until(lambda: _progress_is(scheduler, job_id, 0.25), timeout=5, message="progress")
    assert (await scheduler.get_job(job_id)).progress_message == "a quarter"


async def test_progress_message_postgres_cannot_store_is_refused_at_the_call(pool, make_scheduler):
    scheduler = await make_scheduler()
    job_id = await scheduler.schedule(results_tasks.progress_bad_text, execution_time=now())
    refused = (await scheduler.wait_for(job_id, timeout=10)).result
    assert len(refused) == 4, refused
    assert all("NUL" in m for m in refused[:2]) and all("surrogate" in m for m in refused[2:])
    await wait_until(lambda: _progress_is(scheduler, job_id, 0.75), timeout=5, message="progress")
    assert (await scheduler.get_job(job_id)).progress_message == "fine"


def test_set_progress_after_the_workers_loop_closed_warns_and_returns():
    # A thread that outlives its worker's event loop: the report is dropped
    # with a warning, never an exception into the thread.
    from types import SimpleNamespace

    from structlog.testing import capture_logs

    from pg_scheduler.context import JobContext

    loop = asyncio.new_event_loop()
    task = loop.create_task(asyncio.sleep(0))
    loop.run_until_complete(task)
    loop.close()
    running = SimpleNamespace(task=task, job=SimpleNamespace(job_id="gone", attempt=1))
    context = JobContext(None, running, {})  # type: ignore[arg-type]
    with capture_logs() as logs:
        context.set_progress(0.5, "late")
    assert [entry["event"] for entry in logs] == ["progress not written: the worker has stopped"]
    with pytest.raises(ValueError, match="between 0 and 1"):
        context.set_progress(2.0)


async def _progress_is(scheduler, job_id, value):
    return (await scheduler.get_job(job_id)).progress == value


async def test_events_from_two_worker_processes_reach_a_third(dsn, pool, make_scheduler):
    client = await make_scheduler(start=False)
    async with (
        client.events(["completed"], task="results.echo") as completed,
        client.events(["worker_started"]) as joined,
    ):
        workers = [await Worker.start(dsn), await Worker.start(dsn)]
        try:
            total, batch = 3000, 100
            ids: set[str] = set()
            loop = asyncio.get_running_loop()
            start = loop.time()
            for n in range(0, total, batch):  # about 1,000 jobs a second
                specs = [JobSpec(results_tasks.echo, now(), args=(i,)) for i in range(n, n + batch)]
                ids.update(await client.schedule_bulk(specs))
                await asyncio.sleep(max(0.0, start + (n + batch) / 1000 - loop.time()))
            seen: dict[str, str] = {}
            deadline = loop.time() + 60
            while len(seen) < total:
                event = await asyncio.wait_for(completed.__anext__(), deadline - loop.time())
                assert event.kind == "completed" and event.outcome == "completed"
                seen[event.job_id] = event.worker_id
        finally:
            for worker in workers:
                await worker.stop()
        assert set(seen) == ids and completed.dropped == 0
        assert set(seen.values()) == {w.worker_id for w in workers}
        started = {(await joined.__anext__()).worker_id for _ in range(2)}
        assert started == {w.worker_id for w in workers}


async def test_a_slow_subscriber_drops_and_counts(pool, make_scheduler):
    scheduler = await make_scheduler(max_concurrent_jobs=50, batch_claim_limit=50)
    async with scheduler.events("completed", maxsize=10) as slow:
        specs = [JobSpec(results_tasks.echo, now(), args=(i,)) for i in range(200)]
        await scheduler.schedule_bulk(specs)
        await wait_until(
            lambda: slow.dropped + slow._queue.qsize() >= 200, timeout=20, message="all events"
        )
        assert slow._queue.qsize() == 10 and slow.dropped == 190
        first = await slow.__anext__()
        assert first.kind == "completed"


async def test_a_completion_without_an_event_just_after_the_waiters_flag_is_found_soon(
    pool, make_scheduler
):
    """A completion statement already under way when the first waiter asks
    for completion events read the flags before and sends none; a hand-written
    UPDATE sends none either, and stands in for it here. For a second after
    writing its flag the waiter re-reads the job every 0.5 s, not at the 5 s
    poll of a live listener."""
    await pool.execute("DELETE FROM scheduler_event_flags")
    client = await make_scheduler(start=False)  # its own hub: no flag asked yet
    job_id = await client.schedule(results_tasks.echo, execution_time=now() + timedelta(hours=1))
    waiting = asyncio.create_task(client.wait_for(job_id, timeout=4))

    async def flag_written() -> bool:
        return bool(await pool.fetchval("SELECT count(*) FROM scheduler_event_flags"))

    await wait_until(flag_written, message="the waiter's completion flag")
    await pool.execute(
        "UPDATE scheduled_jobs SET status = 'completed', finished_at = now() WHERE job_id = $1",
        job_id,
    )
    completed = time.monotonic()
    job = await waiting
    assert job.status == "completed"
    assert time.monotonic() - completed < 2
