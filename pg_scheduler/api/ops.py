"""Operating a Scheduler: schema and grants, rescue, vacuum and statistics (its
global limits are ``limits.py``, its queues ``queues.py``). A part of
:class:`~pg_scheduler.Scheduler`; it holds no SQL."""

from __future__ import annotations

from typing import Any

import asyncpg

from ..batching import batch_options_of
from ..observe.stats import QueueStats, collect_stats
from ..services import RescuerService, VacuumService
from ..store import Store
from ..store.housekeeping import VacuumStore
from ..store.migrate import migrate
from ..store.names import Qualifier
from ..store.schema import SchemaStore
from ..support.reconnect import retry_on_disconnect
from ..support.validation import check_int
from ..tasks import TaskRegistry
from ..workflows.decorator import is_workflow
from .settings import Settings


def refused(missing: list[str], role: str | None = None) -> PermissionError:
    """The start-up's PermissionError: every grant the role lacks, and what to do."""
    who = "the database role" if role is None else f"the database role {role}"
    return PermissionError(
        f"{who} lacks {', '.join(missing)}; the worker did not start: grant "
        f"{'it' if len(missing) == 1 else 'them'} as the schema's owner "
        "(docs: Operations, schemas and privileges)"
    )


async def read_access(pool: Any, schema: str) -> tuple[list[str], str]:
    """What the role lacks to read the migration state of ``schema``, and its name."""
    async with pool.acquire() as conn:
        return await SchemaStore(conn, Qualifier(schema)).missing_access()


class Operations:
    """Everything an operator calls besides scheduling, limits, queues and
    awaiting jobs."""

    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        vacuum_store: VacuumStore,
        registry: TaskRegistry,
        rescuer: RescuerService,
        vacuum: VacuumService,
    ) -> None:
        self.settings = settings
        self.store = store
        self.vacuum_store = vacuum_store
        self.registry = registry
        self.rescuer = rescuer
        self.vacuum = vacuum

    # -- schema and grants -------------------------------------------------------

    async def initialize_db(self) -> None:
        """Apply pending migrations (serialized across processes by an advisory lock).

        PermissionError, naming the grants, if the role may not even read the
        migration state (USAGE on the schema, SELECT on its migrations table):
        checked when reading it is refused, so a start pays nothing for it."""
        settings = self.settings
        try:
            await retry_on_disconnect(
                lambda: migrate(settings.db_pool, settings.schema), what="migrate", give_up_after=30
            )
        except asyncpg.InsufficientPrivilegeError:
            missing, role = await read_access(settings.db_pool, settings.schema)
            if missing:
                raise refused(missing, role) from None
            raise

    def required_privileges(self) -> dict[str, str]:
        """Table -> the privileges this worker needs on it."""
        settings = self.settings
        vacuum = settings.vacuum_enabled
        needed = {
            "pg_scheduler_migrations": "SELECT",
            # DELETE only for the vacuum (and completed rows deleted at once).
            "scheduled_jobs": "SELECT,INSERT,UPDATE" + (",DELETE" if vacuum else ""),
            "scheduler_workers": "SELECT,INSERT,UPDATE,DELETE",
        }
        # Migration 0006: attempt history, and the event triggers' flags.
        needed["job_attempts"] = "SELECT,INSERT" + (",DELETE" if vacuum else "")
        needed["scheduler_event_flags"] = "SELECT"
        # Migration 0011: the limited claim locks and stamps limit rows; declared
        # limits are written at start.
        declared = bool(self.registry.all_limits())
        needed["scheduler_limits"] = "SELECT,UPDATE" + (",INSERT,DELETE" if declared else "")
        # Migration 0007: claims skip paused queues (granted to PUBLIC there).
        needed["scheduler_queues"] = "SELECT"
        # Migration 0017: the keyed claim stamps and prunes the starts of rate-limited keys.
        needed["scheduler_key_starts"] = "SELECT,INSERT,DELETE"
        # Migration 0018: the fair claim keeps its worker's recent starts per
        # key (and deletes decayed ones); weights per key are granted to PUBLIC.
        needed["scheduler_fair_share_starts"] = "SELECT,INSERT,UPDATE,DELETE"
        needed["scheduler_fair_share_weights"] = "SELECT"
        # Migration 0020: a worker with batch tasks records each batch (its
        # row names its jobs: SELECT for what the insert returns). The vacuum
        # drops old ones where it may (without DELETE it keeps them, said once).
        names = self.registry.names()
        if any(batch_options_of(self.registry.resolve(name)) for name in names):
            needed["scheduler_batches"] = "SELECT,INSERT"
        if settings.run_periodic_jobs:
            needed["periodic_jobs"] = "SELECT,INSERT,UPDATE"
        if vacuum and settings.vacuum_config.track_metrics:
            needed["vacuum_stats"] = "SELECT,INSERT,UPDATE"
        # Migration 0014: a worker that runs workflows writes their records.
        if any(is_workflow(self.registry.resolve(name)) for name in names):
            needed["workflow_steps"] = "SELECT,INSERT,UPDATE,DELETE"
            needed["workflow_signals"] = "SELECT,INSERT,UPDATE"
            # Migration 0016: a spawning workflow's count of children.
            needed["workflow_waits"] = "SELECT,INSERT,UPDATE"
        return needed

    async def check_privileges(self) -> None:
        """Raise PermissionError naming every grant this worker lacks."""
        missing = await retry_on_disconnect(
            lambda: self.store.missing_privileges(self.required_privileges()),
            what="check privileges",
            give_up_after=30,
        )
        if missing:
            raise refused(missing)

    async def recover_orphaned_jobs(self) -> int:
        """One rescue pass; how many jobs went back to pending."""
        return await retry_on_disconnect(self.rescuer.run_once, what="rescue", give_up_after=30)

    # -- vacuum ----------------------------------------------------------------------

    async def run_vacuum(self) -> dict[str, int]:
        """The vacuum policies applied now ({} while another replica vacuums)."""
        return await self.vacuum.run_once() or {}

    async def get_vacuum_stats(self, days: int = 7) -> list[dict[str, Any]]:
        """Per-day vacuum counts of the last ``days`` days."""
        check_int("days", days, 0)
        return [dict(r) for r in await self.vacuum_store.stats(days)]

    async def get_total_vacuum_stats(self) -> dict[str, Any]:
        """Vacuum totals across all days and workers."""
        return dict(await self.vacuum_store.totals())

    # -- statistics ------------------------------------------------------------------

    async def stats(self) -> QueueStats:
        """The queue's statistics (:func:`~pg_scheduler.observe.stats.collect_stats`)."""
        settings = self.settings
        return await collect_stats(
            settings.db_pool,
            schema=settings.schema,
            heartbeat_threshold=settings.timings.heartbeat_threshold,
            completed_deleted=settings.delete_on_complete(),
        )
