"""The Scheduler's global limits: how many jobs of a task or queue may run at once
anywhere, and how many may start per rolling window (README: Queues and limits).
Mixed into :class:`~pg_scheduler.Scheduler`; parsing is in ``pg_scheduler/limits.py``,
the SQL in ``store/limits.py``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..limits import Limits, RateLimit, check_scope, limit_record

if TYPE_CHECKING:
    from ..engine import Worker
    from ..store import Store
    from ..tasks import TaskRegistry


class LimitsAPI:
    """``configure_task``, ``configure_queue``, ``list_limits``."""

    if TYPE_CHECKING:
        store: Store
        worker: Worker
        registry: TaskRegistry

    async def configure_task(
        self,
        name: str,
        *,
        max_running: int | None = None,
        rate_limit: str | RateLimit | None = None,
    ) -> None:
        """Set (or, with both None, remove) the global limits of task ``name``."""
        await self._set_limits("task", name, Limits.of(max_running, rate_limit))

    async def configure_queue(
        self,
        name: str,
        *,
        max_running: int | None = None,
        rate_limit: str | RateLimit | None = None,
    ) -> None:
        """Set (or, with both None, remove) the global limits of queue ``name``."""
        await self._set_limits("queue", name, Limits.of(max_running, rate_limit))

    async def list_limits(self) -> list[dict[str, Any]]:
        """Every limit, with what runs now and what started in its rate window."""
        return [limit_record(r) for r in await self.store.limits.listing()]

    async def _set_limits(self, scope: str, name: str, limits: Limits) -> None:
        check_scope(scope, name)
        if limits.empty:
            await self.store.limits.clear(scope, name)
        else:
            rate = limits.rate_limit
            await self.store.limits.set(
                scope,
                name,
                limits.max_running,
                None if rate is None else rate.count,
                None if rate is None else rate.period,
            )
        self.worker.limits.forget()

    async def _write_declared_limits(self) -> None:
        """Write the limits declared with ``@task(max_running=..., rate_limit=...)``."""
        for name, limits in self.registry.all_limits().items():
            await self._set_limits("task", name, limits)
