"""The ``pg-scheduler`` command. Each module here adds its own subcommands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import ops, run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pg-scheduler",
        description="PostgreSQL-native job queue and scheduler for asyncio.",
    )
    parser.add_argument(
        "--dsn",
        help="PostgreSQL DSN (default: $PG_SCHEDULER_DSN, else the "
        "embedded database in the per-user data directory)",
    )
    parser.add_argument(
        "--log-format",
        choices=["console", "json"],
        default="console",
        help="log output: human-readable console (default) or JSON lines",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run.register(commands)
    ops.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.handler(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
