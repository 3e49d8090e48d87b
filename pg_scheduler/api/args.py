"""The checks of :class:`~pg_scheduler.Scheduler`'s constructor arguments.

Bad settings raise at construction (TypeError/ValueError naming the argument),
before anything touches the database.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from ..config import PollingConfig, RetryPolicy, VacuumConfig
from ..store import check_schema
from ..support.validation import INT4_MAX, check_bool, check_int, check_seconds


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
