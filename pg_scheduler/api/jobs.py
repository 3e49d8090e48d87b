"""The Scheduler's job methods: register tasks, schedule one or many jobs, read
and cancel a job. Mixed into :class:`~pg_scheduler.Scheduler`; no SQL here.

The signatures list their keywords for users; the bodies hand them to the one
declaration (:class:`~pg_scheduler.tasks.TaskOptions`,
:class:`~pg_scheduler.enqueue.fields.JobOptions`) and the one producer
(``enqueue/producer.py``). ``tests/unit/test_job_options.py`` holds the signatures
to the declarations."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

import asyncpg

from ..config import UNSET, RetryPolicy
from ..engine import CANCELLED_REMOTELY
from ..engine import local as local_start
from ..enqueue.fields import JobOptions
from ..enums import ConflictResolution, JobPriority
from ..job_spec import JobSpec
from ..limits import RateLimit
from ..models import Job, TaskInventory
from ..store import NewJob
from ..support.log import get_logger
from ..support.reconnect import retry_on_disconnect
from ..tasks import TaskOptions, TaskRegistry

if TYPE_CHECKING:
    from ..engine import Worker
    from ..enqueue.producer import Enqueuer
    from ..services import RescuerService
    from ..store import Store

# The lines these methods log keep the Scheduler's logger name.
log = get_logger("pg_scheduler.scheduler")

F = TypeVar("F", bound=Callable[..., Any])


class JobsAPI:
    """Tasks and jobs: what an application calls most."""

    if TYPE_CHECKING:
        db_pool: asyncpg.Pool
        store: Store
        enqueuer: Enqueuer
        registry: TaskRegistry
        rescuer: RescuerService
        worker: Worker
        retry_policy: RetryPolicy

    # -- tasks --------------------------------------------------------------------

    def task(
        self,
        func: F | None = None,
        *,
        name: str | None = None,
        executor: str | None = None,
        dedupe_key: str | Callable[..., str] | None = None,
        dedupe_scope: str | None = None,
        max_running: int | None = None,
        rate_limit: str | RateLimit | None = None,
        queue: str | None = None,
    ) -> Any:
        """Decorator: register a function this scheduler can run (see :func:`pg_scheduler.task`)."""
        return self.registry.decorator(func, TaskOptions.of(locals()))

    def register_task(self, func: F, name: str | None = None) -> F:
        """Register ``func`` so this worker claims its jobs."""
        return self.registry.register(func, name=name)

    async def load_task_functions(self) -> TaskInventory:
        """What this scheduler can run, and due jobs whose task no live worker has."""
        names = self.registry.names()
        unknown = await self.rescuer.report_unknown_tasks()
        return TaskInventory(registered=names, unknown=unknown)

    # -- enqueue --------------------------------------------------------------------

    async def schedule(
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
        connection: asyncpg.Connection | None = None,
        dedupe_key: str | None = None,
        dedupe_scope: str | None = None,
        queue: str | None = None,
    ) -> str:
        """Schedule ``func(*args, **kwargs)`` to run at ``execution_time``; returns the job id.

        ``queue``: the job's queue (default: the task's, ``@task(queue=...)``,
        else "default").

        With ``connection``, the row is written through the caller's connection
        (inside its transaction, if one is open): it exists, and wakes workers,
        only if that transaction commits.

        ``dedupe_key`` (or the task's): at most one job per key and
        ``dedupe_scope`` ("active", the default, or "pending"); on a held key
        ``conflict_resolution`` decides, and IGNORE/REPLACE return the id of
        the job that holds it. See the README's Dedupe keys.
        """
        options = JobOptions.of(locals())
        return await self.enqueuer.schedule(
            func,
            execution_time,
            args,
            kwargs,
            options,
            conflict_resolution,
            connection,
            self._start_here,
        )

    def _start_here(self, row: NewJob) -> Awaitable[bool | None] | None:
        """A due row written already claimed by a worker of this process with a
        free slot, which starts it at once; None if no worker here takes it."""
        local = local_start.local_worker(cast(Any, self), row)
        if local is None:
            return None
        return local_start.write_started(self.db_pool, self.store, row, local)

    async def schedule_bulk(
        self,
        jobs: list[JobSpec],
        *,
        conflict_resolution: ConflictResolution = ConflictResolution.IGNORE,
        batch_size: int = 1000,
        connection: asyncpg.Connection | None = None,
        positional: bool = False,
    ) -> list[str] | list[str | None]:
        """Schedule many jobs; returns their ids in input order.

        With IGNORE, ids that already existed are left out, as pg-scheduler
        0.2.3 does (a second identical call returns ``[]``). ``positional=True``
        returns one entry per spec instead, None where IGNORE skipped one.

        All or nothing: every spec is validated before anything is written,
        and all rows are written in one transaction (a savepoint inside the
        caller's transaction when ``connection`` is given). Caller-chosen ids
        go in statements of ``batch_size`` rows; generated ids in one COPY.
        """
        return await self.enqueuer.schedule_bulk(
            jobs, conflict_resolution, batch_size, connection, positional
        )

    # -- jobs ------------------------------------------------------------------------

    async def get_job(self, job_id: str) -> Job | None:
        """The stored job (status, attempts, timestamps, result, error), or None."""
        row = await self.store.get_job(job_id)
        return None if row is None else Job.from_record(row, self.retry_policy)

    async def cancel_job(self, job_id: str) -> bool:
        """Cancel a pending or running job. A running job's coroutine is cancelled on
        whichever worker runs it (NOTIFY, with the heartbeat as the fallback).
        Returns False if the job does not exist or has already finished."""
        cancelled = await retry_on_disconnect(
            lambda: self.store.cancel(job_id), what="cancel", give_up_after=10
        )
        if cancelled:
            self.worker.cancel_local(job_id, CANCELLED_REMOTELY)
            log.info("job cancelled", event_type="cancelled", job_id=job_id)
        return cancelled
