"""@periodic: recurring jobs, each window run once across any number of replicas.

How it works (docs/periodic.md is the user's view):

* ``@periodic`` validates its arguments at decoration time, registers the
  function as a task, and registers a small runner task ``periodic:<dedup_key>``
  that the window rows route to.
* Fire times come from a :class:`IntervalSchedule` (aligned to the Unix epoch,
  so every replica computes the same windows) or a
  :class:`~pg_scheduler.periodic.cron.CronSchedule` (any time zone, DST rule in
  ``periodic/cron.py``).
* Every Scheduler runs the enqueuer (``periodic/enqueuer.py``). There is no
  leader: each window is enqueued by whichever replica locks the job's row in
  ``periodic_jobs`` first, in the transaction that advances the row's cursor,
  as the row ``periodic:<dedup_key>:<fire time>``. Workers then claim it like
  any job, so it runs once.
* :func:`~pg_scheduler.periodic.windows.plan_windows` decides what to run after an
  outage (misfire grace time and coalesce policy).

This module is the declaration side: ``@periodic``, :class:`PeriodicJobConfig`
and the process-wide registry. A Scheduler's runtime side (enqueuer state,
enable/disable, triggers, running a window) is
:class:`~pg_scheduler.periodic.runtime.PeriodicManager`.
"""

from __future__ import annotations

import hashlib
import inspect
import warnings
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Protocol
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..config import UNSET
from ..enums import JobPriority
from ..store.periodic import PERIODIC_TASK_PREFIX, WINDOW_ID_PREFIX
from ..support.log import get_logger
from ..support.timeutil import human_seconds
from ..support.validation import INT4_MAX, check_name, check_queue
from ..tasks import default_registry
from ..workflows.decorator import is_workflow, mark_workflow, options_of
from .cron import CronError, CronSchedule
from .windows import MICROSECOND, CoalescePolicy, IntervalSchedule, Schedule

log = get_logger("pg_scheduler.periodic")

__all__ = [
    "CoalescePolicy",
    "CronError",
    "IntervalSchedule",
    "PeriodicJobConfig",
    "periodic",
]


def _seconds(name: str, value: Any, allow_unset: bool = False) -> float | Any | None:
    if value is UNSET and allow_unset:
        return UNSET
    if value is None:
        return None
    if isinstance(value, timedelta):
        value = value.total_seconds()
    # At most INT4_MAX: a window's row stores its grace time, rounded up, in an
    # INTEGER column (and NaN fails >= 0).
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= INT4_MAX:
        shown = human_seconds(value) if isinstance(value, int | float) else repr(value)
        raise ValueError(
            f"{name} must be None, a timedelta or seconds from 0 to {INT4_MAX}, got {shown}"
        )
    return float(value)


def _zone(value: Any) -> tzinfo:
    if isinstance(value, tzinfo):
        return value
    if not isinstance(value, str) or not value:
        raise TypeError(f"timezone must be a zone name or a ZoneInfo, got {value!r}")
    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        # "Invalid timezone": the words 0.2.x raised with; callers match on them.
        raise ValueError(
            f"Invalid timezone {value!r}: unknown timezone name; use an IANA name "
            "such as 'Europe/London'"
        ) from None


