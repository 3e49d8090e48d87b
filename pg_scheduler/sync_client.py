"""Enqueue from synchronous code (Django, Flask, scripts) without an event loop.

:class:`SyncClient` schedules, bulk-schedules, gets and cancels jobs with the
same validation, encoding and rows as :class:`~pg_scheduler.Scheduler`:

- on its **own connection**: an unstarted Scheduler over a small asyncpg pool,
  driven by a private event loop in one daemon thread of the client (created
  on first use, and again in a forked child), so it works from any thread,
  even one whose own loop is running;
- on the **caller's connection** (``connection=``): a psycopg 3 or psycopg2
  connection of the caller (the ``[sync]`` extra installs psycopg 3), written
  with :mod:`pg_scheduler.store.dbapi`. Inside the caller's transaction (read
  from the connection's transaction status, whatever its ``autocommit``) it
  is a savepoint: the job exists, and workers are woken, only if the caller
  commits, and the client never commits. On an autocommit connection outside
  a transaction it is a transaction of its own, committed before the call
  returns. asyncpg connections cannot be used from sync code.

``schedule`` takes exactly the keywords of ``Scheduler.schedule``, with the
same defaults, checked by the same code (``Enqueuer.fields_for_call``).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any, TypeVar, cast

import asyncpg

from .config import UNSET, RetryPolicy
from .enqueue.conflicts import (
    check_conflict_resolution,
    check_none_existing,
    check_repeated_ids,
    duplicate_id_error,
    ids_in_order,
)
from .enqueue.producer import Enqueuer
from .enums import ConflictResolution, JobPriority
from .job_spec import JobSpec
from .models import Job
from .scheduler import Scheduler
from .store.dbapi import UNIQUE_VIOLATION, DbapiStatements, sqlstate
from .store.jobs import NewJob, Store
from .store.names import DEFAULT_SCHEMA, check_schema
from .support.validation import INT4_MAX, check_int
from .tasks import TaskRegistry, default_registry

T = TypeVar("T")
_SUFFIX = {
    ConflictResolution.RAISE: "",
    ConflictResolution.IGNORE: "ignore",
    ConflictResolution.REPLACE: "replace",
}


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
        self._settings: dict[str, Any] = dict(
            misfire_grace_time=misfire_grace_time, schema=schema, retry_policy=retry_policy
        )
        self._statements = DbapiStatements(schema)
        # Rows are built exactly as the Scheduler builds them (no pool needed:
        # the statements are only qualified, never run, on this path).
        registry = TaskRegistry(parent=default_registry)
        no_pool = cast(asyncpg.Pool, None)
        self._rows = Enqueuer(Store(no_pool, schema), no_pool, registry, lambda: misfire_grace_time)
        self._lock = threading.Lock()
        self._pid = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._scheduler: Scheduler | None = None
        self._pool: asyncpg.Pool | None = None

    # -- the public API ------------------------------------------------------------

    def schedule(
        self,
        func: Callable[..., Any],
        *,
        execution_time: datetime,
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
    ) -> str:
        """As :meth:`Scheduler.schedule`: the same keywords, defaults and checks
        (``misfire_grace_time`` not given: the client's default). Returns the job id.

        ``connection``: a psycopg 3 / psycopg2 connection. Inside its
        transaction the row is a savepoint of it and exists only if the
        caller commits; on an autocommit connection outside a transaction it
        is committed before this returns. See :meth:`DbapiStatements.atomically`."""
        # The per-job keywords, once: both paths check them with the same code.
        fields: dict[str, Any] = dict(
            execution_time=execution_time,
            priority=priority,
            max_retries=max_retries,
            job_id=job_id,
            misfire_grace_time=misfire_grace_time,
            timeout=timeout,
            retry_policy=retry_policy,
            dedupe_key=dedupe_key,
            dedupe_scope=dedupe_scope,
            queue=queue,
        )
        if connection is None:
            return self._call(
                lambda s: s.schedule(
                    func,
                    args=args,
                    kwargs=kwargs,
                    conflict_resolution=conflict_resolution,
                    **fields,
                )
            )
        check_conflict_resolution(conflict_resolution)
        row = self._rows.new_row(self._rows.fields_for_call(func, args, kwargs, **fields))
        _refuse_keys([row])
        self._write(connection, [row], conflict_resolution, 1)
        return row.job_id

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
                lambda s: s.schedule_bulk(
                    jobs,
                    conflict_resolution=conflict_resolution,
                    batch_size=batch_size,
                    positional=positional,
                )
            )
        if not isinstance(positional, bool):
            raise TypeError(f"positional must be True or False, got {positional!r}")
        check_conflict_resolution(conflict_resolution)
        check_int("batch_size", batch_size, 1)
        rows = self._rows.bulk_rows(jobs)
        if not rows:
            return []
        _refuse_keys(rows)
        user_ids = [spec.job_id for spec in jobs if spec.job_id is not None]
        if user_ids:
            check_repeated_ids(user_ids, conflict_resolution)
        raise_on = user_ids if conflict_resolution is ConflictResolution.RAISE else []
        written = self._write(connection, rows, conflict_resolution, batch_size, raise_on)
        ids = ids_in_order(rows, written, conflict_resolution)
        return ids if positional else [i for i in ids if i is not None]

    def get_job(self, job_id: str) -> Job | None:
        """The stored job, or None (on the client's own connection)."""
        return self._call(lambda s: s.get_job(job_id))

    def cancel_job(self, job_id: str) -> bool:
        """Cancel a pending or running job (its worker hears it by NOTIFY)."""
        return self._call(lambda s: s.cancel_job(job_id))

    def signal(self, job_id: str, name: str, payload: Any = None) -> None:
        """Send signal ``name`` to workflow ``job_id`` (see ``Scheduler.signal``),
        on the client's own connection."""
        return self._call(lambda s: s.signal(job_id, name, payload))

    def close(self) -> None:
        """Close the client's pool and stop its thread (it can be used again after)."""
        with self._lock:
            loop, thread, pool = self._loop, self._thread, self._pool
            self._loop = self._thread = self._pool = self._scheduler = None
        if loop is None or thread is None or self._pid != os.getpid():
            return  # nothing started, or the parent's (a forked child owns neither)
        if pool is not None:
            asyncio.run_coroutine_threadsafe(pool.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------

    def _write(
        self,
        connection: Any,
        rows: list[NewJob],
        conflict: ConflictResolution,
        batch_size: int,
        raise_on: Sequence[str] = (),
    ) -> set[str]:
        """Write ``rows`` through the caller's connection, all or nothing (see
        :meth:`DbapiStatements.atomically`); ``raise_on``: ids refused first if
        they exist already (bulk RAISE), in the same transaction."""
        conn = _dbapi_connection(connection)
        statements, suffix = self._statements, _SUFFIX[conflict]

        def work() -> set[str]:
            if raise_on:
                check_none_existing(statements.existing_ids(conn, raise_on))
            written: set[str] = set()
            for start in range(0, len(rows), batch_size):
                written |= statements.insert(conn, rows[start : start + batch_size], suffix)
            return written

        try:
            return statements.atomically(conn, work)
        except Exception as exc:
            if sqlstate(exc) == UNIQUE_VIOLATION:
                # Both drivers carry the server's DETAIL ("Key (job_id)=(...) already exists.").
                detail = getattr(getattr(exc, "diag", None), "message_detail", None)
                raise duplicate_id_error(detail or str(exc)) from None
            raise

    def _call(self, method: Callable[[Scheduler], Coroutine[Any, Any, T]]) -> T:
        scheduler, loop = self._started()
        return asyncio.run_coroutine_threadsafe(method(scheduler), loop).result()

    def _started(self) -> tuple[Scheduler, asyncio.AbstractEventLoop]:
        with self._lock:
            if self._pid != os.getpid():
                # New, or a forked child: the parent's thread and pool are not ours.
                self._loop = self._thread = self._pool = self._scheduler = None
                self._pid = os.getpid()
            if self._scheduler is None or self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="pg_scheduler-sync-client", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
                self._scheduler = asyncio.run_coroutine_threadsafe(self._open(), loop).result()
            return self._scheduler, self._loop

    async def _open(self) -> Scheduler:
        self._pool = await asyncpg.create_pool(self.dsn, min_size=1, max_size=self.pool_size)
        # Never started: it only enqueues, reads and cancels (no worker, no claims).
        return Scheduler(self._pool, **self._settings, loop_stall_warning=None)


def _dbapi_connection(connection: Any) -> Any:
    """The driver's connection: SQLAlchemy's pooled proxy
    (``session.connection().connection``) gives its ``dbapi_connection``."""
    inner = getattr(connection, "dbapi_connection", None)
    return connection if inner is None else inner


def _refuse_keys(rows: list[NewJob]) -> None:
    """Dedupe keys need the async path's conflict handling (not written on a
    caller's DB-API connection yet): refuse before anything is written."""
    if any(row.dedupe_key is not None for row in rows):
        raise ValueError(
            "SyncClient(connection=...) does not write jobs with a dedupe key; "
            "schedule them without connection= (the client's own connection)"
        )
