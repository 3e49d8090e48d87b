"""Operating a Scheduler: timings, schema and grants, rescue, vacuum, statistics and
periodic-job control (its global limits are in ``limits.py``). Mixed into
:class:`~pg_scheduler.Scheduler`; it holds no SQL and uses only the Scheduler's parts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ..config import VacuumConfig
from ..enums import VacuumTrigger
from ..observe.stats import QueueStats, collect_stats
from ..periodic import PeriodicJobConfig
from ..store.migrate import migrate
from ..support.reconnect import retry_on_disconnect
from ..support.validation import check_int
from ..workflows.decorator import is_workflow

if TYPE_CHECKING:
    import asyncpg

    from ..engine import Worker
    from ..periodic.runtime import PeriodicManager
    from ..services import RescuerService, VacuumService
    from ..store import Store
    from ..store.housekeeping import VacuumStore
    from ..tasks import TaskRegistry


class SchedulerOps:
    """Everything an operator calls besides scheduling and awaiting jobs."""

    if TYPE_CHECKING:
        HEARTBEAT_THRESHOLD: ClassVar[int]
        LEASE_DURATION: ClassVar[int]
        db_pool: asyncpg.Pool
        schema: str
        store: Store
        worker: Worker
        registry: TaskRegistry
        vacuum_store: VacuumStore
        vacuum_config: VacuumConfig
        vacuum_enabled: bool
        run_periodic_jobs: bool
        rescuer: RescuerService
        vacuum: VacuumService
        periodic: PeriodicManager
        _heartbeat_interval: float | None
        _heartbeat_threshold: float | None
        _lease_duration: float | None
        _rescue_interval: float | None

    # -- timings (instance overrides, else derived from the class constants) --

    @property
    def heartbeat_threshold(self) -> float:
        return self._heartbeat_threshold or float(self.HEARTBEAT_THRESHOLD)

    @property
    def lease_duration(self) -> float:
        return self._lease_duration or float(self.LEASE_DURATION)

    @property
    def heartbeat_interval(self) -> float:
        if self._heartbeat_interval:
            return self._heartbeat_interval
        return max(0.05, min(self.lease_duration, self.heartbeat_threshold) / 6)

    @property
    def rescue_interval(self) -> float:
        if self._rescue_interval:
            return self._rescue_interval
        return max(0.05, min(self.lease_duration, self.heartbeat_threshold) / 4)

    def _delete_on_complete(self) -> bool:
        policy = self.vacuum_config.completed
        return (
            self.vacuum_enabled
            and policy is not None
            and (policy.trigger is VacuumTrigger.IMMEDIATE)
        )

    # -- schema and grants -------------------------------------------------------

    async def initialize_db(self) -> None:
        """Apply pending migrations (serialized across processes by an advisory lock)."""
        await retry_on_disconnect(
            lambda: migrate(self.db_pool, self.schema), what="migrate", give_up_after=30
        )

    def required_privileges(self) -> dict[str, str]:
        """Table -> the privileges this worker needs on it (README: schemas and privileges)."""
        needed = {
            "pg_scheduler_migrations": "SELECT",
            # DELETE only for the vacuum (and completed rows deleted at once).
            "scheduled_jobs": "SELECT,INSERT,UPDATE" + (",DELETE" if self.vacuum_enabled else ""),
            "scheduler_workers": "SELECT,INSERT,UPDATE,DELETE",
        }
        # Migration 0006: attempt history, and the event triggers' flags.
        needed["job_attempts"] = "SELECT,INSERT" + (",DELETE" if self.vacuum_enabled else "")
        needed["scheduler_event_flags"] = "SELECT"
        # Migration 0011: the limited claim locks and stamps limit rows; declared
        # limits are written at start.
        declared = bool(self.registry.all_limits())
        needed["scheduler_limits"] = "SELECT,UPDATE" + (",INSERT,DELETE" if declared else "")
        # Migration 0007: claims skip paused queues (granted to PUBLIC there).
        needed["scheduler_queues"] = "SELECT"
        if self.run_periodic_jobs:
            needed["periodic_jobs"] = "SELECT,INSERT,UPDATE"
        if self.vacuum_enabled and self.vacuum_config.track_metrics:
            needed["vacuum_stats"] = "SELECT,INSERT,UPDATE"
        # Migration 0014: a worker that runs workflows writes their records.
        if any(is_workflow(self.registry.resolve(name)) for name in self.registry.names()):
            needed["workflow_steps"] = "SELECT,INSERT,UPDATE,DELETE"
            needed["workflow_signals"] = "SELECT,INSERT,UPDATE"
        return needed

    async def check_privileges(self) -> None:
        """Raise PermissionError naming every grant this worker lacks."""
        missing = await retry_on_disconnect(
            lambda: self.store.missing_privileges(self.required_privileges()),
            what="check privileges",
            give_up_after=30,
        )
        if missing:
            raise PermissionError(
                f"the database role lacks {', '.join(missing)}; the worker did not start "
                "(README: schemas and privileges)"
            )

    async def recover_orphaned_jobs(self) -> int:
        """One rescue pass: jobs of dead workers go back to pending. Returns how many."""
        return await retry_on_disconnect(self.rescuer.run_once, what="rescue", give_up_after=30)

    # -- vacuum ----------------------------------------------------------------------

    async def run_vacuum(self) -> dict[str, int]:
        """Apply the vacuum policies now; deleted counts by status ({} if another
        replica is vacuuming at this moment)."""
        return await self.vacuum.run_once() or {}

    async def get_vacuum_stats(self, days: int = 7) -> list[dict[str, Any]]:
        """Per-day vacuum counts for the last ``days`` days (needs ``track_metrics=True``)."""
        check_int("days", days, 0)
        return [dict(r) for r in await self.vacuum_store.stats(days)]

    async def get_total_vacuum_stats(self) -> dict[str, Any]:
        """Totals across all days and workers (needs ``track_metrics=True``)."""
        return dict(await self.vacuum_store.totals())

    # -- statistics ------------------------------------------------------------------

    async def stats(self) -> QueueStats:
        """Counts by status and task, running jobs per worker, oldest due job's wait,
        recent throughput and failure rate, and workers (see :mod:`pg_scheduler.observe.stats`)."""
        return await collect_stats(
            self.db_pool,
            schema=self.schema,
            heartbeat_threshold=self.heartbeat_threshold,
            completed_deleted=self._delete_on_complete(),
        )

    # -- periodic jobs -------------------------------------------------------------

    def get_periodic_jobs(self) -> dict[str, PeriodicJobConfig]:
        """Every registered periodic job, by dedup key."""
        return self.periodic.get_jobs()

    def enable_periodic_job(self, dedup_key: str) -> bool:
        """Enable a periodic job here at once and in the database (and so on every replica)
        shortly after; False if no such job is registered."""
        return self.periodic.set_enabled_soon(dedup_key, True)

    def disable_periodic_job(self, dedup_key: str) -> bool:
        """Disable a periodic job here at once and on every replica shortly after."""
        return self.periodic.set_enabled_soon(dedup_key, False)

    async def set_periodic_job_enabled(self, dedup_key: str, enabled: bool) -> bool:
        """Awaitable form of enable/disable: returns once the change is stored."""
        return await self.periodic.set_enabled(dedup_key, enabled)

    async def trigger_periodic_job(self, dedup_key: str) -> str | None:
        """Run a periodic job once now, outside its windows; the new job id or None."""
        return await self.periodic.trigger(dedup_key)

    async def fetch_periodic_job_status(self, dedup_key: str) -> dict[str, Any] | None:
        """Awaitable form of :meth:`get_periodic_job_status`, read from the database now."""
        return await self.periodic.fetch_status(dedup_key)

    def get_periodic_job_status(self, dedup_key: str) -> dict[str, Any] | None:
        """Configuration and state (enabled, next and last run, last outcome) of one job."""
        return self.periodic.status(dedup_key)
