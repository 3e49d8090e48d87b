"""The one rule for datetimes the caller gives us."""

from __future__ import annotations

from datetime import datetime


def to_aware(value: datetime) -> datetime:
    """Aware datetimes are kept as given; a naive one is read as the process's local time.

    That is Python's own rule (``datetime.astimezone()``), so
    ``datetime.now() + timedelta(seconds=10)`` means ten seconds from now.
    """
    if value.tzinfo is None or value.utcoffset() is None:
        return value.astimezone()
    return value
