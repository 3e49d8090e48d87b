"""Operations on whole workflows: cancel a graph, retry a graph from a failed
job, fork a code-first workflow, list workflows (statements: :mod:`.graph_sql`)."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from .graph_sql import (
    _CANCEL_MANY,
    _CASCADED,
    _COPY_STEPS,
    _EDGES_OF,
    _FORK_JOB,
    _GRAPH,
    _LIST,
    _LOCK_JOB,
    _NODES,
    _REOPEN,
    _RESET_EDGES,
    _STEP_NAMED,
    _STEPS_BEFORE,
)
from .names import DEFAULT_SCHEMA, Qualifier

#: Jobs one operation walks at most; a larger graph is refused, not cut.
MAX_GRAPH = 100_000
_RETRYABLE = ("failed", "cancelled", "expired")
# Step kinds a fork may not copy: their records point at children or waits of
# the run they belong to.
_UNFORKABLE = ("spawn", "wait")


class GraphTooLarge(ValueError):
    pass


class GraphOpsStore:
    """The statements behind ``cancel_workflow``, ``retry_workflow``,
    ``fork_workflow``, ``workflow_graph`` and ``list_workflows``."""

    def __init__(self, pool: asyncpg.Pool, schema: str = DEFAULT_SCHEMA) -> None:
        self.pool = pool
        q = Qualifier(schema)
        self._graph = q(_GRAPH)
        self._nodes = q(_NODES)
        self._cancel_many = q(_CANCEL_MANY)
        self._lock_job = q(_LOCK_JOB)
        self._cascaded = q(_CASCADED)
        self._edges_of = q(_EDGES_OF)
        self._reset_edges = q(_RESET_EDGES)
        self._reopen = q(_REOPEN)
        self._fork_job = q(_FORK_JOB)
        self._steps_before = q(_STEPS_BEFORE)
        self._step_named = q(_STEP_NAMED)
        self._copy_steps = q(_COPY_STEPS)
        self._list = q(_LIST)

    async def graph(self, db: asyncpg.Connection | asyncpg.Pool, job_id: str) -> list[str]:
        """Every job joined to ``job_id`` by dependencies (``job_id`` included)."""
        rows = await db.fetch(self._graph, job_id, MAX_GRAPH + 1)
        if len(rows) > MAX_GRAPH:
            raise GraphTooLarge(f"the graph of {job_id} has more than {MAX_GRAPH} jobs")
        return [r["job_id"] for r in rows]

    async def nodes(self, job_ids: Sequence[str]) -> list[asyncpg.Record]:
        return await self.pool.fetch(self._nodes, list(job_ids))

    async def cancel(self, job_id: str, reason: str) -> list[asyncpg.Record] | None:
        """Cancel the unfinished jobs of ``job_id``'s graph in one transaction;
        (job_id, was) of each. None: no such job."""
        async with self.pool.acquire() as conn, conn.transaction():
            if await conn.fetchrow(self._lock_job, job_id) is None:
                return None
            ids = await self.graph(conn, job_id)
            return await conn.fetch(self._cancel_many, ids, reason)

    async def retry(self, job_id: str) -> list[asyncpg.Record] | None:
        """Run ``job_id`` again and let its graph go on: the dependents its end
        cancelled wait again. (job_id, status) of each job reopened; None: no
        such job. ValueError: the job is not failed, cancelled or expired, or
        a dependency of its own ended without completing (retry that first)."""
        async with self.pool.acquire() as conn, conn.transaction():
            root = await conn.fetchrow(self._lock_job, job_id)
            if root is None:
                return None
            if root["status"] not in _RETRYABLE:
                raise ValueError(
                    f"job {job_id} is {root['status']}: only a failed, cancelled or "
                    "expired job can be retried"
                )
            for edge in await conn.fetch(self._edges_of, job_id):
                if _blocks(edge, {job_id}):
                    raise ValueError(
                        f"job {job_id} depends on {edge['depends_on']}, which "
                        f"{edge['status']}: retry that job first"
                    )
            reopened = await self._cascade(conn, job_id)
            await conn.execute(self._reset_edges, [job_id, *reopened])
            return await conn.fetch(self._reopen, job_id, reopened)

    async def _cascade(self, conn: asyncpg.Connection, job_id: str) -> list[str]:
        """The dependents ``job_id``'s end cancelled, transitively, that can
        wait again: each of whose dependencies is completed, unfinished, or
        reopened with it."""
        kept: set[str] = {job_id}
        frontier = [job_id]
        edges: dict[str, list[asyncpg.Record]] = {}
        while frontier:
            rows = await conn.fetch(self._cascaded, frontier)
            if len(kept) + len(rows) > MAX_GRAPH * 4:
                raise GraphTooLarge(f"the graph of {job_id} is too large to retry")
            found: dict[str, list[asyncpg.Record]] = {}
            for row in rows:
                if row["job_id"] not in kept:
                    found.setdefault(row["job_id"], []).append(row)
            edges.update(found)
            kept.update(found)
            frontier = list(found)
        # Drop those held back by a dependency that ended and is not reopened,
        # and what only they led to, until nothing changes.
        while True:
            blocked = {j for j, es in edges.items() if any(_blocks(e, kept) for e in es)}
            if not blocked:
                break
            kept -= blocked
            for j in blocked:
                del edges[j]
            reachable = _reachable(job_id, edges)
            for j in [j for j in edges if j not in reachable]:
                kept.discard(j)
                del edges[j]
        kept.discard(job_id)
        return sorted(kept)

    async def fork(self, job_id: str, new_id: str, step: int | str) -> int | None:
        """A new run ``new_id`` of workflow ``job_id`` holding its checkpoints
        before ``step`` (a sequence number, or the first step of that name).
        The number of steps copied; None: no such job."""
        async with self.pool.acquire() as conn, conn.transaction():
            if await conn.fetchrow(self._lock_job, job_id) is None:
                return None
            if isinstance(step, str):
                seq = await conn.fetchval(self._step_named, job_id, step)
                if seq is None:
                    raise ValueError(f"workflow {job_id} has no step named {step!r}")
            else:
                seq = step
            copied = await conn.fetch(self._steps_before, job_id, seq)
            for row in copied:
                if row["kind"] in _UNFORKABLE or row["status"] == "waiting":
                    raise ValueError(
                        f"cannot fork workflow {job_id} after step {row['seq']} "
                        f"({row['kind']} {row['name']!r}, {row['status']}): a fork keeps "
                        "only finished steps, sleeps and signals, not spawned children"
                    )
            await conn.fetchval(self._fork_job, job_id, new_id)
            await conn.execute(self._copy_steps, job_id, new_id, seq)
            return len(copied)

    async def list(self, status: str | None, limit: int) -> list[asyncpg.Record]:
        return await self.pool.fetch(self._list, status, limit)


def _blocks(edge: asyncpg.Record, reopened: set[str]) -> bool:
    """An edge that keeps its dependent from ever running: not met, its
    dependency ended without completing and is not run again."""
    return (
        not edge["met"]
        and edge["status"] is not None
        and edge["status"] != "completed"
        and edge["depends_on"] not in reopened
    )


def _reachable(root: str, edges: dict[str, list[asyncpg.Record]]) -> set[str]:
    """The jobs of ``edges`` reached from ``root`` along their edges."""
    children: dict[str, list[str]] = {}
    for dependent, es in edges.items():
        for e in es:
            children.setdefault(e["depends_on"], []).append(dependent)
    seen: set[str] = set()
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return seen
