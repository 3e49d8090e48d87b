"""The Scheduler's global limits: how many jobs of a task or queue may run at once
anywhere, and how many may start per rolling window (docs: Queues, limits and dedupe keys).
A part of :class:`~pg_scheduler.Scheduler`; parsing is in ``pg_scheduler/limits.py``,
the SQL in ``store/limits.py``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..limits import Limits, RateLimit, check_scope, limit_record
from ..store.limits import LimitStore
from ..tasks import TaskRegistry


class GlobalLimits:
    """Set, remove and list the limits stored in ``scheduler_limits``."""

    def __init__(
        self, store: LimitStore, registry: TaskRegistry, changed: Callable[[], None]
    ) -> None:
        """``changed``: called after each write (the worker reloads its limits)."""
        self.store = store
        self.registry = registry
        self._changed = changed

    async def configure_task(
        self,
        name: str,
        *,
        max_running: int | None = None,
        rate_limit: str | RateLimit | None = None,
    ) -> None:
        """Set (both None: remove) the limits of task ``name``."""
        await self._set_limits("task", name, Limits.of(max_running, rate_limit))

    async def configure_queue(
        self,
        name: str,
        *,
        max_running: int | None = None,
        rate_limit: str | RateLimit | None = None,
    ) -> None:
        """Set (both None: remove) the limits of queue ``name``."""
        await self._set_limits("queue", name, Limits.of(max_running, rate_limit))

    async def list_limits(self) -> list[dict[str, Any]]:
        """Every limit, with what runs now and what started in its window."""
        return [limit_record(r) for r in await self.store.listing()]

    async def write_declared(self) -> None:
        """Write the limits declared with ``@task(max_running=..., rate_limit=...)``."""
        for name, limits in self.registry.all_limits().items():
            await self._set_limits("task", name, limits)

    async def _set_limits(self, scope: str, name: str, limits: Limits) -> None:
        check_scope(scope, name)
        if limits.empty:
            await self.store.clear(scope, name)
        else:
            rate = limits.rate_limit
            await self.store.set(
                scope,
                name,
                limits.max_running,
                None if rate is None else rate.count,
                None if rate is None else rate.period,
            )
        self._changed()
