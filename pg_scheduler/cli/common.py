"""What every subcommand shares: the DSN, logging setup, the event loop, a pool."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import asyncpg
import structlog

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
