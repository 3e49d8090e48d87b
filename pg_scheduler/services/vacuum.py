"""Deletes finished rows per the VacuumConfig policies, in bounded batches.

Only one replica vacuums at a time: a session advisory lock, taken with
``pg_try_advisory_lock``, makes the others skip the round (and is released
by the server if the holder dies).
"""

from __future__ import annotations

from ..config import VacuumConfig
from ..enums import VacuumTrigger
from ..log import get_logger
from ..store import VacuumStore
from .base import Service

log = get_logger(__name__)


class VacuumService(Service):
    name = "vacuum"

    def __init__(self, store: VacuumStore, config: VacuumConfig, worker_id: str) -> None:
        super().__init__(config.interval_minutes * 60)
        self.store = store
        self.config = config
        self.worker_id = worker_id

    async def run_once(self) -> dict[str, int] | None:
        """Apply every policy; None if another replica holds the vacuum lock."""
        async with self.store.pool.acquire() as conn:
            if not await self.store.try_lock(conn):
                log.debug("vacuum skipped: another replica is vacuuming")
                return None
            try:
                counts = {
                    status: await self._apply(
                        conn, status, policy.trigger, policy.days, policy.keep_count
                    )
                    for status, policy in self.config.policies().items()
                }
                if self.config.track_metrics:
                    await self.store.record(conn, counts, self.worker_id)
            finally:
                await self.store.unlock(conn)
        if any(counts.values()):
            log.info("vacuum deleted finished jobs", worker_id=self.worker_id, **counts)
        return counts

    async def _apply(
        self, conn, status: str, trigger: VacuumTrigger, days: float | None, keep_count: int | None
    ) -> int:
        if trigger is VacuumTrigger.NEVER:
            return 0
        total = 0
        older_than = None if days is None else days * 86400.0
        while True:
            deleted = await self.store.delete_batch(
                conn, status, trigger.value, self.config.batch_size, older_than, keep_count
            )
            total += deleted
            if deleted < self.config.batch_size:
                return total
