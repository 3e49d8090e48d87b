"""The commands that change jobs: ``retry``, ``cancel`` and ``vacuum``."""

from __future__ import annotations

import argparse
import os
import socket
import sys

import asyncpg

from ..config import VacuumConfig
from ..enums import FINAL_STATUS_VALUES
from ..store import Store
from ..store.cli import CliStore
from ..store.housekeeping import RETRYABLE_STATUSES, OpsStore, VacuumStore
from .output import (
    EXIT_BUSY,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    CommandError,
    confirm,
    console,
    emit_json,
    table,
)
from .reports import load_job

# Ids per UPDATE when retrying every failed job.
_RETRY_BATCH = 1000


async def cmd_retry(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    if bool(args.job_ids) == bool(args.failed):
        raise CommandError("give JOB_ID(s) or --failed (not both)", EXIT_USAGE)
    if args.task and not args.failed:
        raise CommandError("--task only goes with --failed", EXIT_USAGE)
    if args.dry_run and not args.failed:
        raise CommandError("--dry-run only goes with --failed", EXIT_USAGE)
    ops = OpsStore(pool, args.schema)
    problems: list[str] = []
    if args.failed:
        candidates = await ops.failed_ids(args.task)
        if args.dry_run:
            if args.json:
                emit_json({"would_retry": candidates, "dry_run": True})
            else:
                print(f"would retry {len(candidates)} job(s) (dry run)")
                for job_id in candidates:
                    print(job_id)
            return 0
        if candidates:
            which = f" of {args.task}" if args.task else ""
            confirm(f"retry {len(candidates)} failed job(s){which}", args)
        retried: list[str] = []
        for start in range(0, len(candidates), _RETRY_BATCH):
            retried += await ops.retry(candidates[start : start + _RETRY_BATCH])
    else:
        retried = await ops.retry(args.job_ids)
        for job_id in args.job_ids:
            if job_id in retried:
                continue
            row = await Store(pool, args.schema).get_job(job_id)
            if row is None:
                problems.append(f"no job with id {job_id!r}")
            else:
                problems.append(
                    f"job {job_id!r} is {row['status']}; only "
                    f"{', '.join(RETRYABLE_STATUSES)} jobs can be retried"
                )
    if args.json:
        emit_json({"retried": retried, "errors": problems})
    elif retried or not problems:
        # Nothing retried because of errors: the errors alone say it.
        print(
            f"retried {len(retried)} job(s)" + (": " + ", ".join(retried[:20]) if retried else "")
        )
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return EXIT_NOT_FOUND if problems else 0


async def cmd_cancel(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    if not await Store(pool, args.schema).cancel(args.job_id):
        job = await load_job(pool, args.job_id, args.schema)
        raise CommandError(f"job {args.job_id!r} is already {job.status.value}; not cancelled")
    if args.json:
        emit_json({"cancelled": args.job_id})
    else:
        print(f"cancelled {args.job_id}")
    return 0


async def cmd_vacuum(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    from ..services.vacuum import VacuumService

    chosen = {
        name: getattr(args, name) for name in FINAL_STATUS_VALUES if getattr(args, name) is not None
    }
    config = VacuumConfig(**chosen, batch_size=args.batch_size, track_metrics=args.track_metrics)
    preview = await CliStore(pool, args.schema).vacuum_preview(config.policies())
    if args.dry_run:
        if args.json:
            emit_json({"would_delete": preview, "dry_run": True})
        else:
            console().print(
                table("Would delete (dry run)", ("status", "would delete"), list(preview.items()))
            )
        return 0
    total = sum(preview.values())
    if total:
        detail = ", ".join(f"{n} {status}" for status, n in preview.items() if n)
        confirm(f"delete {total} finished job(s) ({detail})", args)
    worker_id = f"cli-{socket.gethostname()}-{os.getpid()}"
    counts = await VacuumService(VacuumStore(pool, args.schema), config, worker_id).run_once()
    if counts is None:
        raise CommandError("skipped: another process is vacuuming right now", EXIT_BUSY)
    if args.json:
        emit_json({"deleted": counts})
    else:
        console().print(table("Deleted", ("status", "deleted"), list(counts.items())))
    return 0
