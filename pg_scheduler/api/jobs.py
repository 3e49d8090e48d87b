"""The Scheduler's job methods: register tasks, schedule one or many jobs, read
and cancel a job. Mixed into :class:`~pg_scheduler.Scheduler`; no SQL here."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

import asyncpg

from ..config import UNSET, RetryPolicy
from ..engine import CANCELLED_REMOTELY
from ..engine import local as local_start
from ..enqueue.conflicts import check_conflict_resolution
from ..enums import ConflictResolution, JobPriority
from ..job_spec import JobSpec
from ..limits import RateLimit
from ..models import Job, TaskInventory
from ..support.log import get_logger
from ..support.reconnect import retry_on_disconnect

if TYPE_CHECKING:
    from ..engine import Worker
    from ..enqueue.producer import Enqueuer
    from ..services import RescuerService
    from ..store import Store
    from ..tasks import TaskRegistry

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
        return self.registry.decorator(
            func,
            name=name,
            executor=executor,
            dedupe_key=dedupe_key,
            dedupe_scope=dedupe_scope,
            max_running=max_running,
            rate_limit=rate_limit,
            queue=queue,
        )

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
        check_conflict_resolution(conflict_resolution)
        fields = self.enqueuer.fields_for_call(
            func,
            args,
            kwargs,
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
        row = self.enqueuer.new_row(fields)
        if row.dedupe_key is not None:
            # Not started in process: the key's conflict policy settles it first.
            return await self.enqueuer.write_keyed_one(
                row, conflict_resolution, connection, job_id is not None
            )
        # Due now, autocommitted, and a worker of this process has a free slot:
        # written already claimed by it and started at once. (Not inside the
        # caller's transaction: the job must not start before that commits.)
        local = None
        if connection is None and job_id is None:
            local = local_start.local_worker(cast(Any, self), row)
        written = (
            None
            if local is None
            else await local_start.write_started(self.db_pool, self.store, row, local)
        )
        if not written:
            await self.enqueuer.write(
                [row],
                conflict_resolution,
                connection,
                user_ids=job_id is not None,
                retried=written is None and local is not None,
            )
        log.debug(
            "job scheduled",
            event_type="scheduled",
            job_id=row.job_id,
            task=row.task_name,
            execution_time=row.execution_time.isoformat(),
        )
        return row.job_id

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
        if not isinstance(positional, bool):
            raise TypeError(f"positional must be True or False, got {positional!r}")
        ids, written = await self.enqueuer.bulk(jobs, conflict_resolution, batch_size, connection)
        # One line per call, not per job: a bulk call may carry a million rows.
        log.debug("jobs scheduled", event_type="scheduled", count=written, bulk=True)
        if positional:
            return ids
        return [job_id for job_id in ids if job_id is not None]

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
