"""Starting and stopping a Scheduler: the order its parts start in (the first
claim as early as it can go out), and the order they stop in (nothing this
worker owned left held). A part of :class:`~pg_scheduler.Scheduler`."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable

from ..engine import Worker
from ..engine import local as local_start
from ..engine.local import LocalHost
from ..notify.events import EventHub
from ..notify.listener import Listener
from ..periodic.runtime import PeriodicManager
from ..services import (
    HeartbeatService,
    RescuerService,
    TableVacuumService,
    VacuumService,
    WorkflowTimerService,
)
from ..services.watchdog import LoopWatchdog
from ..store import Store
from ..support.log import get_logger
from ..support.process_gc import freeze_objects, thaw_objects
from ..support.reconnect import retry_on_disconnect
from ..tasks import TaskRegistry
from ..workflows.decorator import is_workflow
from .limits import GlobalLimits
from .settings import Settings

# The lines logged here keep the Scheduler's logger name.
log = get_logger("pg_scheduler.scheduler")

# Start-up work that is not on the path to the first claim waits this long.
STARTUP_DEFER = 1.0


class Lifecycle:
    """``start``, ``shutdown`` and what they leave to see (``is_running``)."""

    def __init__(
        self,
        *,
        settings: Settings,
        registry: TaskRegistry,
        worker_id: str,
        local: LocalHost,
        store: Store,
        worker: Worker,
        listener: Listener,
        events_hub: EventHub,
        heartbeat: HeartbeatService,
        rescuer: RescuerService,
        vacuum: VacuumService,
        table_vacuum: TableVacuumService | None,
        periodic: PeriodicManager,
        watchdog: LoopWatchdog | None,
        workflow_timer: WorkflowTimerService,
        limits: GlobalLimits,
        prepare: Callable[[], Awaitable[None]],
    ) -> None:
        """``local``: the Scheduler as the in-process start knows it (offered to
        this process's ``schedule()`` calls while running); ``prepare``: the
        migrations, then the grant check (the Scheduler's ``initialize_db`` and
        ``check_privileges``, which a 0.2.x subclass may override); the rest:
        what it starts and stops, in order."""
        self.prepare = prepare
        self.settings = settings
        self.registry = registry
        self.worker_id = worker_id
        self.local = local
        self.store = store
        self.worker = worker
        self.listener = listener
        self.events_hub = events_hub
        self.heartbeat = heartbeat
        self.rescuer = rescuer
        self.vacuum = vacuum
        self.table_vacuum = table_vacuum
        self.periodic = periodic
        self.watchdog = watchdog
        self.workflow_timer = workflow_timer
        self.limits = limits
        self.is_running = False
        self.is_shutting_down = False
        #: The claim loop's task while running.
        self.claim_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._froze = False
        #: The loop it runs on (a registration from another thread hands over to it).
        self._loop: asyncio.AbstractEventLoop | None = None
        registry.add_listener(self._start_workflow_timer)

    async def start(self) -> None:
        """Migrate, register, then start claiming, heartbeats and housekeeping."""
        settings, worker, listener = self.settings, self.worker, self.listener
        async with self._lock:
            if self.is_running:
                return
            # Start-up is on the path to the first job: each step is one
            # statement, independent ones run together (docs: Benchmarks).
            worker.prepare_start()
            warm = asyncio.create_task(worker.warm_up(), name="pg_scheduler.warm_up")
            listening_before = listener.started
            try:
                # Before the worker registers: a missing grant fails start() here,
                # not halfway through with a worker row left behind.
                await self.prepare()
                await warm
                if settings.notifications:
                    listener.start()  # connects while the worker registers and claims
                await retry_on_disconnect(
                    self.heartbeat.run_once, what="register worker", give_up_after=30
                )
                if self.registry.all_limits():
                    await retry_on_disconnect(
                        self.limits.write_declared, what="write task limits", give_up_after=30
                    )
            except BaseException:
                # Nothing started stays behind: the warm-up's connection, the listener.
                warm.cancel()
                await asyncio.gather(warm, return_exceptions=True)
                await worker.connection.release()
                if listener.started and not listening_before:
                    await listener.stop()
                raise
            self.is_running = True
            self.is_shutting_down = False
            self._loop = asyncio.get_running_loop()
            if settings.gc_freeze:  # before the first job runs
                freeze_objects()
                self._froze = True
            # Jobs run in a copy of this context, not their caller's (starts.py).
            worker.state.job_context = contextvars.copy_context()
            local_start.offer(self.local)
            self.claim_task = asyncio.create_task(worker.run(), name="pg_scheduler.claim")
            await asyncio.sleep(0)  # the first claim goes out before the services' rounds
            # The heartbeat just ran (registering); its loop starts an interval
            # from now. The rescue pass (and the report of due jobs whose task
            # no live worker has) runs beside the first claim, not before it.
            self.heartbeat.start(first_after=self.heartbeat.interval)
            if self.watchdog is not None:
                self.watchdog.start()
            self.rescuer.start()
            self._start_workflow_timer()
            if settings.vacuum_enabled:
                # Its first pass a moment after the first claim rather than with it.
                self.vacuum.start(first_after=min(STARTUP_DEFER, self.vacuum.interval))
            if self.table_vacuum is not None:
                self.table_vacuum.start(first_after=self.table_vacuum.interval)
            if settings.run_periodic_jobs:
                await self.periodic.start()
            # Give the listener a moment so the first wake-ups are not missed.
            try:
                if settings.notifications:
                    await asyncio.wait_for(listener.connected.wait(), 5)
            except TimeoutError:
                log.warning("listener not connected yet; polling until it is")
            log.info(
                "scheduler started",
                worker_id=self.worker_id,
                max_concurrent=settings.max_concurrent_jobs,
                tasks=len(self.registry.names()),
            )

    async def shutdown(self, grace_period: float | None = None) -> None:
        """Stop claiming, drain for ``grace_period`` (default: the setting), hand
        back what is left and every row held here that nothing here runs."""
        settings, worker = self.settings, self.worker
        async with self._lock:
            await self.events_hub.close()  # subscriptions, waiters, own listener
            if not self.is_running:
                return
            self.is_shutting_down = True
            local_start.withdraw(self.local)
            grace = settings.shutdown_grace_period if grace_period is None else grace_period
            worker.stop_claiming()
            if self.claim_task is not None:
                await self.claim_task
            await self.periodic.stop()
            await worker.drain(grace)
            # Then every row still held here that nothing here runs goes back
            # (an in-process start whose caller was cancelled mid-insert, a claim
            # whose answer was lost), once the in-process inserts in flight answered.
            await local_start.settled(worker, timeout=10.0)
            await worker.handback.hand_back_unowned()
            worker.executor.sync.close()
            await self.heartbeat.stop()
            if self.watchdog is not None:
                await self.watchdog.stop()
            await self.rescuer.stop()
            await self.workflow_timer.stop()
            await self.vacuum.stop()
            if self.table_vacuum is not None:
                await self.table_vacuum.stop()
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
        # Once running with a workflow to run (registered before start, or later).
        if not self.is_running or self.workflow_timer.running:
            return
        loop = self._loop
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if loop is not None and here is not loop:
            # A workflow registered from another thread (or before its loop
            # runs): the timer starts on the scheduler's own loop.
            if not loop.is_closed():
                loop.call_soon_threadsafe(self._start_workflow_timer, task_name)
            return
        names = [task_name] if task_name is not None else self.registry.names()
        if any(is_workflow(self.registry.resolve(name)) for name in names):
            self.workflow_timer.start()

    def request_immediate_shutdown(self) -> None:
        """Running jobs are cancelled and handed back at once."""
        self.worker.handback.force_shutdown()
