"""The dashboard's ASGI application (Starlette): pages, JSON API, live stream.

Every page is the same static shell; ``static/app.js`` fetches the JSON API
and renders it with text nodes only, so nothing a job carries (arguments,
errors, names) is ever parsed as HTML. The live stream is server-sent events
fed by the job events of migration 0006 (one EventHub LISTEN); the page
falls back to polling when the stream is unavailable.

Actions are POSTs that need the token, compared in constant time, from the
``X-Dashboard-Token`` header (or ``Authorization: Bearer``; a plain HTML form
may send a ``token`` field instead). A cross-site page cannot set that header
nor know the token, so actions are CSRF-safe. Without a token configured the
dashboard is read-only: every action answers 403.

On a read replica (a hot standby, ``pg_is_in_recovery()``) the dashboard only
reads: no LISTEN (a standby refuses it; the pages poll), and every action
answers 409 with :data:`REPLICA_REFUSAL` before touching the database.
"""

from __future__ import annotations

import asyncio
import hmac
import html
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from importlib import resources
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import asyncpg

from ..notify.events import EventHub, Subscription
from ..notify.listener import Listener
from ..store.dashboard import DashboardStore
from ..store.names import check_schema
from ..support.install import install_hint
from ..support.log import get_logger
from .data import Conflict, NotFound
from .service import DashboardService

try:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles
except ImportError:  # pragma: no cover - the dashboard extra is not installed
    raise ImportError(f"the dashboard needs starlette: {install_hint('dashboard')}") from None

if TYPE_CHECKING:
    from ..scheduler import Scheduler

log = get_logger(__name__)

PAGES = ("overview", "jobs", "job", "workers", "queues", "periodic", "workflows", "graph")
TOKEN_HEADER = "x-dashboard-token"
#: Seconds between keep-alive comments on the event stream.
PING_SECONDS = 15.0
#: Events arriving within this many seconds go out as one message.
COALESCE_SECONDS = 0.2
#: What an action answers when the dashboard reads a standby.
REPLICA_REFUSAL = (
    "this dashboard reads a read replica (a standby in recovery); actions need the primary: "
    "run a dashboard with --dsn pointing at the primary to retry, cancel, pause or trigger"
)


class Dashboard:
    """The state behind one dashboard app: its pool, store, event hub and token."""

    def __init__(
        self,
        source: str | asyncpg.Pool | Scheduler,
        *,
        token: str | None = None,
        schema: str | None = None,
        pgbouncer: bool = False,
        poll_seconds: float = 5.0,
    ) -> None:
        if token is not None and (not isinstance(token, str) or not token):
            raise ValueError("token must be a non-empty str, or None for a read-only dashboard")
        if not isinstance(poll_seconds, int | float) or poll_seconds <= 0:
            raise ValueError(f"poll_seconds must be a positive number, got {poll_seconds!r}")
        self._dsn: str | None = None
        self._pool: asyncpg.Pool | None = None
        self._scheduler: Scheduler | None = None
        if isinstance(source, str):
            self._dsn = source
        elif isinstance(source, asyncpg.Pool):
            self._pool = source
        elif hasattr(source, "db_pool") and hasattr(source, "events_hub"):
            self._scheduler = source
            self._pool = source.db_pool
            schema = source.schema if schema is None else schema
            pgbouncer = pgbouncer or source.pgbouncer
        else:
            raise TypeError("source must be a DSN (str), an asyncpg.Pool or a Scheduler")
        self.schema = check_schema("public" if schema is None else schema)
        self.pgbouncer = pgbouncer
        self.token = token
        self.poll_seconds = float(poll_seconds)
        self._service: DashboardService | None = None
        self._hub: EventHub | None = None
        self._own_pool = False
        self._lock = asyncio.Lock()
        # The open event streams, and the loop they run on (end_streams).
        self._streams: set[Subscription] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ending = False
        #: True when the server is a standby in recovery: reads only, no LISTEN.
        self.replica = False

    @property
    def read_only(self) -> bool:
        return self.token is None

    async def service(self) -> DashboardService:
        """Open the pool (for a DSN) and read the catalog, once."""
        if self._service is not None:
            return self._service
        async with self._lock:
            if self._service is None:
                if self._pool is None:
                    options: dict[str, Any] = {"min_size": 1, "max_size": 5}
                    if self.pgbouncer:
                        options["statement_cache_size"] = 0
                    self._pool = await asyncpg.create_pool(self._dsn, **options)
                    self._own_pool = True
                store = await DashboardStore.open(self._pool, self.schema)
                self.replica = await store.in_recovery()
                self._service = DashboardService(
                    self._pool, store, self.schema, self._scheduler, self.pgbouncer
                )
        return self._service

    async def subscribe(self) -> Subscription | None:
        """A subscription to every event, or None when LISTEN is not available
        (or the server is shutting down: :meth:`end_streams`)."""
        if self._ending:
            return None
        service = await self.service()
        if self.replica:
            return None  # a standby refuses LISTEN: the page polls
        if self._hub is None:
            if self._scheduler is not None:
                self._hub = self._scheduler.events_hub
            else:
                listener = Listener(service.pool, {})
                self._hub = EventHub(
                    listener, service.pool, self.schema, enabled=not self.pgbouncer
                )
        if not await self._hub.listening():
            return None
        sub = self._hub.subscribe(None, maxsize=1000)
        await sub.ready()
        self._loop = asyncio.get_running_loop()
        self._streams.add(sub)
        return sub

    async def on_replica(self) -> bool:
        """Whether the server is (still) a standby; read again on each call,
        so that a promoted replica takes actions from then on."""
        service = await self.service()
        self.replica = await service.store.in_recovery()
        return self.replica

    def end_streams(self) -> None:
        """End every open event stream (and refuse new ones): call it when the
        server starts shutting down, so that its graceful shutdown does not
        wait on open browser tabs until it cancels them. Safe from a signal
        handler or another thread."""
        self._ending = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._close_streams)

    def _close_streams(self) -> None:
        for sub in list(self._streams):
            sub.close()  # its stream's generator ends, and with it the response
        self._streams.clear()

    def check_token(self, given: str | None) -> None:
        if self.token is None:
            raise PermissionError("the dashboard is read-only: start it with a token for actions")
        if given is None or not hmac.compare_digest(given.encode(), self.token.encode()):
            raise PermissionError("a valid dashboard token is required for this action")

    async def close(self) -> None:
        """Stop the event listener and close the pool this dashboard opened."""
        self._ending = True
        self._close_streams()
        if self._hub is not None and self._scheduler is None:
            await self._hub.close()
        self._hub = None
        if self._own_pool and self._pool is not None:
            await self._pool.close()
            self._pool = None
            self._service = None


