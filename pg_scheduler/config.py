"""Validated configuration objects.

They are pydantic dataclasses so that code written for pg-scheduler 0.2.x,
which built them positionally (``VacuumPolicy(VacuumTrigger.NEVER)``), keeps
working, while bad values are rejected at construction with a clear message.
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Mapping
from typing import Any

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.dataclasses import dataclass

from .enums import FINAL_STATUS_VALUES, VacuumTrigger


class _Unset:
    """Marks a parameter the caller did not pass (distinct from an explicit ``None``)."""

    _instance: _Unset | None = None

    def __new__(cls) -> _Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET: Any = _Unset()

_STRICT = ConfigDict(arbitrary_types_allowed=True, validate_assignment=True)


#: The longest ``base_delay`` and ``max_delay`` of a RetryPolicy: 365 days, in
#: seconds. With jitter a retry waits at most twice this; far inside what a
#: PostgreSQL timestamp holds, so a retry time can always be written.
MAX_RETRY_DELAY = 365 * 24 * 3600.0

_RETRY_BOUNDS = {
    "base_delay": (0.0, MAX_RETRY_DELAY),
    "factor": (1.0, math.inf),
    "max_delay": (0.0, MAX_RETRY_DELAY),
    "jitter": (0.0, 1.0),
}


@dataclass(config=_STRICT)
class RetryPolicy:
    """Exponential backoff between attempts of a failed job.

    The n-th retry waits ``min(max_delay, base_delay * factor ** (n - 1))``
    seconds, then a random ``±jitter`` fraction of that is added so that jobs
    failing together do not retry together. Every value is finite;
    ``base_delay`` and ``max_delay`` are at most :data:`MAX_RETRY_DELAY`
    (365 days), so no retry waits longer than twice that.
    """

    # Finite: a job's policy is stored as JSON, which has no NaN or infinity.
    base_delay: float = Field(default=60.0, ge=0, allow_inf_nan=False)
    factor: float = Field(default=2.0, ge=1.0, allow_inf_nan=False)
    max_delay: float = Field(default=300.0, ge=0, allow_inf_nan=False)
    jitter: float = Field(default=0.1, ge=0, le=1, allow_inf_nan=False)

    @field_validator("base_delay", "max_delay")
    @classmethod
    def _bounded_delay(cls, value: float, info: ValidationInfo) -> float:
        if value > MAX_RETRY_DELAY:
            raise ValueError(
                f"{info.field_name} must be at most {MAX_RETRY_DELAY:.0f} seconds (365 days),"
                f" got {value!r}"
            )
        return value

    @classmethod
    def from_stored(cls, stored: Mapping[str, Any]) -> RetryPolicy:
        """The policy a job row carries, as a worker applies it: a value outside
        today's bounds (written before they existed) is brought within them
        instead of failing the job's outcome; one that is not a number is left
        at its default."""
        values: dict[str, float] = {}
        for name, (low, high) in _RETRY_BOUNDS.items():
            value = stored.get(name)
            if isinstance(value, int | float) and not isinstance(value, bool) and value == value:
                values[name] = float(min(max(value, low), high, sys.float_info.max))
        return cls(**values)

    def delay_for(self, retry_number: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before retry number ``retry_number`` (1-based)."""
        delay = self.nominal_delay(retry_number)
        if self.jitter and delay:
            spread = delay * self.jitter
            delay += (rng or random).uniform(-spread, spread)
        return max(0.0, delay)

    def nominal_delay(self, retry_number: int) -> float:
        """The delay before jitter; what ``get_job`` shows as the planned schedule."""
        exponent = max(0, retry_number - 1)
        try:
            # Cap the exponent too: 2.0 ** 2000 overflows a float.
            raw = self.base_delay * self.factor ** min(exponent, 64)
        except OverflowError:  # a huge factor: past any max_delay
            raw = math.inf
        return min(self.max_delay, raw)


@dataclass(config=_STRICT)
class PollingConfig:
    """Polling is the safety net behind LISTEN/NOTIFY.

    When notifications work, an idle worker sleeps until the earliest due job
    or a notification, but never longer than ``max_interval``. When the
    listener is down, it polls with exponential backoff from
    ``idle_start_interval`` up to ``max_interval``.
    """

    min_interval: float = Field(default=0.05, ge=0)
    max_interval: float = Field(default=2.0, ge=0)
    backoff_multiplier: float = Field(default=1.5, ge=1.0)
    idle_start_interval: float = Field(default=0.5, ge=0)
    semaphore_full_interval: float = Field(default=1.0, ge=0)
    jitter: bool = True

    @model_validator(mode="after")
    def _check_bounds(self) -> PollingConfig:
        if self.max_interval < self.min_interval:
            raise ValueError("max_interval must be >= min_interval")
        return self


@dataclass(config=_STRICT)
class VacuumPolicy:
    """Which finished rows of one status the vacuum deletes."""

    trigger: VacuumTrigger
    days: float | None = Field(default=None, ge=0)
    keep_count: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _check_trigger_fields(self) -> VacuumPolicy:
        if self.trigger is VacuumTrigger.TIME_BASED and self.days is None:
            raise ValueError("a TIME_BASED vacuum policy needs days")
        if self.trigger is VacuumTrigger.COUNT_BASED and self.keep_count is None:
            raise ValueError("a COUNT_BASED vacuum policy needs keep_count")
        return self

    @classmethod
    def immediate(cls) -> VacuumPolicy:
        """Delete the row as soon as the job reaches this status."""
        return cls(VacuumTrigger.IMMEDIATE)

    @classmethod
    def after_days(cls, days: float) -> VacuumPolicy:
        """Delete rows that finished more than ``days`` days ago."""
        return cls(VacuumTrigger.TIME_BASED, days=days)

    @classmethod
    def keep_last(cls, count: int) -> VacuumPolicy:
        """Keep only the newest ``count`` rows of this status per job name."""
        return cls(VacuumTrigger.COUNT_BASED, keep_count=count)

    @classmethod
    def never(cls) -> VacuumPolicy:
        """Never delete rows of this status."""
        return cls(VacuumTrigger.NEVER)


@dataclass(config=_STRICT)
class VacuumConfig:
    """Vacuum policies per final status, and how often the vacuum runs."""

    completed: VacuumPolicy | None = None
    failed: VacuumPolicy | None = None
    cancelled: VacuumPolicy | None = None
    interval_minutes: float = Field(default=60, gt=0)
    track_metrics: bool = False
    expired: VacuumPolicy | None = None
    batch_size: int = Field(default=5000, gt=0)
    #: Seconds between the workers' looks at the job table's dead rows: past
    #: a thousand, one of them runs VACUUM on it (services/table_vacuum.py).
    #: None leaves the table to autovacuum alone.
    table_vacuum_seconds: float | None = Field(default=2.0, gt=0)

    def __post_init__(self) -> None:
        if self.completed is None:
            self.completed = VacuumPolicy.after_days(1)
        if self.failed is None:
            self.failed = VacuumPolicy.after_days(7)
        if self.cancelled is None:
            self.cancelled = VacuumPolicy.after_days(3)
        if self.expired is None:
            self.expired = VacuumPolicy.after_days(3)

    def policies(self) -> dict[str, VacuumPolicy]:
        """Status name -> policy, for every final status."""
        policies = {status: getattr(self, status) for status in FINAL_STATUS_VALUES}
        # __post_init__ filled every None with its default.
        return {status: p for status, p in policies.items() if p is not None}
