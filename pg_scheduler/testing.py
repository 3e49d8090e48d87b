"""Helpers for testing your own tasks (needs the ``embedded`` extra:
``pip install -e '.[embedded]'`` in a clone of the repository).

``scheduler_for_tests()``: a started Scheduler on a throwaway embedded
PostgreSQL database (a fresh database per call, dropped afterwards; the
server is shared by the process and stopped at exit)::

    async with scheduler_for_tests() as scheduler:
        assert await scheduler.run(add, 1, 2) == 3

``run_job()`` / ``run_eagerly()``: eager mode. The job runs inline in the
caller's task through the worker's own code path (its outcome written under
the lease guard, retries taken at once, without waiting for their delay), and
its final Job is returned: no worker loop, no sleeps.

Workflows (docs: Durable workflows, "Testing a workflow"), on a Scheduler
that is not started (``scheduler_for_tests(start=False)``): every run goes
through the worker's code path, inline. ``run_workflow()`` /
``resume_workflow()`` run one to its end: signals from ``signals=`` are sent
when it waits for them, the children it waits for run inline, and a
:class:`VirtualClock` lets its sleeps and timeouts pass at once.
``run_until_parked()`` runs it until it parks. ``run_until_crash()`` stops its
run right after a given step as a killed worker would, ``rescue_job()``
returns the row to pending as the rescuer does, and the next run replays.
"""

from __future__ import annotations

import math
import tempfile
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from .api.results import JobNotFound
from .enums import JobStatus
from .models import Job
from .scheduler import Scheduler
from .store.events import EventStore
from .store.testing import TestingStore
from .support.codec import encode_task_data
from .support.timeutil import human_seconds
from .support.validation import check_name
from .workflows.decorator import is_workflow
from .workflows.run import CRASH_AFTER
from .workflows.runner import workflow_store

# Timings that make rescues, heartbeats and shutdown quick in a test.
TEST_SETTINGS: dict[str, Any] = dict(
    heartbeat_interval=0.2,
    heartbeat_threshold=2.0,
    lease_duration=3.0,
    rescue_interval=0.3,
    listener_health_interval=0.5,
    shutdown_grace_period=2.0,
    vacuum_enabled=False,
    run_periodic_jobs=False,
)

_server: Any = None


def _embedded_dsn() -> str:
    global _server
    if _server is None:
        from .embedded import start

        _server = start(tempfile.mkdtemp(prefix="pg-scheduler-test-") + "/pgdata", cleanup="delete")
    return _server.dsn


@asynccontextmanager
async def scheduler_for_tests(
    dsn: str | None = None, *, start: bool = True, **options: Any
) -> AsyncIterator[Scheduler]:
    """A Scheduler on a new, migrated database (on ``dsn``'s server, else the
    embedded one); the database is dropped on exit. ``options`` go to Scheduler."""
    server = dsn or _embedded_dsn()
    name = f"pgs_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    pool = await asyncpg.create_pool(server, database=name, min_size=1, max_size=10)
    scheduler = Scheduler(pool, **{**TEST_SETTINGS, **options})
    try:
        if start:
            await scheduler.start()
        else:
            await scheduler.initialize_db()
        yield scheduler
    finally:
        await scheduler.shutdown(grace_period=1.0)
        await pool.close()
        admin = await asyncpg.connect(server)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


async def run_job(scheduler: Scheduler, job_id: str) -> Job:
    """Run a pending job now, inline, and every retry it earns; its final Job.

    The Scheduler need not be started (it must know the task); the job runs
    whatever its execution_time.
    """
    store = EventStore(scheduler.store.pool, scheduler.store.schema)
    try:
        while True:
            row = await store.claim_one(job_id, scheduler.worker_id)
            if row is None:
                job = await scheduler.get_job(job_id)
                if job is None:
                    raise JobNotFound(job_id)
                if job.status is JobStatus.PENDING:
                    continue  # raced with a worker's claim of it; try again
                if job.status is JobStatus.RUNNING:
                    return await scheduler.wait_for(job_id)
                return job
            await scheduler.worker.executor.execute_job(row)
    finally:
        if not scheduler.is_running:
            # Completions keep a pooled connection between writes; the
            # shutdown of a started Scheduler gives it back, here we must.
            await scheduler.worker.completer.connection.release()


