"""What every part of the dashboard's service shares: JSON-ready values and
the two refusals its HTTP layer turns into 404 and 409."""

from __future__ import annotations

from datetime import UTC, datetime
from enum import Enum
from typing import Any

import asyncpg

#: Rows of a list (jobs, workflows) one request returns at most.
MAX_PAGE = 500


class NotFound(LookupError):
    """No such job, periodic job or queue."""


class Conflict(ValueError):
    """The action does not apply to the thing in its current state."""


def plain(value: Any) -> Any:
    """``value`` made JSON-ready: ISO 8601 UTC times, enum values, nested."""
    if isinstance(value, datetime):
        if value.tzinfo is None:
            value = value.astimezone()
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, asyncpg.Record):
        return {k: plain(v) for k, v in value.items()}
    return value
