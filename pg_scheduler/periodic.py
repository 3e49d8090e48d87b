"""@periodic: recurring jobs, each window run once across any number of replicas.

How it works (the README's "Periodic jobs" section is the user's view):

* ``@periodic`` validates its arguments at decoration time, registers the
  function as a task, and registers a small runner task ``periodic:<dedup_key>``
  that the window rows route to.
* Fire times come from a :class:`IntervalSchedule` (aligned to the Unix epoch,
  so every replica computes the same windows) or a
  :class:`~pg_scheduler.cron.CronSchedule` (any time zone, DST rule in
  ``cron.py``).
* Every Scheduler runs the enqueuer (``services/periodic.py``). There is no
  leader: each window is enqueued by whichever replica locks the job's row in
  ``periodic_jobs`` first, in the transaction that advances the row's cursor,
  as the row ``periodic:<dedup_key>:<fire time>``. Workers then claim it like
  any job, so it runs once.
* :func:`~pg_scheduler.windows.plan_windows` decides what to run after an
  outage (misfire grace time and coalesce policy).

This module is the declaration side: ``@periodic``, :class:`PeriodicJobConfig`
and the process-wide registry. A Scheduler's runtime side (enqueuer state,
enable/disable, triggers, running a window) is
:class:`~pg_scheduler.periodic_manager.PeriodicManager`.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .config import UNSET
from .cron import CronError, CronSchedule
from .enums import JobPriority
from .log import get_logger
from .store_periodic import PERIODIC_TASK_PREFIX, WINDOW_ID_PREFIX
from .tasks import default_registry
from .windows import MICROSECOND, CoalescePolicy, IntervalSchedule, Schedule

log = get_logger(__name__)

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
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ValueError(f"{name} must be None, a timedelta or seconds >= 0, got {value!r}")
    return float(value)


def _zone(value: Any) -> tzinfo:
    if isinstance(value, tzinfo):
        return value
    if not isinstance(value, str) or not value:
        raise TypeError(f"timezone must be a zone name or a ZoneInfo, got {value!r}")
    try:
        return ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(
            f"unknown timezone {value!r}: use an IANA name such as 'Europe/London'"
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
    schedule: Schedule = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        func = self.func
        if not inspect.iscoroutinefunction(func):
            raise TypeError(f"@periodic needs an async function (async def), got {func!r}")
        try:
            inspect.signature(func).bind()
        except TypeError as exc:
            raise TypeError(
                f"@periodic function {func.__qualname__} must be callable without arguments: {exc}"
            ) from None
        if (self.interval is None) == (self.cron is None):
            raise ValueError(
                "@periodic needs exactly one of every= (a timedelta) or cron= (an expression)"
            )
        if self.interval is not None:
            if not isinstance(self.interval, timedelta):
                raise TypeError(f"every= must be a timedelta, got {self.interval!r}")
            if self.interval < MICROSECOND:
                raise ValueError(f"every= must be positive, got {self.interval!r}")
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
        if not isinstance(self.priority, JobPriority):
            raise TypeError(f"priority= must be a JobPriority, got {self.priority!r}")
        if isinstance(self.max_retries, bool) or not isinstance(self.max_retries, int):
            raise TypeError(f"max_retries= must be an int, got {self.max_retries!r}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries= must be >= 0, got {self.max_retries}")
        for name in ("job_name", "dedup_key"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"{name}= must be a non-empty string or None, got {value!r}")
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
        # Imported on use: periodic_manager imports this module.
        from .periodic_manager import PeriodicManager

        current = _registry.get(key, config)
        manager = PeriodicManager.running(job_id)
        if manager is None:
            raise RuntimeError(f"periodic job {key!r} run outside of a Scheduler")
        return await manager.run(current, job_id, window)

    # A unique bare name, so this runner never makes a user function's bare
    # (0.2.x) name ambiguous.
    run_periodic.__name__ = run_periodic.__qualname__ = config.task_name
    return run_periodic


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
    Invalid arguments raise here, at decoration time. Returns the function
    unchanged.
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
        )
        key = config.dedup_key
        assert key is not None
        existing = _registry.get(key)
        if existing is not None and (
            existing.func.__module__,
            existing.func.__qualname__,
        ) != (func.__module__, func.__qualname__):
            raise ValueError(
                f"dedup_key {key!r} is already used by {existing.func.__module__}."
                f"{existing.func.__qualname__}; give each periodic job its own dedup_key"
            )
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


def window_job_id(dedup_key: str, fire_time: datetime) -> str:
    """The id of a window's row: the same on every replica."""
    stamp = fire_time.astimezone(UTC)
    text = stamp.strftime("%Y-%m-%dT%H:%M:%S")
    if stamp.microsecond:
        text += f".{stamp.microsecond:06d}"
    return f"{WINDOW_ID_PREFIX}{dedup_key}:{text}Z"
