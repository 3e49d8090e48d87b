"""A live web dashboard (extra ``dashboard``): ``pg-scheduler dashboard``, or
mounted in an application::

    app.mount("/jobs", dashboard_app(scheduler_or_pool_or_dsn, token="..."))

See ``app.py`` for the pages, the live stream and the token rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import asyncpg

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from ..scheduler import Scheduler


def dashboard_app(
    source: str | asyncpg.Pool | Scheduler,
    *,
    token: str | None = None,
    schema: str | None = None,
    pgbouncer: bool = False,
    poll_seconds: float = 5.0,
) -> Starlette:
    """The dashboard as an ASGI app.

    ``source``: a DSN (the app opens and closes its own small pool), an
    asyncpg pool, or the application's Scheduler (its pool, schema and event
    listener; triggering a periodic job then finds the job's function).
    ``token``: needed for actions (retry, cancel, pause/resume,
    enable/disable, trigger; cancel, retry or fork a whole workflow); None
    makes the dashboard read-only. Reads are
    not protected: bind to localhost or mount behind the application's auth.
    ``poll_seconds``: how often pages refresh when live events are unavailable
    (and, between events, for heartbeats).
    """
    from .app import Dashboard, build_app

    return build_app(
        Dashboard(
            source, token=token, schema=schema, pgbouncer=pgbouncer, poll_seconds=poll_seconds
        )
    )


def __getattr__(name: str) -> Any:
    if name == "Dashboard":
        from .app import Dashboard

        return Dashboard
    raise AttributeError(name)


__all__ = ["dashboard_app"]
