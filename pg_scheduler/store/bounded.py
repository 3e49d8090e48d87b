"""The application's pool as the scheduler's own statements use it: each one bounded.

A connection whose server stopped answering (a half-open socket: the network
dropped the path, or a NAT forgot it, and nothing was closed) never answers a
statement, and asyncpg then waits without end: for the answer, and after a
timeout or a cancellation for the server to acknowledge the cancel before the
connection can go back to its pool. :class:`BoundedPool` gives each statement a
client-side bound (``timeout``) and treats a statement that runs out of it as
a lost connection: the connection is terminated, not handed back, and every
other connection the pool had open is expired (replaced on its next use), since
they most likely crossed the same broken path. A cancelled statement (shutdown
ending a loop mid-statement) is terminated too: its state is unknown.

It changes nothing on the pool or its connections (settings, hooks), so it can
wrap a pool the application owns; everything not listed here is the pool's own.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any

import asyncpg
from asyncpg import exceptions as pgerr

from ..support.reconnect import is_detached_refusal

# Seconds any one of the scheduler's own statements may take (docs: failure
# model): ``Scheduler(statement_timeout=...)``'s default, and the sync client's.
DEFAULT_STATEMENT_TIMEOUT = 10.0


def state_unknown(exc: BaseException) -> bool:
    """True when a statement ended without telling how far it got: timed out,
    cancelled, or the connection broke (its answer, if any, is lost)."""
    return isinstance(
        exc,
        TimeoutError
        | asyncio.CancelledError
        | OSError
        | pgerr.PostgresConnectionError
        | asyncpg.InterfaceError
        | asyncpg.InternalClientError,
    )


def closed_under(exc: BaseException) -> pgerr.ConnectionDoesNotExistError:
    """The lost connection that ``exc`` (a detached proxy's refusal) stands for."""
    return pgerr.ConnectionDoesNotExistError(f"the connection closed while in use ({exc})")


@asynccontextmanager
async def holding(pool: Any) -> AsyncIterator[Any]:
    """``async with pool.acquire() as conn`` for a block of several statements
    on any pool: a connection that closes between them (the pool detaches its
    proxy) ends the block as a lost connection, as :class:`BoundedPool`'s blocks do."""
    async with pool.acquire() as conn:
        try:
            yield conn
        except asyncpg.InterfaceError as exc:
            if is_detached_refusal(exc):
                raise closed_under(exc) from exc
            raise


def terminate(conn: Any) -> None:
    """Close ``conn`` at once, without waiting for anything from the server."""
    try:
        conn.terminate()
    except asyncpg.InterfaceError:  # a proxy its pool already detached
        pass


async def expire(pool: asyncpg.Pool) -> None:
    """Have ``pool`` replace every connection it has open on its next use of it
    (a statement on one of them ran out of time: the others are suspect)."""
    try:
        await pool.expire_connections()
    except Exception:  # pragma: no cover - a closing pool
        pass


async def give_back(
    pool: asyncpg.Pool, conn: Any, error: BaseException | None, timeout: float | None
) -> None:
    """Release ``conn`` to ``pool``, or terminate it first if ``error`` left its
    state unknown (after a timeout, the pool's other connections are expired
    too: they most likely crossed the same broken path); never waits longer
    than ``timeout``."""
    if error is not None and state_unknown(error):
        terminate(conn)
        if isinstance(error, TimeoutError):
            await expire(pool)
    try:
        await pool.release(conn, timeout=timeout)
    except Exception:
        terminate(conn)  # the pool replaces a connection it could not reset


class BoundedPool:
    """A facade over an :class:`asyncpg.Pool`: ``fetch``, ``fetchval``,
    ``fetchrow``, ``execute``, ``executemany``, ``copy_records_to_table`` and
    ``acquire``/``release`` bounded by ``timeout`` seconds; the rest delegates.

    ``async with pool.acquire() as conn`` bounds each statement of the block
    the same way: the block is cancelled once ``timeout`` seconds pass without
    a statement finishing, and the connection is then terminated.
    """

    def __init__(
        self, pool: asyncpg.Pool, timeout: float, *, session_settings: bool = False
    ) -> None:
        self.raw = pool
        self.statement_timeout = timeout
        #: A SET on a connection stays with its session until the pool's reset
        #: (False behind pgbouncer in transaction mode, where it would reach
        #: other clients).
        self.session_settings = session_settings

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)

    def _bound(self, timeout: float | None) -> float:
        return self.statement_timeout if timeout is None else timeout

    async def _run(
        self, method: str, args: tuple[Any, ...], timeout: float | None, **kw: Any
    ) -> Any:
        bound = self._bound(timeout)
        conn = await self.raw.acquire(timeout=bound)
        try:
            result = await getattr(conn, method)(*args, timeout=bound, **kw)
        except BaseException as exc:
            await self.give_back(conn, exc)
            raise
        await self.give_back(conn)
        return result

    async def give_back(self, conn: Any, error: BaseException | None = None) -> None:
        """Release ``conn`` to the pool (see :func:`give_back`)."""
        await give_back(self.raw, conn, error, self.statement_timeout)

    async def fetch(self, query: str, *args: Any, timeout: float | None = None, **kw: Any) -> Any:
        return await self._run("fetch", (query, *args), timeout, **kw)

    async def fetchval(
        self, query: str, *args: Any, timeout: float | None = None, **kw: Any
    ) -> Any:
        return await self._run("fetchval", (query, *args), timeout, **kw)

    async def fetchrow(
        self, query: str, *args: Any, timeout: float | None = None, **kw: Any
    ) -> Any:
        return await self._run("fetchrow", (query, *args), timeout, **kw)

    async def execute(self, query: str, *args: Any, timeout: float | None = None) -> str:
        result: str = await self._run("execute", (query, *args), timeout)
        return result

    async def executemany(self, command: str, args: Any, *, timeout: float | None = None) -> None:
        await self._run("executemany", (command, args), timeout)

    async def copy_records_to_table(
        self, table_name: str, *, timeout: float | None = None, **kw: Any
    ) -> str:
        result: str = await self._run("copy_records_to_table", (table_name,), timeout, **kw)
        return result

    def acquire(self, *, timeout: float | None = None) -> _Acquire:
        return _Acquire(self, self._bound(timeout))

    async def release(self, conn: Any, *, timeout: float | None = None) -> None:
        try:
            await self.raw.release(conn, timeout=self._bound(timeout))
        except Exception:
            terminate(conn)
            raise


