"""A Scheduler's settings: its constructor's arguments, checked (``args.py``),
with the defaults filled in, and the reliability timings derived from them.

One :class:`Settings` object is shared by the Scheduler and the parts that
read settings; each reads a value when it needs it. The Scheduler's public
attributes of the same names are views of it (:class:`Setting`): assigning
``scheduler.misfire_grace_time`` changes what the parts read, as it did when
they were the Scheduler's own attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Self, TypeVar, overload

import asyncpg

from ..config import PollingConfig, RetryPolicy, VacuumConfig
from ..enums import VacuumTrigger
from ..services.stall import default_stall_limit

T = TypeVar("T")


@dataclass(eq=False, slots=True)
class Timings:
    """The reliability timings: each the value given to the Scheduler, else
    derived from its class defaults (``HEARTBEAT_THRESHOLD``, ``LEASE_DURATION``)."""

    default_heartbeat_threshold: float
    default_lease_duration: float
    given_heartbeat_interval: float | None = None
    given_heartbeat_threshold: float | None = None
    given_lease_duration: float | None = None
    given_rescue_interval: float | None = None
    given_loop_stall_limit: float | None = None

    @property
    def heartbeat_threshold(self) -> float:
        return self.given_heartbeat_threshold or float(self.default_heartbeat_threshold)

    @property
    def lease_duration(self) -> float:
        return self.given_lease_duration or float(self.default_lease_duration)

    @property
    def heartbeat_interval(self) -> float:
        if self.given_heartbeat_interval:
            return self.given_heartbeat_interval
        return max(0.05, min(self.lease_duration, self.heartbeat_threshold) / 6)

    @property
    def rescue_interval(self) -> float:
        if self.given_rescue_interval:
            return self.given_rescue_interval
        return max(0.05, min(self.lease_duration, self.heartbeat_threshold) / 4)

    @property
    def loop_stall_limit(self) -> float:
        if self.given_loop_stall_limit is not None:
            return self.given_loop_stall_limit
        return default_stall_limit(self.lease_duration, self.heartbeat_threshold)


@dataclass(eq=False, slots=True)
class Settings:
    """Every setting of one Scheduler (see the module docstring)."""

    db_pool: asyncpg.Pool
    max_concurrent_jobs: int
    misfire_grace_time: int | None
    vacuum_config: VacuumConfig
    vacuum_enabled: bool
    batch_claim_limit: int
    polling_config: PollingConfig
    job_timeout: float | None
    retry_policy: RetryPolicy
    shutdown_grace_period: float
    max_rescues: int
    listener_health_interval: float
    run_periodic_jobs: bool
    start_due_jobs_locally: bool
    schema: str
    pgbouncer: bool
    listen_dsn: str | None
    #: LISTEN works: not behind a transaction pooler, or with a direct ``listen_dsn``.
    notifications: bool
    thread_pool_size: int
    process_pool_size: int
    loop_stall_warning: float | None
    #: The queues claimed from (None: all), and queue -> local concurrency.
    served_queues: list[str] | None
    queue_limits: dict[str, int] | None
    gc_freeze: bool
    statement_timeout: float
    timings: Timings

    def delete_on_complete(self) -> bool:
        """Completed rows are deleted by their completion (the "immediate" vacuum)."""
        policy = self.vacuum_config.completed
        return (
            self.vacuum_enabled
            and policy is not None
            and (policy.trigger is VacuumTrigger.IMMEDIATE)
        )


class Setting(Generic[T]):
    """A Scheduler attribute that reads and writes its ``settings`` object's
    attribute of the same name."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Self: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(obj.settings, self.name)  # type: ignore[attr-defined]

    def __set__(self, obj: object, value: T) -> None:
        setattr(obj.settings, self.name, value)  # type: ignore[attr-defined]
