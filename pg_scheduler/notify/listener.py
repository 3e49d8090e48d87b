"""LISTEN/NOTIFY on a dedicated connection, with health checks and reconnects.

The listener holds one connection from the pool, or its own connection to
``dsn`` when given (behind pgbouncer in transaction mode, LISTEN must bypass
the pooler: a direct connection to PostgreSQL). A connection can die
silently (a killed backend, a half-open TCP socket), so besides asyncpg's
termination callback the listener runs ``SELECT 1`` every
``health_interval`` seconds, and gives it at most that long (and at most the
scheduler's ``statement_timeout``) to answer; on failure the connection is
terminated (never asked to UNLISTEN: it would not answer), the pool's other
connections are expired when it did not answer at all (they crossed the same
path), and the listener reconnects with backoff and re-LISTENs. Taking a
connection, LISTENing and UNLISTENing are bounded by ``statement_timeout``
each. Its own connection to ``dsn`` has TCP keepalives on. While it is down,
:attr:`live` is False and workers fall back to polling; when it comes back,
every handler is called once, since notifications sent meanwhile were lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg

from ..store.bounded import expire
from ..store.session import HEALTH_CHECK
from ..support.connections import set_tcp_keepalive
from ..support.log import get_logger
from ..support.reconnect import Backoff

log = get_logger(__name__)

Handler = Callable[[str], None]


class Listener:
    def __init__(
        self,
        pool: asyncpg.Pool,
        handlers: dict[str, Handler],
        *,
        health_interval: float = 5.0,
        on_reconnect: Callable[[], None] | None = None,
        dsn: str | None = None,
        statement_timeout: float = 10.0,
    ) -> None:
        self._pool = pool
        self._timeout = statement_timeout
        self._dsn = dsn
        self._handlers = handlers
        self._health_interval = health_interval
        self._on_reconnect = on_reconnect
        self._conn: asyncpg.Connection | None = None
        self._lost = asyncio.Event()
        self._stopped = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.live = False
        self.connected = asyncio.Event()
        # Channels LISTENed on the current connection.
        self._listening: set[str] = set()

    @property
    def started(self) -> bool:
        return self._task is not None and not self._stopped.is_set()

    async def add_channel(self, channel: str, handler: Handler) -> None:
        """Listen on one more channel: now if connected, and after every reconnect."""
        self._handlers.setdefault(channel, handler)
        conn = self._conn
        if conn is not None and channel not in self._listening:
            try:
                await self._listen(conn, channel)
            except Exception:
                self._lost.set()  # the reconnect LISTENs on every channel

    async def _listen(self, conn: asyncpg.Connection, channel: str) -> None:
        if channel in self._listening:
            return
        self._listening.add(channel)
        await conn.add_listener(channel, self._dispatch)

    @property
    def backend_pid(self) -> int | None:
        """Server process id of the LISTEN connection; None while it is down."""
        conn = self._conn
        if conn is None or not self.live:
            return None
        try:
            return conn.get_server_pid()
        except asyncpg.InterfaceError:  # died and already detached by the pool
            return None

    def start(self) -> None:
        if self.started:  # already started for wait_for()/events()
            return
        self._stopped.clear()  # started again after a stop
        self._task = asyncio.create_task(self._run(), name="pg_scheduler.listener")

    async def stop(self) -> None:
        self._stopped.set()
        self._lost.set()
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=self._timeout)
            if not self._task.done():
                self._task.cancel()
        await self._close()

    def _dispatch(self, _conn: object, _pid: int, channel: str, payload: str) -> None:
        handler = self._handlers.get(channel)
        if handler is not None:
            try:
                handler(payload)
            except Exception:
                log.exception("notification handler failed", channel=channel)

    def _terminated(self, _conn: object) -> None:
        self._lost.set()

    async def _run(self) -> None:
        backoff = Backoff(initial=0.1, maximum=5.0)
        first = True
        while not self._stopped.is_set():
            try:
                # Bounded: LISTEN on a backend that stopped answering never
                # returns (a connection to take, then its LISTENs).
                await asyncio.wait_for(self._connect(), 2 * self._timeout)
            except Exception as exc:
                self.live = False
                log.warning("listener cannot connect; polling meanwhile", error=repr(exc))
                await self._close(healthy=False)
                await self._sleep(backoff.next_delay())
                continue
            backoff.reset()
            self.live = True
            self.connected.set()
            if not first and self._on_reconnect is not None:
                try:
                    self._on_reconnect()
                except Exception:
                    log.exception("listener reconnect callback failed")
            if not first:
                log.info("listener reconnected")
            first = False
            healthy = await self._watch()
            self.live = False
            self.connected.clear()
            await self._close(healthy)
            if not self._stopped.is_set():
                log.warning("listener connection lost; polling until it is back")

    async def _connect(self) -> None:
        self._lost.clear()
        if self._dsn is not None:
            conn = await asyncpg.connect(self._dsn, timeout=self._timeout, statement_cache_size=0)
            set_tcp_keepalive(conn)
        else:
            conn = await self._pool.acquire(timeout=self._timeout)
        self._conn = conn
        self._listening = set()
        conn.add_termination_listener(self._terminated)
        # add_channel() may add channels meanwhile: loop until all are LISTENed.
        while pending := [c for c in self._handlers if c not in self._listening]:
            for channel in pending:
                await self._listen(conn, channel)

    async def _watch(self) -> bool:
        """Return when the connection is lost (False) or the listener stops (True)."""
        while not self._stopped.is_set():
            try:
                await asyncio.wait_for(self._lost.wait(), self._health_interval)
                return False
            except TimeoutError:
                pass
            try:
                assert self._conn is not None
                await self._conn.fetchval(
                    HEALTH_CHECK, timeout=min(self._health_interval, self._timeout)
                )
            except Exception as exc:
                log.warning("listener health check failed", error=repr(exc))
                if isinstance(exc, TimeoutError) and self._dsn is None:
                    # No answer at all: a half-open connection, most likely.
                    await expire(self._pool)
                return False
        return True

    async def _close(self, healthy: bool = True) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        # A connection that died is detached from its proxy and returned by the
        # pool itself (every call on the proxy then raises InterfaceError), so
        # nothing here may let an exception escape: that would end the listener
        # for good and leave the worker polling forever. One that failed its
        # health check is not asked to UNLISTEN (it would never answer): it is
        # terminated.
        try:
            if healthy:
                await asyncio.wait_for(self._unlisten_and_release(conn), self._timeout)
                return
        except Exception:
            pass
        try:
            conn.terminate()
            if self._dsn is None:
                await self._pool.release(conn)
        except Exception:
            pass

    async def _unlisten_and_release(self, conn: asyncpg.Connection) -> None:
        for channel in list(self._listening):
            await conn.remove_listener(channel, self._dispatch)
        if self._dsn is not None:
            await conn.close(timeout=self._timeout)
        else:
            await self._pool.release(conn, timeout=self._timeout)

    async def _sleep(self, delay: float) -> None:
        try:
            await asyncio.wait_for(self._stopped.wait(), delay)
        except TimeoutError:
            pass
