"""The 0.2.x pass-through methods of :class:`~pg_scheduler.Scheduler`, in one place.

pg-scheduler 0.2.x exposed its internals as public methods (run the claim
loop, the heartbeat or the rescue loop by hand, execute a claimed row, insert
by name, force a status). They keep working, each a thin call into the part
that does the work now; new code has no reason to call them. The 0.2.x import
paths (``pg_scheduler.scheduler``, ``.periodic``, ``.job_spec``,
``.job_priority``, ``.conflict_resolution``, ``.vacuum``, ``.polling``) are
the tiny modules of those names.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ..enqueue.fields import JobOptions
from ..enums import ConflictResolution, JobPriority, JobStatus

if TYPE_CHECKING:
    from ..engine import Worker
    from ..enqueue.producer import Enqueuer
    from ..services import HeartbeatService, RescuerService
    from ..store import Store
    from ..tasks import TaskRegistry


class SchedulerCompat:
    """Mixed into :class:`~pg_scheduler.Scheduler`; uses only its parts."""

    if TYPE_CHECKING:
        worker: Worker
        worker_id: str
        registry: TaskRegistry
        store: Store
        enqueuer: Enqueuer
        heartbeat: HeartbeatService
        rescuer: RescuerService

        @property
        def lease_duration(self) -> float: ...

    @property
    def task_map(self) -> dict[str, Callable[..., Any]]:
        """Task name -> function for every task this scheduler can run."""
        return {name: self.registry.resolve(name) for name in self.registry}  # type: ignore[misc]

    async def listen_for_jobs(self) -> None:
        """The claim loop: runs until shutdown, woken by NOTIFY, due times and polling."""
        await self.worker.run()

    async def schedule_job(
        self,
        job_name: str,
        execution_time: datetime,
        task_data: dict[str, Any],
        priority: JobPriority = JobPriority.NORMAL,
        max_retries: int = 0,
        job_id: str | None = None,
        conflict_resolution: ConflictResolution = ConflictResolution.RAISE,
        misfire_grace_time: int | None = None,
        *,
        dedupe_key: str | None = None,
        dedupe_scope: str | None = None,
        queue: str | None = None,
    ) -> str:
        """Low-level insert by name (0.2.x): ``task_data`` is ``{"args": [...], "kwargs": {...}}``.

        The job runs on a worker that registered a task named ``job_name``
        (its ``module:qualname``, or its bare ``__name__`` when unambiguous).
        ``misfire_grace_time=None`` means the scheduler default.
        ``dedupe_key``: as for ``schedule()`` (a task's own key does not apply here).
        ``queue``:
        the job's queue (default: the queue of the task registered here under
        that name, else "default").
        """
        options = JobOptions.of(locals())
        return await self.enqueuer.schedule_by_name(
            job_name, execution_time, task_data, options, conflict_resolution
        )

    async def update_job_status(self, job_id: str, status: JobStatus | str) -> bool:
        """Force a job's status (an operator's tool; bypasses the lease guard)."""
        try:
            value = JobStatus(status)
        except ValueError:
            raise ValueError(
                f"unknown status {status!r}; one of {[s.value for s in JobStatus]}"
            ) from None
        return await self.store.set_status(job_id, value.value)

    async def send_heartbeat(self, job_id: str) -> bool:
        """Renew the lease of one job this worker holds; False if it holds no such job."""
        return await self.store.renew_lease(job_id, self.worker_id, self.lease_duration)

    async def monitor_heartbeats(self) -> None:
        """Run the heartbeat loop (started by :meth:`start`): renew this worker's
        row and all its leases each ``heartbeat_interval``."""
        await self.heartbeat.run_forever()

    async def periodic_orphan_recovery(self) -> None:
        """Run the rescue loop (started by :meth:`start`) every ``rescue_interval``."""
        await self.rescuer.run_forever()

    async def execute_job_with_concurrency_control(self, job_row: Any) -> None:
        """Run one claimed job row under the ``max_concurrent_jobs`` semaphore."""
        await self.worker.execute_job_with_concurrency_control(job_row)

    async def execute_job(self, job_row: Any) -> None:
        """Run one claimed job row, then complete it (or write its failure), lease-guarded."""
        await self.worker.executor.execute_job(job_row)