@dataclass
class PeriodicJobConfig:
    """A periodic job as declared by ``@periodic`` (validated on construction).

    ``enabled`` is the declared default; a Scheduler's view of the shared,
    runtime value is in :meth:`Scheduler.get_periodic_jobs`.
    """

    func: Callable[..., Any]
    interval: timedelta | None = None
    cron: str | None = None
    timezone: str | tzinfo | None = None
    use_advisory_lock: bool = False
    priority: JobPriority = JobPriority.NORMAL
    max_retries: int = 0
    job_name: str | None = None
    dedup_key: str | None = None
    enabled: bool = True
    coalesce: CoalescePolicy | str = CoalescePolicy.LATEST
    #: Seconds a window may start late; UNSET: the Scheduler's misfire_grace_time.
    misfire_grace_time: float | timedelta | Any | None = UNSET
    #: Maximum random delay (seconds) added to each window's run.
    jitter: float | timedelta | None = None
    #: The runs' queue; None: the function's ``@task(queue=...)``, else "default".
    queue: str | None = None
    schedule: Schedule = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        func = self.func
        # The key words of 0.2.x's messages ("async functions", "Either", "both")
        # are kept: code and tests written for it match on them.
        if not inspect.iscoroutinefunction(func):
            raise TypeError(
                f"@periodic needs an async function (async def); it applies to async "
                f"functions only, got {func!r}"
            )
        try:
            # A workflow takes its context, nothing else.
            inspect.signature(func).bind(*((None,) if is_workflow(func) else ()))
        except TypeError as exc:
            raise TypeError(
                f"@periodic function {func.__qualname__} must be callable without arguments"
                f" (a workflow: with its context only): {exc}"
            ) from None
        exactly_one = "@periodic needs exactly one of every= (a timedelta) or cron= (an expression)"
        if self.interval is None and self.cron is None:
            raise ValueError(f"Either every= or cron= must be given: {exactly_one}")
        if self.interval is not None and self.cron is not None:
            raise ValueError(f"every= and cron= were both given: {exactly_one}")
        if self.interval is not None:
            if not isinstance(self.interval, timedelta):
                raise TypeError(f"every= must be a timedelta, got {self.interval!r}")
            if self.interval < MICROSECOND:
                raise ValueError(f"every= must be positive, got {human_seconds(self.interval)}")
            if self.timezone is not None:
                raise ValueError(
                    "timezone= only applies to cron= (intervals are aligned to the Unix epoch)"
                )
            self.schedule = IntervalSchedule(self.interval)
        else:
            if not isinstance(self.cron, str):
                raise TypeError(f"cron= must be a string, got {self.cron!r}")
            if self.timezone is not None:
                self.timezone = _zone(self.timezone)
            self.schedule = CronSchedule(self.cron, self.timezone)  # raises CronError
        for name in ("use_advisory_lock", "enabled"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}= must be True or False, got {getattr(self, name)!r}")
        if self.use_advisory_lock and is_workflow(self.func):
            raise ValueError(
                "use_advisory_lock=True cannot apply to a workflow: its runs park between "
                "steps, and a session's lock cannot be held across them"
            )
        if not isinstance(self.priority, JobPriority):
            raise TypeError(f"priority= must be a JobPriority, got {self.priority!r}")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int):
            raise TypeError(f"max_retries= must be an int, got {self.max_retries!r}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries= must be >= 0, got {self.max_retries}")
        if self.max_retries > INT4_MAX:
            raise ValueError(f"max_retries= must be <= {INT4_MAX}, got {self.max_retries}")
        if self.queue is not None:
            check_queue(self.queue, "queue=")
        for name in ("job_name", "dedup_key"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{name}= must be a non-empty string or None, got {value!r}")
            if value is not None:
                # Stored as text; the dedup key is a primary key and part of job ids.
                check_name(f"{name}=", value)
        try:
            self.coalesce = CoalescePolicy(self.coalesce)
        except ValueError:
            raise ValueError(
                f"coalesce= must be one of {[p.value for p in CoalescePolicy]}, "
                f"got {self.coalesce!r}"
            ) from None
        self.misfire_grace_time = _seconds(
            "misfire_grace_time", self.misfire_grace_time, allow_unset=True
        )
        self.jitter = _seconds("jitter", self.jitter) or None
        if self.job_name is None:
            self.job_name = f"periodic_{func.__name__}"
        if self.dedup_key is None:
            # The 0.2.x derivation, so keys (and what operators saved of them) carry over.
            if self.interval is not None:
                described = f"interval:{self.interval.total_seconds()}"
            else:
                described = f"cron:{self.cron}:tz:{self.timezone or 'UTC'}"
            material = f"{func.__module__}.{func.__name__}:{described}"
            self.dedup_key = hashlib.sha256(material.encode()).hexdigest()[:16]

    @property
    def task_name(self) -> str:
        """The task the window rows route to (a runner around :attr:`func`)."""
        return f"{PERIODIC_TASK_PREFIX}{self.dedup_key}"

    @property
    def lock_key(self) -> int:
        """The 64-bit advisory lock key of ``use_advisory_lock``."""
        digest = hashlib.sha256(f"pg_scheduler.periodic:{self.dedup_key}".encode()).digest()
        return int.from_bytes(digest[:8], "big", signed=True)

    def describe(self) -> str:
        """The schedule as stored in ``periodic_jobs.schedule``."""
        return self.schedule.describe()


_registry: dict[str, PeriodicJobConfig] = {}


class WindowRunner(Protocol):
    """What a runner task needs of a Scheduler's periodic runtime (``runtime.py``)."""

    def runs_in_current_task(self, job_id: str) -> bool: ...

    async def run(
        self, config: PeriodicJobConfig, job_id: str, window: str | None, ctx: Any = None
    ) -> Any: ...


# Every live runtime adds itself here; a runner task finds the one whose worker
# runs it. Kept here, not in runtime.py, so that this module imports no runtime.
_runtimes: weakref.WeakSet[WindowRunner] = weakref.WeakSet()


def add_runtime(runtime: WindowRunner) -> None:
    _runtimes.add(runtime)


def _runtime_running(job_id: str) -> WindowRunner | None:
    """The runtime whose worker runs ``job_id`` in the current task."""
    for runtime in list(_runtimes):
        if runtime.runs_in_current_task(job_id):
            return runtime
    return None


def registered_periodic_jobs() -> dict[str, PeriodicJobConfig]:
    """Every ``@periodic`` declaration of this process, by dedup key."""
    return dict(_registry)


def registered_periodic_job(dedup_key: str) -> PeriodicJobConfig | None:
    """This process's ``@periodic`` declaration with ``dedup_key``, if any."""
    return _registry.get(dedup_key)


def _make_runner(config: PeriodicJobConfig) -> Callable[..., Any]:
    key = config.dedup_key
    assert key is not None

    async def run_periodic(job_id: str, window: str | None = None) -> Any:
        current = _registry.get(key, config)
        runtime = _runtime_running(job_id)
        if runtime is None:
            raise RuntimeError(f"periodic job {key!r} run outside of a Scheduler")
        return await runtime.run(current, job_id, window)

    async def run_periodic_workflow(ctx: Any, job_id: str, window: str | None = None) -> Any:
        current = _registry.get(key, config)
        runtime = _runtime_running(job_id)
        if runtime is None:
            raise RuntimeError(f"periodic job {key!r} run outside of a Scheduler")
        return await runtime.run(current, job_id, window, ctx)

    # A unique bare name, so this runner never makes a user function's bare
    # (0.2.x) name ambiguous.
    runner: Callable[..., Any] = run_periodic
    if is_workflow(config.func):
        # A workflow's window is a workflow too: the runner gets its context.
        runner = mark_workflow(run_periodic_workflow, options_of(config.func))
    runner.__name__ = runner.__qualname__ = config.task_name
    return runner


def periodic(
    every: timedelta | None = None,
    cron: str | None = None,
    timezone: str | tzinfo | None = None,
    use_advisory_lock: bool = False,
    priority: JobPriority = JobPriority.NORMAL,
    max_retries: int = 0,
    job_name: str | None = None,
    dedup_key: str | None = None,
    enabled: bool = True,
    *,
    coalesce: CoalescePolicy | str = CoalescePolicy.LATEST,
    misfire_grace_time: float | timedelta | Any | None = UNSET,
    jitter: float | timedelta | None = None,
    queue: str | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run the decorated ``async def`` (taking no arguments) on a schedule, once per
    window across every Scheduler sharing the database.

    Exactly one of ``every`` (a timedelta; windows are aligned to the Unix
    epoch) or ``cron`` (5 fields, or 6 with seconds last; ``timezone`` names the
    zone it is read in, UTC by default). ``use_advisory_lock``: a run never
    overlaps another run of the same job anywhere (a window whose run finds the
    lock held is skipped). ``coalesce`` and ``misfire_grace_time`` decide what
    runs after every replica was down (default: only the latest overdue window,
    if within the Scheduler's misfire_grace_time); ``jitter`` adds up to that
    many seconds of random delay to each window, never past the next window.
    ``queue``: the queue its runs go to (default: the function's
    ``@task(queue=...)``, else "default"). Invalid arguments raise here, at
    decoration time. A dedup key registered again (the function defined again,
    its module reloaded) replaces the
    earlier declaration with a warning, as in 0.2.x; another function taking
    over an explicit ``dedup_key`` also emits a RuntimeWarning. Returns the
    function unchanged.
    """

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        config = PeriodicJobConfig(
            func,
            every,
            cron,
            timezone,
            use_advisory_lock,
            priority,
            max_retries,
            job_name,
            dedup_key,
            enabled,
            coalesce,
            misfire_grace_time,
            jitter,
            queue,
        )
        key = config.dedup_key
        assert key is not None
        existing = _registry.get(key)
        if existing is not None and existing.func is not func:
            _warn_replaced(existing, config)
        default_registry.register(func)
        default_registry.register(_make_runner(config), name=config.task_name)
        _registry[key] = config
        log.debug(
            "periodic job registered",
            dedup_key=key,
            job=config.job_name,
            schedule=config.describe(),
        )
        return func

    return decorate


def _origin(func: Callable[..., Any]) -> str:
    return f"{func.__module__}.{func.__qualname__}"


def _warn_replaced(existing: PeriodicJobConfig, new: PeriodicJobConfig) -> None:
    """A dedup key registered again replaces the earlier declaration, as in 0.2.x."""
    old_func, new_func = existing.func, new.func
    fields = dict(
        dedup_key=new.dedup_key,
        replaced=_origin(old_func),
        replaced_schedule=existing.describe(),
        by=_origin(new_func),
        schedule=new.describe(),
    )
    if (old_func.__module__, old_func.__name__) == (new_func.__module__, new_func.__name__):
        # The same function defined again (a reloaded module, a test redefining it).
        log.warning("periodic job registered again; the new definition replaces the old", **fields)
        return
    # Two different functions share an explicit dedup_key: only one of them
    # will run. Loud, since that is almost certainly a mistake.
    message = (
        f"periodic dedup_key {new.dedup_key!r} of {_origin(old_func)} is now used by "
        f"{_origin(new_func)}, which replaces it: {_origin(old_func)} will not run. "
        "Give each periodic job its own dedup_key"
    )
    log.warning("periodic dedup_key taken over by another function", **fields)
    warnings.warn(message, RuntimeWarning, stacklevel=3)


def window_job_id(dedup_key: str, fire_time: datetime) -> str:
    """The id of a window's row: the same on every replica."""
    stamp = fire_time.astimezone(UTC)
    text = stamp.strftime("%Y-%m-%dT%H:%M:%S")
    if stamp.microsecond:
        text += f".{stamp.microsecond:06d}"
    return f"{WINDOW_ID_PREFIX}{dedup_key}:{text}Z"
