"""The Scheduler: lifecycle and public API. It wires the parts and holds no SQL."""

from __future__ import annotations

import asyncio
import contextvars
import math
import uuid
from collections.abc import Callable
from typing import Any, TypeVar, cast

import asyncpg

from .api.args import check_arguments
from .api.compat import SchedulerCompat
from .api.jobs import JobsAPI
from .api.limits import LimitsAPI
from .api.ops import SchedulerOps
from .api.queues import QueueOps, check_queues
from .api.results import ResultsAPI
from .config import PollingConfig, RetryPolicy, VacuumConfig
from .engine import BLOCKED_LOOP, CANCELLED_REMOTELY, Worker
from .engine import local as local_start
from .engine.sync import default_process_pool_size
from .enqueue.producer import Enqueuer
from .notify.events import EventHub
from .notify.listener import Listener
from .periodic.runtime import PeriodicManager
from .services import HeartbeatService, RescuerService, VacuumService, WorkflowTimerService
from .services.stall import StallGuard, default_stall_limit
from .services.watchdog import LoopWatchdog
from .store import (
    CANCEL_CHANNEL,
    DEFAULT_SCHEMA,
    JOBS_CHANNEL,
    QUEUES_CHANNEL,
    QueueStore,
    Store,
)
from .store.bounded import BoundedPool
from .store.housekeeping import VacuumStore
from .support.log import get_logger
from .support.process_gc import freeze_objects, thaw_objects
from .support.reconnect import retry_on_disconnect
from .support.validation import check_bool, check_int, check_seconds
from .tasks import TaskRegistry, default_registry
from .workflows import is_workflow
from .workflows.runner import WAKE_LOOKAHEAD, workflow_store
from .workflows.signals import send_signal

log = get_logger(__name__)

F = TypeVar("F", bound=Callable[..., Any])


# Start-up work that is not on the path to the first claim waits this long.
STARTUP_DEFER = 1.0
# Seconds any one of the scheduler's own statements may take (README: failure model).
DEFAULT_STATEMENT_TIMEOUT = 10.0


