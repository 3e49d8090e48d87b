"""Argument checks shared by the public API: a clear error at the call."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .config import UNSET, RetryPolicy
from .enums import JobPriority


def check_int(name: str, value: Any, minimum: int, allow_none: bool = False) -> None:
    """TypeError unless an int (bools are not), ValueError if below ``minimum``."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


def check_seconds(name: str, value: Any, allow_none: bool = True) -> None:
    """ValueError unless a positive number of seconds (or None when allowed)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


# -- the fields of one job: shared by schedule(), schedule_job() and JobSpec ----
# Each tests the common case first; the wording helpers run only for bad values.


def check_execution_time(value: Any) -> None:
    if not isinstance(value, datetime):
        raise TypeError(f"execution_time must be a datetime, got {value!r}")


def check_priority(value: Any) -> None:
    if not isinstance(value, JobPriority):
        raise TypeError(f"priority must be a JobPriority, got {value!r}")


def check_max_retries(value: Any) -> None:
    if type(value) is not int or value < 0:
        check_int("max_retries", value, 0)


def check_job_id(value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"job_id must be a non-empty string or None, got {value!r}")


def check_misfire_grace_time(value: Any) -> None:
    """A non-negative int, None (no limit) or UNSET (the scheduler's default)."""
    if value is not None and value is not UNSET and (type(value) is not int or value < 0):
        check_int("misfire_grace_time", value, 0)


def check_timeout(value: Any) -> None:
    if value is not None:
        check_seconds("timeout", value)


def check_retry_policy(value: Any) -> None:
    if value is not None and not isinstance(value, RetryPolicy):
        raise TypeError(f"retry_policy must be a RetryPolicy, got {value!r}")


def check_job_fields(
    execution_time: Any,
    priority: Any,
    max_retries: Any,
    job_id: Any,
    misfire_grace_time: Any,
    timeout: Any,
    retry_policy: Any,
) -> None:
    """Every per-job field but the function and its arguments."""
    check_execution_time(execution_time)
    check_priority(priority)
    check_max_retries(max_retries)
    check_job_id(job_id)
    check_misfire_grace_time(misfire_grace_time)
    check_timeout(timeout)
    check_retry_policy(retry_policy)


def as_args(value: Any) -> tuple:
    if type(value) is tuple:
        return value
    if not isinstance(value, tuple | list):
        raise TypeError(f"args must be a tuple or list, got {type(value).__name__}")
    return tuple(value)


def as_kwargs(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"kwargs must be a dict, got {type(value).__name__}")
    return value
