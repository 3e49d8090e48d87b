"""``pg-scheduler workflows``: list workflows and graphs, show a graph,
cancel, retry or fork a whole workflow (``api/workflow_ops.py``), and send a
workflow a signal (``workflows/signals.py``).

Like the other operations commands they talk to the database directly: a
running job is stopped by the worker running it, told through the cancel
channel as by ``pg-scheduler cancel``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import asyncpg

from ..api.results import JobNotFound
from ..api.workflow_ops import WorkflowOps
from ..enums import JobStatus
from ..store.graph_ops import GraphOpsStore
from ..store.workflows import WorkflowStore
from ..workflows.signals import checked_key, checked_signal, send_signal
from .output import EXIT_NOT_FOUND, CommandError, confirm, console, emit_json, table, when


def register(commands: argparse._SubParsersAction, json_flag: argparse.ArgumentParser) -> Any:
    """The ``workflows`` command and its actions; the parsers to give handlers to,
    by action name."""
    workflows = commands.add_parser(
        "workflows",
        help="list workflows and graphs; cancel, retry or fork a whole one; signal one",
        description="A graph is the jobs joined by depends_on (either way); a code-first "
        "workflow is a @workflow job with its steps and children. JOB_ID is any job of it.",
    )
    actions = workflows.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list", parents=[json_flag], help="code-first workflows and graphs, newest first"
    )
    listing.add_argument("--status", choices=[s.value for s in JobStatus])
    listing.add_argument("--limit", type=int, default=50, help="at most N rows (50)")
    graph = actions.add_parser(
        "graph", parents=[json_flag], help="the jobs of a graph with their dependencies"
    )
    cancel = actions.add_parser(
        "cancel",
        parents=[json_flag],
        help="cancel every unfinished job of a graph, or a workflow with its children",
    )
    cancel.add_argument("--yes", "-y", action="store_true", help="do not ask for confirmation")
    retry = actions.add_parser(
        "retry",
        parents=[json_flag],
        help="run a failed job again and let its graph go on (a workflow: from its failed step)",
    )
    fork = actions.add_parser(
        "fork",
        parents=[json_flag],
        help="a new run of a workflow that replays its steps before --from-step",
    )
    fork.add_argument(
        "--from-step",
        required=True,
        metavar="N|NAME",
        help="the first step to run anew: its number (from 1) or its name",
    )
    signal = actions.add_parser(
        "signal",
        parents=[json_flag],
        help="send a workflow a signal (an approval by hand, a lost webhook sent again)",
    )
    for sub in (graph, cancel, retry, fork, signal):
        sub.add_argument("job_id", metavar="JOB_ID")
    signal.add_argument("name", metavar="NAME", help="the signal's name")
    signal.add_argument("--payload", metavar="JSON", help="the payload, as JSON (none: null)")
    signal.add_argument(
        "--key",
        metavar="KEY",
        help="an idempotency key: a second signal of this key to the job writes nothing",
    )
    return {
        "list": listing,
        "graph": graph,
        "cancel": cancel,
        "retry": retry,
        "fork": fork,
        "signal": signal,
    }


def _ops(pool: asyncpg.Pool, args: argparse.Namespace) -> WorkflowOps:
    # No job runs in this process: running ones hear the cancel channel.
    return WorkflowOps(GraphOpsStore(pool, args.schema), lambda job_id, reason: False)


async def _calling(call: Any) -> Any:
    """``call``'s value; its refusals as the command's errors."""
    try:
        return await call
    except JobNotFound as exc:
        raise CommandError(f"no job with id {exc.args[0]!r}", EXIT_NOT_FOUND) from None
    except ValueError as exc:
        raise CommandError(str(exc), EXIT_NOT_FOUND) from None


async def cmd_workflows_list(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise CommandError(f"--limit must be 1 or more, got {args.limit}", 2)
    rows = await _ops(pool, args).list_workflows(args.status, args.limit)
    if args.json:
        emit_json({"workflows": rows})
        return 0
    console().print(
        table(
            "Workflows and graphs",
            ["id", "kind", "task", "queue", "status", "waits for", "steps", "created"],
            [
                [
                    r["job_id"],
                    r["kind"],
                    r["task_name"],
                    r["queue"],
                    r["status"],
                    r["wait_kind"],
                    r["steps"],
                    when(r["created_at"]),
                ]
                for r in rows
            ],
        )
    )
    return 0


async def cmd_workflows_graph(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    nodes = await _calling(_ops(pool, args).workflow_graph(args.job_id))
    if args.json:
        emit_json({"job_id": args.job_id, "nodes": nodes})
        return 0
    counts: dict[str, int] = {}
    for n in nodes:
        counts[n["status"]] = counts.get(n["status"], 0) + 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    console().print(
        table(
            f"Graph of {args.job_id}: {len(nodes)} job(s), {summary}",
            ["id", "task", "status", "depends on", "finished", "error"],
            [
                [
                    n["job_id"],
                    n["task_name"],
                    n["status"],
                    ", ".join(n["depends_on"]) or None,
                    when(n["finished_at"]),
                    (n["error_message"] or "")[:80] or None,
                ]
                for n in nodes
            ],
        )
    )
    return 0


async def cmd_workflows_cancel(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    ops = _ops(pool, args)
    nodes = await _calling(ops.workflow_graph(args.job_id))
    if len(nodes) > 1:
        confirm(f"cancel the unfinished jobs of a graph of {len(nodes)} job(s)", args)
    cancelled = await _calling(ops.cancel_workflow(args.job_id))
    if args.json:
        emit_json({"cancelled": cancelled})
    else:
        print(
            f"cancelled {len(cancelled)} job(s)"
            + (": " + ", ".join(cancelled[:20]) if cancelled else "")
        )
    return 0


async def cmd_workflows_retry(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    reopened = await _calling(_ops(pool, args).retry_workflow(args.job_id))
    if args.json:
        emit_json({"retried": reopened})
    else:
        print(f"retried {args.job_id}; {len(reopened) - 1} dependent job(s) wait again")
    return 0


async def cmd_workflows_fork(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    step: int | str = int(args.from_step) if args.from_step.isdigit() else args.from_step
    new_id = await _calling(_ops(pool, args).fork_workflow(args.job_id, step))
    if args.json:
        emit_json({"job_id": new_id, "forked_from": args.job_id, "from_step": step})
    else:
        print(f"forked {args.job_id} from step {step}: new job {new_id}")
    return 0


async def cmd_workflows_signal(pool: asyncpg.Pool, args: argparse.Namespace) -> int:
    payload = None
    if args.payload is not None:
        try:
            payload = json.loads(args.payload)
        except ValueError as exc:
            raise CommandError(f"--payload is not JSON: {exc}", 2) from None
    try:  # bad input is a usage error (2); a refusal by the database, 1
        checked_signal(args.job_id, args.name, payload)
        checked_key(args.key)
    except (TypeError, ValueError) as exc:
        raise CommandError(str(exc), 2) from None
    stored = await _calling(
        send_signal(
            WorkflowStore(pool, args.schema),
            args.job_id,
            args.name,
            payload,
            idempotency_key=args.key,
        )
    )
    if args.json:
        emit_json({"job_id": args.job_id, "signal": args.name, "stored": stored})
    elif stored:
        print(f"sent {args.name!r} to {args.job_id}")
    else:
        print(f"not sent: {args.job_id} has a signal of key {args.key!r} already")
    return 0


HANDLERS = {
    "list": cmd_workflows_list,
    "graph": cmd_workflows_graph,
    "cancel": cmd_workflows_cancel,
    "retry": cmd_workflows_retry,
    "fork": cmd_workflows_fork,
    "signal": cmd_workflows_signal,
}
