"""The operator's reads of workflows (migration 0014): what a parked workflow
waits for, its steps, its children, its unread signals, and the parked rows
per queue. Read-only; used by the dashboard, the CLI and ``stats()``.

Every read is driven by an index: a job's steps and children by the primary
key of ``workflow_steps`` (job_id, seq), its signals by
``workflow_signals_job_idx``, the parked rows by ``scheduled_jobs_wake_idx``
(WHERE status = 'waiting'). Children are found through their parent's spawn
steps, never by scanning ``scheduled_jobs`` for their ``parent_job_id``; a
child the vacuum deleted still shows, with the outcome copied onto its spawn
step when its row went (0016).

A schema not yet migrated to 0014 has none of this: :meth:`available` says
so (a yes is remembered, a no asked again), and the reads are then not made.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from .names import DEFAULT_SCHEMA, Executor, Qualifier
from .workflow_sql import _FINAL, _STEP_RESULT, _STEP_STATUS

#: Characters of a step's result or error, a child's error or a signal's
#: payload shown; the full length comes with each, so a view can say so.
CLIP = 500

_AVAILABLE = "SELECT to_regclass($1) IS NOT NULL AND to_regclass($2) IS NOT NULL"

# Per job: what it waits for, its place in a family, and how much it has.
# ``children_waiting``: the awaited children not yet ended (a parent parked
# on children waits on the spawn steps in [lower, upper) of wait_children,
# and counts them down as they end: workflow_waits, 0016).
_WAITS = """
SELECT j.job_id, j.status, j.wait_kind, j.wait_for, j.wake_at, j.wait_seq,
       lower(j.wait_children) AS children_from, upper(j.wait_children) AS children_to,
       j.workflow_deadline, j.parent_job_id, j.parent_seq, j.has_children,
       p.task_name AS parent_task, p.status AS parent_status,
       CASE WHEN j.wait_kind = 'children' THEN (
           SELECT w.wait_left::bigint FROM workflow_waits w WHERE w.job_id = j.job_id)
       END AS children_waiting
  FROM scheduled_jobs j
  LEFT JOIN scheduled_jobs p ON p.job_id = j.parent_job_id
 WHERE j.job_id = ANY($1::text[])
"""
# One job's totals: steps, children (spawn steps), unread signals.
_TOTALS = """
SELECT (SELECT count(*) FROM workflow_steps s WHERE s.job_id = $1) AS steps,
       (SELECT count(*) FROM workflow_steps s WHERE s.job_id = $1 AND s.kind = 'spawn')
           AS children,
       (SELECT count(*) FROM workflow_signals g WHERE g.job_id = $1 AND g.consumed_seq IS NULL)
           AS pending_signals
"""
# A page of steps after seq $2, in order; results and errors clipped to $3. A
# spawn step is over when its child's row is final (the outcome lives there
# until the row goes: 0016); it reads as the parent's wait does.
_STEPS = """
SELECT s.seq, s.kind, s.name, s.key, {status} AS status, s.attempts, s.started_at,
       coalesce(c.finished_at, s.finished_at) AS finished_at,
       CASE WHEN {status} <> 'waiting' AND s.started_at IS NOT NULL
            THEN greatest(extract(epoch FROM coalesce(c.finished_at, s.finished_at)
                                           - s.started_at), 0)::float8
       END AS duration,
       left(({result})::text, $3) AS result, length(({result})::text) AS result_length,
       left(s.error, $3) AS error, length(s.error) AS error_length,
       CASE WHEN s.kind = 'spawn' THEN s.result ->> 'job_id' END AS child_job_id
  FROM workflow_steps s
  LEFT JOIN scheduled_jobs c
    ON s.kind = 'spawn' AND s.status = 'waiting' AND c.job_id = s.result ->> 'job_id'
       AND c.status IN {final}
 WHERE s.job_id = $1 AND s.seq > $2
 ORDER BY s.seq
 LIMIT $4
""".format(
    status=_STEP_STATUS.format(s="s", c="c"),
    result=_STEP_RESULT.format(s="s", c="c"),
    final=_FINAL,
)
# A child's status: its row's, else (deleted by the vacuum) what its end wrote
# on the spawn step.
_CHILD_STATUS = """coalesce(j.status, s.result -> 'outcome' ->> 'status',
                  CASE WHEN s.status = 'waiting' THEN 'unknown' ELSE 'deleted' END)"""
# A page of children after spawn step $2, in spawn order.
_CHILDREN = f"""
SELECT s.seq, s.result ->> 'job_id' AS job_id, coalesce(j.task_name, s.name) AS task_name,
       {_CHILD_STATUS} AS status,
       coalesce((s.result ->> 'detached')::boolean, false) AS detached,
       j.attempts, j.created_at, j.started_at, j.finished_at, j.queue,
       left(coalesce(j.error_message, s.result -> 'outcome' ->> 'error'), $3) AS error
  FROM workflow_steps s
  LEFT JOIN scheduled_jobs j ON j.job_id = s.result ->> 'job_id'
 WHERE s.job_id = $1 AND s.kind = 'spawn' AND s.seq > $2
 ORDER BY s.seq
 LIMIT $4