class Deadline:
    """Terminates ``conn`` once ``bound`` seconds pass without :meth:`renew`.

    Terminated, not cancelled: a cancelled statement would run its own
    clean-up (the ROLLBACK of ``conn.transaction()``, asyncpg's wait for the
    cancel to be acknowledged) on the same silent connection and wait for it
    without end. Terminated, every wait on the connection fails at once;
    :attr:`expired` then tells the caller to raise :class:`TimeoutError`."""

    def __init__(self, conn: Any, bound: float) -> None:
        self._conn = conn
        self.bound = bound
        self.expired = False
        self._timer: asyncio.TimerHandle | None = None
        self.renew()

    def _expire(self) -> None:
        self._timer = None
        self.expired = True
        terminate(self._conn)

    def renew(self) -> None:
        """A full bound from now (unless it already expired)."""
        if self.expired:
            return
        self.cancel()
        self._timer = asyncio.get_running_loop().call_later(self.bound, self._expire)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Acquire:
    """``await pool.acquire()`` (bounded wait for a connection) or
    ``async with pool.acquire() as conn`` (each statement of the block bounded
    by a :class:`Deadline`: a block that runs out of it ends with
    :class:`TimeoutError`, its connection terminated)."""

    def __init__(self, pool: BoundedPool, bound: float) -> None:
        self._pool = pool
        self._bound = bound
        self._conn: Any = None
        self._deadline: Deadline | None = None

    def __await__(self) -> Any:
        return self._pool.raw.acquire(timeout=self._bound).__await__()

    def _progress(self, _record: Any) -> None:
        # A statement of the block finished: the next one has a full bound.
        if self._deadline is not None:
            self._deadline.renew()

    async def __aenter__(self) -> Any:
        conn = self._conn = await self._pool.raw.acquire(timeout=self._bound)
        self._deadline = Deadline(conn, self._bound)
        conn.add_query_logger(self._progress)
        return conn

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        conn, self._conn = self._conn, None
        deadline, self._deadline = self._deadline, None
        assert deadline is not None
        deadline.cancel()
        try:
            conn.remove_query_logger(self._progress)
        except asyncpg.InterfaceError:  # terminated: its pool detached it
            pass
        if deadline.expired:
            error = TimeoutError(f"no answer within {self._bound} s")
            await self._pool.give_back(conn, error)
            raise error from exc
        await self._pool.give_back(conn, exc)
        if exc is not None and is_detached_refusal(exc):
            # The connection closed under the block (its proxy detached): said
            # as what it is, so callers retry it like any lost connection.
            raise closed_under(exc) from exc
