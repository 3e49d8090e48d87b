"""``queues list``, ``pause`` and ``resume``."""

from __future__ import annotations

import argparse

import asyncpg

from ..store import QueueStore
from ..support.validation import check_queue
from .output import EXIT_USAGE, CommandError, console, emit_json, table


async def cmd_queues_list(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    rows = [dict(r) for r in await QueueStore(pool, args.schema).queues()]
    if args.json:
        emit_json(rows)
        return 0
    if not rows:
        console().print("No queues yet (a queue appears with its first job, or when paused).")
        return 0
    console().print(
        table(
            None,
            ("queue", "paused", "pending", "due", "running"),
            [
                (r["name"], "PAUSED" if r["paused"] else "no", r["pending"], r["due"], r["running"])
                for r in rows
            ],
        )
    )
    return 0


async def cmd_queues_pause(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    """``pause`` and ``resume``: ``args.pause`` says which."""
    try:
        name = check_queue(args.name)
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from None
    await QueueStore(pool, args.schema).set_paused(name, args.pause)
    if args.json:
        emit_json({"queue": name, "paused": args.pause})
    else:
        print(f"{'paused' if args.pause else 'resumed'} queue {name}")
    return 0