async def run_eagerly(
    scheduler: Scheduler, func: Callable[..., Any], *args: Any, **kwargs: Any
) -> Job:
    """Schedule ``func(*args, **kwargs)`` and run it inline (see run_job)."""
    job_id = await scheduler.schedule(
        func, execution_time=datetime.now(UTC), args=args, kwargs=kwargs
    )
    return await run_job(scheduler, job_id)


# -- workflows -----------------------------------------------------------------------


class WorkflowStuck(RuntimeError):
    """A workflow helper cannot take the workflow further: it waits for a signal
    that ``signals=`` does not hold, with no timeout to end the wait, or it
    parked more than ``max_parks`` times without ending. ``job``: the Job as
    it stands."""

    def __init__(self, message: str, job: Job) -> None:
        super().__init__(message)
        self.job = job


def _scheduler(scheduler: Any) -> Scheduler:
    if not isinstance(scheduler, Scheduler):
        raise TypeError(f"scheduler must be a Scheduler, got {scheduler!r}")
    return scheduler


def _idle(scheduler: Any, what: str) -> Scheduler:
    """``scheduler``, refused when started: its workers would take the runs."""
    _scheduler(scheduler)
    if scheduler.is_running:
        raise RuntimeError(
            f"{what} runs the workflow itself: give it a Scheduler that is not started "
            "(scheduler_for_tests(start=False)); a started one's workers would take its runs"
        )
    return scheduler


def _job_id(job_id: Any) -> str:
    if not isinstance(job_id, str) or not job_id:
        raise TypeError(f"job_id must be a non-empty str, got {job_id!r}")
    return job_id


def _duration(value: Any) -> timedelta:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"the time to advance must be a timedelta or seconds, got {value!r}")
    else:
        seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(
            f"the time to advance must be finite and >= 0, got {human_seconds(seconds)}"
        )
    return value if isinstance(value, timedelta) else timedelta(seconds=seconds)


def _positive_int(what: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{what} must be >= 1, got {value!r}")
    return value


def _signal_queues(signals: Any) -> dict[str, deque[Any]]:
    """``signals=`` (a mapping name -> payload, or (name, payload) pairs) as
    payloads by name, in order; checked as ``scheduler.signal`` checks them."""
    if signals is None:
        return {}
    if isinstance(signals, Mapping):
        pairs: Iterable[Any] = signals.items()
    elif isinstance(signals, str | bytes) or not isinstance(signals, Iterable):
        raise TypeError(
            "signals must be a mapping of name to payload or (name, payload) pairs, "
            f"got {signals!r}"
        )
    else:
        pairs = signals
    queues: dict[str, deque[Any]] = {}
    for pair in pairs:
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"signals: expected a (name, payload) pair, got {pair!r}")
        name, payload = pair
        if not isinstance(name, str) or not name:
            raise TypeError(f"signal name must be a non-empty str, got {name!r}")
        check_name("signal name", name)
        encode_task_data([payload], {}, f"signal {name!r}")
        queues.setdefault(name, deque()).append(payload)
    return queues


async def _job(scheduler: Scheduler, job_id: str) -> Job:
    job = await scheduler.get_job(job_id)
    if job is None:
        raise JobNotFound(job_id)
    return job


async def _wake_due(scheduler: Scheduler) -> int:
    """The workflow timer's own statement, for the rows whose time has come."""
    store, woken, batch = workflow_store(scheduler.store), 0, 1000
    while True:
        count = await store.wake_due(0.0, batch)
        woken += count
        if count < batch:
            return woken


