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
from datetime import datetime
from typing import Any

from ..config import UNSET
from ..enqueue.conflicts import check_conflict_resolution
from ..enqueue.dedupe import resolve as resolve_dedupe
from ..enqueue.fields import JobFields
from ..enqueue.producer import Enqueuer
from ..enums import ConflictResolution, JobPriority, JobStatus
from ..store import Store
from ..support.codec import encode_task_data
from ..support.log import get_logger
from ..support.validation import check_name
from ..tasks import TaskRegistry, queue_of
from .settings import Timings

# The lines these methods log keep the Scheduler's logger name.
log = get_logger("pg_scheduler.scheduler")


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
        """Insert a job by task name (``task_data``: ``{"args": [...], "kwargs": {...}}``)."""
        if not isinstance(job_name, str) or not job_name:
            raise ValueError("job_name must be a non-empty string")
        check_name("job_name", job_name)
        if not isinstance(task_data, dict):
            raise TypeError(f"task_data must be a dict, got {type(task_data).__name__}")
        unknown_keys = set(task_data) - {"args", "kwargs"}
        if unknown_keys:
            raise ValueError(f"task_data may hold only 'args' and 'kwargs', got {unknown_keys}")
        check_conflict_resolution(conflict_resolution)
        key, scope = resolve_dedupe(None, dedupe_key, dedupe_scope)
        job_queue = queue_of(self.registry.resolve(job_name), queue)
        encoded = encode_task_data(
            task_data.get("args") or (), task_data.get("kwargs") or {}, job_name
        )
        fields = JobFields.checked(
            job_name=job_name,
            task_name=job_name,
            execution_time=execution_time,
            task_data=encoded,
            priority=priority,
            max_retries=max_retries,
            job_id=job_id,
            misfire_grace_time=UNSET if misfire_grace_time is None else misfire_grace_time,
            timeout=None,
            retry_policy=None,
            dedupe_key=key,
            dedupe_scope=scope,
            queue=job_queue,
        )
        row = self.enqueuer.new_row(fields)
        if key is not None:
            return await self.enqueuer.write_keyed_one(
                row, conflict_resolution, None, job_id is not None
            )
        await self.enqueuer.write([row], conflict_resolution, None, user_ids=job_id is not None)
        log.debug("job scheduled", event_type="scheduled", job_id=row.job_id, task=job_name)
        return row.job_id

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
        """Renew the lease of one job this worker holds; False if it holds none such."""
        return await self.store.renew_lease(job_id, self.worker_id, self.timings.lease_duration)
