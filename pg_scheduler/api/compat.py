"""The 0.2.x pass-through methods of :class:`~pg_scheduler.Scheduler`, in one place.

pg-scheduler 0.2.x exposed its internals as public methods (run the claim
loop, the heartbeat or the rescue loop by hand, execute a claimed row, insert
by name, force a status). They keep working, each a thin call into the part
that does the work now; new code has no reason to call them. :class:`Compat`,
a part of the Scheduler, holds the few with logic of their own. The 0.2.x import
paths (``pg_scheduler.scheduler``, ``.periodic``, ``.job_spec``,
``.job_priority``, ``.conflict_resolution``, ``.vacuum``, ``.polling``) are
the tiny modules of those names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..enqueue.producer import Enqueuer
from ..enums import JobStatus
from ..store import Store
from ..tasks import TaskRegistry
from .settings import Timings


class Compat:
    """Insert by name, force a status, renew one lease, list the task functions."""

    def __init__(
        self,
        *,
        registry: TaskRegistry,
        enqueuer: Enqueuer,
        store: Store,
        worker_id: str,
        timings: Timings,
    ) -> None:
        self.registry = registry
        self.enqueuer = enqueuer
        self.store = store
        self.worker_id = worker_id
        self.timings = timings

    def task_map(self) -> dict[str, Callable[..., Any]]:
        """Task name -> function for every task this scheduler can run."""
        return {name: self.registry.resolve(name) for name in self.registry}  # type: ignore[misc]

    async def update_job_status(self, job_id: str, status: JobStatus | str) -> bool:
        """Force a job's status (an operator's tool; bypasses the lease guard)."""
        try:
            value = JobStatus(status)
        except ValueError:
            raise ValueError(
                f"unknown status {status!r}; one of {[s.value for s in JobStatus]}"
            ) from None
        if value is JobStatus.WAITING:
            # Only a workflow's own park writes it, with what wakes the row;
            # forced, nothing would ever wake it.
            raise ValueError("status 'waiting' is written only by a workflow parking itself")
        return await self.store.set_status(job_id, value.value)

    async def send_heartbeat(self, job_id: str) -> bool:
        """Renew the lease of one job this worker holds; False if it holds none such."""
        return await self.store.renew_lease(job_id, self.worker_id, self.timings.lease_duration)