class Scheduler(JobsAPI, SchedulerOps, LimitsAPI, QueueOps, ResultsAPI, SchedulerCompat):
    """Claims and runs due jobs from ``scheduled_jobs``; any number may share one database.

    The positional parameters and their defaults are those of pg-scheduler
    0.2.x. The keyword-only ones are additions; ``None`` means "derive from the
    class constants" for the reliability timings.

    ``schema``: the PostgreSQL schema of its tables, locks and channels.
    ``pgbouncer``: the pool goes through pgbouncer in transaction mode (make it
    with ``statement_cache_size=0``); ``listen_dsn``: a direct connection for
    LISTEN, else such a worker polls. See the README's pgbouncer section.
    ``queues``: the queues it claims from: None (all), a list, or a mapping
    queue -> local concurrency within ``max_concurrent_jobs``.
    ``statement_timeout``: seconds any one of the scheduler's own statements
    (claim, complete, heartbeat, rescue, ...) may take before its connection
    is taken for lost: closed, and the pool's other connections replaced.
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
        schema: str = DEFAULT_SCHEMA,
        pgbouncer: bool = False,
        listen_dsn: str | None = None,
        thread_pool_size: int | None = None,
        process_pool_size: int | None = None,
        loop_stall_warning: float | None = 0.5,
        loop_stall_limit: float | None = None,
        queues: list[str] | dict[str, int] | None = None,
        gc_freeze: bool = True,
        statement_timeout: float = DEFAULT_STATEMENT_TIMEOUT,
    ) -> None:
        check_arguments(
            db_pool=db_pool,
            schema=schema,
            pgbouncer=pgbouncer,
            listen_dsn=listen_dsn,
            max_concurrent_jobs=max_concurrent_jobs,
            misfire_grace_time=misfire_grace_time,
            batch_claim_limit=batch_claim_limit,
            max_rescues=max_rescues,
            job_timeout=job_timeout,
            shutdown_grace_period=shutdown_grace_period,
            heartbeat_interval=heartbeat_interval,
            heartbeat_threshold=heartbeat_threshold,
            lease_duration=lease_duration,
            rescue_interval=rescue_interval,
            listener_health_interval=listener_health_interval,
            vacuum_config=vacuum_config,
            polling_config=polling_config,
            retry_policy=retry_policy,
        )
        check_int("thread_pool_size", thread_pool_size, 1, allow_none=True)
        check_int("process_pool_size", process_pool_size, 1, allow_none=True)
        check_seconds("loop_stall_warning", loop_stall_warning)
        check_seconds("loop_stall_limit", loop_stall_limit)
        check_bool("gc_freeze", gc_freeze)
        check_seconds("statement_timeout", statement_timeout, allow_none=False)
        if not math.isfinite(statement_timeout):
            raise ValueError(f"statement_timeout must be finite, got {statement_timeout!r}")
        # None: every queue; a list; or queue -> local concurrency.
        self.served_queues, self.queue_limits = check_queues(queues, max_concurrent_jobs)
        # One thread per slot by default: a thread job never waits for a thread.
        self.thread_pool_size = thread_pool_size or max_concurrent_jobs
        self.process_pool_size = process_pool_size or default_process_pool_size()
        self.loop_stall_warning = loop_stall_warning
        self._loop_stall_limit = loop_stall_limit
        # Freeze the objects alive at start() out of Python's full collections
        # while running (see process_gc); gc_freeze=False leaves gc alone.
        self.gc_freeze = gc_freeze
        self._froze = False

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
        self.schema = schema
        self.pgbouncer = pgbouncer
        self.listen_dsn = listen_dsn
        # Behind a transaction pooler LISTEN needs a direct connection; without
        # one, workers poll every min_interval instead of backing off.
        self.notifications = listen_dsn is not None or not pgbouncer
        if polling_config is None and not self.notifications:
            fast = self.polling_config.min_interval
            self.polling_config = PollingConfig(idle_start_interval=fast, max_interval=fast)

        self.worker_id = uuid.uuid4().hex[: self.WORKER_ID_LENGTH]
        self.registry = TaskRegistry(parent=tasks or default_registry)
        self.statement_timeout = statement_timeout
        # The scheduler's own statements go through this: each one bounded, a
        # connection that does not answer closed (store/bounded.py). The pool
        # itself is left as the application made it.
        bounded = cast(
            asyncpg.Pool,
            BoundedPool(db_pool, statement_timeout, session_settings=not pgbouncer),
        )
        self.store = Store(bounded, schema)
        self.queue_store = QueueStore(bounded, schema)
        self.enqueuer = Enqueuer(
            self.store, db_pool, self.registry, lambda: self.misfire_grace_time
        )
        self.vacuum_store = VacuumStore(bounded, schema)
        self.listener = Listener(
            db_pool,
            {
                self.store.qualify.channel(JOBS_CHANNEL): self._on_jobs_notify,
                self.store.qualify.channel(CANCEL_CHANNEL): self._on_cancel_notify,
                self.store.qualify.channel(QUEUES_CHANNEL): self._on_queues_notify,
            },
            health_interval=listener_health_interval,
            on_reconnect=self._on_listener_reconnect,
            dsn=listen_dsn,
            statement_timeout=statement_timeout,
        )
        self.events_hub = EventHub(self.listener, db_pool, schema, enabled=self.notifications)
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
            asynchronous_commit=not pgbouncer,
            thread_pool_size=self.thread_pool_size,
            process_pool_size=self.process_pool_size,
            served=self.served_queues,
            queue_limits=self.queue_limits,
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
        self.vacuum = VacuumService(
            self.vacuum_store, self.vacuum_config, self.worker_id, transaction_locks=pgbouncer
        )
        self.periodic = PeriodicManager(self)
        # Wakes parked workflows at their time; runs once a workflow is registered.
        self.workflow_timer = WorkflowTimerService(
            workflow_store(self.store), interval=WAKE_LOOKAHEAD / 2, lookahead=WAKE_LOOKAHEAD
        )
        self.watchdog = (
            None
            if loop_stall_warning is None
            else LoopWatchdog(loop_stall_warning, lambda: self.worker.running, self._stall_guard())
        )
        self.registry.add_listener(lambda _name: self.worker.wake())
        self.registry.add_listener(self._start_workflow_timer)

        self.is_running = False
        self.is_shutting_down = False
        self._claim_task: asyncio.Task[None] | None = None
        self._lifecycle = asyncio.Lock()

    @property
    def loop_stall_limit(self) -> float:
        """Seconds a job may block the event loop before it is failed (see the
        failure model); default ``max(60, min(lease_duration, heartbeat_threshold))``."""
        if self._loop_stall_limit is not None:
            return self._loop_stall_limit
        return default_stall_limit(self.lease_duration, self.heartbeat_threshold)

    def _stall_guard(self) -> StallGuard:
        executor = self.worker.executor
        return StallGuard(
            pool=self.db_pool,
            store=self.store,
            worker_id=self.worker_id,
            lease_seconds=lambda: self.lease_duration,
            interval=self.heartbeat_interval,
            limit=self.loop_stall_limit,
            retry_delay=executor.retry_delay,
            stop_blocker=lambda job_id: self.worker.cancel_local(job_id, BLOCKED_LOOP),
        )

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        """Migrate, register, then start claiming, heartbeats and housekeeping (the
        first rescue pass runs beside the first claim)."""
        async with self._lifecycle:
            if self.is_running:
                return
            # Start-up is on the path to the first job: each step is one
            # statement, independent ones run together (README: Benchmarks).
            warm = asyncio.create_task(self.worker.warm_up(), name="pg_scheduler.warm_up")
            listening_before = self.listener.started
            try:
                await self.initialize_db()
                # Before the worker registers: a missing grant fails start() here,
                # not halfway through with a worker row left behind.
                await self.check_privileges()
                await warm
                if self.notifications:
                    self.listener.start()  # connects while the worker registers and claims
                await retry_on_disconnect(
                    self.heartbeat.run_once, what="register worker", give_up_after=30
                )
                if self.registry.all_limits():
                    await retry_on_disconnect(
                        self._write_declared_limits, what="write task limits", give_up_after=30
                    )
            except BaseException:
                # Nothing started stays behind: the warm-up's connection, the listener.
                warm.cancel()
                await asyncio.gather(warm, return_exceptions=True)
                await self.worker.connection.release()
                if self.listener.started and not listening_before:
                    await self.listener.stop()
                raise
            self.is_running = True
            self.is_shutting_down = False
            if self.gc_freeze:  # before the first job runs
                freeze_objects()
                self._froze = True
            # Jobs run in a copy of this context, not their caller's (starts.py).
            self.worker.job_context = contextvars.copy_context()
            local_start.offer(self)
            self._claim_task = asyncio.create_task(self.worker.run(), name="pg_scheduler.claim")
            await asyncio.sleep(0)  # the first claim goes out before the services' rounds
            # The heartbeat just ran (registering); its loop starts an interval
            # from now. The rescue pass (and the report of due jobs whose task
            # no live worker has) runs beside the first claim, not before it.
            self.heartbeat.start(first_after=self.heartbeat.interval)
            if self.watchdog is not None:
                self.watchdog.start()
            self.rescuer.start()
            self._start_workflow_timer()
            if self.vacuum_enabled:
                # Its first round a moment after the first claim rather than with it.
                self.vacuum.start(first_after=min(STARTUP_DEFER, self.vacuum.interval))
            if self.run_periodic_jobs:
                await self.periodic.start()
            # Give the listener a moment so the first wake-ups are not missed.
            try:
                if self.notifications:
                    await asyncio.wait_for(self.listener.connected.wait(), 5)
            except TimeoutError:
                log.warning("listener not connected yet; polling until it is")
            log.info(
                "scheduler started",
                worker_id=self.worker_id,
                max_concurrent=self.max_concurrent_jobs,
                tasks=len(self.registry.names()),
            )

    async def shutdown(self, grace_period: float | None = None) -> None:
        """Stop claiming, let running jobs finish for ``grace_period`` seconds
        (default ``shutdown_grace_period``), cancel and hand back the rest, hand
        back every row held here that this process does not run, and return
        once everything this worker owned is released."""
        async with self._lifecycle:
            await self.events_hub.close()  # subscriptions, waiters, own listener
            if not self.is_running:
                return
            self.is_shutting_down = True
            local_start.withdraw(self)
            grace = self.shutdown_grace_period if grace_period is None else grace_period
            self.worker.stop_claiming()
            if self._claim_task is not None:
                await self._claim_task
            await self.periodic.stop()
            await self.worker.drain(grace)
            # Then every row still held here that nothing here runs goes back
            # (an in-process start whose caller was cancelled mid-insert, a claim
            # whose answer was lost), once the in-process inserts in flight answered.
            await local_start.settled(self.worker, timeout=10.0)
            await self.worker.hand_back_unowned()
            self.worker.executor.sync.close()
            await self.heartbeat.stop()
            if self.watchdog is not None:
                await self.watchdog.stop()
            await self.rescuer.stop()
            await self.workflow_timer.stop()
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
            if self._froze:
                self._froze = False
                thaw_objects()
            log.info("scheduler stopped", worker_id=self.worker_id)

    def _start_workflow_timer(self, task_name: str | None = None) -> None:
        # Once this scheduler runs and has a workflow to run (registered now or later).
        if not self.is_running or self.workflow_timer.running:
            return
        names = [task_name] if task_name is not None else self.registry.names()
        if any(is_workflow(self.registry.resolve(name)) for name in names):
            self.workflow_timer.start()

    async def signal(
        self,
        job_id: str,
        name: str,
        payload: Any = None,
        *,
        connection: asyncpg.Connection | None = None,
    ) -> None:
        """Send signal ``name`` (with a JSON ``payload``) to workflow ``job_id``:
        kept until the workflow waits for it (``ctx.wait_for_signal(name)``), or
        waking it at once if it waits already. JobNotFound for an unknown job,
        ValueError for a finished one (README: Durable workflows)."""
        await send_signal(workflow_store(self.store), job_id, name, payload, connection)

    def request_immediate_shutdown(self) -> None:
        """Make a shutdown in progress (or the next one) skip the grace period:
        running jobs are cancelled and handed back at once."""
        self.worker.force_shutdown()

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.shutdown()

    # -- notifications -----------------------------------------------------------

    def _on_cancel_notify(self, job_id: str) -> None:
        if self.worker.cancel_local(job_id, CANCELLED_REMOTELY):
            log.info("cancelling running job", job_id=job_id, worker_id=self.worker_id)

    def _on_listener_reconnect(self) -> None:
        # Notifications sent while we were disconnected are lost: look now.
        self.worker.wake()
