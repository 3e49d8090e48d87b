"""Setting up the connections the scheduler makes itself (the worker command's
pool, the LISTEN connection to ``listen_dsn``), so a dead peer is noticed.

A connection the network dropped without closing (a NAT or load balancer that
forgot its state, a cable pulled) looks alive to both ends until one of them
sends something and waits for an acknowledgement that never comes. On the
client side TCP keepalives probe an idle connection and ``TCP_USER_TIMEOUT``
bounds how long sent data may stay unacknowledged; the kernel then reports
the connection dead and asyncpg closes it. On the server side the same
settings (``tcp_keepalives_*``, ``tcp_user_timeout``) end the backend of a
client that is gone. The scheduler's statements have their own bound on top
(:mod:`pg_scheduler.store.bounded`), since a frozen server or pooler answers
keepalives without answering queries.

Connections of a pool the application made are left as they are; to give
them the same socket options, make the pool with
``asyncpg.create_pool(dsn, init=pg_scheduler.support.connections.init_connection)``.
"""

from __future__ import annotations

import socket
from typing import Any

import asyncpg

# An idle connection is probed after this many seconds without traffic, then
# every KEEPALIVE_INTERVAL, and declared dead after KEEPALIVE_COUNT unanswered
# probes: 10 + 3 * 5 = 25 s at most.
KEEPALIVE_IDLE = 10
KEEPALIVE_INTERVAL = 5
KEEPALIVE_COUNT = 3
# Data sent and not acknowledged for this long ends the connection (Linux).
USER_TIMEOUT = KEEPALIVE_IDLE + KEEPALIVE_INTERVAL * KEEPALIVE_COUNT


def set_tcp_keepalive(conn: Any) -> bool:
    """Turn on TCP keepalives (and ``TCP_USER_TIMEOUT`` where the platform has
    it) on ``conn``'s socket; False when it has none to set (a Unix socket)."""
    transport = getattr(conn, "_transport", None)
    sock = None if transport is None else transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return False
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", KEEPALIVE_COUNT),
        ("TCP_USER_TIMEOUT", USER_TIMEOUT * 1000),  # milliseconds
    ):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)
    return True


async def init_connection(conn: asyncpg.Connection) -> None:
    """A pool ``init`` hook: :func:`set_tcp_keepalive` on each new connection."""
    set_tcp_keepalive(conn)


def server_settings() -> dict[str, str]:
    """Settings the scheduler's own sessions start with (in the startup packet).

    The server ends the backend of a client that vanished (keepalives, user
    timeout); ``statement_timeout`` and ``lock_timeout`` set on the role or
    the database do not apply (the scheduler bounds its statements itself,
    client-side). Not behind pgbouncer, which refuses startup parameters it
    does not know.
    """
    return {
        "tcp_keepalives_idle": str(KEEPALIVE_IDLE),
        "tcp_keepalives_interval": str(KEEPALIVE_INTERVAL),
        "tcp_keepalives_count": str(KEEPALIVE_COUNT),
        "tcp_user_timeout": str(USER_TIMEOUT * 1000),
        "statement_timeout": "0",
        "lock_timeout": "0",
    }


def pool_options(*, pgbouncer: bool = False) -> dict[str, Any]:
    """``asyncpg.create_pool`` options for a pool the scheduler makes itself."""
    options: dict[str, Any] = {"init": init_connection}
    if not pgbouncer:
        options["server_settings"] = server_settings()
    return options
