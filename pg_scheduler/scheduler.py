"""The Scheduler: the public face. Each method is a call into the part that does
the work (``api/``); the parts are built from the settings in ``api/wiring.py``."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, TypeVar

import asyncpg

from .api.args import settings_of
from .api.fair import FairShare
from .api.jobs import Jobs
from .api.results import Results
from .api.settings import Setting
from .api.wiring import build, lifecycle
from .config import UNSET, PollingConfig, RetryPolicy, VacuumConfig
from .enqueue.fields import JobOptions
from .enums import ConflictResolution, JobPriority, JobStatus
from .job_spec import JobSpec
from .limits import RateLimit
from .models import Job, TaskInventory
from .notify.events import Event, Subscription
from .observe.stats import QueueStats
from .periodic import PeriodicJobConfig
from .store import DEFAULT_SCHEMA
from .store.bounded import DEFAULT_STATEMENT_TIMEOUT
from .tasks import TaskOptions, TaskRegistry, default_registry
from .workflows.runner import workflow_store
from .workflows.signals import Signal, send_signal, send_signals

F = TypeVar("F", bound=Callable[..., Any])


class Scheduler:
    """Claims and runs due jobs from ``scheduled_jobs``; any number may share one database.

    The positional parameters and their defaults are those of pg-scheduler
    0.2.x. The keyword-only ones are additions; ``None`` means "derive from the
    class constants" for the reliability timings.

    ``schema``: the PostgreSQL schema of its tables, locks and channels.
    ``pgbouncer``: the pool goes through pgbouncer in transaction mode (make it
    with ``statement_cache_size=0``); ``listen_dsn``: a direct connection for
    LISTEN, else such a worker polls. See docs/operations.md, pgbouncer.
    ``queues``: the queues it claims from: None (all), a list, or a mapping
    queue -> local concurrency within ``max_concurrent_jobs``.
    ``statement_timeout``: seconds any one of the scheduler's own statements
    (claim, complete, heartbeat, rescue, ...) may take before its connection
    is taken for lost: closed, and the pool's other connections replaced.
    """

    HEARTBEAT_THRESHOLD = 120
    LEASE_DURATION = 60
    WORKER_ID_LENGTH = 8

    # The settings, as given (defaults filled in). Each is a view of the
    # ``settings`` object the parts share: assigning one here changes theirs.
    db_pool = Setting[asyncpg.Pool]()
    max_concurrent_jobs = Setting[int]()
    misfire_grace_time = Setting[int | None]()
    vacuum_config = Setting[VacuumConfig]()
    vacuum_enabled = Setting[bool]()
    batch_claim_limit = Setting[int]()
    polling_config = Setting[PollingConfig]()
    job_timeout = Setting[float | None]()
    retry_policy = Setting[RetryPolicy]()
    shutdown_grace_period = Setting[float]()
    max_rescues = Setting[int]()
    run_periodic_jobs = Setting[bool]()
    start_due_jobs_locally = Setting[bool]()
    schema = Setting[str]()
    pgbouncer = Setting[bool]()
    listen_dsn = Setting[str | None]()
    #: False behind pgbouncer without ``listen_dsn``: no LISTEN, workers poll.
    notifications = Setting[bool]()
    statement_timeout = Setting[float]()
    served_queues = Setting[list[str] | None]()
    queue_limits = Setting[dict[str, int] | None]()
    thread_pool_size = Setting[int]()
    process_pool_size = Setting[int]()
    loop_stall_warning = Setting[float | None]()
    gc_freeze = Setting[bool]()

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
        # Checked first, all of them (api/args.py): bad input writes nothing.
        self.settings = settings = settings_of(
            db_pool=db_pool,
            max_concurrent_jobs=max_concurrent_jobs,
            misfire_grace_time=misfire_grace_time,
            vacuum_config=vacuum_config,
            vacuum_enabled=vacuum_enabled,
            batch_claim_limit=batch_claim_limit,
            polling_config=polling_config,
            job_timeout=job_timeout,
            retry_policy=retry_policy,
            shutdown_grace_period=shutdown_grace_period,
            heartbeat_interval=heartbeat_interval,
            heartbeat_threshold=heartbeat_threshold,
            lease_duration=lease_duration,
            rescue_interval=rescue_interval,
            max_rescues=max_rescues,
            listener_health_interval=listener_health_interval,
            run_periodic_jobs=run_periodic_jobs,
            start_due_jobs_locally=start_due_jobs_locally,
            schema=schema,
            pgbouncer=pgbouncer,
            listen_dsn=listen_dsn,
            thread_pool_size=thread_pool_size,
            process_pool_size=process_pool_size,
            loop_stall_warning=loop_stall_warning,
            loop_stall_limit=loop_stall_limit,
            queues=queues,
            gc_freeze=gc_freeze,
            statement_timeout=statement_timeout,
            default_heartbeat_threshold=self.HEARTBEAT_THRESHOLD,
            default_lease_duration=self.LEASE_DURATION,
        )
        self.worker_id = uuid.uuid4().hex[: self.WORKER_ID_LENGTH]
        # An empty TaskRegistry is falsy (it has a length): only None means the default.
        self.registry = TaskRegistry(parent=default_registry if tasks is None else tasks)
        parts = build(settings, self.worker_id, self.registry)
        self.store = parts.store
        self.queue_store = parts.queue_store
        self.vacuum_store = parts.vacuum_store
        self.enqueuer = parts.enqueuer
        self.listener = parts.listener
        self.events_hub = parts.events_hub
        self.worker = parts.worker
        self.job_semaphore = parts.worker.semaphore
        self.heartbeat = parts.heartbeat
        self.rescuer = parts.rescuer
        self.vacuum = parts.vacuum
        self.table_vacuum = parts.table_vacuum
        self.periodic = parts.periodic
        self.watchdog = parts.watchdog
        self._channels = parts.channels
        self._ops = parts.operations
        self._limits = parts.limits
        self._fair = FairShare(parts.store.fair)
        self._queues = parts.queues
        self._compat = parts.compat
        self._jobs = Jobs(
            local=self,
            settings=settings,
            store=parts.store,
            enqueuer=parts.enqueuer,
            registry=self.registry,
            rescuer=parts.rescuer,
            cancel_local=parts.worker.cancel_local,
        )
        self._results = Results(
            hub=parts.events_hub, settings=settings, get_job=self.get_job, schedule=self.schedule
        )
        self._workflow_ops = parts.workflow_ops
        self._lifecycle = lifecycle(
            settings, parts, self.registry, self.worker_id, local=self, prepare=self._prepare
        )

    # -- tasks and jobs: what an application calls most ------------------------------
    # The signatures list their keywords for users; the bodies hand them to the one
    # declaration (TaskOptions, JobOptions) and the one producer (enqueue/).
    # tests/unit/test_job_options.py holds the signatures to the declarations.

    def task(
        self,
        func: F | None = None,
        *,
        name: str | None = None,
        executor: str | None = None,
        dedupe_key: str | Callable[..., str] | None = None,
        dedupe_scope: str | None = None,
        max_running: int | None = None,
        rate_limit: str | RateLimit | None = None,
        queue: str | None = None,
        concurrency_key: str | Callable[..., str] | None = None,
        max_running_per_key: int | None = None,
        rate_limit_per_key: str | None = None,
        ordered: bool = False,
        debounce: timedelta | float | None = None,
        debounce_max_wait: timedelta | float | None = None,
        debounce_merge: Callable[[Any, Any], Any] | None = None,
        throttle: timedelta | float | None = None,
        batch_size: int | None = None,
        batch_timeout: timedelta | float | None = None,
        fair_share_key: str | Callable[..., str] | None = None,
        fair_share_weight: float | None = None,
    ) -> Any:
        """Decorator: register a function this scheduler can run (see :func:`pg_scheduler.task`)."""
        return self.registry.decorator(func, TaskOptions.of(locals()))

    def register_task(self, func: F, name: str | None = None) -> F:
        """Register ``func`` so this worker claims its jobs."""
        return self.registry.register(func, name=name)

    async def load_task_functions(self) -> TaskInventory:
        """What this scheduler can run, and due jobs whose task no live worker has."""
        return await self._jobs.load_task_functions()

    async def schedule(
        self,
        func: Callable[..., Any],
        *,
        execution_time: datetime | None = None,
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
        dedupe_key: str | None = None,
        dedupe_scope: str | None = None,
        queue: str | None = None,
        depends_on: list[str] | tuple[str, ...] | None = None,
        on_dependency_failure: str = "cancel",
        delay: timedelta | float | None = None,
        concurrency_key: str | None = None,
        max_running_per_key: int | None = None,
        rate_limit_per_key: str | None = None,
        ordered: bool = False,
        debounce: timedelta | float | None = None,
        debounce_max_wait: timedelta | float | None = None,
        throttle: timedelta | float | None = None,
        fair_share_key: str | None = None,
        fair_share_weight: float | None = None,
    ) -> str:
        """Schedule ``func(*args, **kwargs)`` to run at ``execution_time``; returns the job id.

        ``execution_time`` (naive: local time) or ``delay`` (a timedelta or
        seconds from now), not both; neither: due now (this process's UTC
        clock). Arguments ``func``'s signature cannot take raise TypeError here.

        ``queue``: the job's queue (default: the task's, ``@task(queue=...)``,
        else "default").

        With ``connection``, the row is written through the caller's connection
        (inside its transaction, if one is open): it exists, and wakes workers,
        only if that transaction commits.

        ``dedupe_key`` (or the task's): at most one job per key and
        ``dedupe_scope`` ("active", the default, or "pending"); on a held key
        ``conflict_resolution`` decides, and IGNORE/REPLACE return the id of
        the job that holds it. See docs/queues.md, Dedupe keys.

        ``depends_on``: ids of jobs that must complete first; the job waits
        (never claimed) until the last of them completes, then becomes due in
        that same transaction. ``on_dependency_failure``: when one of them
        ends without completing, "cancel" (the default), "run" or "wait".
        See docs/dependencies.md.

        ``debounce`` (with a dedupe key): a burst of calls with one key makes
        one job, due ``debounce`` after the burst's last call (at most
        ``debounce_max_wait`` after its first), with the last call's
        arguments (or the task's ``debounce_merge`` of them); returns that
        job's id. ``throttle``: at most one job per period and key, the
        period's first call's; the others write nothing and return its id.
        See docs/debounce-throttle.md.
        """
        options = JobOptions.of(locals())
        return await self._jobs.schedule(
            func, execution_time, args, kwargs, options, conflict_resolution, connection
        )

    async def schedule_bulk(
        self,
        jobs: list[JobSpec],
        *,
        conflict_resolution: ConflictResolution = ConflictResolution.IGNORE,
        batch_size: int = 1000,
        connection: asyncpg.Connection | None = None,
        positional: bool = False,
    ) -> list[str] | list[str | None]:
        """Schedule many jobs; returns their ids in input order.

        With IGNORE, ids that already existed are left out, as pg-scheduler
        0.2.3 does (a second identical call returns ``[]``). ``positional=True``
        returns one entry per spec instead, None where IGNORE skipped one.

        All or nothing: every spec is validated before anything is written,
        and all rows are written in one transaction (a savepoint inside the
        caller's transaction when ``connection`` is given). Caller-chosen ids
        go in statements of ``batch_size`` rows; generated ids in one COPY.

        A spec's ``depends_on`` may name job ids and other specs of the same
        call: the whole graph is checked (no cycle, no unknown id) and
        written at once; ``pg_scheduler.chain``/``group``/``chord`` build
        such lists. See docs/dependencies.md.
        """
        return await self._jobs.schedule_bulk(
            jobs, conflict_resolution, batch_size, connection, positional
        )

    async def get_job(self, job_id: str) -> Job | None:
        """The stored job (status, attempts, timestamps, result, error), or None."""
        return await self._jobs.get_job(job_id)

    async def cancel_job(self, job_id: str) -> bool:
        """Cancel a pending or running job. A running job's coroutine is cancelled on
        whichever worker runs it (NOTIFY, with the heartbeat as the fallback).
        Returns False if the job does not exist or has already finished."""
        return await self._jobs.cancel_job(job_id)

    # -- timings -----------------------------------------------------------------

    @property
    def heartbeat_threshold(self) -> float:
        """Seconds without a heartbeat after which a worker counts as dead."""
        return self.settings.timings.heartbeat_threshold

    @property
    def lease_duration(self) -> float:
        """Seconds a claimed job's lease lasts between renewals."""
        return self.settings.timings.lease_duration

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between heartbeats (default: a sixth of the shorter of the two above)."""
        return self.settings.timings.heartbeat_interval

    @property
    def rescue_interval(self) -> float:
        """Seconds between rescue passes (default: a quarter of the shorter of the two)."""
        return self.settings.timings.rescue_interval

    @property
    def loop_stall_limit(self) -> float:
        """Seconds a job may block the event loop before it is failed (see the
        failure model); default ``max(60, min(lease_duration, heartbeat_threshold))``."""
        return self.settings.timings.loop_stall_limit

    # -- lifecycle -------------------------------------------------------------

    @property
    def is_running(self) -> bool:
        """True between a completed :meth:`start` and the end of :meth:`shutdown`."""
        return self._lifecycle.is_running

    @property
    def is_shutting_down(self) -> bool:
        """True while :meth:`shutdown` runs."""
        return self._lifecycle.is_shutting_down

    async def start(self) -> None:
        """Migrate, register, then start claiming, heartbeats and housekeeping (the
        first rescue pass runs beside the first claim)."""
        await self._lifecycle.start()

    async def shutdown(self, grace_period: float | None = None) -> None:
        """Stop claiming, let running jobs finish for ``grace_period`` seconds
        (default ``shutdown_grace_period``), cancel and hand back the rest, hand
        back every row held here that this process does not run, and return
        once everything this worker owned is released."""
        await self._lifecycle.shutdown(grace_period)

    def request_immediate_shutdown(self) -> None:
        """Make a shutdown in progress (or the next one) skip the grace period:
        running jobs are cancelled and handed back at once."""
        self._lifecycle.request_immediate_shutdown()

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.shutdown()

    # -- schema, grants, rescue -------------------------------------------------

    async def _prepare(self) -> None:
        # Through the methods, so that a subclass's override runs as in 0.2.x.
        await self.initialize_db()
        await self.check_privileges()

    async def initialize_db(self) -> None:
        """Apply pending migrations (serialized across processes by an advisory lock)."""
        await self._ops.initialize_db()

    def required_privileges(self) -> dict[str, str]:
        """Table -> the privileges this worker needs on it (docs/operations.md: privileges)."""
        return self._ops.required_privileges()

    async def check_privileges(self) -> None:
        """Raise PermissionError naming every grant this worker lacks."""
        await self._ops.check_privileges()

    async def recover_orphaned_jobs(self) -> int:
        """One rescue pass: jobs of dead workers go back to pending. Returns how many."""
        return await self._ops.recover_orphaned_jobs()

    # -- vacuum and statistics -----------------------------------------------------

    async def run_vacuum(self) -> dict[str, int]:
        """Apply the vacuum policies now; deleted counts by status ({} if another
        replica is vacuuming at this moment)."""
        return await self._ops.run_vacuum()

    async def get_vacuum_stats(self, days: int = 7) -> list[dict[str, Any]]:
        """Per-day vacuum counts for the last ``days`` days (needs ``track_metrics=True``)."""
        return await self._ops.get_vacuum_stats(days)

    async def get_total_vacuum_stats(self) -> dict[str, Any]:
        """Totals across all days and workers (needs ``track_metrics=True``)."""
        return await self._ops.get_total_vacuum_stats()

    async def stats(self) -> QueueStats:
        """Counts by status and task, running jobs per worker, oldest due job's wait,
        recent throughput and failure rate, and workers (see :mod:`pg_scheduler.observe.stats`)."""
        return await self._ops.stats()

    # -- global limits -------------------------------------------------------------

    async def configure_task(
        self,
        name: str,
        *,
        max_running: int | None = None,
        rate_limit: str | RateLimit | None = None,
    ) -> None:
        """Set (or, with both None, remove) the global limits of task ``name``."""
        await self._limits.configure_task(name, max_running=max_running, rate_limit=rate_limit)

    async def configure_queue(
        self,
        name: str,
        *,
        max_running: int | None = None,
        rate_limit: str | RateLimit | None = None,
    ) -> None:
        """Set (or, with both None, remove) the global limits of queue ``name``."""
        await self._limits.configure_queue(name, max_running=max_running, rate_limit=rate_limit)

    async def list_limits(self) -> list[dict[str, Any]]:
        """Every limit, with what runs now and what started in its rate window."""
        return await self._limits.list_limits()

    # -- fair share ----------------------------------------------------------------

    async def set_fair_share_weight(self, key: str, weight: float | None) -> None:
        """Set key ``key``'s fair share weight (None: remove it); it wins over
        the weight its jobs carry (docs: Fair share between tenants)."""
        await self._fair.set_weight(key, weight)

    async def fair_share(self, limit: int = 10) -> list[dict[str, Any]]:
        """The busiest fair share keys: waiting, due, running, recent starts, weight."""
        return await self._fair.busiest(limit)

    # -- queues --------------------------------------------------------------------

    async def pause_queue(self, name: str) -> None:
        """Stop every worker claiming from ``name``, at once: the claim statement
        skips paused queues. Running jobs finish; scheduling into it still works."""
        await self._queues.pause_queue(name)

    async def resume_queue(self, name: str) -> None:
        """Let workers claim from ``name`` again (they are woken at once)."""
        await self._queues.resume_queue(name)

    async def list_queues(self) -> list[dict[str, Any]]:
        """Every known queue (configured, or with pending or running jobs):
        ``name``, ``paused``, ``pending``, ``due``, ``running``."""
        return await self._queues.list_queues()

    # -- results and events ------------------------------------------------------

    async def wait_for(self, job_id: str, timeout: float | None = None) -> Job:
        """The job once final (completed, failed, cancelled, expired); JobNotFound
        for an unknown id, TimeoutError after ``timeout`` seconds."""
        return await self._results.wait_for(job_id, timeout)

    async def result(self, job_id: str, timeout: float | None = None) -> Any:
        """The job's result, or JobFailed / JobCancelled / JobExpired."""
        return await self._results.result(job_id, timeout)

    async def run(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Schedule ``func(*args, **kwargs)`` now and return its result."""
        return await self._results.run(func, *args, **kwargs)

    def events(
        self,
        kinds: Any = None,
        *,
        task: str | None = None,
        queue: str | None = None,
        maxsize: int = 10_000,
    ) -> Subscription:
        """Subscribe to events from every process; see events.Subscription."""
        return self._results.events(kinds, task=task, queue=queue, maxsize=maxsize)

    def on(self, kind: Any, callback: Callable[[Event], Any], **filters: Any) -> Subscription:
        """Call ``callback(event)`` for each event of ``kind``; see events.EventHub.on."""
        return self._results.on(kind, callback, **filters)

    # -- workflows (workflows/) --------------------------------------------------------

    async def signal(
        self,
        job_id: str,
        name: str,
        payload: Any = None,
        *,
        connection: asyncpg.Connection | None = None,
        idempotency_key: str | None = None,
    ) -> bool:
        """Send signal ``name`` (with a JSON ``payload``) to workflow ``job_id``:
        kept until the workflow waits for it (``ctx.wait_for_signal(name)``), or
        waking it at once if it waits already. True when stored; False when
        the job already has a signal of ``idempotency_key`` (a repeat: nothing
        written). JobNotFound for an unknown job, ValueError for a finished one
        (docs/workflows.md)."""
        return await send_signal(
            workflow_store(self.store), job_id, name, payload, connection, idempotency_key
        )

    async def signal_bulk(
        self,
        signals: Iterable[Signal],
        *,
        connection: asyncpg.Connection | None = None,
    ) -> int:
        """Send many signals, each ``(job_id, name)``, ``(job_id, name, payload)``
        or ``(job_id, name, payload, idempotency_key)``, in one transaction: all
        or none (JobNotFound, ValueError for a finished job, TypeError/ValueError
        for a bad item; nothing written); repeats of a key are left out.
        Returns how many workflows were waiting for theirs and were woken."""
        return await send_signals(workflow_store(self.store), signals, connection)

    async def cancel_workflow(self, job_id: str) -> list[str]:
        """Cancel ``job_id`` and every unfinished job of its graph (joined by
        ``depends_on``, either way); a code-first workflow's children go with
        it. The ids cancelled (docs/workflow-operations.md)."""
        return await self._workflow_ops.cancel_workflow(job_id)

    async def retry_workflow(self, job_id: str) -> list[str]:
        """Run a failed job again and let its graph go on (the dependents its
        end cancelled wait again); a code-first workflow reruns from its failed
        step. The ids reopened, ``job_id`` first."""
        return await self._workflow_ops.retry_workflow(job_id)

    async def fork_workflow(self, job_id: str, from_step: int | str) -> str:
        """A new run of workflow ``job_id`` that replays its checkpoints before
        ``from_step`` (a number from 1, or a step's name) and runs the rest."""
        return await self._workflow_ops.fork_workflow(job_id, from_step)

    async def workflow_graph(self, job_id: str) -> list[dict[str, Any]]:
        """The jobs joined to ``job_id`` by ``depends_on``, each with its state
        and the ids it depends on."""
        return await self._workflow_ops.workflow_graph(job_id)

    async def list_workflows(
        self, status: str | JobStatus | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        """Code-first workflows and graphs (by their first job), newest first."""
        return await self._workflow_ops.list_workflows(status, limit)

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

    # -- the 0.2.x pass-through methods (api/compat.py) --------------------------

    @property
    def task_map(self) -> dict[str, Callable[..., Any]]:
        """Task name -> function for every task this scheduler can run."""
        return self._compat.task_map()

    async def listen_for_jobs(self) -> None:
        """The claim loop: runs until shutdown, woken by NOTIFY, due times and polling."""
        await self.worker.run()

    async def schedule_job(
        self,
        job_name: str,
        execution_time: datetime | None = None,
        task_data: dict[str, Any] | None = None,
        priority: JobPriority = JobPriority.NORMAL,
        max_retries: int = 0,
        job_id: str | None = None,
        conflict_resolution: ConflictResolution = ConflictResolution.RAISE,
        misfire_grace_time: int | None = None,
        *,
        dedupe_key: str | None = None,
        dedupe_scope: str | None = None,
        queue: str | None = None,
        depends_on: list[str] | tuple[str, ...] | None = None,
        on_dependency_failure: str = "cancel",
        delay: timedelta | float | None = None,
        concurrency_key: str | None = None,
        max_running_per_key: int | None = None,
        rate_limit_per_key: str | None = None,
        ordered: bool = False,
        fair_share_key: str | None = None,
        fair_share_weight: float | None = None,
    ) -> str:
        """Low-level insert by name (0.2.x): ``task_data`` is ``{"args": [...], "kwargs": {...}}``
        (None: no arguments).

        ``execution_time`` or ``delay`` as for :meth:`schedule` (neither: now).
        A name this process has not registered and no worker seen lately
        lists is logged as a warning (the job is written: its worker may not
        have started yet); a task registered here checks its arguments.

        The job runs on a worker that registered a task named ``job_name``
        (its ``module:qualname``, or its bare ``__name__`` when unambiguous).
        ``misfire_grace_time=None`` means the scheduler default.
        ``dedupe_key``: as for ``schedule()`` (a task's own key does not apply here).
        ``queue``:
        the job's queue (default: the queue of the task registered here under
        that name, else "default").
        ``depends_on``, ``on_dependency_failure``: as for ``schedule()``.
        """
        options = JobOptions.of(locals())
        return await self.enqueuer.schedule_by_name(
            job_name, execution_time, task_data, options, conflict_resolution
        )

    async def update_job_status(self, job_id: str, status: JobStatus | str) -> bool:
        """Force a job's status (an operator's tool; bypasses the lease guard)."""
        return await self._compat.update_job_status(job_id, status)

    async def send_heartbeat(self, job_id: str) -> bool:
        """Renew the lease of one job this worker holds; False if it holds no such job."""
        return await self._compat.send_heartbeat(job_id)

    async def monitor_heartbeats(self) -> None:
        """Run the heartbeat loop (started by :meth:`start`): renew this worker's
        row and all its leases each ``heartbeat_interval``."""
        await self.heartbeat.run_forever()

    async def periodic_orphan_recovery(self) -> None:
        """Run the rescue loop (started by :meth:`start`) every ``rescue_interval``."""
        await self.rescuer.run_forever()

    async def execute_job_with_concurrency_control(self, job_row: Any) -> None:
        """Run one claimed job row under the ``max_concurrent_jobs`` semaphore."""
        await self.worker.starts.execute_job_with_concurrency_control(job_row)

    async def execute_job(self, job_row: Any) -> None:
        """Run one claimed job row, then complete it (or write its failure), lease-guarded."""
        await self.worker.executor.execute_job(job_row)
