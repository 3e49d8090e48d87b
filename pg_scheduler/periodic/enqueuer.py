"""The periodic enqueuer: every Scheduler runs one; there is no leader.

Each pass reads the shared state of the registered jobs (one statement), then
for each enabled job whose cursor ``next_run`` is due, locks its row
(``FOR UPDATE SKIP LOCKED``: a replica that finds it locked leaves it to the
holder), plans the due windows (:func:`~pg_scheduler.periodic.windows.plan_windows`),
inserts their rows and advances the cursor in the same transaction. It then
sleeps until the next window or ``refresh_interval``, whichever is sooner.
"""

from __future__ import annotations

import asyncio
import random
from datetime import datetime, timedelta
from typing import Any, Protocol

import asyncpg

from ..enqueue.producer import Enqueuer
from ..enums import ConflictResolution
from ..services.base import Service
from ..store import NewJob
from ..store.bounded import holding
from ..store.periodic import PeriodicStore
from ..support.log import get_logger
from ..support.reconnect import Backoff, is_connection_error
from .registry import PeriodicJobConfig, registered_periodic_jobs, window_job_id
from .windows import CoalescePolicy, coalesced_reason, plan_windows

log = get_logger("pg_scheduler.services.periodic")

# A replica that found a job's row locked looks again this soon.
_BUSY_RETRY = 0.05
BUSY: Any = object()


class EnqueuerHost(Protocol):
    """What the enqueuer needs of one Scheduler's periodic runtime: the pool, the
    periodic store, the producer's writer (``jobs``), the shared state it reads,
    the grace and enabled rules, the row builder. Not the Scheduler."""

    @property
    def pool(self) -> asyncpg.Pool: ...

    store: PeriodicStore
    jobs: Enqueuer
    state: dict[str, dict[str, Any]]
    lookahead: float

    async def refresh(self, keys: list[str]) -> datetime: ...

    async def register(self, configs: list[PeriodicJobConfig]) -> list[Any]: ...

    def is_enabled(self, dedup_key: str) -> bool: ...

    def grace_for(self, config: PeriodicJobConfig) -> float | None: ...

    def new_row(
        self,
        config: PeriodicJobConfig,
        job_id: str,
        execution_time: datetime,
        window: datetime | None,
    ) -> NewJob: ...