class VirtualClock:
    """Time that passes at once for the workflows of ``scheduler``'s database.

    ``await clock.advance(timedelta(days=3))``: every job not finished sees
    three days pass. PostgreSQL's clock still decides, in the statements it
    decides in production: the clock moves the times recorded for those jobs
    back by that span (a parked workflow's wake time, its deadline, the end of
    a sleep and the timeout of a signal wait recorded in its steps, the due
    time of a pending job due later, never earlier than now); then the
    workflow timer's statement makes the parked workflows whose time has come
    pending, as it does once a second in a started Scheduler. A started
    Scheduler's workers run them; otherwise :func:`run_until_parked` or
    :func:`resume_workflow` does.

    Not moved: the times of what happened (created, started, finished,
    attempts, events), ``ctx.now()`` (not replayed anyway), leases and
    heartbeats, periodic windows, retry delays and step retries' pauses (they
    are spent in the run). A time read from a job after an advance (its
    ``wake_at``, a sleep's end) is earlier by what the clock advanced.
    """

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = _scheduler(scheduler)
        self._store = TestingStore(scheduler.store.pool, scheduler.store.schema)
        #: How far the clock was advanced in all.
        self.elapsed = timedelta(0)

    async def advance(self, delta: timedelta | float) -> int:
        """Let ``delta`` (a timedelta or seconds) pass; the number of parked
        workflows it woke (made pending: due now)."""
        return await self._shift(_duration(delta), None)

    async def _advance_to(self, when: datetime) -> int:
        """Let the time pass until ``when`` (nothing if it has come)."""
        return await self._shift(None, when)

    async def _shift(self, by: timedelta | None, until: datetime | None) -> int:
        shifted = await self._store.shift(self._store.pool, by, until)
        self.elapsed += shifted.by
        return await _wake_due(self.scheduler)


def _clock(scheduler: Scheduler, clock: Any) -> VirtualClock:
    if clock is None:
        return VirtualClock(scheduler)
    if not isinstance(clock, VirtualClock):
        raise TypeError(f"clock must be a VirtualClock, got {clock!r}")
    if clock.scheduler is not scheduler:
        raise ValueError("clock belongs to another Scheduler")
    return clock


async def _release(scheduler: Scheduler) -> None:
    # Completions keep a pooled connection between writes; the shutdown of a
    # started Scheduler gives it back, here we must.
    await scheduler.worker.completer.connection.release()


async def _until_parked(scheduler: Scheduler, job_id: str) -> Job:
    """Runs of ``job_id`` (retries taken at once) until one parks, ends the job
    or stops without writing its end (a crash point)."""
    store = EventStore(scheduler.store.pool, scheduler.store.schema)
    while True:
        row = await store.claim_one(job_id, scheduler.worker_id)
        if row is None:
            job = await _job(scheduler, job_id)
            if job.status is JobStatus.PENDING:
                continue  # raced with another claim of it; try again
            if job.status is JobStatus.RUNNING:
                raise RuntimeError(
                    f"job {job_id} is running (worker {job.worker_id}): a run elsewhere, "
                    "or one a crash left (rescue_job() returns it to pending)"
                )
            return job
        attempt = row["attempts"]
        await scheduler.worker.executor.execute_job(row)
        if row["task_name"] not in scheduler.registry:
            # The executor handed it back: nothing here can run it.
            raise LookupError(
                f"job {job_id}: task {row['task_name']!r} is not registered in this "
                "Scheduler (import the module that defines it)"
            )
        job = await _job(scheduler, job_id)
        if job.status is JobStatus.PENDING and job.attempts >= attempt:
            continue  # a failed attempt's retry: taken at once, as run_job does
        # Parked (waiting; or pending, due within the timer's lookahead: a park
        # is not an attempt), ended, or stopped by a crash point (running).
        return job


def _stuck(job: Job) -> str:
    if job.wait_kind == "signal":
        return (
            f"job {job.job_id} waits for signal {job.wait_for!r} with no timeout, and "
            "signals= holds none (or no more) for it: add it to signals=, send it with "
            "scheduler.signal(), or take the workflow step by step with run_until_parked()"
        )
    return (
        f"job {job.job_id} is {job.status.value}, waiting for {job.wait_kind or 'nothing'}, "
        "with nothing to end the wait"
    )


