"""A pooled connection kept for one serial hot path (the claim loop, the completion writer)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from ..store.bounded import BoundedPool, Deadline, closed_under, expire
from ..store.names import Executor
from ..store.session import ASYNC_COMMIT, GENERIC_PLANS, own_timeouts
from ..support.reconnect import is_connection_error, is_detached_refusal

T = TypeVar("T")

# Keep connections only when the pool can spare them: the listener already
# holds one, and heartbeats, the rescuer, vacuum and the application need some.
MIN_POOL_SIZE_TO_HOLD = 6


def _closed(conn: asyncpg.Connection) -> bool:
    try:
        return conn.is_closed()
    except asyncpg.InterfaceError:  # a proxy the pool detached
        return True


class HeldConnection:
    """One connection of the pool, kept between the statements of a serial path.

    asyncpg resets a connection every time it goes back to the pool, one more
    round trip per statement; on the claim path that round trip sits between
    the claim and the start of its jobs. With a small pool, each statement
    takes a connection from the pool as usual. A connection that may be
    broken is closed and handed back (the pool replaces it); a statement's own
    error leaves it in use, since every statement here is its own transaction.

    Each operation is bounded by the pool's ``statement_timeout`` (a
    :class:`~pg_scheduler.store.bounded.BoundedPool`): one that runs out of it
    is taken for a lost connection (terminated, and the pool's other
    connections expired), so a half-open socket never holds the path.
    Where the pool allows session settings (not behind pgbouncer), the held
    session also takes the scheduler's own timeouts (``store.session``), so a
    ``statement_timeout`` or ``lock_timeout`` set on the role or database does
    not reach these statements; the pool's reset undoes them on release.

    ``asynchronous_commit``: the session commits without waiting for the WAL
    flush (``synchronous_commit = off``; the pool's reset undoes it). Only for
    writes that may be forgotten by a database crash without losing a job.
    Such a session also uses generic plans (see ``store.session``).
    """

    def __init__(self, pool: asyncpg.Pool, *, asynchronous_commit: bool = False) -> None:
        self._pool = pool
        self._conn: asyncpg.Connection | None = None
        self._asynchronous_commit = asynchronous_commit
        self.enabled = pool.get_max_size() >= MIN_POOL_SIZE_TO_HOLD
        # Released (at shutdown) and not held again: a statement sent after
        # the release (one that was late to the shutdown) takes a pooled
        # connection for itself only, so none stays taken once the worker stopped.
        self._released = False
        # Statements run when the connection is taken: one round trip, once.
        settings = [ASYNC_COMMIT, GENERIC_PLANS] if asynchronous_commit else []
        self._timeout: float | None = None
        if isinstance(pool, BoundedPool):
            self._timeout = pool.statement_timeout
            if pool.session_settings:
                settings.append(own_timeouts(pool.statement_timeout))
        self._settings = "; ".join(settings)

    async def run(self, operation: Callable[[Executor], Awaitable[T]]) -> T:
        if not self.enabled or self._released:
            return await operation(self._pool)
        if self._conn is not None and _closed(self._conn):
            # Died while idle; the pool has already taken it back.
            self._conn = None
        if self._conn is None:
            conn = await self._pool.acquire(timeout=self._timeout)
            try:
                if self._settings:
                    # Not behind pgbouncer: a SET there reaches other clients.
                    await conn.execute(self._settings, timeout=self._timeout)
            except BaseException:
                # Its state is unknown (or it refused a SET): never reused.
                conn.terminate()
                await self._give_back(conn)
                raise
            self._conn = conn
        deadline = None if self._timeout is None else Deadline(self._conn, self._timeout)
        try:
            return await operation(self._conn)
        except BaseException as exc:
            if deadline is not None and deadline.expired:
                # No answer within the bound: a half-open connection, most
                # likely, and the pool's other connections crossed the same path.
                await self._discard()
                await expire(self._pool)
                raise TimeoutError(f"no answer within {self._timeout} s") from exc
            if isinstance(exc, asyncpg.PostgresError) and not is_connection_error(exc):
                raise  # the statement's own error: the connection is fine
            if is_detached_refusal(exc):
                # Closed under the statements (the pool detached its proxy).
                await self._discard()
                raise closed_under(exc) from exc
            # Lost or cancelled mid-statement: its state is unknown.
            await self._discard()
            raise
        finally:
            if deadline is not None:
                deadline.cancel()

    async def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            conn.terminate()
        except asyncpg.InterfaceError:
            return  # closed under us: the pool has already taken it back
        await self._give_back(conn)

    async def _give_back(self, conn: asyncpg.Connection) -> None:
        try:
            await asyncio.shield(self._pool.release(conn, timeout=self._timeout or 5))
        except Exception:
            pass  # the pool replaces a connection it could not reset

    def hold(self) -> None:
        """Keep a connection between statements again (at start)."""
        self._released = False

    async def release(self) -> None:
        """Hand the connection back to the pool (at shutdown); until :meth:`hold`,
        each statement takes one from the pool and gives it back."""
        self._released = True
        conn, self._conn = self._conn, None
        if conn is not None:
            await self._give_back(conn)
