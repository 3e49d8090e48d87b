"""The Scheduler: lifecycle and public API. It wires the parts and holds no SQL."""

from __future__ import annotations

import asyncio
import uuid
import weakref
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import asyncpg

from .codec import encode_task_data
from .config import UNSET, PollingConfig, RetryPolicy, VacuumConfig
from .enqueue import Enqueuer, check_conflict_resolution
from .enums import ConflictResolution, JobPriority, JobStatus
from .job_spec import JobSpec
from .log import get_logger
from .migrate import migrate
from .models import Job, TaskInventory
from .notify import Listener
from .periodic import PeriodicJobConfig
from .periodic_manager import PeriodicManager
from .reconnect import retry_on_disconnect
from .services import HeartbeatService, RescuerService, VacuumService
from .stats import QueueStats, collect_stats
from .store import CANCEL_CHANNEL, JOBS_CHANNEL, NewJob, Store
from .store_housekeeping import VacuumStore
from .tasks import TaskRegistry, default_registry
from .validation import check_int, check_seconds
from .worker import CANCELLED_REMOTELY, Worker

log = get_logger(__name__)

# Started Schedulers of this process: schedule() hands them due jobs directly.
_RUNNING: weakref.WeakSet[Scheduler] = weakref.WeakSet()
# Jobs due later than this (by this process's clock) are not tried locally.
_LOCAL_START_HORIZON = timedelta(seconds=1)
F = TypeVar("F", bound=Callable[..., Any])


