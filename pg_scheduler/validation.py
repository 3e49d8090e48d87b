"""Argument checks shared by the public API: a clear error at the call."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from typing import Any

from .config import UNSET, RetryPolicy
from .enums import JobPriority
from .timeutil import to_aware

# The largest value of the INTEGER (int4) columns max_retries and misfire_grace_time.
INT4_MAX = 2**31 - 1
# Job ids and names, in UTF-8 bytes. job_id is the primary key: a btree entry
# must fit in about 2,700 bytes, and ids are compared on every lookup.
MAX_NAME_BYTES = 1024


def check_bool(name: str, value: Any) -> None:
    """TypeError unless True or False."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def check_int(
    name: str, value: Any, minimum: int, allow_none: bool = False, maximum: int | None = None
) -> None:
    """TypeError unless an int (bools are not), ValueError if outside [minimum, maximum]."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ValueError(f"{name} must be <= {maximum} (what the column holds), got {value}")


DEFAULT_QUEUE = "default"
#: Queue names: letters, digits and ``_ - . :``, starting with a letter or digit.
#: They travel in NOTIFY payloads, metric labels and CLI arguments.
MAX_QUEUE_LENGTH = 63
_QUEUE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]*\Z")


def check_queue(value: Any, what: str = "queue") -> str:
    """A valid queue name, else TypeError/ValueError naming ``what``."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    if not 0 < len(value) <= MAX_QUEUE_LENGTH or not _QUEUE_RE.match(value):
        raise ValueError(
            f"{what} must be 1 to {MAX_QUEUE_LENGTH} characters of letters, digits, "
            f"'_', '-', '.' or ':', starting with a letter or digit; got {_clip(value)}"
        )
    return value


def check_seconds(name: str, value: Any, allow_none: bool = True) -> None:
    """ValueError unless a positive number of seconds (or None when allowed); NaN is not."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


def text_problem(value: str) -> str | None:
    """Why PostgreSQL cannot store ``value`` as text/jsonb, or None if it can."""
    if "\x00" in value:
        return "contains a NUL character (\\x00), which PostgreSQL text cannot hold"
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            return "contains a lone surrogate, which is not valid UTF-8"
    return None


def check_name(name: str, value: str) -> None:
    """ValueError unless ``value`` (a str) can be stored and indexed as a job id or name."""
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(f"{name} {problem}: {_clip(value)}")
    size = len(value) if value.isascii() else len(value.encode())
    if size > MAX_NAME_BYTES:
        raise ValueError(f"{name} is {size} bytes long; the limit is {MAX_NAME_BYTES} (UTF-8)")


def _clip(value: Any) -> str:
    """A repr short enough for an error message."""
    if isinstance(value, str) and len(value) > 60:
        return f"{value[:60]!r}... ({len(value)} characters)"
    return repr(value)


# -- the fields of one job: shared by schedule(), schedule_job() and JobSpec ----
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
        raise ValueError(f"job_id must be a non-empty string or None, got {_clip(value)}")
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
