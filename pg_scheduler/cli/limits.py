"""``limits list``, ``set`` and ``clear`` (also ``delete``, ``unset``): global
limits per task or queue; ``limits keys``: the busiest concurrency keys."""

from __future__ import annotations

import argparse

import asyncpg

from ..limits import Limits, check_scope, key_record, limit_record
from ..store.keys import KeyStore
from ..store.limits import LimitStore
from ..store.names import Qualifier
from ..store.orphans import OrphanStore
from .output import EXIT_USAGE, CommandError, console, emit_json, table


def _store(pool: asyncpg.Pool, args: argparse.Namespace) -> LimitStore:
    return LimitStore(pool, Qualifier(args.schema))


async def cmd_limits_list(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    rows = [limit_record(r) for r in await _store(pool, args).listing()]
    if args.json:
        emit_json(rows)
        return 0
    keys = [key_record(r) for r in await KeyStore(Qualifier(args.schema)).busiest(pool, 10)]
    if not rows:
        console().print("No limits set.")
        if keys:
            _print_keys(keys)
        return 0
    console().print(
        table(
            None,
            ("scope", "name", "max running", "running", "rate limit", "started in window"),
            [
                (
                    r["scope"],
                    r["name"],
                    r["max_running"],
                    r["running"],
                    r["rate_limit"],
                    r["started_in_window"],
                )
                for r in rows
            ],
        )
    )
    if keys:
        _print_keys(keys)
    return 0


async def cmd_limits_keys(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    """The busiest concurrency keys (docs/keys.md)."""
    keys = [key_record(r) for r in await KeyStore(Qualifier(args.schema)).busiest(pool, args.top)]
    if args.json:
        emit_json(keys)
    elif not keys:
        console().print("No job with a concurrency key is pending or running.")
    else:
        _print_keys(keys)
    return 0


def _print_keys(keys: list[dict]) -> None:
    console().print(
        table(
            "Busiest concurrency keys",
            (
                "key",
                "running",
                "max running",
                "waiting",
                "rate limit",
                "started in window",
                "ordered",
            ),
            [
                (
                    k["key"],
                    k["running"],
                    k["max_running_per_key"],
                    k["waiting"],
                    k["rate_limit_per_key"],
                    k["started_in_window"],
                    "yes" if k["ordered"] else "",
                )
                for k in keys
            ],
        )
    )


async def cmd_limits_set(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    try:
        check_scope(args.scope, args.name)
        limits = Limits.of(args.max_running, args.rate_limit)
    except (TypeError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    store = _store(pool, args)
    if limits.empty:
        raise CommandError("give --max-running and/or --rate-limit (or use `limits clear`)")
    if not args.force and not await OrphanStore(pool, args.schema).known(args.scope, args.name):
        what = "worker lists it, no job has it" if args.scope == "task" else "job has been in it"
        raise CommandError(
            f"no {args.scope} named {args.name!r} is known (no {what}): check the name, "
            f"or pass --force to set a limit before its first job",
            EXIT_USAGE,
        )
    rate = limits.rate_limit
    await store.set(
        args.scope,
        args.name,
        limits.max_running,
        None if rate is None else rate.count,
        None if rate is None else rate.period,
    )
    return await _show_one(store, args)


async def cmd_limits_clear(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    removed = await _store(pool, args).clear(args.scope, args.name)
    if not removed:
        raise CommandError(f"no limit on {args.scope} {args.name!r}")
    if args.json:
        emit_json({"scope": args.scope, "name": args.name, "removed": True})
    else:
        console().print(f"Removed the limits of {args.scope} {args.name}.")
    return 0


async def _show_one(store: LimitStore, args: argparse.Namespace) -> int:
    rows = [limit_record(r) for r in await store.listing()]
    row = next(r for r in rows if (r["scope"], r["name"]) == (args.scope, args.name))
    if args.json:
        emit_json(row)
    else:
        console().print(
            f"{row['scope']} {row['name']}: max running {row['max_running'] or '-'}, "
            f"rate limit {row['rate_limit'] or '-'}"
        )
    return 0