"""
_CHILD_COUNTS = f"""
SELECT {_CHILD_STATUS} AS status, count(*)::bigint AS n
  FROM workflow_steps s
  LEFT JOIN scheduled_jobs j ON j.job_id = s.result ->> 'job_id'
 WHERE s.job_id = $1 AND s.kind = 'spawn'
 GROUP BY 1
"""
# Signals sent and not yet taken by a wait, oldest first.
_PENDING_SIGNALS = """
SELECT g.id, g.name, g.sent_at, left(g.payload::text, $2) AS payload,
       length(g.payload::text) AS payload_length, g.idempotency_key
  FROM workflow_signals g
 WHERE g.job_id = $1 AND g.consumed_seq IS NULL
 ORDER BY g.id
 LIMIT $3
"""
# Parked rows per queue (scheduled_jobs_wake_idx holds exactly these rows).
_WAITING_BY_QUEUE = """
SELECT queue, count(*)::bigint AS n FROM scheduled_jobs WHERE status = 'waiting' GROUP BY queue
"""


def is_workflow_row(family: asyncpg.Record, totals: asyncpg.Record) -> bool:
    """Whether a job has anything of a workflow to show (steps, signals, a
    wait, a parent, children, a deadline), from :meth:`WorkflowViews.waits`
    and :meth:`WorkflowViews.totals`. A workflow not yet started has none."""
    return bool(
        totals["steps"]
        or totals["pending_signals"]
        or family["wait_kind"]
        or family["parent_job_id"]
        or family["has_children"]
        or family["workflow_deadline"]
    )


class WorkflowViews:
    """The read-only workflow statements of one schema."""

    def __init__(self, pool: asyncpg.Pool, schema: str = DEFAULT_SCHEMA) -> None:
        self.pool = pool
        q = Qualifier(schema)
        self._tables = (q.table("workflow_steps"), q.table("workflow_signals"))
        self._available = False
        self._waits = q(_WAITS)
        self._totals = q(_TOTALS)
        self._steps = q(_STEPS)
        self._children = q(_CHILDREN)
        self._child_counts = q(_CHILD_COUNTS)
        self._pending_signals = q(_PENDING_SIGNALS)
        self._waiting_by_queue = q(_WAITING_BY_QUEUE)

    async def available(self, db: Executor | None = None) -> bool:
        """Whether this schema has workflows (migration 0014)."""
        if not self._available:
            self._available = bool(await (db or self.pool).fetchval(_AVAILABLE, *self._tables))
        return self._available

    async def waits(
        self, job_ids: Sequence[str], db: Executor | None = None
    ) -> dict[str, asyncpg.Record]:
        """job_id -> its wait, deadline and family columns, for each id that exists."""
        if not job_ids or not await self.available(db):
            return {}
        rows = await (db or self.pool).fetch(self._waits, list(job_ids))
        return {r["job_id"]: r for r in rows}

    async def totals(self, job_id: str, db: Executor | None = None) -> asyncpg.Record:
        """(steps, children, pending_signals) of one job."""
        return await (db or self.pool).fetchrow(self._totals, job_id)

    async def steps(
        self,
        job_id: str,
        *,
        after: int = 0,
        limit: int = 200,
        clip: int = CLIP,
        db: Executor | None = None,
    ) -> list[asyncpg.Record]:
        return await (db or self.pool).fetch(self._steps, job_id, after, clip, limit)

    async def children(
        self,
        job_id: str,
        *,
        after: int = 0,
        limit: int = 200,
        clip: int = CLIP,
        db: Executor | None = None,
    ) -> list[asyncpg.Record]:
        """Children spawned after spawn step ``after``, in spawn order."""
        return await (db or self.pool).fetch(self._children, job_id, after, clip, limit)

    async def child_counts(self, job_id: str, db: Executor | None = None) -> dict[str, int]:
        rows = await (db or self.pool).fetch(self._child_counts, job_id)
        return {r["status"]: int(r["n"]) for r in rows}

    async def pending_signals(
        self, job_id: str, *, limit: int = 50, clip: int = CLIP, db: Executor | None = None
    ) -> list[asyncpg.Record]:
        return await (db or self.pool).fetch(self._pending_signals, job_id, clip, limit)

    async def waiting_by_queue(self, db: Executor | None = None) -> dict[str, int]:
        """queue -> parked workflows ({} before migration 0014)."""
        if not await self.available(db):
            return {}
        rows = await (db or self.pool).fetch(self._waiting_by_queue)
        return {r["queue"]: int(r["n"]) for r in rows}
