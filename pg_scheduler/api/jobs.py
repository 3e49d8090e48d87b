"""What the Scheduler's job methods do: schedule through the one producer (a due
job started here when a worker of this process has room), read a job, cancel one,
report the tasks this worker can run. A part of :class:`~pg_scheduler.Scheduler`,
which declares the public signatures; no SQL here."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import asyncpg

from ..batching import batch_options_of
from ..engine import CANCELLED_REMOTELY
from ..engine import local as local_start
from ..engine.local import LocalHost
from ..enqueue.fields import JobOptions
from ..enqueue.producer import Enqueuer
from ..enums import ConflictResolution
from ..job_spec import JobSpec
from ..models import Job, TaskInventory
from ..periodic.registry import registered_periodic_jobs
from ..services import RescuerService
from ..store import NewJob, Store
from ..support.log import get_logger
from ..support.reconnect import retry_on_disconnect
from ..tasks import TaskRegistry
from .settings import Settings

# The lines logged here keep the Scheduler's logger name.
log = get_logger("pg_scheduler.scheduler")


class Jobs:
    """Schedule, read and cancel jobs; the tasks a worker can run."""

    def __init__(
        self,
        *,
        local: LocalHost,
        settings: Settings,
        store: Store,
        enqueuer: Enqueuer,
        registry: TaskRegistry,
        rescuer: RescuerService,
        cancel_local: Callable[[str, str], bool],
    ) -> None:
        """``local``: the Scheduler as the in-process start knows it (a due job
        it schedules may start on a worker of this process); ``settings``: the
        pool an in-process start writes through and the default retry policy a
        job's view resolves against; ``cancel_local``: stop a job running here."""
        self.local = local
        self.settings = settings
        self.store = store
        self.enqueuer = enqueuer
        self.registry = registry
        self.rescuer = rescuer
        self.cancel_local = cancel_local

    async def load_task_functions(self) -> TaskInventory:
        names = self.registry.names()
        unknown = await self.rescuer.report_unknown_tasks()
        periodic = {
            config.task_name: config.job_name or key
            for key, config in registered_periodic_jobs().items()
            if config.task_name in names
        }
        batches = {
            name: options.size
            for name in self.registry  # full names, not the bare legacy ones
            if (options := batch_options_of(self.registry.resolve(name))) is not None
        }
        return TaskInventory(registered=names, unknown=unknown, periodic=periodic, batches=batches)

    async def schedule(
        self,
        func: Callable[..., Any],
        execution_time: datetime | None,
        args: tuple,
        kwargs: dict[str, Any] | None,
        options: JobOptions,
        conflict_resolution: ConflictResolution,
        connection: asyncpg.Connection | None,
    ) -> str:
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
        local = local_start.local_worker(self.local, row)
        if local is None:
            return None
        return local_start.write_started(self.settings.db_pool, self.store, row, local)

    async def schedule_bulk(
        self,
        jobs: list[JobSpec],
        conflict_resolution: ConflictResolution,
        batch_size: int,
        connection: asyncpg.Connection | None,
        positional: bool,
    ) -> list[str] | list[str | None]:
        return await self.enqueuer.schedule_bulk(
            jobs, conflict_resolution, batch_size, connection, positional
        )

    async def get_job(self, job_id: str) -> Job | None:
        row = await self.store.get_job(job_id)
        return None if row is None else Job.from_record(row, self.settings.retry_policy)

    async def cancel_job(self, job_id: str) -> bool:
        cancelled = await retry_on_disconnect(
            lambda: self.store.cancel(job_id), what="cancel", give_up_after=10
        )
        if cancelled:
            self.cancel_local(job_id, CANCELLED_REMOTELY)
            log.info("job cancelled", event_type="cancelled", job_id=job_id)
        return cancelled
