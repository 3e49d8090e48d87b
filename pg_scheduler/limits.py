"""Global limits: how many jobs of a task or queue may run at once anywhere, and
how many may start per rolling window. Parsing and validation only; the
database enforces them in the claim (:mod:`pg_scheduler.engine.limited`).

A rate is written ``"N/unit"`` or ``"N/Kunit"`` with unit ``s``, ``m``, ``h``
or ``d`` (``"100/m"``, ``"5/s"``, ``"20/10s"``), or given as
:class:`RateLimit`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .support.validation import check_name

#: At most this many starts per window: the claim keeps one timestamp per start.
MAX_RATE_COUNT = 10_000
#: Limit scopes stored in ``scheduler_limits.scope``.
SCOPES = ("task", "queue")
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_RATE = re.compile(r"^\s*(\d+)\s*/\s*(\d*)\s*([smhd])\s*$")


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``count`` starts in any window of ``period`` seconds."""

    count: int
    period: float

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int):
            raise TypeError(f"rate_limit count must be an int, got {self.count!r}")
        if not 1 <= self.count <= MAX_RATE_COUNT:
            raise ValueError(f"rate_limit count must be 1..{MAX_RATE_COUNT}, got {self.count}")
        period = self.period
        if isinstance(period, bool) or not isinstance(period, (int, float)):
            raise TypeError(f"rate_limit period must be seconds, got {period!r}")
        if not math.isfinite(period) or not 0.01 <= period <= 7 * 86400:
            raise ValueError(f"rate_limit period must be 0.01 s .. 7 days, got {period!r}")

    def __str__(self) -> str:
        for unit, seconds in reversed(_UNITS.items()):
            if self.period % seconds == 0:
                multiple = int(self.period // seconds)
                return f"{self.count}/{'' if multiple == 1 else multiple}{unit}"
        return f"{self.count}/{self.period:g}s"


def parse_rate_limit(value: Any) -> RateLimit | None:
    """``None``, a :class:`RateLimit` or a string such as ``"100/m"``."""
    if value is None or isinstance(value, RateLimit):
        return value
    if not isinstance(value, str):
        raise TypeError(f'rate_limit must be a string like "100/m" or a RateLimit, got {value!r}')
    match = _RATE.match(value)
    if match is None:
        raise ValueError(
            f'rate_limit must look like "100/m", "5/s" or "20/10s" (units s, m, h, d), '
            f"got {value!r}"
        )
    count, multiple, unit = match.groups()
    if len(count) > 6:
        raise ValueError(f"rate_limit count must be 1..{MAX_RATE_COUNT}, got {count}")
    return RateLimit(int(count), int(multiple or 1) * _UNITS[unit])


def check_max_running(value: Any) -> int | None:
    """``None`` or a positive int."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"max_running must be a positive int or None, got {value!r}")
    if not 1 <= value <= 1_000_000:
        raise ValueError(f"max_running must be 1..1000000, got {value}")
    return value


@dataclass(frozen=True, slots=True)
class Limits:
    """The limits of one task or queue (``None``: that kind of limit is off)."""

    max_running: int | None = None
    rate_limit: RateLimit | None = None

    @classmethod
    def of(cls, max_running: Any = None, rate_limit: Any = None) -> Limits:
        return cls(check_max_running(max_running), parse_rate_limit(rate_limit))

    @property
    def empty(self) -> bool:
        return self.max_running is None and self.rate_limit is None


def check_scope(scope: Any, name: Any) -> tuple[str, str]:
    """A valid (scope, name) pair for ``scheduler_limits``."""
    if scope not in SCOPES:
        raise ValueError(f"limit scope must be one of {', '.join(SCOPES)}, got {scope!r}")
    if not isinstance(name, str):
        raise TypeError(f"{scope} name must be a string, got {name!r}")
    if not name:
        raise ValueError(f"{scope} name must not be empty")
    check_name(f"{scope} name", name)
    return scope, name


def limit_record(row: Mapping[str, Any]) -> dict[str, Any]:
    """One ``scheduler_limits`` listing row as the API and the CLI show it."""
    rate = (
        None
        if row["rate_count"] is None
        else str(RateLimit(row["rate_count"], float(row["rate_period"])))
    )
    return {
        "scope": row["scope"],
        "name": row["name"],
        "max_running": row["max_running"],
        "rate_limit": rate,
        "running": row["running"],
        "started_in_window": row["started_in_window"] if rate is not None else None,
    }


def key_record(row: Mapping[str, Any]) -> dict[str, Any]:
    """One concurrency key (store/keys.py's listing) as the API and the CLI show it."""
    rate = (
        None
        if row["rate_count"] is None
        else str(RateLimit(row["rate_count"], float(row["rate_period"])))
    )
    return {
        "key": row["key"],
        "running": row["running"],
        "waiting": row["waiting"],
        "max_running_per_key": row["max_running_per_key"],
        "rate_limit_per_key": rate,
        "started_in_window": row["started_in_window"] if rate is not None else None,
        "ordered": row["ordered"],
    }
