"""The wiring of a Scheduler: its parts, built from its settings.

Each part receives what it needs (the settings or a value of them, a store,
the worker or one of its parts, a callable), never the Scheduler. Values the
application may change on a running Scheduler (its ``misfire_grace_time``, the
vacuum settings) are read from the shared :class:`~.settings.Settings` when
used.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import cast

import asyncpg

from ..engine import BLOCKED_LOOP, Worker
from ..engine.channels import WorkerChannels
from ..engine.local import LocalHost
from ..enqueue.producer import Enqueuer
from ..notify.events import EventHub
from ..notify.listener import Listener
from ..periodic.runtime import PeriodicManager
from ..services import HeartbeatService, RescuerService, VacuumService, WorkflowTimerService
from ..services.stall import StallGuard
from ..services.table_vacuum import TableVacuumService
from ..services.watchdog import LoopWatchdog
from ..store import QueueStore, Store
from ..store.bounded import BoundedPool
from ..store.graph_ops import GraphOpsStore
from ..store.housekeeping import VacuumStore
from ..store.table_vacuum import TableVacuumStore
from ..tasks import TaskRegistry
from ..workflows.runner import WAKE_LOOKAHEAD, workflow_store
from .compat import Compat
from .lifecycle import Lifecycle
from .limits import GlobalLimits
from .ops import Operations
from .queues import Queues
from .settings import Settings
from .workflow_ops import WorkflowOps


@dataclass(eq=False, slots=True)
class Parts:
    """What one Scheduler is made of (see :func:`build`)."""

    store: Store
    queue_store: QueueStore
    vacuum_store: VacuumStore
    enqueuer: Enqueuer
    worker: Worker
    channels: WorkerChannels
    listener: Listener
    events_hub: EventHub
    heartbeat: HeartbeatService
    rescuer: RescuerService
    vacuum: VacuumService
    #: The workers' own VACUUM of the job table (None: autovacuum only).
    table_vacuum: TableVacuumService | None
    periodic: PeriodicManager
    watchdog: LoopWatchdog | None
    #: Wakes parked workflows at their time (runs once a workflow is registered).
    workflow_timer: WorkflowTimerService
    operations: Operations
    #: Whole workflows and graphs: cancel, retry, fork, list.
    workflow_ops: WorkflowOps
    limits: GlobalLimits
    queues: Queues
    compat: Compat


def build(settings: Settings, worker_id: str, registry: TaskRegistry) -> Parts:
    """The parts of the Scheduler ``worker_id`` with these settings and tasks."""
    pool = settings.db_pool
    timings = settings.timings
    schema = settings.schema
    # The scheduler's own statements go through this: each one bounded, a
    # connection that does not answer closed (store/bounded.py). The pool
    # itself is left as the application made it.
    bounded = cast(
        asyncpg.Pool,
        BoundedPool(pool, settings.statement_timeout, session_settings=not settings.pgbouncer),
    )
    store = Store(bounded, schema)
    queue_store = QueueStore(bounded, schema)
    vacuum_store = VacuumStore(bounded, schema)
    enqueuer = Enqueuer(store, pool, registry, lambda: settings.misfire_grace_time)
    listener: Listener
    worker = Worker(
        store=store,
        registry=registry,
        worker_id=worker_id,
        max_concurrent_jobs=settings.max_concurrent_jobs,
        batch_claim_limit=settings.batch_claim_limit,
        polling=settings.polling_config,
        lease_seconds=lambda: timings.lease_duration,
        job_timeout=settings.job_timeout,
        retry_policy=settings.retry_policy,
        delete_completed=settings.delete_on_complete,
        notifications_live=lambda: listener.live,
        asynchronous_commit=not settings.pgbouncer,
        thread_pool_size=settings.thread_pool_size,
        process_pool_size=settings.process_pool_size,
        served=settings.served_queues,
        queue_limits=settings.queue_limits,
        max_rescues=settings.max_rescues,
    )
    channels = WorkerChannels(worker)
    listener = Listener(
        pool,
        channels.handlers(store.qualify),
        health_interval=settings.listener_health_interval,
        on_reconnect=channels.on_reconnect,
        dsn=settings.listen_dsn,
        statement_timeout=settings.statement_timeout,
    )
    rescuer = RescuerService(
        store,
        timings.rescue_interval,
        lambda: timings.heartbeat_threshold,
        settings.max_rescues,
        registry.names,
    )
    vacuum = VacuumService(
        vacuum_store, settings.vacuum_config, worker_id, transaction_locks=settings.pgbouncer
    )
    every = settings.vacuum_config.table_vacuum_seconds
    table_vacuum = (
        None if every is None else TableVacuumService(TableVacuumStore(bounded, schema), every)
    )
    warning = settings.loop_stall_warning
    watchdog = (
        None
        if warning is None
        else LoopWatchdog(warning, lambda: worker.running, stall_guard(settings, store, worker))
    )
    registry.add_listener(lambda _name: worker.wake())
    return Parts(
        store=store,
        queue_store=queue_store,
        vacuum_store=vacuum_store,
        enqueuer=enqueuer,
        worker=worker,
        channels=channels,
        listener=listener,
        events_hub=EventHub(listener, pool, schema, enabled=settings.notifications),
        heartbeat=HeartbeatService(
            store, worker, timings.heartbeat_interval, lambda: timings.lease_duration
        ),
        rescuer=rescuer,
        vacuum=vacuum,
        table_vacuum=table_vacuum,
        periodic=PeriodicManager(
            pool, schema, enqueuer, lambda: settings.misfire_grace_time, worker.running
        ),
        watchdog=watchdog,
        workflow_timer=WorkflowTimerService(
            workflow_store(store), interval=WAKE_LOOKAHEAD / 2, lookahead=WAKE_LOOKAHEAD
        ),
        operations=Operations(
            settings=settings,
            store=store,
            vacuum_store=vacuum_store,
            registry=registry,
            rescuer=rescuer,
            vacuum=vacuum,
        ),
        workflow_ops=WorkflowOps(GraphOpsStore(bounded, schema), worker.cancel_local),
        limits=GlobalLimits(store.limits, registry, worker.limits.forget),
        queues=Queues(queue_store),
        compat=Compat(
            registry=registry, enqueuer=enqueuer, store=store, worker_id=worker_id, timings=timings
        ),
    )


def stall_guard(settings: Settings, store: Store, worker: Worker) -> StallGuard:
    """What the watchdog does during a stall of ``worker``'s loop (services/stall.py)."""
    timings = settings.timings
    return StallGuard(
        pool=settings.db_pool,
        store=store,
        worker_id=worker.worker_id,
        lease_seconds=lambda: timings.lease_duration,
        interval=timings.heartbeat_interval,
        limit=timings.loop_stall_limit,
        retry_delay=worker.executor.retry_delay,
        stop_blocker=lambda job_id: worker.cancel_local(job_id, BLOCKED_LOOP),
    )


def lifecycle(
    settings: Settings,
    parts: Parts,
    registry: TaskRegistry,
    worker_id: str,
    local: LocalHost,
    prepare: Callable[[], Awaitable[None]],
) -> Lifecycle:
    """The start and shutdown of the Scheduler made of ``parts`` (``local``: that
    Scheduler, as the in-process start knows it; ``prepare``: its migrations and
    grant check, run first by ``start()``)."""
    return Lifecycle(
        settings=settings,
        prepare=prepare,
        registry=registry,
        worker_id=worker_id,
        local=local,
        store=parts.store,
        worker=parts.worker,
        listener=parts.listener,
        events_hub=parts.events_hub,
        heartbeat=parts.heartbeat,
        rescuer=parts.rescuer,
        vacuum=parts.vacuum,
        table_vacuum=parts.table_vacuum,
        periodic=parts.periodic,
        watchdog=parts.watchdog,
        workflow_timer=parts.workflow_timer,
        limits=parts.limits,
    )
