"""``JobSpec``: one job for ``Scheduler.schedule_bulk`` (also the 0.2.x import path)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from .config import UNSET, RetryPolicy
from .enums import JobPriority
from .tasks import ensure_async
from .validation import as_args, as_kwargs, check_job_fields

__all__ = ["JobSpec"]


class JobSpec:
    """One job for :meth:`Scheduler.schedule_bulk`.

    Checked when built, so a mistake shows where it is made;
    ``schedule_bulk`` checks every field again, as a spec may be changed
    afterwards. A plain slotted class, not a pydantic model: bulk callers
    build hundreds of thousands of these, and this costs a microsecond or two
    each where a pydantic model cost about eight.
    """

    __slots__ = (
        "args",
        "execution_time",
        "func",
        "job_id",
        "kwargs",
        "max_retries",
        "misfire_grace_time",
        "priority",
        "retry_policy",
        "timeout",
    )

    # The last function found async: bulk lists repeat one function, and
    # inspect.iscoroutinefunction is the costliest check here.
    _last_async: Any = None

    def __init__(
        self,
        func: Callable[..., Any],
        execution_time: datetime,
        args: tuple | list = (),
        kwargs: dict[str, Any] | None = None,
        priority: JobPriority = JobPriority.NORMAL,
        max_retries: int = 0,
        job_id: str | None = None,
        misfire_grace_time: int | None = UNSET,
        timeout: float | None = None,
        retry_policy: RetryPolicy | None = None,
    ) -> None:
        if func is not JobSpec._last_async:
            ensure_async(func)
            JobSpec._last_async = func
        check_job_fields(
            execution_time, priority, max_retries, job_id, misfire_grace_time, timeout, retry_policy
        )
        self.func = func
        self.execution_time = execution_time
        self.args = as_args(args)
        self.kwargs = as_kwargs(kwargs)
        self.priority = priority
        self.max_retries = max_retries
        self.job_id = job_id
        self.misfire_grace_time = misfire_grace_time
        self.timeout = timeout
        self.retry_policy = retry_policy

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
)
