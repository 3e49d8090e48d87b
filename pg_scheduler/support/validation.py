"""Argument checks shared by the public API: a clear error at the call."""

from __future__ import annotations

import re
from typing import Any

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
            f"'_', '-', '.' or ':', starting with a letter or digit; got {clip_repr(value)}"
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
        raise ValueError(f"{name} {problem}: {clip_repr(value)}")
    size = len(value) if value.isascii() else len(value.encode())
    if size > MAX_NAME_BYTES:
        raise ValueError(f"{name} is {size} bytes long; the limit is {MAX_NAME_BYTES} (UTF-8)")


def clip_repr(value: Any) -> str:
    """A repr short enough for an error message."""
    if isinstance(value, str) and len(value) > 60:
        return f"{value[:60]!r}... ({len(value)} characters)"
    return repr(value)


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