async def _drive(
    scheduler: Scheduler,
    job_id: str,
    signals: dict[str, deque[Any]],
    clock: VirtualClock,
    max_parks: int,
    crash_after: int | None = None,
) -> Job:
    """Take ``job_id`` to its end (or, with ``crash_after``, to that crash)."""
    tstore = TestingStore(scheduler.store.pool, scheduler.store.schema)
    if crash_after is not None:
        CRASH_AFTER[job_id] = crash_after
    parks = 0
    try:
        while True:
            job = await _until_parked(scheduler, job_id)
            if job.status is JobStatus.RUNNING:
                if crash_after is not None and job_id not in CRASH_AFTER:
                    return job  # stopped right after the step, nothing more written
                raise RuntimeError(f"job {job_id}: its run stopped without writing its end")
            if job.status.is_final:
                if crash_after is not None:
                    raise ValueError(
                        f"crash after step {crash_after}: job {job_id} ended "
                        f"({job.status.value}) before its run was past step {crash_after}"
                    )
                return job
            parks += 1
            if parks > max_parks:
                raise WorkflowStuck(
                    f"job {job_id} parked more than {max_parks} times without ending "
                    f"(max_parks={max_parks})",
                    job,
                )
            waiting = signals.get(job.wait_for or "") if job.wait_kind == "signal" else None
            if waiting:
                await scheduler.signal(job_id, job.wait_for or "", waiting.popleft())
                continue
            if job.wait_kind == "children":
                children = await tstore.unfinished_children(tstore.pool, job_id)
                if children:
                    # Each starts now, as idle workers would start them all,
                    # then each is taken to its end in turn.
                    for child in children:
                        await _until_parked(scheduler, child)
                    for child in children:
                        await _drive(scheduler, child, {}, clock, max_parks)
                    continue
            when = job.execution_time if job.status is JobStatus.PENDING else job.wake_at
            if when is None:
                raise WorkflowStuck(_stuck(job), job)
            await clock._advance_to(when)
    finally:
        if crash_after is not None:
            CRASH_AFTER.pop(job_id, None)


async def run_until_parked(scheduler: Scheduler, job_id: str) -> Job:
    """Run workflow ``job_id`` inline (eager mode) until it parks or ends, and
    return its Job: ``waiting`` with what it waits for (``wait_kind``:
    ``sleep``, ``signal`` or ``children``; ``wait_for``: the signal's name;
    ``wake_at``), ``pending`` when it parked within two seconds of its wake
    (due then: ``execution_time``), or final. A failed attempt's retry is
    taken at once. A job already waiting is returned as it is."""
    _idle(scheduler, "run_until_parked")
    _job_id(job_id)
    try:
        return await _until_parked(scheduler, job_id)
    finally:
        await _release(scheduler)


async def resume_workflow(
    scheduler: Scheduler,
    job_id: str,
    *,
    signals: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
    clock: VirtualClock | None = None,
    max_parks: int = 1000,
) -> Job:
    """Run workflow ``job_id`` inline to its end; its final Job.

    Each time it parks: waiting for a signal that ``signals`` holds (a
    mapping name -> payload, or (name, payload) pairs: several of one name
    are sent in order, one per wait), that signal is sent with
    ``scheduler.signal``; waiting for children, those not ended run inline the
    same way (signals go to this workflow only); sleeping, or waiting with a
    timeout or a deadline, the ``clock`` (a new :class:`VirtualClock` if
    None) advances to its wake time. A signal it waits for with no timeout and
    not in ``signals`` raises :class:`WorkflowStuck`, as does parking more
    than ``max_parks`` times. Signals it never waits for are not sent.
    """
    _idle(scheduler, "resume_workflow")
    _job_id(job_id)
    queues = _signal_queues(signals)
    the_clock = _clock(scheduler, clock)
    parks = _positive_int("max_parks", max_parks)
    try:
        return await _drive(scheduler, job_id, queues, the_clock, parks)
    finally:
        await _release(scheduler)


