"""The read-only commands: ``status``, ``jobs`` and ``metrics``."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
from typing import Any

import asyncpg

from ..config import RetryPolicy
from ..models import Job
from ..stats import QueueStats, collect_stats
from ..store import Store
from ..store_housekeeping import OpsStore
from .output import (
    EXIT_USAGE,
    CommandError,
    ago,
    console,
    emit_json,
    first_line,
    table,
    when,
    window_name,
)

# -- status ---------------------------------------------------------------------------------


async def cmd_status(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    stats = await collect_stats(pool)
    if args.json:
        emit_json(stats.model_dump(mode="json"))
        return 0
    render_status(stats)
    return 0


def render_status(stats: QueueStats) -> None:
    out = console()
    counts = stats.counts
    out.print(
        f"[bold]Queue[/bold] at {when(stats.taken_at)}: {stats.due} due "
        f"(oldest waiting {ago(stats.oldest_pending_age)}), {stats.scheduled} scheduled, "
        f"{counts['running']} running; {stats.live_workers} live worker(s)"
    )
    task_rows = [
        (
            t.task_name,
            t.due,
            t.pending - t.due,
            t.running,
            t.completed,
            t.failed,
            t.cancelled,
            t.expired,
        )
        for t in stats.by_task
    ]
    task_rows.append(
        (
            "TOTAL",
            stats.due,
            stats.scheduled,
            counts["running"],
            counts["completed"],
            counts["failed"],
            counts["cancelled"],
            counts["expired"],
        )
    )
    columns = ("task", "due", "scheduled", "running", "completed", "failed", "cancelled", "expired")
    out.print(table("Jobs by task", columns, task_rows))
    if stats.workers:
        out.print(
            table(
                "Workers",
                ("worker", "host", "pid", "running", "last seen", "state"),
                [
                    (
                        w.worker_id,
                        w.hostname,
                        w.pid,
                        f"{w.running}/{w.max_concurrent}",
                        f"{ago(w.seen_seconds_ago)} ago",
                        "alive" if w.alive else "DEAD",
                    )
                    for w in stats.workers
                ],
            )
        )
    else:
        out.print("No workers registered.")
    out.print(
        table(
            "Finished recently",
            ("window", "completed", "failed", "cancelled", "expired", "per second", "failure rate"),
            [
                (
                    window_name(w.seconds),
                    "-" if stats.completed_deleted else w.completed,
                    w.failed,
                    w.cancelled,
                    w.expired,
                    None if w.throughput is None else f"{w.throughput:.3g}",
                    None if w.failure_rate is None else f"{w.failure_rate:.1%}",
                )
                for w in stats.windows
            ],
        )
    )
    if stats.completed_deleted:
        out.print("(completed jobs are deleted on completion: completed counts are unknown)")


# -- jobs -------------------------------------------------------------------------------------


async def load_job(pool: asyncpg.Pool, job_id: str) -> Job:
    """The job with ``job_id``; CommandError if there is none."""
    row = await Store(pool).get_job(job_id)
    if row is None:
        raise CommandError(f"no job with id {job_id!r}")
    return Job.from_record(row, RetryPolicy())


async def cmd_jobs(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    if args.job_id is not None:
        if args.status or args.task or args.since or args.until:
            raise CommandError("JOB_ID cannot be combined with filters", EXIT_USAGE)
        job = await load_job(pool, args.job_id)
        if args.json:
            emit_json(job.model_dump(mode="json"))
        else:
            render_job(job)
        return 0
    rows = await OpsStore(pool).list_jobs(
        args.status, args.task, args.since, args.until, args.limit
    )
    if args.json:
        emit_json([_job_summary(r) for r in rows])
        return 0
    out = console()
    if not rows:
        out.print("No jobs match.")
        return 0
    out.print(
        table(
            None,
            ("job id", "task", "status", "attempts", "due", "finished", "error"),
            [
                (
                    r["job_id"],
                    r["task_name"],
                    r["status"],
                    r["attempts"],
                    when(r["execution_time"]),
                    when(r["finished_at"]),
                    first_line(r["error_message"], 60),
                )
                for r in rows
            ],
        )
    )
    if len(rows) == args.limit:
        out.print(f"(first {args.limit}; use --limit for more)")
    return 0


def _job_summary(row: asyncpg.Record) -> dict[str, Any]:
    summary = dict(row)
    summary.pop("last_change", None)  # the sort key of the listing, not a job field
    summary["error"] = summary.pop("error_message")
    return summary


def render_job(job: Job) -> None:
    out = console()  # first: it explains a missing rich
    from rich.table import Table

    fields = [
        ("job id", job.job_id),
        ("job name", job.job_name),
        ("task", job.task_name),
        ("status", job.status.value),
        ("priority", job.priority.value),
        ("due", when(job.execution_time)),
        ("created", when(job.created_at)),
        ("started", when(job.started_at)),
        ("finished", when(job.finished_at)),
        ("attempts", f"{job.attempts} (retries {job.retry_count}/{job.max_retries})"),
        ("rescues", job.rescue_count),
        ("worker", job.worker_id),
        ("next retry", when(job.next_retry_at) if job.next_retry_at else None),
        ("args", json.dumps(job.args, default=str)),
        ("kwargs", json.dumps(job.kwargs, default=str)),
        ("result", None if job.result is None else json.dumps(job.result, default=str)),
        ("error", job.error),
    ]
    view = Table(show_header=False, show_edge=False, pad_edge=False, box=None)
    view.add_column(style="bold")
    view.add_column(overflow="fold")
    for name, value in fields:
        view.add_row(name, "-" if value is None else str(value))
    out.print(view)
    if job.traceback:
        out.print("[bold]traceback[/bold]")
        out.print(job.traceback.rstrip(), markup=False)


# -- metrics ----------------------------------------------------------------------------------


async def cmd_metrics(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    """Serve the statistics for Prometheus until SIGINT or SIGTERM."""
    from ..metrics import MetricsExporter

    exporter = MetricsExporter(pool, port=args.port, addr=args.addr, interval=args.interval)
    try:
        await exporter.start()
    except ImportError as exc:  # prometheus-client is the optional ``metrics`` extra
        raise CommandError(str(exc)) from None
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    print(f"serving metrics on http://{args.addr}:{exporter.port}/metrics", flush=True)
    await stop.wait()
    await exporter.stop()
    return 0
