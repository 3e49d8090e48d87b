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


# The server rolled the statement (its whole transaction) back to break a
# deadlock or a serialization conflict: it had no effect, so running it again
# is always safe. A worker's own statements can deadlock each other (the
# heartbeat and a completion batch lock the same rows in different orders).
_ROLLED_BACK = (pgerr.DeadlockDetectedError, pgerr.SerializationError)


def is_rolled_back_conflict(exc: BaseException) -> bool:
    """True when the server aborted the statement over a lock conflict (40P01, 40001)."""
    return isinstance(exc, _ROLLED_BACK)


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


def is_detached_refusal(exc: BaseException) -> bool:
    """True for asyncpg's refusal of a pooled connection's proxy that its pool
    detached ("released back to the pool"). The pool detaches the proxy of a
    connection that closes (a restart, a terminated backend), so for a caller
    that has not released it, the refusal means a lost connection; for any
    other it means a use after release."""
    return isinstance(exc, asyncpg.InterfaceError) and "released back to the pool" in str(exc)


def is_lost_while_held(exc: BaseException) -> bool:
    """For a caller that still holds the pooled connection ``exc`` came from:
    True when that connection is gone (a lost connection, or the pool's
    refusal of the proxy it detached on the connection's close)."""
    return is_connection_error(exc) or is_detached_refusal(exc)


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
    """Run ``operation``, retrying with backoff while the database is unreachable,
    and after a deadlock or serialization failure (the server rolled it back).

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
            conflict = is_rolled_back_conflict(exc)
            if not (conflict or is_connection_error(exc)) or should_stop():
                raise
            if deadline is not None and loop.time() >= deadline:
                raise
            delay = backoff.next_delay()
            log.warning(
                "rolled back by a lock conflict, retrying"
                if conflict
                else "database unreachable, retrying",
                operation=what,
                error=repr(exc),
                retry_in=round(delay, 3),
            )
            await asyncio.sleep(delay)
