"""The one rule for datetimes the caller gives us."""

from __future__ import annotations

from datetime import datetime, timedelta


def to_aware(value: datetime) -> datetime:
    """Aware datetimes are kept as given; a naive one is read as the process's local time.

    That is Python's own rule (``datetime.astimezone()``), so
    ``datetime.now() + timedelta(seconds=10)`` means ten seconds from now.
    """
    if value.tzinfo is None or value.utcoffset() is None:
        return value.astimezone()
    return value


def human_seconds(value: float | timedelta) -> str:
    """A duration as people write it, sign first: ``-5s``, ``90s``, ``1.5s``,
    ``2h``, ``-1d 3h`` (a negative timedelta's repr, ``timedelta(days=-1,
    seconds=86395)``, reads as a day, not as minus five seconds)."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):
        return str(seconds)
    sign = "-" if seconds < 0 else ""
    rest = abs(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if rest >= max(size, 120):
            count = int(rest // size)
            parts.append(f"{count}{unit}")
            rest -= count * size
    if rest or not parts:
        parts.append(f"{rest:g}s")
    return sign + " ".join(parts)
