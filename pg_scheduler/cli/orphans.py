"""``pg-scheduler orphans``: work no live process serves, listed and removed.

Orphaned jobs are due jobs whose task no live worker has registered; orphaned
periodic jobs are stored periodic jobs no live process declares (see
``store/orphans.py``). ``--delete`` removes both (a periodic job with its
pending windows), each statement checking again that no worker took them up.
"""

from __future__ import annotations

import argparse
from typing import Any

import asyncpg

from ..observe.stats import task_label
from ..store.orphans import Orphans, OrphanStore
from .output import CommandError, confirm, console, emit_json, json_value, table, when

#: A worker seen within this many seconds counts as live (the Scheduler's default).
DEFAULT_THRESHOLD = 120.0


def register(commands: argparse._SubParsersAction, json_flag: argparse.ArgumentParser) -> Any:
    orphans = commands.add_parser(
        "orphans",
        parents=[json_flag],
        help="list (or --delete) due jobs and periodic jobs no live worker runs",
        description="Orphaned jobs: due jobs whose task no live worker has registered (a "
        "stopped app, a renamed task, a typo). Orphaned periodic jobs: stored periodic jobs "
        "no live process declares. NAME limits it to these task names (a periodic job also "
        "by its dedup key or job name). --delete removes them, a periodic job with its "
        "pending windows; it asks first unless --yes.",
    )
    orphans.add_argument("names", nargs="*", metavar="NAME")
    orphans.add_argument(
        "--delete", action="store_true", help="delete what is listed (asks unless --yes)"
    )
    orphans.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    orphans.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        metavar="SECONDS",
        help="a worker seen within SECONDS is live (120, the Scheduler's default)",
    )
    return orphans


def _summary(found: Orphans) -> str:
    jobs = sum(o.due for o in found.jobs)
    windows = sum(p.pending for p in found.periodic)
    return (
        f"{jobs} orphaned due job(s) of {len(found.jobs)} task/queue group(s), "
        f"{len(found.periodic)} orphaned periodic job(s) with {windows} pending window(s)"
    )


async def cmd_orphans(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    store = OrphanStore(pool, args.schema)
    found = await store.read(args.threshold, args.names or None)
    names = await store.periodic_names()
    if not args.delete:
        if args.json:
            emit_json(
                {
                    "jobs": [json_value(o._asdict()) for o in found.jobs],
                    "periodic": [json_value(p._asdict()) for p in found.periodic],
                }
            )
        else:
            render_orphans(found, names)
        return 0
    if not found:
        if args.names:
            raise CommandError(f"nothing orphaned among {', '.join(args.names)}")
        _done(args, 0, [], 0)
        return 0
    confirm(f"delete {_summary(found)}", args)
    removed = await store.delete(args.threshold, args.names or None)
    _done(args, removed.jobs, removed.periodic, removed.windows)
    return 0


def _done(args: argparse.Namespace, jobs: int, periodic: list[str], windows: int) -> None:
    if args.json:
        emit_json({"deleted_jobs": jobs, "deleted_periodic": periodic, "deleted_windows": windows})
    else:
        print(
            f"deleted {jobs} orphaned job(s) and {len(periodic)} periodic job(s) "
            f"with {windows} pending window(s)"
        )


def render_orphans(found: Orphans, names: dict[str, str], out: Any = None) -> None:
    """The orphaned work as tables (``status`` prints them too); a line when none."""
    out = out or console()
    if not found:
        out.print("Nothing orphaned: every due job and periodic job has a live worker.")
        return
    if found.jobs:
        out.print(
            table(
                "Orphaned jobs: due, and no live worker has their task",
                ("task", "queue", "due", "due since"),
                [
                    (task_label(o.task_name, names), o.queue, o.due, when(o.oldest_due))
                    for o in found.jobs
                ],
            )
        )
    if found.periodic:
        out.print(
            table(
                "Orphaned periodic jobs: no live process declares them",
                ("periodic job", "schedule", "pending windows", "next run"),
                [
                    (task_label(p.task_name, names), p.schedule, p.pending, when(p.next_run))
                    for p in found.periodic
                ],
            )
        )
    out.print("Remove them with `pg-scheduler orphans --delete` (or start their worker).")
