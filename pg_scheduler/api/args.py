"""The checks of :class:`~pg_scheduler.Scheduler`'s constructor arguments, and
the :class:`~.settings.Settings` made of them.

Bad settings raise at construction (TypeError/ValueError naming the argument),
before anything touches the database.
"""

from __future__ import annotations

import math
from typing import Any

import asyncpg

from ..config import PollingConfig, RetryPolicy, VacuumConfig
from ..engine.sync import default_process_pool_size
from ..store import check_schema
from ..support.validation import INT4_MAX, check_bool, check_int, check_seconds
from .queues import check_queues
from .settings import Settings, Timings


def _statement_cache_size(pool: asyncpg.Pool) -> int | None:
    """The pool's asyncpg statement cache size, None when it cannot be told."""
    options = getattr(pool, "_connect_kwargs", None)
    if not isinstance(options, dict):
        return None
    return options.get("statement_cache_size", 100)


def check_arguments(
    *,
    db_pool: Any,
    schema: Any,
    pgbouncer: Any,
    listen_dsn: Any,
    max_concurrent_jobs: Any,
    misfire_grace_time: Any,
    batch_claim_limit: Any,
    max_rescues: Any,
    job_timeout: Any,
    shutdown_grace_period: Any,
    heartbeat_interval: Any,
    heartbeat_threshold: Any,
    lease_duration: Any,
    rescue_interval: Any,
    listener_health_interval: Any,
    vacuum_config: Any,
    polling_config: Any,
    retry_policy: Any,
    thread_pool_size: Any,
    process_pool_size: Any,
    loop_stall_warning: Any,
    loop_stall_limit: Any,
    gc_freeze: Any,
    statement_timeout: Any,
) -> None:
    """Checked in a fixed order, the pool first; raises on the first bad one."""
    if not isinstance(db_pool, asyncpg.Pool):
        raise TypeError(f"db_pool must be an asyncpg.Pool, got {type(db_pool).__name__}")
    check_schema(schema)
    check_bool("pgbouncer", pgbouncer)
    if listen_dsn is not None and (not isinstance(listen_dsn, str) or not listen_dsn):
        raise ValueError("listen_dsn must be a non-empty DSN string or None")
    if pgbouncer and _statement_cache_size(db_pool) != 0:
        # A named prepared statement may run on another server connection,
        # where it does not exist or names another client's statement.
        raise ValueError(
            "pgbouncer=True needs a pool without named prepared statements: "
            "asyncpg.create_pool(dsn, statement_cache_size=0)"
        )
    check_int("max_concurrent_jobs", max_concurrent_jobs, 1)
    check_int("misfire_grace_time", misfire_grace_time, 0, allow_none=True, maximum=INT4_MAX)
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
    check_int("thread_pool_size", thread_pool_size, 1, allow_none=True)
    check_int("process_pool_size", process_pool_size, 1, allow_none=True)
    check_seconds("loop_stall_warning", loop_stall_warning)
    check_seconds("loop_stall_limit", loop_stall_limit)
    check_bool("gc_freeze", gc_freeze)
    check_seconds("statement_timeout", statement_timeout, allow_none=False)
    if not math.isfinite(statement_timeout):
        raise ValueError(f"statement_timeout must be finite, got {statement_timeout!r}")


def settings_of(
    *,
    db_pool: asyncpg.Pool,
    max_concurrent_jobs: int,
    misfire_grace_time: int | None,
    vacuum_config: VacuumConfig | None,
    vacuum_enabled: bool,
    batch_claim_limit: int,
    polling_config: PollingConfig | None,
    job_timeout: float | None,
    retry_policy: RetryPolicy | None,
    shutdown_grace_period: float,
    heartbeat_interval: float | None,
    heartbeat_threshold: float | None,
    lease_duration: float | None,
    rescue_interval: float | None,
    max_rescues: int,
    listener_health_interval: float,
    run_periodic_jobs: bool,
    start_due_jobs_locally: bool,
    schema: str,
    pgbouncer: bool,
    listen_dsn: str | None,
    thread_pool_size: int | None,
    process_pool_size: int | None,
    loop_stall_warning: float | None,
    loop_stall_limit: float | None,
    queues: list[str] | dict[str, int] | None,
    gc_freeze: bool,
    statement_timeout: float,
    default_heartbeat_threshold: float,
    default_lease_duration: float,
) -> Settings:
    """The arguments of ``Scheduler(...)`` checked (:func:`check_arguments`, then
    ``queues``), as :class:`~.settings.Settings` with the defaults filled in."""
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
        thread_pool_size=thread_pool_size,
        process_pool_size=process_pool_size,
        loop_stall_warning=loop_stall_warning,
        loop_stall_limit=loop_stall_limit,
        gc_freeze=gc_freeze,
        statement_timeout=statement_timeout,
    )
    # None: every queue; a list; or queue -> local concurrency.
    served_queues, queue_limits = check_queues(queues, max_concurrent_jobs)
    # Behind a transaction pooler LISTEN needs a direct connection; without
    # one, workers poll every min_interval instead of backing off.
    notifications = listen_dsn is not None or not pgbouncer
    polling = polling_config or PollingConfig()
    if polling_config is None and not notifications:
        fast = polling.min_interval
        polling = PollingConfig(idle_start_interval=fast, max_interval=fast)
    return Settings(
        db_pool=db_pool,
        max_concurrent_jobs=max_concurrent_jobs,
        misfire_grace_time=misfire_grace_time,
        vacuum_config=vacuum_config or VacuumConfig(),
        vacuum_enabled=vacuum_enabled,
        batch_claim_limit=batch_claim_limit,
        polling_config=polling,
        job_timeout=job_timeout,
        retry_policy=retry_policy or RetryPolicy(),
        shutdown_grace_period=shutdown_grace_period,
        max_rescues=max_rescues,
        listener_health_interval=listener_health_interval,
        run_periodic_jobs=run_periodic_jobs,
        start_due_jobs_locally=start_due_jobs_locally,
        schema=schema,
        pgbouncer=pgbouncer,
        listen_dsn=listen_dsn,
        notifications=notifications,
        # One thread per slot by default: a thread job never waits for a thread.
        thread_pool_size=thread_pool_size or max_concurrent_jobs,
        process_pool_size=process_pool_size or default_process_pool_size(),
        loop_stall_warning=loop_stall_warning,
        served_queues=served_queues,
        queue_limits=queue_limits,
        # Freeze the objects alive at start() out of Python's full collections
        # while running (see process_gc); gc_freeze=False leaves gc alone.
        gc_freeze=gc_freeze,
        statement_timeout=statement_timeout,
        timings=Timings(
            default_heartbeat_threshold=default_heartbeat_threshold,
            default_lease_duration=default_lease_duration,
            given_heartbeat_interval=heartbeat_interval,
            given_heartbeat_threshold=heartbeat_threshold,
            given_lease_duration=lease_duration,
            given_rescue_interval=rescue_interval,
            given_loop_stall_limit=loop_stall_limit,
        ),
    )
