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
from ..enums import DEFAULT_QUEUE, FINAL_STATUS_VALUES
from ..models import Job
from ..observe.stats import QueueStats, collect_stats
from ..store import Store
from ..store.cli import CliStore
from ..store.orphans import OrphanedJobs, OrphanedPeriodic, Orphans
from ..store.workflow_views import WorkflowViews, is_workflow_row
from .orphans import render_orphans
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
        f"{counts['running']} running, {counts['waiting']} waiting; "
        f"{stats.live_workers} live worker(s)"
    )
    task_rows = [
        (
            stats.label(t.task_name),
            t.due,
            t.pending - t.due,
            t.running,
            t.waiting,
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
            counts["waiting"],
            counts["completed"],
            counts["failed"],
            counts["cancelled"],
            counts["expired"],
        )
    )
    columns = ("task", "due", "scheduled", "running", "waiting", *FINAL_STATUS_VALUES)
    out.print(table("Jobs by task", columns, task_rows))
    if stats.orphaned_jobs or stats.orphaned_periodic:
        render_orphans(
            Orphans(
                [OrphanedJobs(**o.model_dump()) for o in stats.orphaned_jobs],
                [OrphanedPeriodic(**p.model_dump()) for p in stats.orphaned_periodic],
            ),
            stats.periodic_names,
            out,
        )
    # Only once queues are in use: a single "default" queue says nothing new.
    if any(q.queue != DEFAULT_QUEUE or q.paused for q in stats.by_queue):
        out.print(
            table(
                "Queues",
                ("queue", "due", "scheduled", "running", "waiting", "state"),
                [
                    (
                        q.queue,
                        q.due,
                        q.pending - q.due,
                        q.running,
                        q.waiting,
                        "PAUSED" if q.paused else "",
                    )
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
    if stats.keys:
        out.print(
            table(
                "Busiest concurrency keys",
                ("key", "running", "max running", "waiting", "rate limit", "started in window"),
                [
                    (
                        k.key,
                        k.running,
                        k.max_running_per_key,
                        k.waiting,
                        k.rate_limit_per_key,
                        k.started_in_window,
                    )
                    for k in stats.keys
                ],
            )
        )
    if stats.fair_share:
        out.print(
            table(
                "Fair share keys",
                ("key", "weight", "waiting", "due", "running", "recent starts", "share"),
                [
                    (
                        f.key,
                        "jobs'" if f.weight is None else f"{f.weight:g}",
                        f.waiting,
                        f.due,
                        f.running,
                        f"{f.recent_starts:.1f}",
                        f"{f.share:.1%}",
                    )
                    for f in stats.fair_share
                ],
            )
        )
    out.print(
        table(
            "Finished recently",
            ("window", *FINAL_STATUS_VALUES, "per second", "failure rate"),
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
    views = WorkflowViews(pool, args.schema)
    if args.job_id is not None:
        if args.status or args.task or args.since or args.until or args.batch:
            raise CommandError("JOB_ID cannot be combined with filters", EXIT_USAGE)
        job = await load_job(pool, args.job_id, args.schema)
        family = (await views.waits([job.job_id])).get(job.job_id)
        workflow = await load_workflow(views, job.job_id, family)
        if args.json:
            data = job_json(job, family)
            if workflow is not None:
                data["workflow"] = workflow
            emit_json(data)
        else:
            render_job(job, family, workflow)
        return 0
    rows = await CliStore(pool, args.schema).list_jobs(
        args.status, args.task, args.since, args.until, args.limit, args.batch
    )
    jobs = [Job.from_record(r, RetryPolicy()) for r in rows]
    families = await views.waits([j.job_id for j in jobs])
    if args.json:
        emit_json([job_json(j, families.get(j.job_id)) for j in jobs])
        return 0
    out = console()
    if not jobs:
        out.print("No jobs match.")
        return 0
    waits = {i: describe_wait(f) for i, f in families.items() if f["wait_kind"] is not None}
    columns: tuple[str, ...] = (
        "job id",
        "task",
        "status",
        "priority",
        "attempts",
        "due",
        "finished",
        "error",
    )
    listed: list[tuple[Any, ...]] = [
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
    ]
    if waits:  # a column for what parked workflows wait for, only when one is listed
        columns = (*columns[:3], "waits for", *columns[3:])
        listed = [(*r[:3], waits.get(j.job_id), *r[3:]) for r, j in zip(listed, jobs, strict=True)]
    out.print(table(None, columns, listed))
    if len(jobs) == args.limit:
        out.print(f"(first {args.limit}; use --limit for more)")
    return 0


def job_json(job: Job, family: asyncpg.Record | None = None) -> dict[str, Any]:
    """A job's one JSON shape, in a listing and in detail: every field of
    :class:`~pg_scheduler.models.Job`, times in ISO 8601 UTC, priority by name;
    ``wait``: what a parked workflow waits for (else null); ``parent_job_id``:
    the workflow that spawned it (else null). The detail of a workflow (or of
    a workflow's child) adds ``workflow``: its steps, children and unread signals."""
    data: dict[str, Any] = json_value(job.model_dump())
    data["wait"] = wait_json(family)
    data["parent_job_id"] = None if family is None else family["parent_job_id"]
    return data


# -- workflows ------------------------------------------------------------------------------

#: Steps, children and unread signals a job's detail shows (totals are given).
STEPS_SHOWN = 200
CHILDREN_SHOWN = 50
SIGNALS_SHOWN = 20


def wait_json(family: asyncpg.Record | None) -> dict[str, Any] | None:
    """What a parked workflow waits for: ``kind`` sleep (``until``), signal
    (``signal``; ``until``: its timeout or the workflow's deadline, if any),
    children (``children``: how many have not ended; ``until``: the deadline)."""
    if family is None or family["wait_kind"] is None:
        return None
    return {
        "kind": family["wait_kind"],
        "signal": family["wait_for"],
        "until": family["wake_at"],
        "seq": family["wait_seq"],
        "children": family["children_waiting"],
    }


def describe_wait(family: asyncpg.Record) -> str | None:
    """``sleep until T``, ``signal "name" until T``, ``N children to end``."""
    kind, until = family["wait_kind"], family["wake_at"]
    if kind is None:
        return None
    if kind == "sleep":
        return f"sleep until {when(until)}"
    if kind == "signal":
        name = family["wait_for"]
        return f'signal "{name}"' + (f" until {when(until)}" if until else " (no timeout)")
    if kind == "children":
        n = family["children_waiting"]
        text = "children" if n is None else f"{n} child{'' if n == 1 else 'ren'} to end"
        return text + (f" (deadline {when(until)})" if until else "")
    return str(kind)


async def load_workflow(
    views: WorkflowViews, job_id: str, family: asyncpg.Record | None
) -> dict[str, Any] | None:
    """A workflow's steps, children and unread signals (None for a plain job)."""
    if family is None:
        return None
    totals = await views.totals(job_id)
    if not is_workflow_row(family, totals):
        return None
    return {
        "wait": wait_json(family),
        "deadline": family["workflow_deadline"],
        "parent": (
            None
            if family["parent_job_id"] is None
            else {
                "job_id": family["parent_job_id"],
                "seq": family["parent_seq"],
                "task_name": family["parent_task"],
                "status": family["parent_status"],
            }
        ),
        "steps": [dict(r) for r in await views.steps(job_id, limit=STEPS_SHOWN)],
        "steps_total": totals["steps"],
        "children": [dict(r) for r in await views.children(job_id, limit=CHILDREN_SHOWN)],
        "children_total": totals["children"],
        "children_counts": await views.child_counts(job_id) if totals["children"] else {},
        "signals": [dict(r) for r in await views.pending_signals(job_id, limit=SIGNALS_SHOWN)],
        "signals_total": totals["pending_signals"],
    }


def _step_outcome(step: dict[str, Any]) -> str | None:
    if step["error"]:
        return first_line(step["error"], 60)
    if step["child_job_id"]:
        return f"child {step['child_job_id']}"
    return first_line(step["result"], 60)


def _duration(step: dict[str, Any]) -> str | None:
    if step["status"] == "waiting" or step["duration"] is None:
        return None
    seconds = float(step["duration"])
    return f"{seconds * 1000:.0f}ms" if seconds < 1 else ago(seconds)


def render_workflow(workflow: dict[str, Any], out: Any) -> None:
    steps = workflow["steps"]
    shown = f" (the first {len(steps)})" if len(steps) < workflow["steps_total"] else ""
    if steps:  # a plain job spawned by a workflow has none (its parent is a field)
        out.print(
            table(
                f"steps: {workflow['steps_total']}{shown}",
                ("seq", "kind", "name", "key", "status", "attempts", "duration", "result or error"),
                [
                    (
                        s["seq"],
                        s["kind"],
                        s["name"],
                        s["key"] or None,
                        s["status"],
                        s["attempts"],
                        _duration(s),
                        _step_outcome(s),
                    )
                    for s in steps
                ],
            )
        )
    if workflow["children_total"]:
        counts = ", ".join(
            f"{n} {status}" for status, n in sorted(workflow["children_counts"].items())
        )
        children = workflow["children"]
        shown = f"; the first {len(children)}" if len(children) < workflow["children_total"] else ""
        out.print(
            table(
                f"children: {workflow['children_total']} ({counts}{shown})",
                ("job id", "task", "status", "attempts", "finished", "error"),
                [
                    (
                        c["job_id"],
                        c["task_name"],
                        c["status"] + (" (detached)" if c["detached"] else ""),
                        c["attempts"],
                        when(c["finished_at"]),
                        first_line(c["error"], 60),
                    )
                    for c in children
                ],
            )
        )
    if workflow["signals_total"]:
        out.print(
            table(
                f"unread signals: {workflow['signals_total']}",
                ("id", "name", "sent", "key", "payload"),
                [
                    (
                        g["id"],
                        g["name"],
                        when(g["sent_at"]),
                        g["idempotency_key"],
                        first_line(g["payload"], 60),
                    )
                    for g in workflow["signals"]
                ],
            )
        )


def describe_key(job: Job) -> str | None:
    """A job's dedupe key and scope; a debounced job's burst (docs/debounce-throttle.md)."""
    if not job.dedupe_key:
        return None
    if job.dedupe_scope == "debounce" and job.status.value == "pending":
        return (
            f"{job.dedupe_key} (debounced: burst since {when(job.created_at)}, "
            f"due {when(job.execution_time)} unless another call moves it)"
        )
    return f"{job.dedupe_key} (scope {job.dedupe_scope})"


def describe_concurrency_key(job: Job) -> str | None:
    """A job's concurrency key and its limits (docs/keys.md)."""
    if job.concurrency_key is None:
        return None
    limits = [
        "ordered" if job.ordered else None,
        None
        if job.max_running_per_key is None or job.ordered
        else f"{job.max_running_per_key} at once",
        job.rate_limit_per_key,
    ]
    shown = ", ".join(x for x in limits if x)
    return f"{job.concurrency_key} ({shown})" if shown else job.concurrency_key


def describe_fair_share(job: Job) -> str | None:
    """A job's fair share key and weight (docs/fair-share.md)."""
    if job.fair_share_key is None:
        return None
    weight = 1.0 if job.fair_share_weight is None else job.fair_share_weight
    return f"{job.fair_share_key} (weight {weight:g})"


def describe_batch(job: Job) -> str | None:
    """The batch a batch task's job last ran in, and how many jobs it held."""
    if job.batch_id is None:
        return None
    size = job.batch_size
    return f"{job.batch_id} ({size} job{'' if size == 1 else 's'})"


def render_job(
    job: Job, family: asyncpg.Record | None = None, workflow: dict[str, Any] | None = None
) -> None:
    parent = None
    if family is not None and family["parent_job_id"] is not None:
        parent = (
            f"{family['parent_job_id']} ({family['parent_task'] or 'deleted'}"
            f"{', ' + family['parent_status'] if family['parent_status'] else ''}"
            f"; step {family['parent_seq']})"
        )
    fields = [
        ("job id", job.job_id),
        ("job name", job.job_name),
        ("task", job.task_name),
        ("status", job.status.value),
        ("waits for", describe_wait(family) if family is not None else None),
        ("deadline", when(family["workflow_deadline"]) if family is not None else None),
        ("parent", parent),
        ("priority", job.priority.value),
        ("due", when(job.execution_time)),
        ("created", when(job.created_at)),
        ("started", when(job.started_at)),
        ("finished", when(job.finished_at)),
        ("attempts", f"{job.attempts} (retries {job.retry_count}/{job.max_retries})"),
        ("rescues", job.rescue_count),
        ("worker", job.worker_id),
        ("batch", describe_batch(job)),
        ("concurrency key", describe_concurrency_key(job)),
        ("fair share key", describe_fair_share(job)),
        ("dedupe key", describe_key(job)),
        ("next retry", when(job.next_retry_at) if job.next_retry_at else None),
        ("args", json.dumps(job.args, default=str)),
        ("kwargs", json.dumps(job.kwargs, default=str)),
        ("result", None if job.result is None else json.dumps(job.result, default=str)),
        ("error", job.error),
    ]
    # The workflow lines only where they say something.
    optional = ("waits for", "deadline", "parent", "batch", "concurrency key", "fair share key")
    fields = [(k, v) for k, v in fields if k not in optional or (v is not None and v != "-")]
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
    if workflow is not None:
        render_workflow(workflow, out)


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
