"""One Scheduler's side of periodic jobs (:class:`PeriodicManager`): the shared
enable/disable state, registering the declarations in ``periodic_jobs``, status,
manual triggers, the rows of runs, and running a window. The declarations
themselves (``@periodic``, :class:`~pg_scheduler.periodic.PeriodicJobConfig`) are
in ``registry.py``; the enqueue loop is ``enqueuer.py``.
"""

from __future__ import annotations

import asyncio
import copy
import math
import uuid
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import asyncpg

from ..config import UNSET
from ..enqueue.fields import JobFields, row_of
from ..store import NewJob
from ..store.periodic import MANUAL_ID_PREFIX, PeriodicStore
from ..support.codec import encode_json
from ..support.log import get_logger
from ..support.reconnect import Backoff, is_connection_error
from ..tasks import queue_of
from .enqueuer import PeriodicService
from .registry import (
    PeriodicJobConfig,
    add_runtime,
    registered_periodic_job,
    registered_periodic_jobs,
)
from .windows import CoalescePolicy, coalesced_reason

if TYPE_CHECKING:
    from ..engine import Worker
    from ..store import Store

# The logger name of before the split out of periodic.py: log filters keep matching.
log = get_logger("pg_scheduler.periodic")


def _no_default_grace() -> int | None:
    return None  # a window's grace is always resolved by grace_for()


class PeriodicHost(Protocol):
    """What periodic jobs use of a :class:`~pg_scheduler.Scheduler`."""

    @property
    def db_pool(self) -> asyncpg.Pool: ...

    @property
    def schema(self) -> str: ...

    @property
    def store(self) -> Store: ...

    @property
    def misfire_grace_time(self) -> int | None: ...

    @property
    def worker(self) -> Worker: ...


