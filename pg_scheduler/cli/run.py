"""Commands that run things: ``worker``, ``migrate`` and ``demo``."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import inspect
import signal
import sys
from typing import Any

from ..api.queues import parse_queues_option
from ..support.log import get_logger
from .common import configure_logging, open_pool, run_cli

log = get_logger("pg_scheduler.cli")

# Past the grace period and the statements shutdown may still have to wait
# for (each bounded by statement_timeout), a worker told to stop cuts every
# connection and exits (docs: Failure model, SIGTERM during an outage).
SHUTDOWN_STATEMENTS = 3
SHUTDOWN_SLACK = 5.0


def register(commands: argparse._SubParsersAction) -> None:
    worker = commands.add_parser(
        "worker",
        help="run a worker for an application's tasks until SIGINT/SIGTERM",
        description="Import MODULE (registering its @task and @periodic functions) and run "
        "jobs until SIGINT or SIGTERM; the first signal shuts down gracefully, a second one "
        "hands running jobs back at once. ATTR, if given, names a dict of Scheduler keyword "
        "arguments in MODULE, or a function returning one.",
    )
    worker.add_argument("app", metavar="MODULE[:ATTR]")
    worker.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="max_concurrent_jobs (default: the app's, else 25)",
    )
    worker.add_argument(
        "--queues",
        type=_queues_option,
        default=None,
        metavar="Q[=N],...",
        help="serve only these queues: emails,reports, or with local concurrencies "
        "emails=20,reports=2 (default: the app's, else every queue)",
    )
    worker.add_argument(
        "--grace", type=float, default=None, help="seconds running jobs get to finish at shutdown"
    )
    worker.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="leave Python's garbage collector as it is: Scheduler gc_freeze=False "
        "(default: what is alive at start is frozen out of full collections; the app's "
        "dict may also set it)",
    )
    worker.set_defaults(handler=_cmd_worker)

    migrate = commands.add_parser("migrate", help="apply pending schema migrations")
    migrate.set_defaults(handler=_cmd_migrate)

    demo = commands.add_parser(
        "demo", help="schedule a mix of jobs and watch them run (embedded database by default)"
    )
    demo.add_argument("--seconds", type=float, default=12.0, help="how long to run")
    demo.set_defaults(handler=_cmd_demo)

    dsn = commands.add_parser(
        "dsn",
        help="print the embedded database's DSN (starting it if needed)",
        description="Start the embedded PostgreSQL the demo and the other commands use "
        "without --dsn (data in ~/.local/share/pg-scheduler/pgdata), leave it running, and "
        "print its DSN: PG_SCHEDULER_DSN=$(pg-scheduler dsn). --stop stops it.",
    )
    dsn.add_argument("--stop", action="store_true", help="stop the embedded server instead")
    dsn.set_defaults(handler=_cmd_dsn)


def _queues_option(text: str) -> list[str] | dict[str, int]:
    try:
        return parse_queues_option(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def load_app(spec: str) -> dict[str, Any]:
    """Import ``MODULE[:ATTR]``; return the Scheduler options ATTR names (or {})."""
    module_name, _, attr = spec.partition(":")
    if not module_name:
        raise SystemExit(f"error: {spec!r} names no module")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SystemExit(f"error: cannot import {module_name!r}: {exc}") from None
    if not attr:
        return {}
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise SystemExit(f"error: module {module_name!r} has no attribute {attr!r}") from None
    if callable(target):
        try:
            inspect.signature(target).bind()
        except TypeError:
            raise SystemExit(
                f"error: {spec} must be a dict of Scheduler options or a function "
                "taking no arguments that returns one"
            ) from None
        target = target()
    options = target
    if not isinstance(options, dict):
        raise SystemExit(f"error: {spec} must be a dict of Scheduler options (or return one)")
    return dict(options)


def _cmd_worker(args: argparse.Namespace) -> int:
    configure_logging(args)
    sys.path.insert(0, "")
    options = load_app(args.app)
    if args.concurrency is not None:
        options["max_concurrent_jobs"] = args.concurrency
    if args.grace is not None:
        options["shutdown_grace_period"] = args.grace
    if args.queues is not None:
        options["queues"] = args.queues
    # Command-line settings win over the app's dict; the app's win over defaults.
    if args.schema != "public" or "schema" not in options:
        options["schema"] = args.schema
    if args.pgbouncer:
        options["pgbouncer"] = True
    if args.listen_dsn:
        options["listen_dsn"] = args.listen_dsn
    if not args.gc_freeze:
        options["gc_freeze"] = False
    return run_cli(args, lambda: _worker(args, options))


async def _worker(args: argparse.Namespace, options: dict[str, Any]) -> int:
    from ..scheduler import Scheduler
    from ..support.connections import pool_options

    concurrency = int(options.get("max_concurrent_jobs", 25))
    # The worker's own pool: keepalives on its sockets, the server told to
    # end a vanished client's backend, the role's timeouts not applied.
    own = pool_options(pgbouncer=bool(args.pgbouncer or options.get("pgbouncer")))
    async with open_pool(args, max_size=max(10, min(concurrency, 50) // 2 + 5), **own) as pool:
        scheduler = Scheduler(pool, **options)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal(signame: str) -> None:
            if stop.is_set():
                log.warning("second signal: handing running jobs back now", signal=signame)
                scheduler.request_immediate_shutdown()
            else:
                log.info("shutting down gracefully (signal again to force)", signal=signame)
                stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig.name)
        await scheduler.start()
        await stop.wait()
        return await _shut_down(scheduler, pool)


async def _shut_down(scheduler: Any, pool: Any) -> int:
    """Shut ``scheduler`` down; if that outlasts its bound (the database is
    unreachable and the connections hang), hand the jobs back, cut every
    connection and return 1: a worker told to stop always stops."""
    bound = (
        scheduler.shutdown_grace_period
        + SHUTDOWN_STATEMENTS * scheduler.statement_timeout
        + SHUTDOWN_SLACK
    )
    shutdown = asyncio.ensure_future(scheduler.shutdown())
    try:
        await asyncio.wait_for(asyncio.shield(shutdown), bound)
        return 0
    except TimeoutError:
        pass
    log.error(
        "shutdown did not finish in time; closing every connection and exiting "
        "(jobs still running here will be rescued and run again)",
        seconds=round(bound, 1),
    )
    scheduler.request_immediate_shutdown()
    pool.terminate()
    try:
        await asyncio.wait_for(asyncio.shield(shutdown), scheduler.statement_timeout)
    except Exception as exc:
        log.error("shutdown ended with an error", error=repr(exc))
    return 1


def _cmd_migrate(args: argparse.Namespace) -> int:
    configure_logging(args)

    async def go() -> int:
        from ..store.migrate import MigrationError, migrate

        async with open_pool(args) as pool:
            try:
                applied = await migrate(pool, args.schema)
            except MigrationError as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
        print(f"applied migrations: {applied}" if applied else "schema is up to date")
        return 0

    return run_cli(args, go)


def _cmd_demo(args: argparse.Namespace) -> int:
    # The demo's table shows every outcome, retries included: log lines inside it
    # would only garble it. Only errors are logged, unless debug was asked for.
    if args.log_level != "debug":
        args.log_level = "error"
    configure_logging(args)
    from .demo import run_demo

    async def go() -> int:
        async with open_pool(args) as pool:
            await run_demo(pool, seconds=args.seconds)
        return 0

    return run_cli(args, go)


def _cmd_dsn(args: argparse.Namespace) -> int:
    from ..embedded import is_running, start

    try:
        if args.stop:
            if not is_running():
                print("the embedded server is not running")
                return 0
            # Attached in "stop" mode, this process is the last handle: the server
            # stops when it exits (unless another command is still using it).
            start(cleanup="stop")
            print("stopping the embedded server")
            return 0
        server = start(cleanup=None)  # stays up for the tools given its DSN
    except RuntimeError as exc:  # pgserver is not installed
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(server.dsn)
    return 0


__all__ = ["load_app", "register"]
