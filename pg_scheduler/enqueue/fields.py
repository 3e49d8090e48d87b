"""A job's fields: the one declaration of its optional keywords, their defaults
and their checks (:class:`JobOptions`, :func:`check_job`), and the resolved
fields on their way to the job's row (:class:`JobFields`, :func:`row_of`).

Every way a job gets in follows :class:`JobOptions`: ``Scheduler.schedule`` and
``SyncClient.schedule`` take its fields as keywords, ``JobSpec`` positionally
after ``kwargs``, ``schedule_job`` (0.2.x) a subset of them, and a periodic run's
row is made of one. Those public signatures list the keywords for their users
and hand them over with :meth:`JobOptions.of`; ``tests/unit/test_job_options.py``
holds each signature's names and defaults to this declaration.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import Any, NamedTuple

from ..config import UNSET, RetryPolicy
from ..enums import PRIORITY_DB_VALUE_OF, JobPriority
from ..store import NewJob
from ..support.codec import encode_retry_policy
from ..support.validation import check_queue
from .checks import (
    check_depends_on,
    check_job_id,
    check_max_retries,
    check_misfire_grace_time,
    check_on_dependency_failure,
    check_priority,
    check_retry_policy,
    check_timeout,
    check_when,
)
from .dedupe import check_dedupe_key, check_dedupe_scope
from .fair import check_fair_share_key, check_fair_share_weight
from .keys import NO_KEY, KeyFields, check_key_options
from .timing import Timing, check_duration


@dataclass(frozen=True, slots=True)
class JobOptions:
    """A job's optional keywords and their defaults (its function, arguments
    and ``execution_time`` aside). Not checked when made: :func:`check_job`."""

    priority: JobPriority = JobPriority.NORMAL
    max_retries: int = 0
    job_id: str | None = None  # None: a fresh time-ordered id
    misfire_grace_time: Any = UNSET  # int | None, or UNSET: the scheduler's default
    timeout: float | None = None
    retry_policy: RetryPolicy | None = None
    dedupe_key: str | None = None  # None: the task's key, if it has one
    dedupe_scope: str | None = None  # None: the task's scope, else "active"
    queue: str | None = None  # None: the task's queue, else enums.DEFAULT_QUEUE
    # Jobs that must complete first (ids; in schedule_bulk, JobSpecs of the call too).
    depends_on: Sequence[Any] | None = None
    on_dependency_failure: str = "cancel"  # "cancel", "run" or "wait"
    # Due this long after now (a timedelta or seconds); instead of execution_time.
    delay: timedelta | float | None = None
    # Per-key limits (enqueue/keys.py; None: the task's): the job's key, how many
    # of the key's jobs run at once, how many start per window ("10/s"), and
    # whether the key's jobs run one at a time in enqueue order.
    concurrency_key: str | None = None
    max_running_per_key: int | None = None
    rate_limit_per_key: str | None = None
    ordered: bool = False
    # One job per burst of calls with the job's dedupe key, due this long (a
    # timedelta or seconds) after the burst's last call; at most
    # debounce_max_wait after its first. See docs/debounce-throttle.md.
    debounce: timedelta | float | None = None
    debounce_max_wait: timedelta | float | None = None
    # At most one job per this period and dedupe key: the period's first call.
    throttle: timedelta | float | None = None
    # Fair share (docs/fair-share.md): the job's key (None: the task's, if any)
    # and its weight (None: the task's, else 1).
    fair_share_key: str | None = None
    fair_share_weight: float | None = None

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> JobOptions:
        """The options among ``values``: a public method's ``locals()``, taken
        before it assigns any, hands over the keywords its signature lists."""
        return cls(**{name: values[name] for name in OPTION_NAMES if name in values})


#: The options' names, in declaration order (JobSpec's positional order).
OPTION_NAMES: tuple[str, ...] = tuple(f.name for f in fields(JobOptions))
#: Each option's default.
OPTION_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {f.name: f.default for f in fields(JobOptions)}
)


def _check_queue_or_none(value: Any) -> None:
    if value is not None:
        check_queue(value)


def check_job(execution_time: Any, options: Any) -> None:
    """Every check of a job's fields but its function and arguments: a clear
    TypeError or ValueError naming the first bad one, its time first
    (``execution_time`` or ``delay``, never both; neither: now), then the other
    options in declaration order. ``options``: a :class:`JobOptions`,
    or anything with its attributes (a ``JobSpec``). ``tests/unit/test_job_options.py``
    gives it a bad value of each option."""
    check_when(execution_time, options.delay)
    check_priority(options.priority)
    check_max_retries(options.max_retries)
    check_job_id(options.job_id)
    check_misfire_grace_time(options.misfire_grace_time)
    check_timeout(options.timeout)
    check_retry_policy(options.retry_policy)
    check_dedupe_key(options.dedupe_key)
    check_dedupe_scope(options.dedupe_scope)
    _check_queue_or_none(options.queue)
    check_depends_on(options.depends_on)
    check_on_dependency_failure(options.on_dependency_failure)
    check_key_options(options)
    check_duration("debounce", options.debounce)
    check_duration("debounce_max_wait", options.debounce_max_wait)
    check_duration("throttle", options.throttle)
    check_fair_share_key(options.fair_share_key)
    check_fair_share_weight(options.fair_share_weight)


class JobFields(NamedTuple):
    """A job as it will be written: checked, its names and arguments encoded,
    and what its task decides where the call named nothing resolved."""

    job_name: str
    task_name: str
    execution_time: datetime  # aware
    task_data: str  # {"args": [...], "kwargs": {...}} as JSON text
    options: JobOptions  # as the call gave them
    dedupe_key: str | None  # the call's, else the task's
    dedupe_scope: str | None  # with a key: the call's, else the task's, else "active"
    queue: str  # the call's, else the task's, else enums.DEFAULT_QUEUE
    keys: KeyFields = NO_KEY  # the call's key and per-key limits over the task's
    timing: Timing | None = None  # debounced or throttled (the task's defaults applied)
    fair_share_key: str | None = None  # the call's, else the task's
    fair_share_weight: float | None = None  # with a key: the call's, else the task's


def row_of(fields: JobFields, job_id: str, default_grace: Callable[[], int | None]) -> NewJob:
    """The row for checked ``fields`` under ``job_id``."""
    options = fields.options
    grace = options.misfire_grace_time
    if grace is UNSET:
        grace = default_grace()
    timeout, policy = options.timeout, options.retry_policy
    return NewJob(
        job_id,
        fields.job_name,
        fields.task_name,
        fields.execution_time,
        fields.task_data,
        PRIORITY_DB_VALUE_OF[options.priority],
        options.max_retries,
        grace,
        None if timeout is None else float(timeout),
        None if policy is None else encode_retry_policy(policy),
        fields.dedupe_key,
        fields.dedupe_scope,
        fields.queue,
        *fields.keys,
        fields.fair_share_key,
        fields.fair_share_weight,
    )
