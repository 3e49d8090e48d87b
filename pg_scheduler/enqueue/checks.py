"""The check of each of a job's fields: a clear error at the call.

:func:`~pg_scheduler.enqueue.fields.check_job` runs them all (``schedule()``,
``schedule_job``, ``JobSpec``, the sync client); ``schedule_bulk``'s rows call
them one by one, once per distinct value (``rows.py``)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

from ..config import UNSET, RetryPolicy
from ..enums import JobPriority
from ..support.timeutil import human_seconds, to_aware
from ..support.validation import INT4_MAX, check_int, check_name, check_seconds, clip_repr

# Each tests the common case first; the wording helpers run only for bad values.


def check_execution_time(value: Any) -> None:
    if not isinstance(value, datetime):
        raise TypeError(f"execution_time must be a datetime, got {value!r}")
    # UTC offsets are under a day: only the first and last year can overflow.
    if value.year == 1 or value.year == 9999:
        try:
            utc = to_aware(value).astimezone(UTC).replace(tzinfo=None)
        except (OverflowError, ValueError):
            utc = datetime.min
        # asyncpg sends datetime.min and datetime.max as -infinity and infinity.
        if utc == datetime.min or utc == datetime.max:
            raise ValueError(
                f"execution_time {value!r} is out of range: in UTC it must fall "
                "after 0001-01-01 00:00 and before 9999-12-31 23:59:59.999999"
            )


def check_delay(value: Any) -> None:
    """A non-negative timedelta or number of seconds (None: not given)."""
    if value is None:
        return
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise TypeError(f"delay must be a timedelta or a number of seconds, got {clip_repr(value)}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"delay must be a finite duration >= 0, got {human_seconds(seconds)}")


def when_of(execution_time: Any, delay: Any, now: datetime | None = None) -> datetime:
    """The aware time a job is due at: ``execution_time`` (naive: local time), or
    ``now`` (default: this process's UTC clock) plus ``delay``, or ``now`` when
    neither is given. Both checked first (:func:`check_when`)."""
    if delay is not None:
        base = now if now is not None else datetime.now(UTC)
        step = delay if isinstance(delay, timedelta) else timedelta(seconds=delay)
        try:
            return base + step
        except OverflowError:
            raise ValueError(
                f"delay {human_seconds(step)} is out of range: the job would be due "
                "after 9999-12-31"
            ) from None
    if execution_time is None:
        return now if now is not None else datetime.now(UTC)
    return to_aware(execution_time)


def check_when(execution_time: Any, delay: Any) -> None:
    """``execution_time`` or ``delay`` (or neither: now), never both."""
    if delay is not None:
        if execution_time is not None:
            raise ValueError("give execution_time or delay, not both (neither: the job is due now)")
        check_delay(delay)
        check_execution_time(when_of(None, delay))
    elif execution_time is not None:
        check_execution_time(execution_time)


def check_priority(value: Any) -> None:
    if not isinstance(value, JobPriority):
        raise TypeError(f"priority must be a JobPriority, got {value!r}")


def check_max_retries(value: Any) -> None:
    if type(value) is not int or value < 0 or value > INT4_MAX:
        check_int("max_retries", value, 0, maximum=INT4_MAX)


def check_job_id(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"job_id must be a non-empty string or None, got {clip_repr(value)}")
    check_name("job_id", value)


def check_misfire_grace_time(value: Any) -> None:
    """A non-negative int, None (no limit) or UNSET (the scheduler's default)."""
    if (
        value is not None
        and value is not UNSET
        and (type(value) is not int or value < 0 or value > INT4_MAX)
    ):
        check_int("misfire_grace_time", value, 0, maximum=INT4_MAX)


def check_timeout(value: Any) -> None:
    if value is not None:
        check_seconds("timeout", value)
        if value == math.inf:
            raise ValueError("timeout must be a finite number of seconds (None: no timeout)")


def check_retry_policy(value: Any) -> None:
    if value is not None and not isinstance(value, RetryPolicy):
        raise TypeError(f"retry_policy must be a RetryPolicy, got {value!r}")


#: What a job does when one of its dependencies ends without completing.
DEPENDENCY_FAILURE_POLICIES = ("cancel", "run", "wait")


def check_depends_on(value: Any) -> None:
    """None, or a list or tuple of job ids (strings) and, in ``schedule_bulk``,
    ``JobSpec``s of the same call (which ``enqueue/dependencies.py`` checks)."""
    if value is None:
        return
    if not isinstance(value, list | tuple):
        raise TypeError(
            f"depends_on must be a list of job ids (or JobSpecs), got {clip_repr(value)}"
        )
    for item in value:
        if (
            type(item) is not str
            and not isinstance(item, str | int | float | bytes | dict | list | tuple)
            and item is not None
        ):
            continue  # a JobSpec (checked where it is resolved)
        if isinstance(item, str):
            if not item.strip():
                raise ValueError("depends_on must not hold an empty job id")
            check_name("depends_on", item)
        elif item is None or isinstance(item, int | float | bytes | dict | list | tuple):
            raise TypeError(f"depends_on must hold job ids (or JobSpecs), got {clip_repr(item)}")


def check_on_dependency_failure(value: Any) -> None:
    if value not in DEPENDENCY_FAILURE_POLICIES or not isinstance(value, str):
        raise ValueError(
            f"on_dependency_failure must be one of {', '.join(DEPENDENCY_FAILURE_POLICIES)}, "
            f"got {clip_repr(value)}"
        )
