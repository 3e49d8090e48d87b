"""What every subcommand shares: the DSN, logging setup, the event loop, a pool."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import parse_qs, urlsplit

import asyncpg
import structlog

from ..support.install import install_hint

T = TypeVar("T")

# Seconds a pool's close may take before its connections are cut.
POOL_CLOSE_TIMEOUT = 10.0


def resolve_dsn(args: argparse.Namespace) -> str | None:
    """--dsn, else $PG_SCHEDULER_DSN, else None (meaning: the embedded database)."""
    return getattr(args, "dsn", None) or os.environ.get("PG_SCHEDULER_DSN") or None


def configure_logging(args: argparse.Namespace) -> None:
    """The CLI, unlike the library, owns the process and configures logging."""
    level = getattr(logging, str(getattr(args, "log_level", "info")).upper())
    renderer: Any
    if getattr(args, "log_format", "console") == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def server_of(dsn: str | None) -> str:
    """Where ``dsn`` points, as ``host:port`` (a socket directory: ``dir/.s.PGSQL.port``),
    read as libpq reads it: the URL, its ``host``/``port`` query, then $PGHOST/$PGPORT."""
    if not dsn:
        return "the embedded PostgreSQL"
    try:
        parts = urlsplit(dsn)
        query = parse_qs(parts.query)
        host = parts.hostname or (query.get("host") or [""])[0]
        port = parts.port or (query.get("port") or [""])[0]
    except ValueError:
        return "the server of --dsn"
    host = host or os.environ.get("PGHOST") or "localhost"
    port = port or os.environ.get("PGPORT") or 5432
    if host.startswith("/"):
        return f"{host}/.s.PGSQL.{port}"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_WHERE = "check --dsn or $PG_SCHEDULER_DSN"


def failure_line(exc: BaseException, dsn: str | None) -> str | None:
    """One line for the failures a first run meets (no server there, a wrong
    password, a missing database or grant, no embedded PostgreSQL), naming
    what failed and what to do; None for anything else."""
    from ..embedded import EmbeddedUnavailable
    from ..store.migrate import MigrationError

    server = server_of(dsn)
    if isinstance(exc, EmbeddedUnavailable):
        return (
            "error: no --dsn or $PG_SCHEDULER_DSN given, and the embedded PostgreSQL is not "
            f"installed: point PG_SCHEDULER_DSN at a server, or install the embedded extra "
            f"({install_hint('embedded')})"
        )
    if isinstance(exc, PermissionError | MigrationError):
        return f"error: {exc}"
    if isinstance(exc, socket.gaierror):
        return f"error: cannot resolve the host of {server} ({exc.strerror}); {_WHERE}"
    if isinstance(exc, ConnectionRefusedError) or (
        isinstance(exc, OSError) and "refused" in str(exc).lower()
    ):
        return (
            f"error: cannot connect to PostgreSQL at {server}: connection refused; "
            f"is the server running there? ({_WHERE})"
        )
    if isinstance(exc, TimeoutError):
        return f"error: PostgreSQL at {server} did not answer in time; {_WHERE}"
    if isinstance(
        exc, asyncpg.InvalidPasswordError | asyncpg.InvalidAuthorizationSpecificationError
    ):
        return f"error: PostgreSQL at {server} refused the login: {exc}; {_WHERE}"
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return f"error: PostgreSQL at {server}: {exc}; create it or {_WHERE}"
    if isinstance(exc, asyncpg.UndefinedTableError):
        return (
            f"error: {exc}: the pg_scheduler schema is missing in this database "
            "(run `pg-scheduler migrate`)"
        )
    if isinstance(exc, asyncpg.InsufficientPrivilegeError):
        return (
            f"error: database: {exc}; grant it to the role as the schema's owner "
            "(docs: Operations, schemas and privileges)"
        )
    if isinstance(exc, asyncpg.ReadOnlySQLTransactionError):
        return (
            f"error: PostgreSQL at {server} refused a write ({exc}): it is a read replica "
            "(a standby in recovery) or the role reads only; this command writes: point "
            "--dsn at the primary"
        )
    if isinstance(exc, OSError | asyncpg.PostgresError | asyncpg.InterfaceError):
        return f"error: database at {server}: {exc}"
    return None


def run_cli(args: argparse.Namespace, factory: Callable[[], Awaitable[int]]) -> int:
    """Run a command's coroutine; the failures :func:`failure_line` knows end as
    that one line on stderr and exit code 1, never a traceback."""
    try:
        return run_async(factory)
    except Exception as exc:
        line = failure_line(exc, resolve_dsn(args))
        if line is None:
            raise
        print(line, file=sys.stderr)
        return 1


def run_async(factory: Callable[[], Awaitable[T]]) -> T:
    """Run a coroutine on uvloop when it is installed."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        return asyncio.run(factory())  # type: ignore[arg-type]
    return uvloop.run(factory())  # type: ignore[arg-type]


def embedded_dsn() -> str:
    from ..embedded import is_running, start

    # A server someone else started (``pg-scheduler dsn``) keeps running after us.
    return start(cleanup=None if is_running() else "stop").dsn


@asynccontextmanager
async def open_pool(args: argparse.Namespace, **options: Any):
    """A pool on --dsn / $PG_SCHEDULER_DSN, or on the embedded database."""
    dsn = resolve_dsn(args) or await asyncio.to_thread(embedded_dsn)
    options.setdefault("min_size", 1)
    options.setdefault("max_size", 10)
    if getattr(args, "pgbouncer", False):
        # Behind a transaction pooler a named prepared statement may be run on
        # another server connection, where that name means another statement.
        options["statement_cache_size"] = 0
    pool = await asyncpg.create_pool(dsn, **options)
    try:
        yield pool
    finally:
        try:
            # A close waits for every connection to say goodbye: bounded, in
            # case the server stopped answering.
            await asyncio.wait_for(pool.close(), POOL_CLOSE_TIMEOUT)
        except (TimeoutError, OSError, asyncpg.InterfaceError):
            pool.terminate()
