"""The dashboard's workflow pages and actions, as plain JSON-ready data: the
list of code-first workflows and graphs, one graph as nodes and edges with
its counts by status, cancel, retry or fork of a whole workflow, and a signal
sent to one (``workflows/signals.py``, as ``Scheduler.signal`` sends it).

They go through the operations of ``api/workflow_ops.py``: the application's
Scheduler when the dashboard was given one (a running job of its own process
then stops at once), else operations of their own, whose running jobs hear
the cancel channel, as with ``pg-scheduler workflows cancel``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import asyncpg

from ..api.results import JobNotFound
from ..api.workflow_ops import WorkflowOps
from ..enums import JobStatus
from ..store.graph_ops import GraphOpsStore
from ..store.workflow_views import CLIP
from ..store.workflows import WorkflowStore
from ..workflows.signals import checked_key, checked_signal, send_signal
from .data import MAX_PAGE, Conflict, NotFound, plain

if TYPE_CHECKING:
    from ..scheduler import Scheduler

#: Jobs of one graph sent to the page at most (the oldest first); the page
#: says how many more there are.
GRAPH_SHOWN = 2000


class WorkflowOperations(Protocol):
    """What the pages use of ``Scheduler`` (or ``WorkflowOps``)."""

    async def cancel_workflow(self, job_id: str) -> list[str]: ...

    async def retry_workflow(self, job_id: str) -> list[str]: ...

    async def fork_workflow(self, job_id: str, from_step: int | str) -> str: ...

    async def workflow_graph(self, job_id: str) -> list[dict[str, Any]]: ...

    async def list_workflows(
        self, status: str | JobStatus | None = None, limit: int = 50
    ) -> list[dict[str, Any]]: ...


def workflow_operations(
    pool: asyncpg.Pool, schema: str, scheduler: Scheduler | None
) -> WorkflowOperations:
    """The application's Scheduler, else operations on ``pool`` and ``schema``
    (no job runs in the dashboard's process: running ones hear the cancel
    channel)."""
    if scheduler is not None:
        return scheduler
    return WorkflowOps(GraphOpsStore(pool, schema), lambda job_id, reason: False)


def parse_step(value: Any) -> int | str:
    """A fork's first step from a request: a number from 1 (an int, or a
    string of digits) or a step's name. ValueError for anything else."""
    if isinstance(value, bool) or value is None:
        raise ValueError("from_step is required: a step number (from 1) or a step's name")
    if isinstance(value, int):
        step: int | str = value
    elif isinstance(value, str):
        text = value.strip()
        if not text:
            raise ValueError("from_step is required: a step number (from 1) or a step's name")
        step = int(text) if text.isdecimal() else text
    else:
        raise ValueError(
            f"from_step must be a step number or a step's name, got {type(value).__name__}"
        )
    if isinstance(step, int) and step < 1:
        raise ValueError(f"from_step must be 1 or more (steps count from 1), got {step}")
    return step


class WorkflowPages:
    """The workflow reads and actions of one dashboard."""

    def __init__(self, ops: WorkflowOperations, signals: WorkflowStore) -> None:
        self.ops = ops
        self.signals = signals

    async def listing(self, params: dict[str, str]) -> dict[str, Any]:
        """Workflows and graphs, newest first. ``params``: status, limit.
        ValueError on bad input."""
        status = params.get("status") or None
        try:
            limit = int(params.get("limit") or 50)
        except ValueError:
            raise ValueError(f"limit must be an integer, got {params.get('limit')!r}") from None
        if not 1 <= limit <= MAX_PAGE:
            raise ValueError(f"limit must be 1..{MAX_PAGE}, got {limit}")
        rows = await self.ops.list_workflows(status, limit)
        return {"workflows": [plain(r) for r in rows], "status": status, "limit": limit}

    async def graph(self, job_id: str) -> dict[str, Any]:
        """The graph of ``job_id``: its jobs (oldest first), the edges from
        each dependency to its dependent, and the jobs per status."""
        if not job_id:
            raise ValueError("id is required: a job id")
        try:
            nodes = await self.ops.workflow_graph(job_id)
        except JobNotFound:
            raise NotFound(f"no job with id {job_id!r}") from None
        except ValueError as exc:  # too large to walk
            raise Conflict(str(exc)) from None
        counts: dict[str, int] = {}
        for n in nodes:
            counts[n["status"]] = counts.get(n["status"], 0) + 1
        shown = nodes[:GRAPH_SHOWN]
        if not any(n["job_id"] == job_id for n in shown):
            shown += [n for n in nodes if n["job_id"] == job_id]
        ids = {n["job_id"] for n in shown}
        edges = [
            {"from": dep, "to": n["job_id"]} for n in shown for dep in n["depends_on"] if dep in ids
        ]
        return {
            "job_id": job_id,
            "nodes": [self._node(n) for n in shown],
            "edges": edges,
            "counts": counts,
            "total": len(nodes),
            "truncated": len(shown) < len(nodes),
        }

    @staticmethod
    def _node(node: dict[str, Any]) -> dict[str, Any]:
        data = plain(node)
        error = node.get("error_message")
        if error is not None and len(error) > CLIP:
            data["error_message"] = error[:CLIP]
            data["error_length"] = len(error)
        return data

    async def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel every unfinished job of ``job_id``'s graph (a code-first
        workflow: with its children)."""
        try:
            cancelled = await self.ops.cancel_workflow(job_id)
        except JobNotFound:
            raise NotFound(f"no job with id {job_id!r}") from None
        except ValueError as exc:
            raise Conflict(str(exc)) from None
        return {"job_id": job_id, "cancelled": cancelled}

    async def retry(self, job_id: str) -> dict[str, Any]:
        """Run a failed job again and let its graph go on; a code-first
        workflow from its failed step. Conflict when it cannot be retried."""
        try:
            retried = await self.ops.retry_workflow(job_id)
        except JobNotFound:
            raise NotFound(f"no job with id {job_id!r}") from None
        except ValueError as exc:
            raise Conflict(str(exc)) from None
        return {"job_id": job_id, "retried": retried}

    async def fork(self, job_id: str, from_step: Any) -> dict[str, Any]:
        """A new run of code-first workflow ``job_id`` from ``from_step``.
        ValueError for a step that is neither a number from 1 nor a name;
        Conflict when the workflow cannot be forked there."""
        step = parse_step(from_step)
        try:
            new_id = await self.ops.fork_workflow(job_id, step)
        except JobNotFound:
            raise NotFound(f"no job with id {job_id!r}") from None
        except ValueError as exc:
            raise Conflict(str(exc)) from None
        return {"job_id": new_id, "forked_from": job_id, "from_step": step}

    async def signal(
        self, job_id: str, name: str, payload: Any, idempotency_key: Any
    ) -> dict[str, Any]:
        """Send signal ``name`` with ``payload`` (any JSON value) to workflow
        ``job_id``; ``stored`` False for a repeat of ``idempotency_key``.
        ValueError for a bad name, payload or key; NotFound, or Conflict for a
        finished job."""
        try:
            checked_signal(job_id, name, payload)
            key = checked_key(idempotency_key)
        except TypeError as exc:
            raise ValueError(str(exc)) from None
        try:
            stored = await send_signal(self.signals, job_id, name, payload, idempotency_key=key)
        except JobNotFound:
            raise NotFound(f"no job with id {job_id!r}") from None
        except ValueError as exc:  # finished
            raise Conflict(str(exc)) from None
        return {"job_id": job_id, "signal": name, "stored": stored}
