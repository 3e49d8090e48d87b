"""What ``Scheduler`` offers on whole workflows: cancel a graph or a
code-first workflow with its children, retry a graph from its failed job (or
a code-first workflow from its failed step), fork a code-first workflow from
a step, read a graph, list workflows (docs/workflow-operations.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..engine import CANCELLED_REMOTELY
from ..enqueue.ids import new_job_id
from ..enums import JobStatus
from ..store.graph_ops import GraphOpsStore
from ..support.log import get_logger
from .results import JobNotFound

log = get_logger(__name__)

#: The error a job cancelled by ``cancel_workflow`` records.
CANCEL_REASON = "cancelled with its workflow by cancel_workflow({job_id})"


def _check_id(job_id: Any, what: str = "job_id") -> str:
    if not isinstance(job_id, str):
        raise TypeError(f"{what} must be a job id (a str), got {type(job_id).__name__}")
    if not job_id:
        raise ValueError(f"{what} must not be empty")
    return job_id


class WorkflowOps:
    """Operations on a job and everything joined to it."""

    def __init__(self, store: GraphOpsStore, cancel_local: Callable[[str, str], Any]) -> None:
        self.store = store
        self._cancel_local = cancel_local

    async def cancel_workflow(self, job_id: str) -> list[str]:
        """Cancel ``job_id`` and every unfinished job joined to it by declared
        dependencies, either way (the whole graph), in one transaction; a
        code-first workflow's children go with it. Running jobs are stopped
        where they run, as by ``cancel_job``. The ids cancelled (empty if all
        had ended); JobNotFound for an unknown job."""
        _check_id(job_id)
        rows = await self.store.cancel(job_id, CANCEL_REASON.format(job_id=job_id))
        if rows is None:
            raise JobNotFound(job_id)
        for row in rows:
            if row["was"] == JobStatus.RUNNING:
                self._cancel_local(row["job_id"], CANCELLED_REMOTELY)
        ids = [r["job_id"] for r in rows]
        log.info("workflow cancelled", event_type="cancelled", job_id=job_id, jobs=len(ids))
        return ids

    async def retry_workflow(self, job_id: str) -> list[str]:
        """Run a failed, cancelled or expired job again and let what follows
        it go on: the dependents its end cancelled wait for their dependencies
        again (transitively; not those another failed dependency holds back).
        For a code-first workflow, the run replays its completed steps and
        runs the failed one again. The ids reopened, ``job_id`` first.
        JobNotFound; ValueError if the job has not ended that way, or one of
        its own dependencies did not complete (retry that one first)."""
        _check_id(job_id)
        rows = await self.store.retry(job_id)
        if rows is None:
            raise JobNotFound(job_id)
        ids = sorted((r["job_id"] for r in rows), key=lambda i: (i != job_id, i))
        log.info("workflow retried", event_type="scheduled", job_id=job_id, jobs=len(ids))
        return ids

    async def fork_workflow(self, job_id: str, from_step: int | str) -> str:
        """A new run of code-first workflow ``job_id`` (same task, arguments and
        options), due now, that replays the original's checkpoints before
        ``from_step`` (a step number, 1 for the first, or the name of a step:
        its first occurrence) and runs the rest anew. The new job's id.
        JobNotFound; ValueError for a step past a spawn or a wait for
        children, or an unknown step name."""
        _check_id(job_id)
        if isinstance(from_step, bool) or not isinstance(from_step, int | str):
            raise TypeError(
                f"from_step must be a step number or name, got {type(from_step).__name__}"
            )
        if isinstance(from_step, int) and from_step < 1:
            raise ValueError(f"from_step must be 1 or more (steps count from 1), got {from_step}")
        if isinstance(from_step, str) and not from_step:
            raise ValueError("from_step must not be an empty name")
        new_id = new_job_id()
        copied = await self.store.fork(job_id, new_id, from_step)
        if copied is None:
            raise JobNotFound(job_id)
        log.info("workflow forked", event_type="scheduled", job_id=new_id, forked_from=job_id)
        return new_id

    async def workflow_graph(self, job_id: str) -> list[dict[str, Any]]:
        """The jobs joined to ``job_id`` by declared dependencies (itself
        included), oldest first: id, task, queue, status, what it waits for,
        times, error, and the ids it depends on. JobNotFound."""
        _check_id(job_id)
        nodes = await self.store.nodes(await self.store.graph(self.store.pool, job_id))
        if not nodes:
            raise JobNotFound(job_id)
        return [{**dict(r), "depends_on": list(r["depends_on"])} for r in nodes]

    async def list_workflows(
        self, status: str | JobStatus | None = None, limit: int = 50
    ) -> list[dict[str, Any]]:
        """Code-first workflows and graphs (by their first job), newest first:
        ``kind`` is ``"workflow"`` or ``"graph"``. ``status`` filters."""
        if status is not None:
            try:
                status = JobStatus(status).value
            except ValueError:
                known = ", ".join(s.value for s in JobStatus)
                raise ValueError(f"unknown status {status!r} (one of {known})") from None
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive int, got {limit!r}")
        return [dict(r) for r in await self.store.list(status, limit)]
