"""One job's fields on their way from the caller to its row.

``schedule()``, ``schedule_job()``, ``JobSpec`` (``schedule_bulk``) and the
periodic runtime all describe a job as one :class:`JobFields`;
:func:`row_of` turns it into the ``scheduled_jobs`` row. ``execution_time`` is
normalised once, when the fields are made (:meth:`JobFields.checked`, or the
bulk path's one ``to_aware`` per distinct time).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple

from ..config import UNSET, RetryPolicy
from ..enums import DEFAULT_QUEUE, PRIORITY_DB_VALUE_OF, JobPriority
from ..store import NewJob
from ..support.codec import encode_retry_policy
from ..support.timeutil import to_aware
from .checks import check_job_fields


class JobFields(NamedTuple):
    """A job as the caller described it, checked (a tuple: cheap to make in bulk)."""

    job_name: str
    task_name: str
    execution_time: datetime  # aware
    task_data: str  # {"args": [...], "kwargs": {...}} as JSON text
    priority: JobPriority = JobPriority.NORMAL
    max_retries: int = 0
    job_id: str | None = None  # None: a fresh time-ordered id
    misfire_grace_time: Any = UNSET  # int | None, or UNSET: the Scheduler's default
    timeout: float | None = None
    retry_policy: RetryPolicy | None = None
    dedupe_key: str | None = None
    dedupe_scope: str | None = None  # resolved: "active" or "pending" with a key
    queue: str = DEFAULT_QUEUE  # checked (validation.check_queue)

    @classmethod
    def checked(
        cls,
        *,
        job_name: str,
        task_name: str,
        execution_time: Any,
        task_data: str,
        priority: Any,
        max_retries: Any,
        job_id: Any,
        misfire_grace_time: Any,
        timeout: Any,
        retry_policy: Any,
        dedupe_key: str | None = None,
        dedupe_scope: str | None = None,
        queue: str = DEFAULT_QUEUE,
    ) -> JobFields:
        """Validate the caller's values (TypeError/ValueError naming the field)."""
        check_job_fields(
            execution_time, priority, max_retries, job_id, misfire_grace_time, timeout, retry_policy
        )
        return cls(
            job_name,
            task_name,
            to_aware(execution_time),
            task_data,
            priority,
            max_retries,
            job_id,
            misfire_grace_time,
            timeout,
            retry_policy,
            dedupe_key,
            dedupe_scope,
            queue,
        )


def row_of(fields: JobFields, job_id: str, default_grace: Callable[[], int | None]) -> NewJob:
    """The row for checked ``fields`` under ``job_id``."""
    grace = fields.misfire_grace_time
    if grace is UNSET:
        grace = default_grace()
    timeout, policy = fields.timeout, fields.retry_policy
    return NewJob(
        job_id,
        fields.job_name,
        fields.task_name,
        fields.execution_time,
        fields.task_data,
        PRIORITY_DB_VALUE_OF[fields.priority],
        fields.max_retries,
        grace,
        None if timeout is None else float(timeout),
        None if policy is None else encode_retry_policy(policy),
        fields.dedupe_key,
        fields.dedupe_scope,
        fields.queue,
    )
