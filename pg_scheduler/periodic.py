"""@periodic: decorator-registered recurring jobs (interval form; cron is being built)."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo

from .enums import ConflictResolution, JobPriority
from .log import get_logger
from .tasks import default_registry, ensure_async, task_name_of

if TYPE_CHECKING:
    from .scheduler import Scheduler

log = get_logger(__name__)


@dataclass
class PeriodicJobConfig:
    func: Callable[..., Any]
    interval: timedelta | None = None
    cron: str | None = None
    timezone: str | ZoneInfo | None = None
    use_advisory_lock: bool = False
    priority: JobPriority = JobPriority.NORMAL
    max_retries: int = 0
    job_name: str | None = None
    dedup_key: str | None = None
    enabled: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.interval is None) == (self.cron is None):
            raise ValueError("@periodic needs exactly one of every= or cron=")
        if self.interval is not None and self.interval.total_seconds() <= 0:
            raise ValueError("every= must be a positive timedelta")
        if self.timezone is not None and self.cron is None:
            raise ValueError("timezone= can only be used with cron=")
        if self.job_name is None:
            self.job_name = f"periodic_{self.func.__name__}"
        if self.dedup_key is None:
            schedule = (
                f"interval:{self.interval.total_seconds()}"
                if self.interval
                else f"cron:{self.cron}:tz:{self.timezone or 'UTC'}"
            )
            material = f"{task_name_of(self.func)}:{schedule}"
            self.dedup_key = hashlib.sha256(material.encode()).hexdigest()[:16]


_registry: dict[str, PeriodicJobConfig] = {}


def periodic(
    every: timedelta | None = None,
    cron: str | None = None,
    timezone: str | ZoneInfo | None = None,
    use_advisory_lock: bool = False,
    priority: JobPriority = JobPriority.NORMAL,
    max_retries: int = 0,
    job_name: str | None = None,
    dedup_key: str | None = None,
    enabled: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Run the decorated async function on a schedule, once per window across replicas."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        ensure_async(func)
        config = PeriodicJobConfig(
            func,
            every,
            cron,
            timezone,
            use_advisory_lock,
            priority,
            max_retries,
            job_name,
            dedup_key,
            enabled,
        )
        default_registry.register(func)
        _registry[config.dedup_key] = config  # type: ignore[index]
        return func

    return decorate


class PeriodicManager:
    """Enqueues each window's run; the job id makes it one row across replicas."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._task: asyncio.Task[None] | None = None

    def get_jobs(self) -> dict[str, PeriodicJobConfig]:
        return dict(_registry)

    async def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _loop(self) -> None:
        while True:
            for config in list(_registry.values()):
                if config.enabled and config.interval is not None:
                    try:
                        await self._enqueue_next(config)
                    except Exception:
                        log.exception("periodic enqueue failed", dedup_key=config.dedup_key)
            await asyncio.sleep(1.0)

    async def _enqueue_next(self, config: PeriodicJobConfig) -> None:
        assert config.interval is not None
        step = config.interval.total_seconds()
        now = datetime.now(UTC).timestamp()
        window = int(now // step) + 1
        await self.scheduler.schedule(
            config.func,
            execution_time=datetime.fromtimestamp(window * step, UTC),
            job_id=f"periodic:{config.dedup_key}:{window}",
            priority=config.priority,
            max_retries=config.max_retries,
            conflict_resolution=ConflictResolution.IGNORE,
        )

    def set_enabled_soon(self, dedup_key: str, enabled: bool) -> bool:
        config = _registry.get(dedup_key)
        if config is None:
            return False
        config.enabled = enabled
        return True

    async def set_enabled(self, dedup_key: str, enabled: bool) -> bool:
        return self.set_enabled_soon(dedup_key, enabled)

    async def trigger(self, dedup_key: str) -> str | None:
        config = _registry.get(dedup_key)
        if config is None:
            return None
        return await self.scheduler.schedule(
            config.func,
            execution_time=datetime.now(UTC),
            priority=config.priority,
            max_retries=config.max_retries,
        )

    def status(self, dedup_key: str) -> dict[str, Any] | None:
        config = _registry.get(dedup_key)
        if config is None:
            return None
        return {
            "job_name": config.job_name,
            "enabled": config.enabled,
            "dedup_key": config.dedup_key,
            "priority": config.priority.value,
        }
