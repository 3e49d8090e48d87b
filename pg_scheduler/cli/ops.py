"""Operations commands: status, jobs, retry, cancel, vacuum, periodic, metrics.

They talk to the database directly (no Scheduler is started, nothing is
claimed), so they work from any machine that can reach it. Exit codes: 0 done;
1 an unknown job id, a job in the wrong state, or a database error; 2 bad
arguments; 3 ``vacuum`` skipped because another process is vacuuming.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg

from ..config import RetryPolicy, VacuumConfig, VacuumPolicy
from ..enums import JobStatus
from ..models import Job
from ..stats import QueueStats, collect_stats
from ..store import Store
from ..store_housekeeping import RETRYABLE_STATUSES, OpsStore, VacuumStore
from .common import configure_logging, open_pool, run_async

EXIT_NOT_FOUND = 1
EXIT_USAGE = 2
EXIT_BUSY = 3


class CommandError(Exception):
    """A failure to report on stderr with an exit code, without a traceback."""

    def __init__(self, message: str, code: int = EXIT_NOT_FOUND) -> None:
        super().__init__(message)
        self.code = code


# -- argument types ------------------------------------------------------------------

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(value: str) -> datetime:
    """``30m``/``2h``/``1d`` (that long ago) or an ISO 8601 time (naive = local time)."""
    match = _DURATION.match(value.strip())
    if match:
        seconds = float(match[1]) * _UNIT_SECONDS[match[2]]
        return datetime.now(UTC) - timedelta(seconds=seconds)
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is neither a duration like 30m, 2h, 1d nor an ISO 8601 time"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.astimezone()


def parse_policy(value: str) -> VacuumPolicy:
    """``immediate``, ``never``, ``days:N`` or ``keep:N``."""
    name, _, number = value.strip().lower().partition(":")
    try:
        if name == "immediate" and not number:
            return VacuumPolicy.immediate()
        if name == "never" and not number:
            return VacuumPolicy.never()
        if name in ("days", "after_days") and number:
            return VacuumPolicy.after_days(float(number))
        if name in ("keep", "keep_last") and number:
            return VacuumPolicy.keep_last(int(number))
    except ValueError:
        pass  # pydantic's or float()'s complaint; ours below names the forms
    raise argparse.ArgumentTypeError(
        f"{value!r} is not a policy: use immediate, never, days:N or keep:N (N >= 0)"
    )


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {number}")
    return number


# -- registration ------------------------------------------------------------------------


def register(commands: argparse._SubParsersAction) -> None:
    """Add the operations subcommands."""
    json_flag = argparse.ArgumentParser(add_help=False)
    json_flag.add_argument(
        "--json", action="store_true", help="machine-readable JSON on stdout instead of tables"
    )

    status = commands.add_parser(
        "status",
        parents=[json_flag],
        help="summary of queues, workers and recent rates",
        description="Jobs by task and status, live workers with their running jobs, the "
        "wait of the oldest due job, and throughput and failure rate over the last "
        "minute, 5 minutes and hour.",
    )
    status.set_defaults(handler=_handler(_status))

    jobs = commands.add_parser(
        "jobs",
        parents=[json_flag],
        help="list jobs, or show one with its error and traceback",
        description="Without JOB_ID: list jobs, most recently changed first (a job's last "
        "change is when it finished, else started, else when it is due). With JOB_ID: "
        "show that job in full.",
    )
    jobs.add_argument("job_id", nargs="?", metavar="JOB_ID", help="show this job in full")
    jobs.add_argument(
        "--status",
        action="append",
        choices=[s.value for s in JobStatus],
        help="only jobs in this status (repeatable)",
    )
    jobs.add_argument("--task", help="only jobs of this task name (or job name)")
    jobs.add_argument(
        "--since", type=parse_time, help="last change at or after: 30m, 2h, 1d, or ISO 8601"
    )
    jobs.add_argument("--until", type=parse_time, help="last change before (same forms)")
    jobs.add_argument("--limit", type=positive_int, default=50, help="at most N rows (50)")
    jobs.set_defaults(handler=_handler(_jobs))

    retry = commands.add_parser(
        "retry",
        parents=[json_flag],
        help="run failed, cancelled or expired jobs again, now",
        description="Put jobs back to pending, due now. Each gets one more attempt (its "
        "attempt count continues; its last error stays visible until the new outcome).",
    )
    retry.add_argument("job_ids", nargs="*", metavar="JOB_ID")
    retry.add_argument("--failed", action="store_true", help="retry every failed job")
    retry.add_argument("--task", help="with --failed: only jobs of this task (or job name)")
    retry.set_defaults(handler=_handler(_retry))

    cancel = commands.add_parser(
        "cancel",
        parents=[json_flag],
        help="cancel a pending or running job",
        description="A running job's coroutine is cancelled on the worker running it.",
    )
    cancel.add_argument("job_id", metavar="JOB_ID")
    cancel.set_defaults(handler=_handler(_cancel))

    vacuum = commands.add_parser(
        "vacuum",
        parents=[json_flag],
        help="delete finished jobs per vacuum policies, now",
        description="Apply vacuum policies once (defaults: completed days:1, failed days:7, "
        "cancelled days:3, expired days:3). POLICY is immediate, never, days:N or keep:N "
        "(keep the newest N per job name). Exits 3 if another process is vacuuming.",
    )
    for status_name in ("completed", "failed", "cancelled", "expired"):
        vacuum.add_argument(f"--{status_name}", type=parse_policy, metavar="POLICY")
    vacuum.add_argument("--batch-size", type=positive_int, default=5000)
    vacuum.add_argument(
        "--track-metrics", action="store_true", help="add the counts to the vacuum_stats table"
    )
    vacuum.set_defaults(handler=_handler(_vacuum))

    periodic = commands.add_parser(
        "periodic",
        help="list, enable, disable or trigger periodic jobs",
        description="KEY is a periodic job's dedup key, or its job name when that is "
        "unique. enable/disable are stored in the database: every replica follows within "
        "about a second (disabling also cancels its pending windows).",
    )
    actions = periodic.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", parents=[json_flag], help="every stored periodic job")
    listing.set_defaults(handler=_handler(_periodic_list))
    for action, text in (("enable", "enable"), ("disable", "disable")):
        sub = actions.add_parser(action, parents=[json_flag], help=f"{text} a periodic job")
        sub.add_argument("key", metavar="KEY")
        sub.set_defaults(handler=_handler(_periodic_enable), enable=action == "enable")
    trigger = actions.add_parser(
        "trigger",
        parents=[json_flag],
        help="run a periodic job once now",
        description="Enqueue one run now, outside its windows. The job's function must be "
        "registered in this process: --app imports the module that declares it.",
    )
    trigger.add_argument("key", metavar="KEY")
    trigger.add_argument("--app", metavar="MODULE", help="module declaring the @periodic job")
    trigger.set_defaults(handler=_handler(_periodic_trigger))

    metrics = commands.add_parser(
        "metrics",
        help="serve the queue statistics for Prometheus until interrupted",
        description="Needs pip install 'pg-scheduler[metrics]'.",
    )
    metrics.add_argument("--port", type=int, required=True)
    metrics.add_argument("--addr", default="0.0.0.0", help="address to bind (0.0.0.0)")
    metrics.add_argument(
        "--interval", type=float, default=15.0, help="seconds between refreshes (15)"
    )
    metrics.set_defaults(handler=_cmd_metrics)


# -- plumbing ------------------------------------------------------------------------------


def _handler(
    action: Callable[[asyncpg.Pool, argparse.Namespace], Awaitable[int]],
) -> Callable[[argparse.Namespace], int]:
    def handle(args: argparse.Namespace) -> int:
        configure_logging(args)

        async def go() -> int:
            async with open_pool(args, min_size=1, max_size=4) as pool:
                return await action(pool, args)

        return run_command(go)

    return handle


def run_command(go: Callable[[], Awaitable[int]]) -> int:
    """Run ``go`` and turn expected failures into one line on stderr and an exit code."""
    try:
        return run_async(go)
    except CommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
    except asyncpg.UndefinedTableError as exc:
        print(
            f"error: {exc}: the pg_scheduler schema is missing in this database "
            "(run `pg-scheduler migrate`)",
            file=sys.stderr,
        )
        return EXIT_NOT_FOUND
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        print(f"error: database: {exc}", file=sys.stderr)
        return EXIT_NOT_FOUND


def emit_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))


def console() -> Any:
    try:
        from rich.console import Console
    except ImportError:  # pragma: no cover - depends on the install
        raise CommandError(
            "tables need the 'rich' package: pip install 'pg-scheduler[cli]' (or use --json)"
        ) from None
    # Off a terminal (pipes, tests) do not squeeze tables into 80 columns.
    return Console(width=None if sys.stdout.isatty() else 160, highlight=False)


def table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Any:
    from rich.table import Table

    view = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for column in columns:
        numeric = column in _NUMERIC_COLUMNS
        view.add_column(column, justify="right" if numeric else "left", overflow="fold")
    for row in rows:
        view.add_row(*("-" if v is None else str(v) for v in row))
    return view


_NUMERIC_COLUMNS = {
    "due",
    "scheduled",
    "running",
    "completed",
    "failed",
    "cancelled",
    "expired",
    "pid",
    "attempts",
    "per second",
    "failure rate",
    "deleted",
}


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f}s"
    if seconds < 7200:
        return f"{seconds / 60:.1f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def when(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def window_name(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


# -- status ---------------------------------------------------------------------------------


async def _status(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
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
    columns = ("task", "due", "scheduled", "running", "completed", "failed", "cancelled")
    out.print(table("Jobs by task", (*columns, "expired"), task_rows))
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
    row = await Store(pool).get_job(job_id)
    if row is None:
        raise CommandError(f"no job with id {job_id!r}")
    return Job.from_record(row, RetryPolicy())


async def _jobs(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
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
                    _first_line(r["error_message"], 60),
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
    summary.pop("last_change", None)
    summary["error"] = summary.pop("error_message")
    return summary


def _first_line(text: str | None, width: int) -> str | None:
    if not text:
        return None
    line = text.strip().splitlines()[0]
    return line if len(line) <= width else line[: width - 1] + "…"


def render_job(job: Job) -> None:
    out = console()
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
    from rich.table import Table

    view = Table(show_header=False, show_edge=False, pad_edge=False, box=None)
    view.add_column(style="bold")
    view.add_column(overflow="fold")
    for name, value in fields:
        view.add_row(name, "-" if value is None else str(value))
    out.print(view)
    if job.traceback:
        out.print("[bold]traceback[/bold]")
        out.print(job.traceback.rstrip(), markup=False)


# -- retry / cancel ------------------------------------------------------------------------


async def _retry(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    if bool(args.job_ids) == bool(args.failed):
        raise CommandError("give JOB_ID(s) or --failed (not both)", EXIT_USAGE)
    if args.task and not args.failed:
        raise CommandError("--task only goes with --failed", EXIT_USAGE)
    ops = OpsStore(pool)
    problems: list[str] = []
    if args.failed:
        candidates = await ops.failed_ids(args.task)
        retried: list[str] = []
        for start in range(0, len(candidates), 1000):
            retried += await ops.retry(candidates[start : start + 1000])
    else:
        retried = await ops.retry(args.job_ids)
        for job_id in args.job_ids:
            if job_id in retried:
                continue
            row = await Store(pool).get_job(job_id)
            if row is None:
                problems.append(f"no job with id {job_id!r}")
            else:
                problems.append(
                    f"job {job_id!r} is {row['status']}; only "
                    f"{', '.join(RETRYABLE_STATUSES)} jobs can be retried"
                )
    if args.json:
        emit_json({"retried": retried, "errors": problems})
    else:
        print(
            f"retried {len(retried)} job(s)" + (": " + ", ".join(retried[:20]) if retried else "")
        )
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return EXIT_NOT_FOUND if problems else 0


async def _cancel(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    if not await Store(pool).cancel(args.job_id):
        job = await load_job(pool, args.job_id)
        raise CommandError(f"job {args.job_id!r} is already {job.status.value}; not cancelled")
    if args.json:
        emit_json({"cancelled": args.job_id})
    else:
        print(f"cancelled {args.job_id}")
    return 0


# -- vacuum ----------------------------------------------------------------------------------


async def _vacuum(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    from ..services.vacuum import VacuumService

    chosen = {
        name: getattr(args, name)
        for name in ("completed", "failed", "cancelled", "expired")
        if getattr(args, name) is not None
    }
    config = VacuumConfig(**chosen, batch_size=args.batch_size, track_metrics=args.track_metrics)
    worker_id = f"cli-{socket.gethostname()}-{os.getpid()}"
    counts = await VacuumService(VacuumStore(pool), config, worker_id).run_once()
    if counts is None:
        raise CommandError("skipped: another process is vacuuming right now", EXIT_BUSY)
    if args.json:
        emit_json({"deleted": counts})
    else:
        console().print(table("Deleted", ("status", "deleted"), list(counts.items())))
    return 0


# -- periodic ---------------------------------------------------------------------------------


async def _resolve_periodic(pool: asyncpg.Pool, key: str) -> asyncpg.Record:
    rows = await OpsStore(pool).periodic_jobs(key)
    exact = [r for r in rows if r["dedup_key"] == key]
    if exact:
        return exact[0]
    if not rows:
        raise CommandError(f"no periodic job with dedup key or job name {key!r}")
    if len(rows) > 1:
        keys = ", ".join(r["dedup_key"] for r in rows)
        raise CommandError(f"job name {key!r} is ambiguous; use a dedup key: {keys}")
    return rows[0]


def _periodic_dict(row: asyncpg.Record) -> dict[str, Any]:
    return dict(row)


async def _periodic_list(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    rows = await OpsStore(pool).periodic_jobs()
    if args.json:
        emit_json([_periodic_dict(r) for r in rows])
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


def _scheduler(pool: asyncpg.Pool) -> Any:
    from ..scheduler import Scheduler

    # Never started: only its public periodic methods are used.
    return Scheduler(pool, vacuum_enabled=False, run_periodic_jobs=False)


async def _periodic_enable(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    row = await _resolve_periodic(pool, args.key)
    key = row["dedup_key"]
    if not await _scheduler(pool).set_periodic_job_enabled(key, args.enable):
        raise CommandError(f"no periodic job with dedup key {key!r}")
    state = "enabled" if args.enable else "disabled"
    if args.json:
        emit_json({"dedup_key": key, "job_name": row["job_name"], "enabled": args.enable})
    else:
        print(f"{state} {row['job_name']} ({key})")
    return 0


async def _periodic_trigger(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    row = await _resolve_periodic(pool, args.key)
    key = row["dedup_key"]
    if args.app:
        from .run import load_app

        sys.path.insert(0, "")
        load_app(args.app.partition(":")[0])
    job_id = await _scheduler(pool).trigger_periodic_job(key)
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


# -- metrics ----------------------------------------------------------------------------------


def _cmd_metrics(args: argparse.Namespace) -> int:
    configure_logging(args)

    async def go() -> int:
        import asyncio
        import signal

        from ..metrics import MetricsExporter

        async with open_pool(args, min_size=1, max_size=2) as pool:
            exporter = MetricsExporter(pool, port=args.port, addr=args.addr, interval=args.interval)
            try:
                await exporter.start()
            except ImportError as exc:
                raise CommandError(str(exc)) from None
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            print(f"serving metrics on http://{args.addr}:{exporter.port}/metrics", flush=True)
            await stop.wait()
            await exporter.stop()
        return 0

    return run_command(go)
