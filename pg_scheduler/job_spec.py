"""``JobSpec``: one job for ``Scheduler.schedule_bulk`` (also the 0.2.x import path)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from .config import UNSET, RetryPolicy
from .enqueue.checks import check_execution_time, check_job_fields
from .enqueue.dedupe import check_dedupe_key, check_dedupe_scope
from .enums import JobPriority
from .support.validation import as_args, as_kwargs, check_queue

__all__ = ["JobSpec"]

#: "Not given" for ``misfire_grace_time`` (the Scheduler's default applies).
#: Private, but 0.2.x code and tests import it from here: the very same object.
_UNSET: Any = UNSET
_NORMAL = JobPriority.NORMAL


class JobSpec:
    """One job for :meth:`Scheduler.schedule_bulk`.

    Checked when built, so a mistake shows where it is made;
    ``schedule_bulk`` checks every field again, as a spec may be changed
    afterwards. A plain slotted class, not a pydantic model: bulk callers
    build hundreds of thousands of these, and this costs a microsecond or two
    each where a pydantic model cost about eight.

    ``func`` need only be callable here, as in 0.2.x: ``schedule_bulk`` is
    where a function that cannot run as a task (not ``async def``) raises
    TypeError, before anything is written.
    """

    __slots__ = (
        "args",
        "dedupe_key",
        "dedupe_scope",
        "execution_time",
        "func",
        "job_id",
        "kwargs",
        "max_retries",
        "misfire_grace_time",
        "priority",
        "queue",
        "retry_policy",
        "timeout",
    )

    def __init__(
        self,
        func: Callable[..., Any],
        execution_time: datetime,
        args: tuple | list = (),
        kwargs: dict[str, Any] | None = None,
        priority: JobPriority = JobPriority.NORMAL,
        max_retries: int = 0,
        job_id: str | None = None,
        misfire_grace_time: int | None = _UNSET,
        timeout: float | None = None,
        retry_policy: RetryPolicy | None = None,
        dedupe_key: str | None = None,
        dedupe_scope: str | None = None,
        queue: str | None = None,
    ) -> None:
        if not callable(func):
            raise TypeError(f"func must be a callable (an async function), got {func!r}")
        if (
            priority is _NORMAL
            and type(max_retries) is int
            and max_retries == 0
            and job_id is None
            and misfire_grace_time is UNSET
            and timeout is None
            and retry_policy is None
        ):
            # Every other field at its default, which is valid: a bulk's common case.
            check_execution_time(execution_time)
        else:
            check_job_fields(
                execution_time,
                priority,
                max_retries,
                job_id,
                misfire_grace_time,
                timeout,
                retry_policy,
            )
        if dedupe_key is not None or dedupe_scope is not None:
            check_dedupe_key(dedupe_key)
            check_dedupe_scope(dedupe_scope)
        self.func = func
        self.execution_time = execution_time
        self.args = args if type(args) is tuple else as_args(args)
        self.kwargs = {} if kwargs is None else as_kwargs(kwargs)
        self.priority = priority
        self.max_retries = max_retries
        self.job_id = job_id
        self.misfire_grace_time = misfire_grace_time
        self.timeout = timeout
        self.retry_policy = retry_policy
        self.dedupe_key = dedupe_key
        self.dedupe_scope = dedupe_scope
        # None: the task's queue (``@task(queue=...)``), else "default".
        self.queue = None if queue is None else check_queue(queue)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELD_ORDER)
        return f"JobSpec({fields})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobSpec):
            return NotImplemented
        return all(getattr(self, n) == getattr(other, n) for n in _FIELD_ORDER)

    __hash__ = None  # type: ignore[assignment]  # mutable, like a dataclass


# The constructor's parameter order, for repr.
_FIELD_ORDER = (
    "func",
    "execution_time",
    "args",
    "kwargs",
    "priority",
    "max_retries",
    "job_id",
    "misfire_grace_time",
    "timeout",
    "retry_policy",
    "dedupe_key",
    "dedupe_scope",
    "queue",
)