class PeriodicService(Service):
    name = "periodic"

    def __init__(self, manager: EnqueuerHost, interval: float) -> None:
        super().__init__(interval)
        self.manager = manager
        self.store = manager.store
        # What this replica last wrote to periodic_jobs, per key.
        self._registered: dict[str, tuple[Any, ...]] = {}
        self._mismatch_warned: set[str] = set()
        self._wake = asyncio.Event()

    def wake(self) -> None:
        self._wake.set()

    async def run_forever(self) -> None:
        errors = Backoff(initial=0.1, maximum=5.0)
        while not self._stop.is_set():
            self._wake.clear()
            try:
                delay = await self.run_once()
                errors.reset()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if is_connection_error(exc):
                    log.warning("periodic enqueuer: database unreachable", error=repr(exc))
                else:
                    log.exception("periodic enqueuer pass failed")
                delay = errors.next_delay()
            try:
                # A floor, so that a state this pass could not change never spins.
                await asyncio.wait_for(self._wake.wait(), min(max(delay, 0.005), self.interval))
            except TimeoutError:
                pass

    @staticmethod
    def _signature(config: PeriodicJobConfig) -> tuple[Any, ...]:
        return (config.job_name, config.task_name, config.describe(), config.enabled)

    async def run_once(self) -> float:
        """One pass; returns the seconds until the next one is needed."""
        configs = registered_periodic_jobs()
        if not configs:
            return self.interval
        manager = self.manager
        db_now = await manager.refresh(list(configs))
        stale = [
            c
            for key, c in configs.items()
            if key not in manager.state or self._registered.get(key) != self._signature(c)
        ]
        if stale:
            await manager.register(stale)
            for config in stale:
                self._registered[config.dedup_key] = self._signature(config)  # type: ignore[index]
            db_now = await manager.refresh([c.dedup_key for c in stale])  # type: ignore[misc]
        delay = self.interval
        for key, config in configs.items():
            row = manager.state.get(key)
            if row is None or not manager.is_enabled(key) or not self._owns_schedule(config, row):
                continue
            next_run = row["next_run"]
            ahead = manager.lookahead
            if next_run is not None and next_run > db_now + timedelta(seconds=ahead):
                delay = min(delay, (next_run - db_now).total_seconds() - ahead)
                continue
            result = await self.enqueue(config)
            if result is BUSY:  # another replica holds the row right now
                delay = min(delay, _BUSY_RETRY)
                continue
            row["next_run"] = result
            if result is not None:
                delay = min(delay, max(0.0, (result - db_now).total_seconds() - ahead))
        return max(0.0, delay)

    def _owns_schedule(self, config: PeriodicJobConfig, row: dict[str, Any]) -> bool:
        mine, stored = config.describe(), row.get("schedule")
        if stored is None or stored == mine:
            self._mismatch_warned.discard(config.dedup_key)  # type: ignore[arg-type]
            return True
        if config.dedup_key not in self._mismatch_warned:
            self._mismatch_warned.add(config.dedup_key)  # type: ignore[arg-type]
            log.warning(
                "periodic job has another schedule in the database (registered by a "
                "replica started later); this replica does not enqueue it",
                dedup_key=config.dedup_key,
                here=mine,
                stored=stored,
            )
        return False

    async def enqueue(self, config: PeriodicJobConfig) -> datetime | Any | None:
        """Enqueue the due windows of one job; returns the new cursor, or
        :data:`BUSY` if another replica holds the job's row."""
        manager = self.manager
        key = config.dedup_key
        assert key is not None
        async with holding(manager.pool) as conn, conn.transaction():
            row = await self.store.lock_for_enqueue(conn, key)
            if row is None:
                return BUSY
            if (
                not row["enabled"]
                or row["schedule"] != config.describe()
                or not manager.is_enabled(key)
            ):
                return row["next_run"]
            now: datetime = row["db_now"]
            grace = manager.grace_for(config)
            plan = plan_windows(
                config.schedule,
                row["next_run"],
                now,
                grace,
                config.coalesce,  # type: ignore[arg-type]
                lookahead=manager.lookahead,
            )
            run = plan.due
            cancel: list[str] = []
            if run and config.coalesce is not CoalescePolicy.ALL:
                pending = await self.store.pending_due_windows(conn, config.task_name)
                if grace is not None:
                    # Older ones expire when claimed; they are not candidates.
                    oldest = now - timedelta(seconds=grace)
                    pending = [p for p in pending if p["execution_time"] >= oldest]
                if config.coalesce is CoalescePolicy.LATEST:
                    cancel = [p["job_id"] for p in pending]
                elif pending:  # EARLIEST: the oldest pending window is the one to run
                    cancel = [p["job_id"] for p in pending[1:]]
                    run = []
                elif coalesced_reason(
                    config.schedule,
                    CoalescePolicy.EARLIEST,
                    run[0],
                    now,
                    row["last_window"],
                    row["last_run"],
                ):
                    run = []  # an older window started late: it serves this backlog
            if cancel:
                await self.store.cancel_jobs(
                    conn, cancel, f"coalesced: newer windows were due (coalesce={config.coalesce})"
                )
            run = run + plan.upcoming
            if run:
                rows = [
                    manager.new_row(config, window_job_id(key, f), self._jittered(config, f), f)
                    for f in run
                ]
                # Inside this transaction, with the cursor's advance: both or neither.
                await manager.jobs.insert(conn, rows, ConflictResolution.IGNORE)
            if plan.next_run != row["next_run"]:
                await self.store.advance(conn, key, plan.next_run)
        if plan.overdue is not None:
            log.info(
                "periodic job was behind; coalesced its overdue windows",
                dedup_key=key,
                overdue_from=plan.overdue[0].isoformat() if plan.overdue else None,
                overdue_to=plan.overdue[1].isoformat() if plan.overdue else None,
                running=[f.isoformat() for f in run if f <= now],
                cancelled=len(cancel),
                coalesce=str(config.coalesce),
                misfire_grace_time=grace,
            )
        return plan.next_run

    @staticmethod
    def _jittered(config: PeriodicJobConfig, fire_time: datetime) -> datetime:
        if not config.jitter:
            return fire_time
        room = float(config.jitter)  # type: ignore[arg-type]
        following = config.schedule.next_after(fire_time)
        if following is not None:
            # Well before the next window, which would supersede this run.
            room = min(room, 0.9 * (following - fire_time).total_seconds())
        return fire_time + timedelta(seconds=random.uniform(0, max(0.0, room)))