def _shell(page: str, base: str, dashboard: Dashboard) -> str:
    template = resources.files(__package__).joinpath("static/index.html").read_text("utf-8")
    values = {
        "base": html.escape(base, quote=True),
        "page": page,
        "readonly": "true" if dashboard.read_only else "false",
        "replica": "true" if dashboard.replica else "false",
        "poll": f"{dashboard.poll_seconds:g}",
    }
    for key, value in values.items():
        template = template.replace("{{" + key + "}}", value)
    return template


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _api(
    read: Callable[[DashboardService, Request], Awaitable[Any]], dashboard: Dashboard
) -> Callable[[Request], Awaitable[Response]]:
    async def endpoint(request: Request) -> Response:
        try:
            service = await dashboard.service()
            return JSONResponse(await read(service, request))
        except NotFound as exc:
            return _error(404, str(exc))
        except (Conflict, asyncpg.UndefinedTableError, asyncpg.UndefinedColumnError) as exc:
            return _error(409, str(exc))
        except ValueError as exc:
            return _error(400, str(exc))
        except asyncpg.ReadOnlySQLTransactionError as exc:
            # A standby promoted or demoted since the last check, or a
            # read-only role or default_transaction_read_only: a write refused.
            return _error(
                409,
                f"the database refused a write ({exc}): it is a read replica or the role "
                "reads only; actions need the primary",
            )
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            return _error(503, f"database: {exc}")

    return endpoint


async def _body(request: Request) -> dict[str, Any]:
    kind = request.headers.get("content-type", "")
    if kind.startswith("application/json"):
        data = await request.json()
        if not isinstance(data, dict):
            raise ValueError("the request body must be a JSON object")
        return data
    if kind.startswith("application/x-www-form-urlencoded"):
        # Parsed here: starlette's form parser needs one more package.
        fields = parse_qs((await request.body()).decode("utf-8", "replace"))
        return {k: v[-1] for k, v in fields.items()}
    return {}


def _given_token(request: Request, body: dict[str, Any]) -> str | None:
    header = request.headers.get(TOKEN_HEADER)
    if header:
        return header
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    # Only a form post may carry it in the body: JS always sends the header.
    token = (
        body.get("token")
        if not request.headers.get("content-type", "").startswith("application/json")
        else None
    )
    return token if isinstance(token, str) else None


def _field(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} is required")
    return value


ACTIONS: dict[str, Callable[[DashboardService, dict[str, Any]], Awaitable[dict[str, Any]]]] = {
    "retry": lambda s, b: s.retry(_field(b, "job_id")),
    "cancel": lambda s, b: s.cancel(_field(b, "job_id")),
    "pause": lambda s, b: s.set_queue_paused(_field(b, "queue"), True),
    "resume": lambda s, b: s.set_queue_paused(_field(b, "queue"), False),
    "enable": lambda s, b: s.set_periodic_enabled(_field(b, "key"), True),
    "disable": lambda s, b: s.set_periodic_enabled(_field(b, "key"), False),
    "trigger": lambda s, b: s.trigger_periodic(_field(b, "key")),
    "cancel_workflow": lambda s, b: s.workflows.cancel(_field(b, "job_id")),
    "retry_workflow": lambda s, b: s.workflows.retry(_field(b, "job_id")),
    "fork_workflow": lambda s, b: s.workflows.fork(_field(b, "job_id"), b.get("from_step")),
    "signal_workflow": lambda s, b: s.workflows.signal(
        _field(b, "job_id"), _field(b, "name"), b.get("payload"), b.get("idempotency_key")
    ),
}


