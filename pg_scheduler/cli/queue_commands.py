"""``queues list``, ``pause``, ``resume`` and ``delete``."""

from __future__ import annotations

import argparse

import asyncpg

from ..enums import DEFAULT_QUEUE
from ..store import QueueStore
from ..store.orphans import OrphanStore
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
    known = name == DEFAULT_QUEUE or await OrphanStore(pool, args.schema).known("queue", name)
    if not args.force and not known:
        raise CommandError(
            f"no queue named {name!r} is known (no job has been in it, nothing configured "
            f"it); {'pausing' if args.pause else 'resuming'} it would create it: check the "
            "name (`pg-scheduler queues list`), or pass --force to create it before its "
            "first job",
            EXIT_USAGE,
        )
    await QueueStore(pool, args.schema).set_paused(name, args.pause)
    if args.json:
        emit_json({"queue": name, "paused": args.pause})
    else:
        print(f"{'paused' if args.pause else 'resumed'} queue {name}")
    return 0


async def cmd_queues_delete(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    """Drop a queue's stored row (a phantom created by a pause, say)."""
    paused = await QueueStore(pool, args.schema).delete(args.name, args.force)
    if paused is None:
        rows = {r["name"]: r for r in await QueueStore(pool, args.schema).queues()}
        row = rows.get(args.name)
        if row is not None and (row["pending"] or row["running"]):
            raise CommandError(
                f"queue {args.name!r} still has {row['pending']} pending and "
                f"{row['running']} running job(s): resume it instead, or --force "
                "to drop its setting anyway"
            )
        raise CommandError(f"no stored queue named {args.name!r}")
    if args.json:
        emit_json({"queue": args.name, "deleted": True, "was_paused": paused})
    else:
        print(f"deleted queue {args.name}" + (" (it was paused: resumed)" if paused else ""))
    return 0
