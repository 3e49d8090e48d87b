"""A TCP proxy on 127.0.0.1 that can break the path to PostgreSQL without closing it.

``black_hole()``: every connection through the proxy, open or opened later,
stops carrying bytes: what either end sends is read and dropped, nothing is
closed, so both ends see a live socket that never answers (the kernel on
this side acknowledges everything, so TCP keepalives do not notice either:
only the client's own timeouts can). ``cut()`` closes every open connection
at both ends, as a reset would. ``heal()``: connections opened from
then on are carried again; those that were black-holed stay so for good, as
behind a NAT or load balancer that lost its state. ``close()`` ends it all.

Upstream is a TCP address or a Unix socket (the embedded server's).
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import parse_qs, urlsplit, urlunsplit


class _Link:
    def __init__(self, dead: bool) -> None:
        self.dead = dead
        self.writers: list[asyncio.StreamWriter] = []
        self.tasks: list[asyncio.Task[None]] = []


class TcpProxy:
    def __init__(self, upstream: str | tuple[str, int]) -> None:
        self._upstream = upstream
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._holing = False
        self.port = 0
        self.accepted = 0

    async def start(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def dsn_for(self, dsn: str) -> str:
        """``dsn`` rewritten to go through this proxy (user, password, database kept)."""
        parts = urlsplit(dsn)
        user = parts.username or ""
        auth = f"{user}:{parts.password}@" if parts.password else (f"{user}@" if user else "")
        return urlunsplit(parts._replace(netloc=f"{auth}127.0.0.1:{self.port}", query=""))

    @staticmethod
    def upstream_of(dsn: str) -> str | tuple[str, int]:
        """Where ``dsn`` connects: a Unix socket path or (host, port)."""
        parts = urlsplit(dsn)
        port = parts.port or 5432
        host = parts.hostname or parse_qs(parts.query).get("host", [""])[0]
        if not host or host.startswith("/"):
            return f"{host or '/tmp'}/.s.PGSQL.{port}"
        return (host, port)

    def black_hole(self) -> None:
        """Drop every byte of every connection, open or to come; close nothing."""
        self._holing = True
        for link in self._links:
            link.dead = True

    def cut(self) -> None:
        """Close every open connection, both ends (as a reset would); new ones
        are carried."""
        for link in list(self._links):
            self._end(link)

    def heal(self) -> None:
        """Carry new connections again; the black-holed ones stay dead."""
        self._holing = False

    @property
    def live_links(self) -> int:
        return sum(1 for link in self._links if not link.dead)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        link = _Link(dead=self._holing)
        link.writers.append(writer)
        self._links.add(link)
        if link.dead:
            # Never reaches the server: the client's bytes go nowhere.
            link.tasks.append(asyncio.create_task(self._drain(link, reader)))
            return
        try:
            if isinstance(self._upstream, str):
                up_reader, up_writer = await asyncio.open_unix_connection(self._upstream)
            else:
                up_reader, up_writer = await asyncio.open_connection(*self._upstream)
        except OSError:
            writer.close()
            self._links.discard(link)
            return
        link.writers.append(up_writer)
        link.tasks += [
            asyncio.create_task(self._pump(link, reader, up_writer)),
            asyncio.create_task(self._pump(link, up_reader, writer)),
        ]

    async def _drain(self, link: _Link, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(Exception):
            while await reader.read(65536):
                pass
        self._end(link)

    async def _pump(
        self, link: _Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while data := await reader.read(65536):
                if link.dead:
                    continue
                writer.write(data)
                await writer.drain()
        except Exception:
            pass
        # One end closed its socket (a client's terminate, a server's exit):
        # the other end learns it, as it would without the proxy.
        self._end(link)

    def _end(self, link: _Link) -> None:
        if link not in self._links:
            return
        self._links.discard(link)
        for writer in link.writers:
            with contextlib.suppress(Exception):
                writer.close()
        current = asyncio.current_task()
        for task in link.tasks:
            if task is not current:
                task.cancel()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            self._end(link)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