class Scheduler:
    """Claims and runs due jobs from ``scheduled_jobs``; any number may share one database.

    The positional parameters and their defaults are those of pg-scheduler
    0.2.x. The keyword-only ones are additions; ``None`` means "derive from the
    class constants" for the reliability timings.
    """

    HEARTBEAT_THRESHOLD = 120
    LEASE_DURATION = 60
    WORKER_ID_LENGTH = 8

    def __init__(
        self,
        db_pool: asyncpg.Pool,
        max_concurrent_jobs: int = 25,
        misfire_grace_time: int | None = 300,
        vacuum_config: VacuumConfig | None = None,
        vacuum_enabled: bool = True,
        batch_claim_limit: int = 10,
        polling_config: PollingConfig | None = None,
        *,
        job_timeout: float | None = None,
        retry_policy: RetryPolicy | None = None,
        shutdown_grace_period: float = 30.0,
        heartbeat_interval: float | None = None,
        heartbeat_threshold: float | None = None,
        lease_duration: float | None = None,
        rescue_interval: float | None = None,
        max_rescues: int = 3,
        listener_health_interval: float = 5.0,
        tasks: TaskRegistry | None = None,
        run_periodic_jobs: bool = True,
        start_due_jobs_locally: bool = True,
    ) -> None:
        if not isinstance(db_pool, asyncpg.Pool):
            raise TypeError(f"db_pool must be an asyncpg.Pool, got {type(db_pool).__name__}")
        check_int("max_concurrent_jobs", max_concurrent_jobs, 1)
        check_int("misfire_grace_time", misfire_grace_time, 0, allow_none=True)
        check_int("batch_claim_limit", batch_claim_limit, 1)
        check_int("max_rescues", max_rescues, 0)
        check_seconds("job_timeout", job_timeout)
        check_seconds("shutdown_grace_period", shutdown_grace_period, allow_none=False)
        for name, value in (
            ("heartbeat_interval", heartbeat_interval),
            ("heartbeat_threshold", heartbeat_threshold),
            ("lease_duration", lease_duration),
            ("rescue_interval", rescue_interval),
            ("listener_health_interval", listener_health_interval),
        ):
            check_seconds(name, value)
        if vacuum_config is not None and not isinstance(vacuum_config, VacuumConfig):
            raise TypeError("vacuum_config must be a VacuumConfig")
        if polling_config is not None and not isinstance(polling_config, PollingConfig):
            raise TypeError("polling_config must be a PollingConfig")
        if retry_policy is not None and not isinstance(retry_policy, RetryPolicy):
            raise TypeError("retry_policy must be a RetryPolicy")

        self.db_pool = db_pool
        self.max_concurrent_jobs = max_concurrent_jobs
        self.misfire_grace_time = misfire_grace_time
        self.vacuum_enabled = vacuum_enabled
        self.vacuum_config = vacuum_config or VacuumConfig()
        self.batch_claim_limit = batch_claim_limit
        self.polling_config = polling_config or PollingConfig()
        self.job_timeout = job_timeout
        self.retry_policy = retry_policy or RetryPolicy()
        self.shutdown_grace_period = shutdown_grace_period
        self.max_rescues = max_rescues
        self._heartbeat_interval = heartbeat_interval
        self._heartbeat_threshold = heartbeat_threshold
        self._lease_duration = lease_duration
        self._rescue_interval = rescue_interval
        self.run_periodic_jobs = run_periodic_jobs
        self.start_due_jobs_locally = start_due_jobs_locally

        self.worker_id = uuid.uuid4().hex[: self.WORKER_ID_LENGTH]
        self.registry = TaskRegistry(parent=tasks or default_registry)
        self.store = Store(db_pool)
        self.enqueuer = Enqueuer(
            self.store, db_pool, self.registry, lambda: self.misfire_grace_time
        )
        self.vacuum_store = VacuumStore(db_pool)
        self.listener = Listener(
            db_pool,
            {JOBS_CHANNEL: self._on_jobs_notify, CANCEL_CHANNEL: self._on_cancel_notify},
            health_interval=listener_health_interval,
            on_reconnect=self._on_listener_reconnect,
        )
        self.worker = Worker(
            store=self.store,
            registry=self.registry,
            worker_id=self.worker_id,
            max_concurrent_jobs=max_concurrent_jobs,
            batch_claim_limit=batch_claim_limit,
            polling=self.polling_config,
            lease_seconds=lambda: self.lease_duration,
            job_timeout=job_timeout,
            retry_policy=self.retry_policy,
            delete_completed=self._delete_on_complete,
            notifications_live=lambda: self.listener.live,
        )
        self.job_semaphore = self.worker.semaphore
        self.heartbeat = HeartbeatService(
            self.store, self.worker, self.heartbeat_interval, lambda: self.lease_duration
        )
        self.rescuer = RescuerService(
            self.store,
            self.rescue_interval,
            lambda: self.heartbeat_threshold,
            max_rescues,
            self.registry.names,
        )
        self.vacuum = VacuumService(self.vacuum_store, self.vacuum_config, self.worker_id)
        self.periodic = PeriodicManager(self)
        self.registry.add_listener(lambda _name: self.worker.wake())

        self.is_running = False
        self.is_shutting_down = False
        self._claim_task: asyncio.Task[None] | None = None
        self._lifecycle = asyncio.Lock()

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

    @property
    def task_map(self) -> dict[str, Callable[..., Any]]:
        """Task name -> function for every task this scheduler can run."""
        return {name: self.registry.resolve(name) for name in self.registry}  # type: ignore[misc]

    def _delete_on_complete(self) -> bool:
        from .enums import VacuumTrigger

        policy = self.vacuum_config.completed
        return (
            self.vacuum_enabled
            and policy is not None
            and (policy.trigger is VacuumTrigger.IMMEDIATE)
        )

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Migrate, rescue orphans, then start claiming, heartbeats and housekeeping."""
        async with self._lifecycle:
            if self.is_running:
                return
            await self.initialize_db()
            await retry_on_disconnect(
                self.heartbeat.run_once, what="register worker", give_up_after=30
            )
            await self.recover_orphaned_jobs()
            self.listener.start()
            self.is_running = True
            self.is_shutting_down = False
            _RUNNING.add(self)
            self._claim_task = asyncio.create_task(
                self.listen_for_jobs(), name="pg_scheduler.claim"
            )
            self.heartbeat.start()
            self.rescuer.start()
            if self.vacuum_enabled:
                self.vacuum.start()
            if self.run_periodic_jobs:
                await self.periodic.start()
            # Give the listener a moment so the first wake-ups are not missed.
            try:
                await asyncio.wait_for(self.listener.connected.wait(), 5)
            except TimeoutError:
                log.warning("listener not connected yet; polling until it is")
            inventory = await self.load_task_functions()
            log.info(
                "scheduler started",
                worker_id=self.worker_id,
                max_concurrent=self.max_concurrent_jobs,
                tasks=len(inventory.registered),
            )

    async def shutdown(self, grace_period: float | None = None) -> None:
        """Stop claiming, let running jobs finish for ``grace_period`` seconds
        (default ``shutdown_grace_period``), cancel and hand back the rest, and
        return once everything this worker owned is released."""
        async with self._lifecycle:
            if not self.is_running:
                return
            self.is_shutting_down = True
            _RUNNING.discard(self)
            grace = self.shutdown_grace_period if grace_period is None else grace_period
            self.worker.stop_claiming()
            if self._claim_task is not None:
                await self._claim_task
            await self.periodic.stop()
            await self.worker.drain(grace)
            await self.heartbeat.stop()
            await self.rescuer.stop()
            await self.vacuum.stop()
            await self.listener.stop()
            try:
                await retry_on_disconnect(
                    lambda: self.store.unregister_worker(self.worker_id),
                    what="unregister worker",
                    give_up_after=5,
                )
            except Exception as exc:
                log.warning("could not unregister worker; it will age out", error=repr(exc))
            self.is_running = False
            self.is_shutting_down = False
            log.info("scheduler stopped", worker_id=self.worker_id)

    def request_immediate_shutdown(self) -> None:
        """Make a shutdown in progress (or the next one) skip the grace period:
        running jobs are cancelled and handed back at once."""
        self.worker.force_shutdown()

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.shutdown()

    async def initialize_db(self) -> None:
        """Apply pending migrations (serialized across processes by an advisory lock)."""
        await retry_on_disconnect(lambda: migrate(self.db_pool), what="migrate", give_up_after=30)

    async def listen_for_jobs(self) -> None:
        """The claim loop: runs until shutdown, woken by NOTIFY, due times and polling."""
        await self.worker.run()

    # -- notifications -----------------------------------------------------------

    def _on_jobs_notify(self, _payload: str) -> None:
        self.worker.wake()

    def _on_cancel_notify(self, job_id: str) -> None:
        if self.worker.cancel_local(job_id, CANCELLED_REMOTELY):
            log.info("cancelling running job", job_id=job_id, worker_id=self.worker_id)

    def _on_listener_reconnect(self) -> None:
        # Notifications sent while we were disconnected are lost: look now.
        self.worker.wake()

    # -- tasks --------------------------------------------------------------------

    def task(self, func: F | None = None, *, name: str | None = None) -> Any:
        """Decorator: register an async function this scheduler can run."""

        def decorate(f: F) -> F:
            return self.registry.register(f, name=name)

        return decorate(func) if func is not None else decorate

    def register_task(self, func: F, name: str | None = None) -> F:
        """Register ``func`` so this worker claims its jobs."""
        return self.registry.register(func, name=name)

    async def load_task_functions(self) -> TaskInventory:
        """What this scheduler can run, and due jobs whose task no live worker has."""
        names = self.registry.names()
        unknown = await self.rescuer.report_unknown_tasks()
        return TaskInventory(registered=names, unknown=unknown)

    # -- enqueue --------------------------------------------------------------------

    async def schedule(
        self,
        func: Callable[..., Any],
        *,
        execution_time: datetime,
        args: tuple = (),
        kwargs: dict[str, Any] | None = None,
        priority: JobPriority = JobPriority.NORMAL,
        max_retries: int = 0,
        job_id: str | None = None,
        conflict_resolution: ConflictResolution = ConflictResolution.RAISE,
        misfire_grace_time: int | Any | None = UNSET,
        timeout: float | None = None,
        retry_policy: RetryPolicy | None = None,
        connection: asyncpg.Connection | None = None,
    ) -> str:
        """Schedule ``func(*args, **kwargs)`` to run at ``execution_time``; returns the job id.

        With ``connection``, the row is written through the caller's connection
        (inside its transaction, if one is open): it exists, and wakes workers,
        only if that transaction commits.
        """
        check_conflict_resolution(conflict_resolution)
        row = self.enqueuer.build(
            func,
            execution_time,
            args,
            kwargs,
            priority,
            max_retries,
            job_id,
            misfire_grace_time,
            timeout,
            retry_policy,
        )
        # Due now, autocommitted, and a worker of this process has a free slot:
        # written already claimed by it and started at once. (Not inside the
        # caller's transaction: the job must not start before that commits.)
        local = self._local_worker(row) if connection is None and job_id is None else None
        written = None if local is None else await self.enqueuer.write_started(row, local)
        if not written:
            await self.enqueuer.write(
                [row],
                conflict_resolution,
                connection,
                user_ids=job_id is not None,
                retried=written is None and local is not None,
            )
        log.debug(
            "job scheduled",
            event_type="scheduled",
            job_id=row.job_id,
            task=row.task_name,
            execution_time=row.execution_time.isoformat(),
        )
        return row.job_id

    def _local_worker(self, row: NewJob) -> Worker | None:
        """A running worker of this process, on this pool, that runs ``row``'s task."""
        if row.execution_time > datetime.now(UTC) + _LOCAL_START_HORIZON:
            return None
        for scheduler in (self, *_RUNNING):
            if (
                scheduler in _RUNNING
                and scheduler.start_due_jobs_locally
                and scheduler.db_pool is self.db_pool
                and scheduler.registry.resolve(row.task_name) is not None
            ):
                return scheduler.worker
        return None

    async def schedule_bulk(
        self,
        jobs: list[JobSpec],
        *,
        conflict_resolution: ConflictResolution = ConflictResolution.IGNORE,
        batch_size: int = 1000,
        connection: asyncpg.Connection | None = None,
    ) -> list[str | None]:
        """Schedule many jobs; ids come back in input order, None where IGNORE skipped one.

        Every spec is validated before anything is written. Each batch of
        ``batch_size`` rows is one statement in its own transaction (or a
        savepoint inside the caller's transaction when ``connection`` is given).
        """
        ids, written = await self.enqueuer.bulk(jobs, conflict_resolution, batch_size, connection)
        # One line per call, not per job: a bulk call may carry a million rows.
        log.debug("jobs scheduled", event_type="scheduled", count=written, bulk=True)
        return ids

    async def schedule_job(
        self,
        job_name: str,
        execution_time: datetime,
        task_data: dict[str, Any],
        priority: JobPriority = JobPriority.NORMAL,
        max_retries: int = 0,
        job_id: str | None = None,
        conflict_resolution: ConflictResolution = ConflictResolution.RAISE,
        misfire_grace_time: int | None = None,
    ) -> str:
        """Low-level insert by name (0.2.x): ``task_data`` is ``{"args": [...], "kwargs": {...}}``.

        The job runs on a worker that registered a task named ``job_name``
        (its ``module:qualname``, or its bare ``__name__`` when unambiguous).
        ``misfire_grace_time=None`` means the scheduler default.
        """
        if not isinstance(job_name, str) or not job_name:
            raise ValueError("job_name must be a non-empty string")
        if not isinstance(task_data, dict):
            raise TypeError(f"task_data must be a dict, got {type(task_data).__name__}")
        unknown_keys = set(task_data) - {"args", "kwargs"}
        if unknown_keys:
            raise ValueError(f"task_data may hold only 'args' and 'kwargs', got {unknown_keys}")
        check_conflict_resolution(conflict_resolution)
        encoded = encode_task_data(
            task_data.get("args") or (), task_data.get("kwargs") or {}, job_name
        )
        row = self.enqueuer.row(
            job_name,
            job_name,
            execution_time,
            encoded,
            priority,
            max_retries,
            job_id,
            UNSET if misfire_grace_time is None else misfire_grace_time,
            None,
            None,
        )
        await self.enqueuer.write([row], conflict_resolution, None, user_ids=job_id is not None)
        log.debug("job scheduled", event_type="scheduled", job_id=row.job_id, task=job_name)
        return row.job_id

    # -- jobs ------------------------------------------------------------------------

    async def get_job(self, job_id: str) -> Job | None:
        """The stored job (status, attempts, timestamps, result, error), or None."""
        row = await self.store.get_job(job_id)
        return None if row is None else Job.from_record(row, self.retry_policy)

    async def cancel_job(self, job_id: str) -> bool:
        """Cancel a pending or running job. A running job's coroutine is cancelled on
        whichever worker runs it (NOTIFY, with the heartbeat as the fallback).
        Returns False if the job does not exist or has already finished."""
        cancelled = await retry_on_disconnect(
            lambda: self.store.cancel(job_id), what="cancel", give_up_after=10
        )
        if cancelled:
            self.worker.cancel_local(job_id, CANCELLED_REMOTELY)
            log.info("job cancelled", event_type="cancelled", job_id=job_id)
        return cancelled

    async def update_job_status(self, job_id: str, status: JobStatus | str) -> bool:
        """Force a job's status (an operator's tool; bypasses the lease guard)."""
        try:
            value = JobStatus(status)
        except ValueError:
            raise ValueError(
                f"unknown status {status!r}; one of {[s.value for s in JobStatus]}"
            ) from None
        return await self.store.set_status(job_id, value.value)

    async def send_heartbeat(self, job_id: str) -> bool:
        """Renew the lease of one job this worker holds; False if it holds no such job."""
        return await self.store.renew_lease(job_id, self.worker_id, self.lease_duration)

    async def monitor_heartbeats(self) -> None:
        """Run the heartbeat loop (started by :meth:`start`): renew this worker's
        row and all its leases each ``heartbeat_interval``."""
        await self.heartbeat.run_forever()

    async def recover_orphaned_jobs(self) -> int:
        """One rescue pass: jobs of dead workers go back to pending. Returns how many."""
        return await retry_on_disconnect(self.rescuer.run_once, what="rescue", give_up_after=30)

    async def periodic_orphan_recovery(self) -> None:
        """Run the rescue loop (started by :meth:`start`) every ``rescue_interval``."""
        await self.rescuer.run_forever()

    async def execute_job_with_concurrency_control(self, job_row: Any) -> None:
        """Run one claimed job row under the ``max_concurrent_jobs`` semaphore."""
        await self.worker.execute_job_with_concurrency_control(job_row)

    async def execute_job(self, job_row: Any) -> None:
        """Run one claimed job row and record its outcome under the lease guard."""
        await self.worker.execute_job(job_row)

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
        recent throughput and failure rate, and workers (see :mod:`pg_scheduler.stats`)."""
        return await collect_stats(
            self.db_pool,
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
