"""Enqueue from synchronous code (Django, Flask, scripts) without an event loop.

:class:`SyncClient` schedules, bulk-schedules, gets and cancels jobs, and
signals workflows (``workflows.signals``, on either connection). It holds
the producer the Scheduler uses (``enqueue.producer.Producer``: the same
checks, encoding and rows) and writes its rows

- on its **own connection**: through ``enqueue.producer.Enqueuer`` (the
  Scheduler's writer) over a small asyncpg pool, driven by a private event loop
  in one daemon thread of the client (created on first use, and again in a
  forked child), so it works from any thread, even one whose own loop is
  running;
- on the **caller's connection** (``connection=``): a psycopg 3 or psycopg2
  connection of the caller (the ``[sync]`` extra installs psycopg 3), through
  ``enqueue.dbapi.DbapiEnqueuer`` and the statements of
  :mod:`pg_scheduler.store.dbapi`. Inside the caller's transaction (read
  from the connection's transaction status, whatever its ``autocommit``) it
  is a savepoint: the job exists, and workers are woken, only if the caller
  commits, and the client never commits. On an autocommit connection outside
  a transaction it is a transaction of its own, committed before the call
  returns. asyncpg connections cannot be used from sync code.

``schedule`` takes exactly the keywords of ``Scheduler.schedule``, with the
same defaults (both follow ``enqueue.fields.JobOptions``).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine, Iterable
from datetime import datetime, timedelta
from typing import Any, NamedTuple, TypeVar, cast

import asyncpg

from .api.results import JobNotFound, outcome
from .config import UNSET, RetryPolicy
from .enqueue.dbapi import DbapiEnqueuer
from .enqueue.fields import JobOptions
from .enqueue.producer import Enqueuer, Producer
from .enums import FINAL_STATUSES, ConflictResolution, JobPriority
from .job_spec import JobSpec
from .models import Job
from .store.bounded import DEFAULT_STATEMENT_TIMEOUT, BoundedPool
from .store.dbapi import DbapiStatements
from .store.jobs import Store
from .store.names import DEFAULT_SCHEMA, check_schema
from .support.log import get_logger
from .support.reconnect import retry_on_disconnect
from .support.validation import INT4_MAX, check_int, check_seconds
from .tasks import TaskRegistry, default_registry
from .workflows.runner import workflow_store
from .workflows.signals import (
    Signal,
    SignalBatch,
    checked_key,
    checked_signal,
    many_signals,
    one_signal,
    run_dbapi,
    send_signal,
    send_signals,
)

T = TypeVar("T")

# wait_for's reads of the job: the first after this many seconds, each wait
# twice the last, never more than POLL_MOST.
POLL_FIRST = 0.05
POLL_MOST = 1.0

# The lines the client logs are the ones a Scheduler logs for the same calls.
log = get_logger("pg_scheduler.scheduler")


class _Own(NamedTuple):
    """The client's own connection, in this process: its pool, the store its
    reads and cancels use (each statement bounded, as a Scheduler's), and the
    writer of the producer's rows."""

    pool: asyncpg.Pool
    store: Store
    enqueuer: Enqueuer


class SyncClient:
    """A synchronous producer: ``SyncClient(dsn)``; use it as a context manager or
    call :meth:`close`. ``pool_size``: connections of its own pool (opened on
    first use); ``misfire_grace_time`` and ``retry_policy``: the defaults a
    Scheduler would apply. Thread-safe."""

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = DEFAULT_SCHEMA,
        pool_size: int = 2,
        misfire_grace_time: int | None = 300,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        if not isinstance(dsn, str) or not dsn:
            raise TypeError(f"dsn must be a non-empty connection string, got {dsn!r}")
        check_int("pool_size", pool_size, 1)
        if retry_policy is not None and not isinstance(retry_policy, RetryPolicy):
            raise TypeError(f"retry_policy must be a RetryPolicy, got {retry_policy!r}")
        check_schema(schema)
        check_int("misfire_grace_time", misfire_grace_time, 0, allow_none=True, maximum=INT4_MAX)
        self.dsn = dsn
        self.pool_size = pool_size
        self.retry_policy = retry_policy
        self._schema = schema
        # What a job read back shows of the retry policy, as a Scheduler's get_job.
        self._read_policy = retry_policy or RetryPolicy()
        # The producer: the Scheduler's checks and rows, for both ways of writing.
        self._producer = Producer(TaskRegistry(parent=default_registry), lambda: misfire_grace_time)
        self._callers = DbapiEnqueuer(self._producer, DbapiStatements(schema))
        self._lock = threading.Lock()
        self._pid = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._own: _Own | None = None

    # -- the public API ------------------------------------------------------------

    def schedule(
        self,
        func: Callable[..., Any],
        *,
        execution_time: datetime | None = None,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        priority: JobPriority = JobPriority.NORMAL,
        max_retries: int = 0,
        job_id: str | None = None,
        conflict_resolution: ConflictResolution = ConflictResolution.RAISE,
        misfire_grace_time: int | Any | None = UNSET,
        timeout: float | None = None,
        retry_policy: RetryPolicy | None = None,
        connection: Any = None,
        dedupe_key: str | None = None,
        dedupe_scope: str | None = None,
        queue: str | None = None,
        depends_on: list[str] | tuple[str, ...] | None = None,
        on_dependency_failure: str = "cancel",
        delay: timedelta | float | None = None,
        concurrency_key: str | None = None,
        max_running_per_key: int | None = None,
        rate_limit_per_key: str | None = None,
        ordered: bool = False,
        debounce: timedelta | float | None = None,
        debounce_max_wait: timedelta | float | None = None,
        throttle: timedelta | float | None = None,
        fair_share_key: str | None = None,
        fair_share_weight: float | None = None,
    ) -> str:
        """As :meth:`Scheduler.schedule`: the same keywords, defaults and checks
        (``misfire_grace_time`` not given: the client's default). Returns the job id.

        ``connection``: a psycopg 3 / psycopg2 connection. Inside its
        transaction the row is a savepoint of it and exists only if the
        caller commits; on an autocommit connection outside a transaction it
        is committed before this returns. See :meth:`DbapiStatements.atomically`."""
        options = JobOptions.of(locals())
        if connection is None:
            return self._call(
                lambda own: own.enqueuer.schedule(
                    func, execution_time, args, kwargs, options, conflict_resolution, None
                )
            )
        return self._callers.schedule(
            func, execution_time, args, kwargs, options, conflict_resolution, connection
        )

    def schedule_bulk(
        self,
        jobs: list[JobSpec],
        *,
        conflict_resolution: ConflictResolution = ConflictResolution.IGNORE,
        batch_size: int = 1000,
        connection: Any = None,
        positional: bool = False,
    ) -> list[str] | list[str | None]:
        """As :meth:`Scheduler.schedule_bulk`: all or nothing, ids in input order;
        ``connection`` as for :meth:`schedule`."""
        if connection is None:
            return self._call(
                lambda own: own.enqueuer.schedule_bulk(
                    jobs, conflict_resolution, batch_size, None, positional
                )
            )
        return self._callers.schedule_bulk(
            jobs, conflict_resolution, batch_size, connection, positional
        )

    def get_job(self, job_id: str) -> Job | None:
        """The stored job, or None (on the client's own connection)."""
        return self._call(lambda own: self._get_job(own, job_id))

    def cancel_job(self, job_id: str) -> bool:
        """Cancel a pending or running job (its worker hears it by NOTIFY)."""
        return self._call(lambda own: self._cancel_job(own, job_id))

    def wait_for(self, job_id: str, timeout: float | None = None) -> Job:
        """The job once final (completed, failed, cancelled, expired), as
        :meth:`Scheduler.wait_for`: JobNotFound for an unknown id, TimeoutError
        after ``timeout`` seconds. The client does not LISTEN: it reads the
        job on its own connection, every 50 ms at first and at most every
        second as the wait grows (one indexed read each)."""
        if not isinstance(job_id, str):
            raise TypeError(f"job_id must be a str, got {type(job_id).__name__}")
        if timeout is not None:
            check_seconds("timeout", timeout)
        return self._call(lambda own: self._wait_for(own, job_id, timeout))

    def result(self, job_id: str, timeout: float | None = None) -> Any:
        """The job's result once final, as :meth:`Scheduler.result` (JobFailed,
        JobCancelled or JobExpired for the other final states); polls as
        :meth:`wait_for` does."""
        return outcome(self.wait_for(job_id, timeout))

    def signal(
        self,
        job_id: str,
        name: str,
        payload: Any = None,
        *,
        connection: Any = None,
        idempotency_key: str | None = None,
    ) -> bool:
        """Send signal ``name`` to workflow ``job_id`` (see ``Scheduler.signal``);
        False for a repeat of ``idempotency_key``. On the client's own
        connection, or on ``connection`` (psycopg 3 / psycopg2) as for
        :meth:`schedule`: inside the caller's transaction the signal exists,
        and wakes the workflow, only if the caller commits."""
        if connection is None:
            return self._call(
                lambda own: send_signal(
                    workflow_store(own.store),
                    job_id,
                    name,
                    payload,
                    idempotency_key=idempotency_key,
                )
            )
        plan = one_signal(
            job_id, name, checked_signal(job_id, name, payload), checked_key(idempotency_key)
        )
        return run_dbapi(self._callers.statements, connection, plan)

    def signal_bulk(self, signals: Iterable[Signal], *, connection: Any = None) -> int:
        """Send many signals in one transaction, all or none (see
        ``Scheduler.signal_bulk``), on the client's own connection or on
        ``connection`` as for :meth:`signal`; how many workflows were woken."""
        if connection is not None:
            batch = SignalBatch.of(signals)
            if not batch.job_ids:
                return 0
            return run_dbapi(self._callers.statements, connection, many_signals(batch))
        # Read here, in the caller's thread (a generator is not the loop's to run).
        items = (
            list(signals)
            if isinstance(signals, Iterable) and not isinstance(signals, (str, bytes))
            else signals
        )
        return self._call(lambda own: send_signals(workflow_store(own.store), items))

    def close(self) -> None:
        """Close the client's pool and stop its thread (it can be used again after)."""
        with self._lock:
            loop, thread, own = self._loop, self._thread, self._own
            self._loop = self._thread = self._own = None
        if loop is None or thread is None or self._pid != os.getpid():
            return  # nothing started, or the parent's (a forked child owns neither)
        if own is not None:
            asyncio.run_coroutine_threadsafe(own.pool.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------

    async def _get_job(self, own: _Own, job_id: str) -> Job | None:
        row = await own.store.get_job(job_id)
        return None if row is None else Job.from_record(row, self._read_policy)

    async def _wait_for(self, own: _Own, job_id: str, timeout: float | None) -> Job:
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        pause = POLL_FIRST
        while True:
            job = await self._get_job(own, job_id)
            if job is None:
                raise JobNotFound(job_id)
            if job.status in FINAL_STATUSES:
                return job
            wait = pause
            if deadline is not None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise TimeoutError(f"job {job_id} not finished after {timeout} s")
                wait = min(wait, remaining)
            await asyncio.sleep(wait)
            pause = min(pause * 2, POLL_MOST)

    async def _cancel_job(self, own: _Own, job_id: str) -> bool:
        cancelled = await retry_on_disconnect(
            lambda: own.store.cancel(job_id), what="cancel", give_up_after=10
        )
        if cancelled:
            log.info("job cancelled", event_type="cancelled", job_id=job_id)
        return cancelled

    def _call(self, method: Callable[[_Own], Coroutine[Any, Any, T]]) -> T:
        own, loop = self._started()
        return asyncio.run_coroutine_threadsafe(method(own), loop).result()

    def _started(self) -> tuple[_Own, asyncio.AbstractEventLoop]:
        with self._lock:
            if self._pid != os.getpid():
                # New, or a forked child: the parent's thread and pool are not ours.
                self._loop = self._thread = self._own = None
                self._pid = os.getpid()
            if self._own is None or self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="pg_scheduler-sync-client", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
                self._own = asyncio.run_coroutine_threadsafe(self._open(), loop).result()
            return self._own, self._loop

    async def _open(self) -> _Own:
        pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self.pool_size)
        # As a Scheduler's: its own statements bounded, the writes on the pool.
        bounded = cast(
            asyncpg.Pool, BoundedPool(pool, DEFAULT_STATEMENT_TIMEOUT, session_settings=True)
        )
        store = Store(bounded, self._schema)
        producer = self._producer
        enqueuer = Enqueuer(store, pool, producer.registry, producer.default_misfire_grace_time)
        return _Own(pool, store, enqueuer)
