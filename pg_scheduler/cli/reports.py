"""The read-only commands: ``status``, ``jobs`` and ``metrics``."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import signal
import sys
from typing import Any

import asyncpg

from ..config import RetryPolicy
from ..models import Job
from ..observe.stats import QueueStats, collect_stats
from ..store import Store
from ..store.cli import CliStore
from .output import (
    EXIT_USAGE,
    CommandError,
    ago,
    console,
    emit_json,
    first_line,
    interactive,
    json_value,
    table,
    when,
    window_name,
)

# -- status ---------------------------------------------------------------------------------


async def cmd_status(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    if getattr(args, "watch", False):
        return await watch_status(pool, args)
    stats = await collect_stats(pool, schema=args.schema)
    if args.json:
        emit_json(stats.model_dump(mode="json"))
        return 0
    render_status(stats)
    return 0


# Home, then clear the screen: each frame replaces the last one on a terminal.
_CLEAR = "\x1b[H\x1b[2J"


async def watch_status(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    """Redraw the status every ``--interval`` seconds until Ctrl-C, EOF (Ctrl-D) on the
    terminal, or ``--iterations`` frames. With --json: one JSON document per line."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    watching_stdin = interactive()
    if watching_stdin:

        def on_input() -> None:
            # A line ("q" + Enter) or EOF ends the watch.
            sys.stdin.readline()
            stop.set()

        loop.add_reader(sys.stdin.fileno(), on_input)
    in_place = sys.stdout.isatty() and not args.json
    frames = 0
    try:
        while True:
            stats = await collect_stats(pool, schema=args.schema)
            if args.json:
                emit_json(stats.model_dump(mode="json"), indent=None)
            else:
                frame = io.StringIO()
                render_status(stats, console(file=frame, terminal=in_place or None))
                footer = f"(every {args.interval:g}s; Ctrl-C or Ctrl-D to stop)"
                text = frame.getvalue() + footer + "\n"
                sys.stdout.write((_CLEAR if in_place else "\n" if frames else "") + text)
                sys.stdout.flush()
            frames += 1
            if args.iterations is not None and frames >= args.iterations:
                return 0
            try:
                await asyncio.wait_for(stop.wait(), args.interval)
                return 0
            except TimeoutError:
                pass
    finally:
        if watching_stdin:
            loop.remove_reader(sys.stdin.fileno())


def render_status(stats: QueueStats, out: Any = None) -> None:
    out = out or console()
    counts = stats.counts
    out.print(
        f"[bold]Queue[/bold] at {when(stats.taken_at)}: {stats.due} due "
        f"(oldest waiting {ago(stats.oldest_pending_age)}), {stats.scheduled} scheduled, "
        f"{counts['running']} running"
        + (f", {counts['waiting']} waiting (parked workflows)" if counts.get("waiting") else "")
        + f"; {stats.live_workers} live worker(s)"
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
    # Only once queues are in use: a single "default" queue says nothing new.
    if any(q.queue != "default" or q.paused for q in stats.by_queue):
        out.print(
            table(
                "Queues",
                ("queue", "due", "scheduled", "running", "state"),
                [
                    (q.queue, q.due, q.pending - q.due, q.running, "PAUSED" if q.paused else "")
                    for q in stats.by_queue
                ],
            )
        )
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
    if stats.limits:
        out.print(
            table(
                "Limits",
                ("scope", "name", "running", "max running", "rate limit", "started in window"),
                [
                    (
                        x.scope,
                        x.name,
                        x.running,
                        x.max_running,
                        x.rate_limit,
                        x.started_in_window,
                    )
                    for x in stats.limits
                ],
            )
        )
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


async def load_job(pool: asyncpg.Pool, job_id: str, schema: str = "public") -> Job:
    """The job with ``job_id``; CommandError if there is none."""
    row = await Store(pool, schema).get_job(job_id)
    if row is None:
        raise CommandError(f"no job with id {job_id!r}")
    return Job.from_record(row, RetryPolicy())


async def cmd_jobs(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    if args.job_id is not None:
        if args.status or args.task or args.since or args.until:
            raise CommandError("JOB_ID cannot be combined with filters", EXIT_USAGE)
        job = await load_job(pool, args.job_id, args.schema)
        if args.json:
            emit_json(job_json(job))
        else:
            render_job(job)
        return 0
    rows = await CliStore(pool, args.schema).list_jobs(
        args.status, args.task, args.since, args.until, args.limit
    )
    jobs = [Job.from_record(r, RetryPolicy()) for r in rows]
    if args.json:
        emit_json([job_json(j) for j in jobs])
        return 0
    out = console()
    if not jobs:
        out.print("No jobs match.")
        return 0
    out.print(
        table(
            None,
            ("job id", "task", "status", "priority", "attempts", "due", "finished", "error"),
            [
                (
                    j.job_id,
                    j.task_name,
                    j.status.value,
                    j.priority.value,
                    j.attempts,
                    when(j.execution_time),
                    when(j.finished_at),
                    first_line(j.error, 60),
                )
                for j in jobs
            ],
        )
    )
    if len(jobs) == args.limit:
        out.print(f"(first {args.limit}; use --limit for more)")
    return 0


def job_json(job: Job) -> dict[str, Any]:
    """A job's one JSON shape, in a listing and in detail: every field of
    :class:`~pg_scheduler.models.Job`, times in ISO 8601 UTC, priority by name."""
    return json_value(job.model_dump())


def _waits_for(job: Job) -> str | None:
    """What a parked workflow waits for: "signal approved until ...", "sleep until ..."."""
    if job.wait_kind is None:
        return None
    what = job.wait_kind if job.wait_for is None else f"{job.wait_kind} {job.wait_for}"
    return what if job.wake_at is None else f"{what} until {when(job.wake_at)}"


def render_job(job: Job) -> None:
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
        ("waits for", _waits_for(job)),
        ("parent", job.parent_job_id),
        ("dedupe key", f"{job.dedupe_key} (scope {job.dedupe_scope})" if job.dedupe_key else None),
        ("next retry", when(job.next_retry_at) if job.next_retry_at else None),
        ("args", json.dumps(job.args, default=str)),
        ("kwargs", json.dumps(job.kwargs, default=str)),
        ("result", None if job.result is None else json.dumps(job.result, default=str)),
        ("error", job.error),
    ]
    out = console()
    out.print(table(None, ("field", "value"), fields, header=False))
    if job.traceback:
        out.print("[bold]traceback[/bold]")
        out.print(job.traceback.rstrip(), markup=False)
    # Every attempt, oldest first (tracebacks: --json).
    if job.progress is not None:
        out.print(f"[bold]progress[/bold] {job.progress:.0%} {job.progress_message or ''}")
    if job.attempt_history:
        attempts = [
            (
                a.attempt,
                a.outcome or "running",
                a.worker_id,
                when(a.started_at),
                when(a.finished_at),
                first_line(a.error, 60),
            )
            for a in job.attempt_history
        ]
        header = ("attempt", "outcome", "worker", "started", "finished", "error")
        out.print(table("attempts", header, attempts))


# -- metrics ----------------------------------------------------------------------------------


async def cmd_metrics(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    """Serve the statistics for Prometheus until SIGINT or SIGTERM."""
    from ..observe.metrics import MetricsExporter

    exporter = MetricsExporter(
        pool, port=args.port, addr=args.addr, interval=args.interval, schema=args.schema
    )
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
