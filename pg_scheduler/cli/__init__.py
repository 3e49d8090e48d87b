"""The ``pg-scheduler`` command. Each module here adds its own subcommands."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import dashboard, ops, run


def add_global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The options every command shares. After the command name they default to
    SUPPRESS, so a value given before it is not overwritten by a default."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--dsn",
        default=default(None),
        help="PostgreSQL DSN (default: $PG_SCHEDULER_DSN, else the "
        "embedded database in the per-user data directory)",
    )
    parser.add_argument(
        "--log-format",
        choices=["console", "json"],
        default=default("console"),
        help="log output: human-readable console (default) or JSON lines",
    )
    parser.add_argument(
        "--log-level", default=default("info"), choices=["debug", "info", "warning", "error"]
    )
    parser.add_argument(
        "--pgbouncer",
        action="store_true",
        default=default(os.environ.get("PG_SCHEDULER_PGBOUNCER", "") not in ("", "0")),
        help="the DSN goes through pgbouncer in transaction mode: no prepared statements, "
        "session locks or SET; LISTEN only over --listen-dsn (default: $PG_SCHEDULER_PGBOUNCER)",
    )
    parser.add_argument(
        "--schema",
        default=default(os.environ.get("PG_SCHEDULER_SCHEMA") or "public"),
        help="the PostgreSQL schema of the scheduler's tables (default: $PG_SCHEDULER_SCHEMA, "
        "else public)",
    )
    parser.add_argument(
        "--listen-dsn",
        default=default(os.environ.get("PG_SCHEDULER_LISTEN_DSN") or None),
        help="a direct connection for LISTEN when --dsn goes through pgbouncer "
        "(default: $PG_SCHEDULER_LISTEN_DSN; without it, workers poll)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pg-scheduler",
        description="PostgreSQL-native job queue and scheduler for asyncio.",
    )
    add_global_options(parser, suppress=False)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run.register(commands)
    ops.register(commands)
    dashboard.register(commands)
    # Global options work after the command too (``status --dsn X``).
    for sub in _subcommand_parsers(parser):
        add_global_options(sub, suppress=True)
    return parser


def _subcommand_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every subcommand's parser, nested ones (``periodic list``) included."""
    found: list[argparse.ArgumentParser] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):
                found.append(sub)
                found += _subcommand_parsers(sub)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