async def run_until_crash(
    scheduler: Scheduler,
    job_id: str,
    step: int,
    *,
    signals: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
    clock: VirtualClock | None = None,
    max_parks: int = 1000,
) -> Job:
    """Run workflow ``job_id`` as :func:`resume_workflow` does, and stop its run
    as a killed worker would once it is past step ``step`` (the place in its
    record: 1 for the first call of ``ctx`` that records, a step, transaction,
    sleep, signal wait, spawn or wait) and that step's record is committed: the
    run writes nothing more and does nothing more of the workflow. Returns the
    Job as the crash left it: ``running``, held by this Scheduler's worker id
    until its lease runs out. :func:`rescue_job` then returns it to pending,
    and the next run replays it.

    The run stops at the next call of ``ctx`` after that step, or when the
    workflow returns: code of the workflow between two steps (not in a step)
    runs before the crash, and again when the workflow is replayed. ValueError
    if the workflow ends before its run is past that step.
    """
    _idle(scheduler, "run_until_crash")
    _job_id(job_id)
    crash = _positive_int("step", step)
    queues = _signal_queues(signals)
    the_clock = _clock(scheduler, clock)
    parks = _positive_int("max_parks", max_parks)
    try:
        return await _drive(scheduler, job_id, queues, the_clock, parks, crash)
    finally:
        await _release(scheduler)


async def rescue_job(scheduler: Scheduler, job_id: str) -> Job:
    """Do what the rescuer does once the worker of running job ``job_id`` died
    and its lease ran out: its lease is made to run out now, then the
    rescuer's own statement returns it to pending (``rescue_count`` + 1, the
    attempt kept as ``rescued``; failed past ``max_rescues``). Its Job then.
    ValueError when the job is not running."""
    _scheduler(scheduler)
    _job_id(job_id)
    tstore = TestingStore(scheduler.store.pool, scheduler.store.schema)
    if await tstore.expire_lease(tstore.pool, job_id) is None:
        job = await _job(scheduler, job_id)
        raise ValueError(f"job {job_id} is {job.status.value}, not running: nothing to rescue")
    rescuer = scheduler.rescuer
    await scheduler.store.rescue_orphans(
        rescuer.heartbeat_threshold(), rescuer.max_rescues, rescuer.max_unstarted_rescues
    )
    return await _job(scheduler, job_id)


async def run_workflow(
    scheduler: Scheduler,
    func: Callable[..., Any],
    /,
    *args: Any,
    signals: Mapping[str, Any] | Iterable[tuple[str, Any]] | None = None,
    clock: VirtualClock | None = None,
    crash_after_step: int | None = None,
    max_parks: int = 1000,
    **kwargs: Any,
) -> Job:
    """Schedule workflow ``func(*args, **kwargs)`` now and run it inline to its
    end (see :func:`resume_workflow`); its final Job. With
    ``crash_after_step``: its run first stops right after that step as a
    killed worker's would (:func:`run_until_crash`), the rescuer returns it to
    pending (:func:`rescue_job`), and it is resumed from there."""
    _idle(scheduler, "run_workflow")
    if not is_workflow(func):
        raise TypeError(f"{func!r} is not a @workflow (run_eagerly() runs a plain task)")
    queues = _signal_queues(signals)
    the_clock = _clock(scheduler, clock)
    parks = _positive_int("max_parks", max_parks)
    crash = (
        None if crash_after_step is None else _positive_int("crash_after_step", crash_after_step)
    )
    job_id = await scheduler.schedule(
        func, execution_time=datetime.now(UTC), args=args, kwargs=kwargs
    )
    try:
        if crash is not None:
            await _drive(scheduler, job_id, queues, the_clock, parks, crash)
            await rescue_job(scheduler, job_id)
        return await _drive(scheduler, job_id, queues, the_clock, parks)
    finally:
        await _release(scheduler)
