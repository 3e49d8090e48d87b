"""Telling lost connections from real errors, and retrying only the former."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg
from asyncpg import exceptions as pgerr

from .log import get_logger

log = get_logger(__name__)
T = TypeVar("T")

_TRANSIENT = (
    pgerr.PostgresConnectionError,  # class 08: the connection is gone
    pgerr.AdminShutdownError,  # 57P01: server shutting down / backend terminated
    pgerr.CrashShutdownError,  # 57P02
    pgerr.CannotConnectNowError,  # 57P03: still starting up
    pgerr.TooManyConnectionsError,  # 53300
    ConnectionError,
    OSError,
    asyncio.TimeoutError,
)


def is_connection_error(exc: BaseException) -> bool:
    """True when ``exc`` means the database went away, not that the statement is wrong."""
    if isinstance(exc, _TRANSIENT):
        return True
    if isinstance(exc, asyncpg.InternalClientError):
        # The client's protocol state broke, seen on connections the server
        # terminated mid-statement (a restart): like a lost connection, the
        # statement may or may not have run, and another connection works.
        return True
    if isinstance(exc, asyncpg.InterfaceError):
        text = str(exc).lower()
        return "connection" in text and "pool" not in text
    return False


class Backoff:
    """Exponential backoff with full jitter, reset on success."""

    def __init__(self, initial: float = 0.05, maximum: float = 5.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self._next = initial

    def next_delay(self) -> float:
        delay = random.uniform(self._next / 2, self._next)
        self._next = min(self.maximum, self._next * 2)
        return delay

    def reset(self) -> None:
        self._next = self.initial


async def retry_on_disconnect(
    operation: Callable[[], Awaitable[T]],
    *,
    what: str,
    give_up_after: float | None = None,
    should_stop: Callable[[], bool] = lambda: False,
) -> T:
    """Run ``operation``, retrying with backoff while the database is unreachable.

    Other errors propagate at once. ``give_up_after`` bounds the total wait in
    seconds (None: keep trying until ``should_stop()``).
    """
    backoff = Backoff()
    loop = asyncio.get_running_loop()
    deadline = None if give_up_after is None else loop.time() + give_up_after
    while True:
        try:
            return await operation()
        except Exception as exc:
            if not is_connection_error(exc) or should_stop():
                raise
            if deadline is not None and loop.time() >= deadline:
                raise
            delay = backoff.next_delay()
            log.warning(
                "database unreachable, retrying",
                operation=what,
                error=repr(exc),
                retry_in=round(delay, 3),
            )
            await asyncio.sleep(delay)
