"""``JobSpec``: one job for ``Scheduler.schedule_bulk`` (also the 0.2.x import path)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from .config import UNSET, RetryPolicy
from .enqueue.checks import check_execution_time
from .enqueue.fields import OPTION_NAMES, check_job
from .enums import JobPriority
from .support.validation import as_args, as_kwargs

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
    TypeError, before anything is written. So are arguments ``func``
    cannot take (bound to its signature there, not here: a 0.2.x spec is
    built whatever its arguments).

    ``execution_time`` None (the default) and no ``delay``: due at the
    ``schedule_bulk`` call; ``delay`` (a timedelta or seconds): that long
    after it. Not both.

    Its fields after ``kwargs`` are the options of
    :class:`~pg_scheduler.enqueue.fields.JobOptions`, in their order and with
    their defaults (``tests/unit/test_job_options.py``), checked by the same
    :func:`~pg_scheduler.enqueue.fields.check_job`.
    """

    __slots__ = ("func", "execution_time", "args", "kwargs", *OPTION_NAMES)

    def __init__(
        self,
        func: Callable[..., Any],
        execution_time: datetime | None = None,
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
        depends_on: list[str | JobSpec] | tuple[str | JobSpec, ...] | None = None,
        on_dependency_failure: str = "cancel",
        delay: timedelta | float | None = None,
        concurrency_key: str | None = None,
        max_running_per_key: int | None = None,
        rate_limit_per_key: str | None = None,
        ordered: bool = False,
        debounce: timedelta | float | None = None,
        debounce_max_wait: timedelta | float | None = None,
        throttle: timedelta | float | None = None,
        fair_share_key: str | None = None,
        fair_share_weight: float | None = None,
    ) -> None:
        if isinstance(func, str):
            raise TypeError(
                f"func must be a callable (the task's function itself), got the name "
                f"{func!r}; to schedule by name, use Scheduler.schedule_job"
            )
        if not callable(func):
            raise TypeError(f"func must be a callable (an async function), got {func!r}")
        self.func = func
        self.execution_time = execution_time
        self.priority = priority
        self.max_retries = max_retries
        self.job_id = job_id
        self.misfire_grace_time = misfire_grace_time
        self.timeout = timeout
        self.retry_policy = retry_policy
        self.dedupe_key = dedupe_key
        self.dedupe_scope = dedupe_scope
        # None: the task's queue (``@task(queue=...)``), else "default".
        self.queue = queue
        # Job ids, or JobSpecs of the same schedule_bulk call (see docs/dependencies.md).
        self.depends_on = depends_on
        self.on_dependency_failure = on_dependency_failure
        self.delay = delay
        # Per-key limits (see docs/keys.md); None: the task's.
        self.concurrency_key = concurrency_key
        self.max_running_per_key = max_running_per_key
        self.rate_limit_per_key = rate_limit_per_key
        self.ordered = ordered
        # Kept and checked; schedule_bulk refuses them (schedule() writes such jobs).
        self.debounce = debounce
        self.debounce_max_wait = debounce_max_wait
        self.throttle = throttle
        self.fair_share_key = fair_share_key
        self.fair_share_weight = fair_share_weight
        if (
            priority is _NORMAL
            and type(max_retries) is int
            and max_retries == 0
            and job_id is None
            and misfire_grace_time is UNSET
            and timeout is None
            and retry_policy is None
            and dedupe_key is None
            and dedupe_scope is None
            and queue is None
            and depends_on is None
            and on_dependency_failure == "cancel"
            and delay is None
            and concurrency_key is None
            and max_running_per_key is None
            and rate_limit_per_key is None
            and ordered is False
            and debounce is None
            and debounce_max_wait is None
            and throttle is None
            and fair_share_key is None
            and fair_share_weight is None
        ):
            # Every option at its default, which is valid: a bulk's common case.
            if execution_time is not None:
                check_execution_time(execution_time)
        else:
            check_job(execution_time, self)
        self.args = args if type(args) is tuple else as_args(args)
        self.kwargs = {} if kwargs is None else as_kwargs(kwargs)
        # Its arguments are bound to the function's signature by schedule_bulk,
        # not here: a 0.2.x JobSpec is built whatever they are.

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={_shown(self, name)}" for name in _FIELD_ORDER)
        return f"JobSpec({fields})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, JobSpec):
            return NotImplemented
        return all(
            _same_dependencies(self.depends_on, other.depends_on)
            if n == "depends_on"
            else getattr(self, n) == getattr(other, n)
            for n in _FIELD_ORDER
        )

    __hash__ = None  # type: ignore[assignment]  # mutable, like a dataclass


# The constructor's parameter order, for repr.
_FIELD_ORDER = ("func", "execution_time", "args", "kwargs", *OPTION_NAMES)


def _shown(spec: JobSpec, name: str) -> str:
    """A field's repr; a JobSpec depended on by its function's name (a chain's
    last spec would otherwise spell out the whole chain)."""
    value = getattr(spec, name)
    if name == "depends_on" and value is not None:
        items = [
            f"<JobSpec {getattr(v.func, '__name__', v.func)!s}>"
            if isinstance(v, JobSpec)
            else repr(v)
            for v in value
        ]
        return "[" + ", ".join(items) + "]"
    return repr(value)


def _same_dependencies(a: Any, b: Any) -> bool:
    """Equal lists of dependencies: the same ids, the very same JobSpecs."""
    if a is None or b is None:
        return a is b
    return len(a) == len(b) and all(
        x is y if isinstance(x, JobSpec) else x == y for x, y in zip(a, b, strict=True)
    )
