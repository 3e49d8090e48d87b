"""``fair-share list`` (the busiest keys: waiting, due, running, recent
starts, weight), ``fair-share weight KEY W`` and ``fair-share clear KEY``."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import asyncpg

from ..enqueue.fair import check_fair_share_key, check_fair_share_weight
from ..store.fair import FairStore
from ..store.names import Qualifier
from .output import CommandError, console, emit_json, table


def _store(pool: asyncpg.Pool, args: argparse.Namespace) -> FairStore:
    return FairStore(pool, Qualifier(args.schema))


async def cmd_fair_share_list(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    rows = [dict(r) for r in await _store(pool, args).busiest(args.limit)]
    if args.json:
        emit_json(rows)
        return 0
    if not rows:
        console().print("No fair share keys have work or a weight.")
        return 0
    console().print(
        table(
            None,
            ("key", "waiting", "due", "running", "recent starts", "weight"),
            [
                (
                    r["fair_share_key"],
                    r["waiting"],
                    r["due"],
                    r["running"],
                    f"{r['recent_starts']:.1f}",
                    "jobs'" if r["weight"] is None else f"{r['weight']:g}",
                )
                for r in rows
            ],
        )
    )
    return 0


async def cmd_fair_share_weight(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    weight = None if args.action == "clear" else args.weight
    try:
        check_fair_share_key(args.key)
        check_fair_share_weight(weight)
    except (TypeError, ValueError) as exc:
        raise CommandError(str(exc)) from None
    changed = await _store(pool, args).set_weight(args.key, weight)
    if weight is None and not changed:
        raise CommandError(f"no weight set on key {args.key!r}")
    if args.json:
        emit_json({"fair_share_key": args.key, "weight": weight})
    else:
        what = "its jobs' weights" if weight is None else f"weight {weight:g}"
        console().print(f"Key {args.key!r}: {what}.")
    return 0


def register(
    commands: argparse._SubParsersAction,
    json_flag: argparse.ArgumentParser,
    handler: Callable[..., Callable[[argparse.Namespace], int]],
) -> None:
    """Add ``fair-share`` and its actions."""
    fair = commands.add_parser(
        "fair-share",
        help="the busiest fair share keys; set or clear a key's weight",
        description="Due work of equal priority is shared between fair share keys in "
        "proportion to their weights. A weight set here wins over the jobs' own; every "
        "worker's next claim follows it.",
    )
    actions = fair.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list", parents=[json_flag], help="the busiest keys: waiting, due, running, recent starts"
    )
    listing.add_argument("--limit", type=int, default=20, metavar="N", help="at most N keys")
    listing.set_defaults(handler=handler(cmd_fair_share_list))
    weight = actions.add_parser("weight", parents=[json_flag], help="set a key's weight")
    weight.add_argument("key", metavar="KEY")
    weight.add_argument("weight", type=float, metavar="WEIGHT")
    clear = actions.add_parser("clear", parents=[json_flag], help="remove a key's weight")
    clear.add_argument("key", metavar="KEY")
    for sub in (weight, clear):
        sub.set_defaults(handler=handler(cmd_fair_share_weight))
