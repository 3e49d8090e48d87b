"""Deletes finished rows per the VacuumConfig policies, in bounded batches.

Only one replica vacuums at a time: a session advisory lock, taken with
``pg_try_advisory_lock``, makes the others skip the round (and is released
by the server if the holder dies). Behind pgbouncer in transaction mode a
session lock would stay on whichever server connection took it, so there
(``transaction_locks``) each batch is its own transaction under
``pg_try_advisory_xact_lock``, and a round ends early when another replica
took the lock between two batches. Each batch is one short statement of at
most ``batch_size`` rows, locked with SKIP LOCKED, so the vacuum never waits
on, nor holds up, the claim or the completions.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from ..config import VacuumConfig, VacuumPolicy
from ..enums import VacuumTrigger
from ..store.housekeeping import VacuumStore
from ..support.log import get_logger
from .base import Service

log = get_logger(__name__)

T = TypeVar("T")


class _LockTaken(Exception):
    """Another replica holds the vacuum lock (transaction_locks mode)."""


class VacuumService(Service):
    name = "vacuum"

    def __init__(
        self,
        store: VacuumStore,
        config: VacuumConfig,
        worker_id: str,
        *,
        transaction_locks: bool = False,
    ) -> None:
        super().__init__(config.interval_minutes * 60)
        self.store = store
        self.transaction_locks = transaction_locks
        self.config = config
        self.worker_id = worker_id
        self._prune_throttles_allowed = True
        self._prune_batches_allowed = True

    async def run_once(self) -> dict[str, int] | None:
        """Apply every policy; None if another replica holds the vacuum lock."""
        started = time.perf_counter()
        counts: dict[str, int] = {}
        async with self.store.pool.acquire() as conn:
            if self.transaction_locks:
                try:
                    await self._step(conn, lambda: self._noop())
                except _LockTaken:
                    self._skipped()
                    return None
            elif not await self.store.try_lock(conn):
                self._skipped()
                return None
            try:
                for status, policy in self.config.policies().items():
                    counts[status] = 0
                    counts[status] = await self._apply(conn, status, policy, counts)
                await self._step(conn, lambda: self.store.prune_key_starts(conn))
                await self._prune_throttles(conn)
                await self._prune_batches(conn)
                if self.config.track_metrics:
                    await self._step(conn, lambda: self.store.record(conn, counts, self.worker_id))
            except _LockTaken:
                log.info("vacuum round ended early: another replica took the lock")
                for status in self.config.policies():
                    counts.setdefault(status, 0)
            finally:
                if not self.transaction_locks:
                    await self.store.unlock(conn)
        log.info(
            "vacuum finished",
            event_type="vacuum",
            worker_id=self.worker_id,
            duration=round(time.perf_counter() - started, 4),
            **{f"deleted_{status}": n for status, n in counts.items()},
        )
        return counts

    def _skipped(self) -> None:
        log.debug(
            "vacuum skipped: another replica is vacuuming",
            event_type="vacuum_skipped",
            worker_id=self.worker_id,
        )
        return None

    @staticmethod
    async def _noop() -> None:
        return None

    async def _prune_throttles(self, conn: asyncpg.Connection) -> None:
        """Drop ended throttle periods. A worker role without DELETE on
        scheduler_throttles (it was not among a worker's grants before) keeps
        them: one small row per key, reused by the key's next period."""
        if not self._prune_throttles_allowed:
            return
        try:
            await self._step(conn, lambda: self.store.prune_throttles(conn))
        except asyncpg.InsufficientPrivilegeError:
            self._prune_throttles_allowed = False
            log.info(
                "ended throttle periods are kept: the role lacks DELETE on scheduler_throttles"
            )

    async def _prune_batches(self, conn: asyncpg.Connection) -> None:
        """Drop the rows of batches older than every job left (migration 0020),
        in statements of at most ``batch_size`` rows. A role without DELETE on
        scheduler_batches keeps them (said once, at INFO)."""
        if not self._prune_batches_allowed:
            return
        batch = self.config.batch_size
        try:
            deleted = batch
            while deleted >= batch:
                deleted = await self._step(conn, lambda: self.store.prune_batches(conn, batch))
                await asyncio.sleep(0)  # the claim loop and completions run between
        except asyncpg.InsufficientPrivilegeError:
            self._prune_batches_allowed = False
            log.info("old batch records are kept: the role lacks DELETE on scheduler_batches")

    async def _step(self, conn: asyncpg.Connection, op: Callable[[], Awaitable[T]]) -> T:
        """Run one statement: under the session lock already held, or in its own
        transaction that takes the lock first."""
        if not self.transaction_locks:
            return await op()
        async with conn.transaction():
            if not await self.store.try_xact_lock(conn):
                raise _LockTaken
            return await op()

    async def _apply(
        self, conn: asyncpg.Connection, status: str, policy: VacuumPolicy, counts: dict[str, int]
    ) -> int:
        batch = self.config.batch_size
        if policy.trigger is VacuumTrigger.NEVER:
            return 0
        if policy.trigger is VacuumTrigger.COUNT_BASED:
            assert policy.keep_count is not None
            keep = policy.keep_count
            cutoffs = await self._step(
                conn, lambda: self.store.keep_last_cutoffs(conn, status, keep)
            )
            if not cutoffs:
                return 0
            return await self._loop(
                conn,
                status,
                counts,
                lambda: self.store.delete_up_to_cutoffs(conn, status, batch, cutoffs),
            )
        if policy.trigger is VacuumTrigger.IMMEDIATE:
            seconds = 0.0
        else:
            assert policy.days is not None  # TIME_BASED requires days
            seconds = policy.days * 86400.0
        return await self._loop(
            conn,
            status,
            counts,
            lambda: self.store.delete_older_than(conn, status, batch, seconds),
        )

    async def _loop(
        self,
        conn: asyncpg.Connection,
        status: str,
        counts: dict[str, int],
        delete_batch: Callable[[], Awaitable[int]],
    ) -> int:
        total = 0
        while True:
            deleted = await self._step(conn, delete_batch)
            total += deleted
            counts[status] = total
            if deleted < self.config.batch_size:
                return total
            # Let the claim loop and completions of this process run between batches.
            await asyncio.sleep(0)
