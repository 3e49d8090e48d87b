"""``pg-scheduler dashboard``: serve the web dashboard (extra ``dashboard``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from ..support.install import install_hint
from .common import configure_logging, embedded_dsn, failure_line, resolve_dsn, run_cli


def register(commands: argparse._SubParsersAction) -> None:
    dashboard = commands.add_parser(
        "dashboard",
        help="serve the live web dashboard (embedded database by default)",
        description="Serve the dashboard at http://HOST:PORT/ until Ctrl-C. Without --token "
        "(or $PG_SCHEDULER_DASHBOARD_TOKEN) it is read-only; with one, retry, cancel, "
        "pause/resume and the periodic actions need it. Reads are not protected: keep the "
        "default 127.0.0.1 or put it behind your own auth. Needs the dashboard extra: "
        f"{install_hint('dashboard')}.",
    )
    dashboard.add_argument("--host", default="127.0.0.1", help="address to bind (127.0.0.1)")
    dashboard.add_argument("--port", type=int, default=8080, help="port (8080)")
    dashboard.add_argument(
        "--token",
        default=os.environ.get("PG_SCHEDULER_DASHBOARD_TOKEN") or None,
        help="the token actions need (default: $PG_SCHEDULER_DASHBOARD_TOKEN; none: read-only)",
    )
    dashboard.add_argument(
        "--app",
        metavar="MODULE",
        help="import MODULE first, so that triggering its @periodic jobs works",
    )
    dashboard.add_argument(
        "--poll", type=float, default=5.0, help="seconds between refreshes without events (5)"
    )
    dashboard.set_defaults(handler=_cmd_dashboard)


def _cmd_dashboard(args: argparse.Namespace) -> int:
    configure_logging(args)
    try:
        import uvicorn

        from ..dashboard import dashboard_app
    except ImportError as exc:
        print(
            f"error: {exc}: the dashboard needs its extra: {install_hint('dashboard')}",
            file=sys.stderr,
        )
        return 1
    if args.app:
        from .run import load_app

        sys.path.insert(0, "")
        load_app(args.app.partition(":")[0])
    dsn = resolve_dsn(args)
    if dsn is None:
        # The embedded database may be brand new: give it the schema first.
        try:
            dsn = embedded_dsn()
        except Exception as exc:
            line = failure_line(exc, None)
            if line is None:
                raise
            print(line, file=sys.stderr)
            return 1
        embedded = dsn
        code = run_cli(args, lambda: _migrate(embedded, args.schema))
        if code:
            return code
    app = dashboard_app(
        dsn, token=args.token, schema=args.schema, pgbouncer=args.pgbouncer, poll_seconds=args.poll
    )
    mode = "actions need the token" if args.token else "read-only: no --token"
    print(f"pg_scheduler dashboard on http://{args.host}:{args.port}/ ({mode})", flush=True)
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=2,
    )
    dashboard = app.state.dashboard

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            # Open browser tabs hold event streams: end them at once, so the
            # graceful shutdown finishes instead of cancelling them.
            dashboard.end_streams()
            super().handle_exit(sig, frame)

    try:
        Server(config).run()
    except KeyboardInterrupt:
        pass  # the Ctrl-C uvicorn raises again once it has shut down
    return 0


async def _migrate(dsn: str, schema: str) -> int:
    import asyncpg

    from ..store.migrate import migrate

    conn = await asyncio.wait_for(asyncpg.connect(dsn), 30)
    try:
        await migrate(conn, schema)
    finally:
        await conn.close()
    return 0