def build_app(dashboard: Dashboard) -> Starlette:
    async def page(request: Request) -> Response:
        name = request.path_params.get("page", "overview")
        if name not in PAGES:
            return HTMLResponse("not found", status_code=404)
        base = request.scope.get("root_path", "").rstrip("/")
        try:
            await dashboard.service()  # learns whether the server is a replica
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            pass  # the page shows the API's error when it fetches
        return HTMLResponse(_shell(name, base, dashboard))

    async def action(request: Request) -> Response:
        name = request.path_params["name"]
        run = ACTIONS.get(name)
        if run is None:
            return _error(404, f"no action {name!r}")
        try:
            body = await _body(request)
        except ValueError as exc:
            return _error(400, f"bad request body: {exc}")
        try:
            replica = await dashboard.on_replica()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            return _error(503, f"database: {exc}")
        if replica:
            return _error(409, REPLICA_REFUSAL)
        try:
            dashboard.check_token(_given_token(request, body))
        except PermissionError as exc:
            return _error(403, str(exc))
        return await _api(lambda service, _request: run(service, body), dashboard)(request)

    async def config(_request: Request) -> Response:
        try:
            await dashboard.service()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            return _error(503, f"database: {exc}")
        return JSONResponse(
            {
                "read_only": dashboard.read_only or dashboard.replica,
                "replica": dashboard.replica,
                "poll_seconds": dashboard.poll_seconds,
            }
        )

    async def stream(_request: Request) -> Response:
        try:
            sub = await dashboard.subscribe()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, RuntimeError) as exc:
            log.warning("dashboard event stream unavailable", error=repr(exc))
            sub = None
        return StreamingResponse(
            _events(sub, dashboard._streams.discard),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    api = {
        "overview": lambda s, r: s.overview(),
        "jobs": lambda s, r: s.jobs(dict(r.query_params)),
        "job": lambda s, r: s.job(
            r.query_params.get("id", ""),
            r.query_params.get("steps_after"),
            r.query_params.get("children_after"),
        ),
        "workers": lambda s, r: s.workers(),
        "queues": lambda s, r: s.queues(),
        "periodic": lambda s, r: s.periodic(),
        "workflows": lambda s, r: s.workflows.listing(dict(r.query_params)),
        "graph": lambda s, r: s.workflows.graph(r.query_params.get("id", "")),
    }
    routes = [
        Route("/", page),
        *(Route(f"/api/{name}", _api(read, dashboard)) for name, read in api.items()),
        Route("/api/config", config),
        Route("/api/stream", stream),
        Route("/api/action/{name}", action, methods=["POST"]),
        Mount("/static", StaticFiles(packages=[(__package__, "static")]), name="static"),
        Route("/{page}", page),
    ]

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        await dashboard.close()

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.dashboard = dashboard
    return app


async def _events(
    sub: Subscription | None, forget: Callable[[Subscription], None]
) -> AsyncIterator[str]:
    if sub is None:
        # No LISTEN (pgbouncer without listen_dsn, or a standby): the page polls.
        yield 'event: mode\ndata: {"live": false}\n\n'
        return
    loop = asyncio.get_running_loop()
    try:
        yield 'retry: 3000\nevent: mode\ndata: {"live": true}\n\n'
        while True:
            try:
                first = await asyncio.wait_for(anext(sub), PING_SECONDS)
            except TimeoutError:
                yield ": ping\n\n"
                continue
            except StopAsyncIteration:
                return
            batch = [first]
            deadline = loop.time() + COALESCE_SECONDS
            while len(batch) < 500 and (left := deadline - loop.time()) > 0:
                try:
                    batch.append(await asyncio.wait_for(anext(sub), left))
                except (TimeoutError, StopAsyncIteration):
                    break
            kinds: dict[str, int] = {}
            for event in batch:
                kinds[event.kind] = kinds.get(event.kind, 0) + 1
            named = sorted({e.job_id for e in batch if e.job_id is not None})
            # "more": the batch named more jobs than it lists (a page showing
            # some jobs refreshes on it whatever they are).
            data = {"kinds": kinds, "jobs": named[:100], "more": len(named) > 100}
            yield f"event: change\ndata: {json.dumps(data)}\n\n"
    finally:
        sub.close()
        forget(sub)
