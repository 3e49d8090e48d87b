"""Deletes finished rows per the VacuumConfig policies, in bounded batches.

Only one replica vacuums at a time: a session advisory lock, taken with
``pg_try_advisory_lock``, makes the others skip the round (and is released
by the server if the holder dies). Each batch is one short statement of at
most ``batch_size`` rows, locked with SKIP LOCKED, so the vacuum never waits
on, nor holds up, the claim or the completions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import asyncpg

from ..config import VacuumConfig, VacuumPolicy
from ..enums import VacuumTrigger
from ..log import get_logger
from ..store_housekeeping import VacuumStore
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
        started = time.perf_counter()
        async with self.store.pool.acquire() as conn:
            if not await self.store.try_lock(conn):
                log.debug(
                    "vacuum skipped: another replica is vacuuming",
                    event_type="vacuum_skipped",
                    worker_id=self.worker_id,
                )
                return None
            try:
                counts = {
                    status: await self._apply(conn, status, policy)
                    for status, policy in self.config.policies().items()
                }
                if self.config.track_metrics:
                    await self.store.record(conn, counts, self.worker_id)
            finally:
                await self.store.unlock(conn)
        log.info(
            "vacuum finished",
            event_type="vacuum",
            worker_id=self.worker_id,
            duration=round(time.perf_counter() - started, 4),
            **{f"deleted_{status}": n for status, n in counts.items()},
        )
        return counts

    async def _apply(self, conn: asyncpg.Connection, status: str, policy: VacuumPolicy) -> int:
        batch = self.config.batch_size
        if policy.trigger is VacuumTrigger.NEVER:
            return 0
        if policy.trigger is VacuumTrigger.COUNT_BASED:
            assert policy.keep_count is not None
            cutoffs = await self.store.keep_last_cutoffs(conn, status, policy.keep_count)
            if not cutoffs:
                return 0
            return await self._loop(
                lambda: self.store.delete_up_to_cutoffs(conn, status, batch, cutoffs)
            )
        seconds = 0.0 if policy.trigger is VacuumTrigger.IMMEDIATE else policy.days * 86400.0
        return await self._loop(lambda: self.store.delete_older_than(conn, status, batch, seconds))

    async def _loop(self, delete_batch: Callable[[], Awaitable[int]]) -> int:
        total = 0
        while True:
            deleted = await delete_batch()
            total += deleted
            if deleted < self.config.batch_size:
                return total
            # Let the claim loop and acks of this process run between batches.
            await asyncio.sleep(0)