class PeriodicManager:
    """One Scheduler's side of periodic jobs: the enqueuer, the shared
    enable/disable state, status, manual triggers, and the runs themselves."""

    #: How often the enqueuer re-reads the shared state (enable/disable made by
    #: other replicas, status) when no window is due sooner.
    refresh_interval = 0.5
    #: Windows are enqueued this many seconds ahead, so that workers, which sleep
    #: until the earliest due row, start them on time.
    lookahead = 0.5

    def __init__(self, scheduler: PeriodicHost) -> None:
        self.scheduler = scheduler
        self.store = PeriodicStore(scheduler.db_pool, scheduler.schema)
        self.jobs_store = scheduler.store
        #: Last state read from ``periodic_jobs``, by dedup key.
        self.state: dict[str, dict[str, Any]] = {}
        self.state_read_at: datetime | None = None
        #: enable/disable calls not yet stored (the value here wins meanwhile).
        self._desired: dict[str, bool] = {}
        self._enable_lock = asyncio.Lock()
        self._flusher: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._service: PeriodicService | None = None
        add_runtime(self)

    # -- declarations --------------------------------------------------------

    def get_jobs(self) -> dict[str, PeriodicJobConfig]:
        """Registered jobs with ``enabled`` as this Scheduler currently sees it."""
        jobs = {}
        for key, config in registered_periodic_jobs().items():
            view = copy.copy(config)
            view.enabled = self.is_enabled(key)
            jobs[key] = view
        return jobs

    def is_enabled(self, dedup_key: str) -> bool:
        if dedup_key in self._desired:
            return self._desired[dedup_key]
        stored = self.state.get(dedup_key)
        if stored is not None:
            return bool(stored["enabled"])
        config = registered_periodic_job(dedup_key)
        return bool(config and config.enabled)

    def grace_for(self, config: PeriodicJobConfig) -> float | None:
        """The misfire grace time that applies to ``config``'s windows."""
        grace = config.misfire_grace_time
        if grace is UNSET:
            return self.scheduler.misfire_grace_time
        if grace is None or isinstance(grace, float | int):
            return grace
        # PeriodicJobConfig turns a timedelta into seconds when it is built.
        assert isinstance(grace, timedelta)
        return grace.total_seconds()

    # -- lifecycle -------------------------------------------------------------

    @property
    def pool(self) -> asyncpg.Pool:
        return self.scheduler.db_pool

    async def start(self) -> None:

        self._loop = asyncio.get_running_loop()
        if self._service is None:
            self._service = PeriodicService(self, self.refresh_interval)
        self._service.start()
        if self._desired:
            self._kick_flusher()

    async def stop(self) -> None:
        if self._service is not None:
            await self._service.stop()
        flusher = self._flusher
        if flusher is not None and not flusher.done():
            # Changes made just before shutdown still reach the database.
            done, _ = await asyncio.wait({flusher}, timeout=5.0)
            if not done:
                flusher.cancel()
                log.warning(
                    "periodic enable/disable not stored before shutdown", jobs=sorted(self._desired)
                )

    def wake(self) -> None:
        """Make the enqueuer look at the shared state now."""
        if self._service is not None:
            self._service.wake()

    # -- enable / disable --------------------------------------------------------

    def set_enabled_soon(self, dedup_key: str, enabled: bool) -> bool:
        """Apply at once here, store in the background (every replica follows
        within about ``refresh_interval``). False if no such job is registered."""
        if registered_periodic_job(dedup_key) is None:
            return False
        self._desired[dedup_key] = bool(enabled)
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        home = self._loop
        if home is not None and running is not home and not home.is_closed():
            home.call_soon_threadsafe(self._kick_flusher)  # called from another thread
        elif running is not None:
            self._kick_flusher()
        # else: not started yet; start() stores it.
        return True

    async def set_enabled(self, dedup_key: str, enabled: bool) -> bool:
        """Store the change and return once it is stored. Works for any job stored
        in the database, registered in this process or not."""
        if registered_periodic_job(dedup_key) is not None:
            self._desired[dedup_key] = bool(enabled)
        async with self._enable_lock:
            return await self._store_enabled(dedup_key, bool(enabled))

    def _kick_flusher(self) -> None:
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.get_running_loop().create_task(
                self._flush_enabled(), name="pg_scheduler.periodic.enable"
            )

    async def _flush_enabled(self) -> None:
        backoff = Backoff(initial=0.05, maximum=2.0)
        while self._desired:
            key, enabled = next(iter(self._desired.items()))
            try:
                async with self._enable_lock:
                    if self._desired.get(key) == enabled:
                        await self._store_enabled(key, enabled)
            except Exception as exc:
                level = log.warning if is_connection_error(exc) else log.exception
                level(
                    "storing periodic enable/disable failed; retrying",
                    dedup_key=key,
                    error=repr(exc),
                )
                await asyncio.sleep(backoff.next_delay())
                continue
            backoff.reset()

    async def _store_enabled(self, key: str, enabled: bool) -> bool:
        reason = "periodic job disabled"
        stored = await self.store.set_enabled(key, enabled, reason)
        config = registered_periodic_job(key)
        if not stored and config is not None:
            # Not in the database yet (this Scheduler never ran the enqueuer).
            await self.register([config])
            stored = await self.store.set_enabled(key, enabled, reason)
        if self._desired.get(key) == enabled:
            del self._desired[key]
        if stored:
            row = self.state.setdefault(key, {"dedup_key": key})
            if row.get("enabled") != enabled:
                row["next_run"] = None
            row["enabled"] = enabled
            log.info("periodic job enabled" if enabled else "periodic job disabled", dedup_key=key)
            self.wake()
        return stored

    async def register(self, configs: list[PeriodicJobConfig]) -> list[Any]:
        """Create or update the shared rows of ``configs``; returns the rows written."""
        written = await self.store.register(
            [c.dedup_key for c in configs],  # type: ignore[misc]
            [c.job_name for c in configs],  # type: ignore[misc]
            [c.task_name for c in configs],
            [c.describe() for c in configs],
            [c.enabled for c in configs],
        )
        for row in written:
            # Windows enqueued ahead under the old schedule, or before the code
            # disabled the job, must not run.
            if not row["enabled"]:
                await self.store.cancel_pending_windows(row["task_name"], "periodic job disabled")
            elif row["rescheduled"]:
                await self.store.cancel_pending_windows(
                    row["task_name"], "periodic job rescheduled"
                )
        return written

    # -- manual runs and status ------------------------------------------------

    def new_row(
        self,
        config: PeriodicJobConfig,
        job_id: str,
        execution_time: datetime,
        window: datetime | None,
    ) -> NewJob:
        """The ``scheduled_jobs`` row of one run of ``config``."""
        grace = self.grace_for(config)
        kwargs: dict[str, Any] = {"job_id": job_id}
        if window is not None:
            kwargs["window"] = window.isoformat()
        fields = JobFields(
            job_name=config.job_name,  # type: ignore[arg-type]
            task_name=config.task_name,
            execution_time=execution_time,
            task_data=encode_json({"args": [], "kwargs": kwargs}),
            priority=config.priority,
            max_retries=config.max_retries,
            job_id=job_id,
            misfire_grace_time=None if grace is None else math.ceil(grace),
            queue=queue_of(config.func, config.queue),
        )
        return row_of(fields, job_id, _no_default_grace)

    async def trigger(self, dedup_key: str) -> str | None:
        """Enqueue one run now, outside the windows (the cursor is untouched, and the
        run takes the advisory lock like any other). None if not registered here."""
        config = registered_periodic_job(dedup_key)
        if config is None:
            return None
        job_id = f"{MANUAL_ID_PREFIX}{dedup_key}:{uuid.uuid4().hex}"
        row = self.new_row(config, job_id, datetime.now(UTC), None)
        await self.jobs_store.insert(self.scheduler.db_pool, [row])
        log.info("periodic job triggered", dedup_key=dedup_key, job_id=job_id)
        return job_id

    def status(self, dedup_key: str) -> dict[str, Any] | None:
        """Configuration and shared state (as of the last refresh, at most about
        ``refresh_interval`` old while the enqueuer runs). None if not registered."""
        config = registered_periodic_job(dedup_key)
        if config is None:
            return None
        stored = self.state.get(dedup_key, {})
        return {
            "job_name": config.job_name,
            "dedup_key": dedup_key,
            "enabled": self.is_enabled(dedup_key),
            "schedule": config.describe(),
            "interval": None if config.interval is None else config.interval.total_seconds(),
            "cron": config.cron,
            "timezone": None if config.timezone is None else str(config.timezone),
            "priority": config.priority.value,
            "queue": queue_of(config.func, config.queue),
            "max_retries": config.max_retries,
            "use_advisory_lock": config.use_advisory_lock,
            "coalesce": str(config.coalesce),
            "misfire_grace_time": self.grace_for(config),
            "jitter": config.jitter,
            "function_name": config.func.__name__,
            "function_module": config.func.__module__,
            "next_run": stored.get("next_run"),
            "last_run": stored.get("last_run"),
            "last_window": stored.get("last_window"),
            "last_finished_at": stored.get("last_finished_at"),
            "last_outcome": stored.get("last_outcome"),
            "last_error": stored.get("last_error"),
            "last_job_id": stored.get("last_job_id"),
            "state_read_at": self.state_read_at,
        }

    async def fetch_status(self, dedup_key: str) -> dict[str, Any] | None:
        """:meth:`status`, read from the database now."""
        await self.refresh([dedup_key])
        return self.status(dedup_key)

    async def refresh(self, keys: list[str]) -> datetime:
        """Read the shared state of ``keys`` into :attr:`state`; returns the db clock."""
        db_now, rows = await self.store.load(keys)
        for key in keys:
            self.state.pop(key, None)
        for row in rows:
            self.state[row["dedup_key"]] = dict(row)
        self.state_read_at = db_now
        return db_now

    # -- running a window ------------------------------------------------------

    def runs_in_current_task(self, job_id: str) -> bool:
        """Whether this Scheduler's worker runs ``job_id`` in the current task."""
        entry = self.scheduler.worker.running.get(job_id)
        return entry is not None and entry.task is asyncio.current_task()

    async def _record(self, what: str, *args: Any) -> Any:
        try:
            return await getattr(self.store, what)(*args)
        except Exception as exc:  # the run matters more than its bookkeeping
            log.warning("periodic status not recorded", what=what, error=repr(exc))
            return None

    async def _skip(self, key: str | None, job_id: str, why: str) -> dict[str, str]:
        log.info("periodic run skipped", dedup_key=key, job_id=job_id, reason=why)
        await self._record("run_finished", key, job_id, "skipped", why)
        return {"skipped": why}

    async def _begin(
        self, config: PeriodicJobConfig, job_id: str, window: str | None
    ) -> str | None:
        """Record that a window's run started; why it is skipped (coalesced), or None."""
        key = config.dedup_key
        fire_time = None if window is None else datetime.fromisoformat(window)
        previous = await self._record("run_started", key, job_id, fire_time)
        entry = self.scheduler.worker.running.get(job_id)
        first_attempt = entry is None or entry.job.attempt == 1
        if fire_time is not None and previous is not None and first_attempt:
            # Retries are not coalesced: they follow a failure, not lateness.
            why = coalesced_reason(
                config.schedule,
                config.coalesce,  # type: ignore[arg-type]
                fire_time,
                previous["db_now"],
                previous["last_window"],
                previous["last_run"],
            )
            if (
                why is None
                and config.coalesce is CoalescePolicy.EARLIEST
                and await self.store.older_window_serving(config.task_name, fire_time)
            ):
                # Runs of overdue windows may record their start in any order.
                why = "coalesced: an earlier overdue window is running (coalesce='earliest')"
            return why
        return None

    async def run(
        self, config: PeriodicJobConfig, job_id: str, window: str | None, ctx: Any = None
    ) -> Any:
        """Run one window (or manual run) of ``config``; called by its runner task.
        ``ctx``: a workflow's context (its window is a workflow run: the start is
        a step, so a run resumed after a park does not start the window again)."""
        key = config.dedup_key
        if ctx is None:
            why = await self._begin(config, job_id, window)
        else:
            why = await ctx.step("periodic:start", self._begin, config, job_id, window)
        if why is not None:
            return await self._skip(key, job_id, why)
        try:
            if ctx is not None:
                result = await config.func(ctx)
            elif config.use_advisory_lock:
                async with self.scheduler.db_pool.acquire() as conn, conn.transaction():
                    if not await self.store.try_xact_lock(conn, config.lock_key):
                        why = "skipped: another run of this job holds its advisory lock"
                        return await self._skip(key, job_id, why)
                    result = await config.func()
            else:
                result = await config.func()
        except Exception as exc:
            await self._record(
                "run_finished", key, job_id, "failed", f"{type(exc).__name__}: {exc}"
            )
            raise
        await self._record("run_finished", key, job_id, "completed", None)
        return result
