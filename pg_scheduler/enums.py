"""The shared vocabulary of the public API and the store: the enumerations, the
final statuses and the default queue's name, each declared once here.

It imports nothing from the package (``tests/unit/test_house.py``), so any layer may
import it.
"""

from __future__ import annotations

from enum import Enum, StrEnum

#: The queue of a job whose task and call name none: every other spelling of
#: "default" (stores, events, metrics, the CLI, SQL text) is built from this.
DEFAULT_QUEUE = "default"

_PRIORITY_DB_VALUES = {"critical": 1, "high": 3, "normal": 5, "low": 8}


class JobPriority(Enum):
    """Job priority. Lower database values run first: CRITICAL(1) < HIGH(3) < NORMAL(5) < LOW(8)."""

    CRITICAL = "critical"
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"

    @property
    def db_value(self) -> int:
        """The integer stored in ``scheduled_jobs.priority``."""
        return _PRIORITY_DB_VALUES[self.value]

    @classmethod
    def from_db_value(cls, db_value: int) -> JobPriority:
        """Map a stored integer back to a priority; unknown values read as NORMAL."""
        for member in cls:
            if member.db_value == db_value:
                return member
        return cls.NORMAL

    def __str__(self) -> str:
        return self.value

    def __repr__(self) -> str:
        return f"<JobPriority.{self.name}: {self.value} (db_value={self.db_value})>"


# Claim order: one index probe per level, most urgent first.
PRIORITY_DB_VALUES: list[int] = sorted(_PRIORITY_DB_VALUES.values())
# The same map keyed by member: a dict lookup per row when enqueueing.
PRIORITY_DB_VALUE_OF: dict[JobPriority, int] = {
    p: _PRIORITY_DB_VALUES[p.value] for p in JobPriority
}


class ConflictResolution(Enum):
    """What ``schedule`` does when ``job_id`` already exists."""

    RAISE = "raise"
    IGNORE = "ignore"
    REPLACE = "replace"


class JobStatus(StrEnum):
    """Every state a row of ``scheduled_jobs`` can be in."""

    PENDING = "pending"
    RUNNING = "running"
    #: A workflow parked: sleeping, waiting for a signal or for its children;
    #: or a job whose dependencies have not all completed (wait_kind
    #: "dependencies"). No worker holds it; what it waits for is on its row
    #: (Job.wait_kind).
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    @property
    def is_final(self) -> bool:
        return self in FINAL_STATUSES


#: The statuses a job ends in: the one declaration (states, the stores' SQL,
#: events, results, metrics and the CLI derive theirs from it).
FINAL_STATUSES = frozenset(
    {JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.EXPIRED}
)
#: The same as the text the database stores, in JobStatus order.
FINAL_STATUS_VALUES: tuple[str, ...] = tuple(s.value for s in JobStatus if s in FINAL_STATUSES)


class VacuumTrigger(Enum):
    """How a vacuum policy decides which finished rows to delete."""

    IMMEDIATE = "immediate"
    TIME_BASED = "time_based"
    COUNT_BASED = "count_based"
    NEVER = "never"
