"""``periodic list``, ``enable``, ``disable`` and ``trigger``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import asyncpg

from ..store.housekeeping import OpsStore
from .output import EXIT_USAGE, CommandError, console, emit_json, table, when

if TYPE_CHECKING:
    from ..scheduler import Scheduler


async def resolve_periodic(pool: asyncpg.Pool, key: str, schema: str = "public") -> asyncpg.Record:
    """The stored periodic job whose dedup key, or else unique job name, is ``key``."""
    rows = await OpsStore(pool, schema).periodic_jobs(key)
    exact = [r for r in rows if r["dedup_key"] == key]
    if exact:
        return exact[0]
    if not rows:
        raise CommandError(f"no periodic job with dedup key or job name {key!r}")
    if len(rows) > 1:
        keys = ", ".join(r["dedup_key"] for r in rows)
        raise CommandError(f"job name {key!r} is ambiguous; use a dedup key: {keys}")
    return rows[0]


async def cmd_periodic_list(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    rows = await OpsStore(pool, args.schema).periodic_jobs()
    if args.json:
        emit_json([dict(r) for r in rows])
        return 0
    if not rows:
        console().print("No periodic jobs stored (a worker stores them when it starts).")
        return 0
    console().print(
        table(
            None,
            ("dedup key", "job name", "schedule", "enabled", "next run", "last run", "outcome"),
            [
                (
                    r["dedup_key"],
                    r["job_name"],
                    r["schedule"],
                    "yes" if r["enabled"] else "NO",
                    when(r["next_run"]) if r["enabled"] else None,
                    when(r["last_run"]),
                    r["last_outcome"],
                )
                for r in rows
            ],
        )
    )
    return 0


def _scheduler(pool: asyncpg.Pool, args: argparse.Namespace) -> Scheduler:
    from ..scheduler import Scheduler

    # Never started: only its public periodic methods are used.
    return Scheduler(
        pool,
        vacuum_enabled=False,
        run_periodic_jobs=False,
        schema=args.schema,
        pgbouncer=args.pgbouncer,
    )


async def cmd_periodic_enable(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    """``enable`` and ``disable``: ``args.enable`` says which."""
    row = await resolve_periodic(pool, args.key, args.schema)
    key = row["dedup_key"]
    if not await _scheduler(pool, args).set_periodic_job_enabled(key, args.enable):
        raise CommandError(f"no periodic job with dedup key {key!r}")
    if args.json:
        emit_json({"dedup_key": key, "job_name": row["job_name"], "enabled": args.enable})
    else:
        state = "enabled" if args.enable else "disabled"
        print(f"{state} {row['job_name']} ({key})")
    return 0


async def cmd_periodic_trigger(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    row = await resolve_periodic(pool, args.key, args.schema)
    key = row["dedup_key"]
    if args.app:
        from .run import load_app

        sys.path.insert(0, "")
        load_app(args.app.partition(":")[0])
    job_id = await _scheduler(pool, args).trigger_periodic_job(key)
    if job_id is None:
        raise CommandError(
            f"periodic job {row['job_name']} ({key}) is not registered in this process: "
            "pass --app MODULE, the module that declares it",
            EXIT_USAGE,
        )
    if args.json:
        emit_json({"dedup_key": key, "job_id": job_id})
    else:
        print(f"triggered {row['job_name']} ({key}): job {job_id}")
    return 0
