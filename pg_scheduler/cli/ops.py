"""Operations commands: status, jobs, retry, cancel, vacuum, periodic, limits,
queues, orphans, workflows, metrics.

This module declares their arguments and runs them; ``reports`` (status, jobs,
metrics), ``job_actions`` (retry, cancel, vacuum) and ``periodic_jobs`` implement
them, and ``output`` holds the exit codes and the JSON and table output.

They talk to the database directly (no Scheduler is started, nothing is
claimed), so they work from any machine that can reach it. Exit codes: 0 done;
1 an unknown job id, a job in the wrong state, or a database error; 2 bad
arguments; 3 ``vacuum`` skipped because another process is vacuuming.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

import asyncpg

from ..config import VacuumPolicy
from ..enums import FINAL_STATUS_VALUES, JobStatus
from ..support.install import install_hint
from .common import configure_logging, open_pool, run_cli
from .fair_share import register as register_fair_share
from .job_actions import cmd_cancel, cmd_retry, cmd_vacuum
from .limits import cmd_limits_clear, cmd_limits_keys, cmd_limits_list, cmd_limits_set
from .orphans import cmd_orphans
from .orphans import register as register_orphans
from .output import EXIT_INTERRUPTED, CommandError
from .periodic_jobs import cmd_periodic_enable, cmd_periodic_list, cmd_periodic_trigger
from .queue_commands import cmd_queues_delete, cmd_queues_list, cmd_queues_pause
from .reports import cmd_jobs, cmd_metrics, cmd_status
from .workflows import HANDLERS as WORKFLOW_HANDLERS
from .workflows import register as register_workflows

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


def positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return number


def batch_id(value: str) -> str:
    """A batch id (a UUID, as ``Job.batch_id`` shows it)."""
    try:
        return str(uuid.UUID(value.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a batch id (a UUID)") from None


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
    status.add_argument(
        "--watch",
        action="store_true",
        help="redraw in place every --interval seconds until Ctrl-C or Ctrl-D "
        "(with --json: one JSON document per line)",
    )
    status.add_argument(
        "--interval", type=positive_float, default=2.0, help="seconds between redraws (2)"
    )
    status.add_argument(
        "--iterations", type=positive_int, default=None, help="with --watch: stop after N frames"
    )
    status.set_defaults(handler=_handler(cmd_status))

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
    jobs.add_argument(
        "--batch", type=batch_id, help="only the jobs whose latest batch is this one (a batch id)"
    )
    jobs.add_argument("--limit", type=positive_int, default=50, help="at most N rows (50)")
    jobs.set_defaults(handler=_handler(cmd_jobs))

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
    retry.add_argument(
        "--yes", "-y", action="store_true", help="with --failed: do not ask for confirmation"
    )
    retry.add_argument(
        "--dry-run", action="store_true", help="with --failed: list the jobs; change nothing"
    )
    retry.set_defaults(handler=_handler(cmd_retry))

    cancel = commands.add_parser(
        "cancel",
        parents=[json_flag],
        help="cancel a pending or running job",
        description="A running job's coroutine is cancelled on the worker running it.",
    )
    cancel.add_argument("job_id", metavar="JOB_ID")
    cancel.set_defaults(handler=_handler(cmd_cancel))

    vacuum = commands.add_parser(
        "vacuum",
        parents=[json_flag],
        help="delete finished jobs per vacuum policies, now",
        description="Apply vacuum policies once (defaults: completed days:1, failed days:7, "
        "cancelled days:3, expired days:3). POLICY is immediate, never, days:N or keep:N "
        "(keep the newest N per job name). Asks for confirmation (refuses without a "
        "terminal) unless --yes. Exits 3 if another process is vacuuming.",
    )
    for status_name in FINAL_STATUS_VALUES:
        vacuum.add_argument(f"--{status_name}", type=parse_policy, metavar="POLICY")
    vacuum.add_argument("--batch-size", type=positive_int, default=5000)
    vacuum.add_argument(
        "--track-metrics", action="store_true", help="add the counts to the vacuum_stats table"
    )
    vacuum.add_argument(
        "--dry-run", action="store_true", help="count what would be deleted; delete nothing"
    )
    vacuum.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    vacuum.set_defaults(handler=_handler(cmd_vacuum))

    periodic = commands.add_parser(
        "periodic",
        help="list, enable, disable or trigger periodic jobs",
        description="KEY is a periodic job's dedup key, or its job name when that is "
        "unique. enable/disable are stored in the database: every replica follows within "
        "about a second (disabling also cancels its pending windows).",
    )
    actions = periodic.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", parents=[json_flag], help="every stored periodic job")
    listing.set_defaults(handler=_handler(cmd_periodic_list))
    for action, text in (("enable", "enable"), ("disable", "disable")):
        sub = actions.add_parser(action, parents=[json_flag], help=f"{text} a periodic job")
        sub.add_argument("key", metavar="KEY")
        sub.set_defaults(handler=_handler(cmd_periodic_enable), enable=action == "enable")
    trigger = actions.add_parser(
        "trigger",
        parents=[json_flag],
        help="run a periodic job once now",
        description="Enqueue one run now, outside its windows. The job's function must be "
        "registered in this process: --app imports the module that declares it.",
    )
    trigger.add_argument("key", metavar="KEY")
    trigger.add_argument("--app", metavar="MODULE", help="module declaring the @periodic job")
    trigger.set_defaults(handler=_handler(cmd_periodic_trigger))

    limits = commands.add_parser(
        "limits",
        help="list, set or clear (delete) global limits of a task or queue",
        description="max running: never more than N jobs of the task or queue running at "
        "once on all workers; rate limit: at most N starts in any rolling window "
        '("100/m", "5/s", "20/10s"). Every worker follows within about a second.',
    )
    limit_actions = limits.add_subparsers(dest="action", required=True, metavar="ACTION")
    limit_list = limit_actions.add_parser("list", parents=[json_flag], help="every limit")
    limit_list.set_defaults(handler=_handler(cmd_limits_list))
    limit_keys = limit_actions.add_parser(
        "keys",
        parents=[json_flag],
        help="the busiest concurrency keys: running, waiting, starts in the rate window",
    )
    limit_keys.add_argument("--top", type=positive_int, default=20, metavar="N")
    limit_keys.set_defaults(handler=_handler(cmd_limits_keys))
    limit_set = limit_actions.add_parser("set", parents=[json_flag], help="set limits")
    limit_clear = limit_actions.add_parser(
        "clear", aliases=["delete", "unset"], parents=[json_flag], help="remove limits"
    )
    for sub in (limit_set, limit_clear):
        sub.add_argument("scope", choices=("task", "queue"))
        sub.add_argument("name", metavar="NAME")
    limit_set.add_argument(
        "--force", action="store_true", help="set it even for a name the database does not know"
    )
    limit_set.add_argument("--max-running", type=positive_int, metavar="N")
    limit_set.add_argument("--rate-limit", metavar="N/UNIT", help='e.g. "100/m", "5/s"')
    limit_set.set_defaults(handler=_handler(cmd_limits_set))
    limit_clear.set_defaults(handler=_handler(cmd_limits_clear))
    register_fair_share(commands, json_flag, _handler)
    queues = commands.add_parser(
        "queues",
        help="list, pause, resume or delete queues",
        description="A paused queue is stored in the database: every worker stops "
        "starting its jobs at once (running jobs finish); scheduling into it still works. "
        "resume wakes the workers that serve it.",
    )
    queue_actions = queues.add_subparsers(dest="action", required=True, metavar="ACTION")
    queue_list = queue_actions.add_parser(
        "list", parents=[json_flag], help="every queue with its pending, due and running jobs"
    )
    queue_list.set_defaults(handler=_handler(cmd_queues_list))
    for action in ("pause", "resume"):
        sub = queue_actions.add_parser(action, parents=[json_flag], help=f"{action} a queue")
        sub.add_argument("name", metavar="NAME")
        sub.add_argument(
            "--force",
            action="store_true",
            help="even a queue the database does not know yet (no job has been in it)",
        )
        sub.set_defaults(handler=_handler(cmd_queues_pause), pause=action == "pause")
    delete = queue_actions.add_parser(
        "delete",
        parents=[json_flag],
        help="drop a queue's stored setting (a phantom queue made by a pause, say)",
    )
    delete.add_argument("name", metavar="NAME")
    delete.add_argument(
        "--force", action="store_true", help="even while jobs wait in it (it is resumed)"
    )
    delete.set_defaults(handler=_handler(cmd_queues_delete))

    orphans = register_orphans(commands, json_flag)
    orphans.set_defaults(handler=_handler(cmd_orphans))

    for action, parser in register_workflows(commands, json_flag).items():
        parser.set_defaults(handler=_handler(WORKFLOW_HANDLERS[action]))

    metrics = commands.add_parser(
        "metrics",
        help="serve the queue statistics for Prometheus until interrupted",
        description=f"Needs the metrics extra: {install_hint('metrics')}.",
    )
    metrics.add_argument("--port", type=int, required=True)
    metrics.add_argument("--addr", default="0.0.0.0", help="address to bind (0.0.0.0)")
    metrics.add_argument(
        "--interval", type=float, default=15.0, help="seconds between refreshes (15)"
    )
    metrics.set_defaults(handler=_handler(cmd_metrics, max_size=2))


# -- dispatch ------------------------------------------------------------------------------


def _handler(
    action: Callable[[asyncpg.Pool, argparse.Namespace], Awaitable[int]],
    max_size: int = 4,
) -> Callable[[argparse.Namespace], int]:
    """An argparse handler: configure logging, open a small pool, run ``action`` on it."""

    def handle(args: argparse.Namespace) -> int:
        configure_logging(args)

        async def go() -> int:
            async with open_pool(args, min_size=1, max_size=max_size) as pool:
                return await action(pool, args)

        code = run_command(go, args)
        # Ctrl-C is how a watch ends: a clean exit.
        return 0 if code == EXIT_INTERRUPTED and getattr(args, "watch", False) else code

    return handle


def run_command(go: Callable[[], Awaitable[int]], args: argparse.Namespace) -> int:
    """Run ``go`` and turn expected failures into one line on stderr and an exit code."""
    try:
        return run_cli(args, go)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``| head``): nothing left to say to it.
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # silence the flush at exit
        return 0
    except CommandError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.code
