"""Statements on dedupe keys (migrations 0008 and 0013): who holds a key, and
replacing the pending job that holds one.

Each scope has its own partial unique index; a statement names its scope's
predicate as constants so the planner can use that index (a predicate that
compared the scope with a parameter could not).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .jobs import NewJob
from .names import Executor, Qualifier

#: What holding a key means in each scope: the predicate of its unique index.
#: "active": pending, running, or a workflow parked (migration 0014).
#: "pending": no attempt has started (``started_before``, migration 0013), and
#: the job is pending or waits claimed ahead in a worker's buffer.
HELD_IN_SCOPE = {
    "active": "j.dedupe_scope = 'active' AND j.status IN ('pending', 'running', 'waiting')",
    "pending": "j.dedupe_scope = 'pending' AND NOT j.started_before"
    " AND (j.status = 'pending' OR (j.status = 'running' AND j.claimed_ahead))",
}
#: Rows of a debounced burst (migration 0019): held as in scope "pending". A
#: scope of its own, written only by ``schedule(debounce=...)`` (store/timing.py).
HELD_DEBOUNCED = HELD_IN_SCOPE["pending"].replace("'pending' AND NOT", "'debounce' AND NOT")
#: The unique indexes, by name: a UniqueViolationError names its index.
DEDUPE_INDEXES = frozenset(
    {
        "scheduled_jobs_dedupe_active_idx",
        "scheduled_jobs_dedupe_pending_idx",
        "scheduled_jobs_dedupe_debounce_idx",
    }
)

_HOLDERS = """
SELECT j.dedupe_key, j.job_id, j.status FROM scheduled_jobs j
 WHERE j.dedupe_key = ANY($1::text[]) AND {held}
"""

# The pending holder takes the new job's fields and starts afresh (as REPLACE
# by job id does); it keeps its job id. A running holder (scope "pending": one
# claimed ahead, waiting in a worker's buffer) is never touched.
_REPLACE_PENDING = """
UPDATE scheduled_jobs j
   SET job_name = d.job_name, task_name = d.task_name, execution_time = d.execution_time,
       task_data = d.task_data::jsonb, priority = d.priority, max_retries = d.max_retries,
       misfire_grace_time = d.misfire_grace_time, timeout = d.timeout,
       retry_policy = d.retry_policy::jsonb, queue = d.queue, status = 'pending',
       concurrency_key = d.concurrency_key, max_running_per_key = d.max_running_per_key,
       rate_count_per_key = d.rate_count_per_key, rate_period_per_key = d.rate_period_per_key,
       key_ordered = d.key_ordered, key_seq = NULL,
       fair_share_key = d.fair_share_key, fair_share_weight = d.fair_share_weight,
       retry_count = 0,
       attempts = 0, rescue_count = 0, unstarted_rescues = 0, error_message = NULL,
       error_traceback = NULL, result = NULL, worker_id = NULL, last_heartbeat = NULL,
       lease_until = NULL, started_at = NULL, finished_at = NULL, created_at = now(),
       claimed_ahead = false, started_before = false
  FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::text[], $5::int[], $6::int[],
              $7::int[], $8::float8[], $9::text[], $10::text[], $11::text[], $12::text[],
              $13::int[], $14::int[], $15::float8[], $16::bool[], $17::text[], $18::float8[])
    AS d(job_name, task_name, execution_time, task_data, priority, max_retries,
         misfire_grace_time, timeout, retry_policy, dedupe_key, queue, concurrency_key,
         max_running_per_key, rate_count_per_key, rate_period_per_key, key_ordered,
         fair_share_key, fair_share_weight)
 WHERE j.dedupe_key = d.dedupe_key AND j.status = 'pending' AND {held}
RETURNING j.dedupe_key, j.job_id
"""


class DedupeStore:
    """The dedupe statements of one schema (one variant per scope)."""

    def __init__(self, q: Qualifier) -> None:
        self._holders = {s: q(_HOLDERS.format(held=p)) for s, p in HELD_IN_SCOPE.items()}
        self._replace = {s: q(_REPLACE_PENDING.format(held=p)) for s, p in HELD_IN_SCOPE.items()}

    async def holders(
        self, db: Executor, scope: str, keys: Sequence[str]
    ) -> dict[str, tuple[str, str]]:
        """key -> (job id, status) of the job holding each of ``keys`` in ``scope``."""
        rows = await db.fetch(self._holders[scope], list(keys))
        return {r["dedupe_key"]: (r["job_id"], r["status"]) for r in rows}

    async def replace_pending(
        self, db: Executor, scope: str, jobs: Sequence[NewJob]
    ) -> dict[str, str]:
        """Give each pending holder of a key in ``scope`` the fields of the job in
        ``jobs`` with that key (one job per key); key -> the holder's job id."""
        columns: list[list[Any]] = [[] for _ in range(18)]
        for j in jobs:
            values = (
                j.job_name,
                j.task_name,
                j.execution_time,
                j.task_data,
                j.priority,
                j.max_retries,
                j.misfire_grace_time,
                j.timeout,
                j.retry_policy,
                j.dedupe_key,
                j.queue,
                j.concurrency_key,
                j.max_running_per_key,
                j.rate_count_per_key,
                j.rate_period_per_key,
                j.key_ordered,
                j.fair_share_key,
                j.fair_share_weight,
            )
            for column, value in zip(columns, values, strict=True):
                column.append(value)
        rows = await db.fetch(self._replace[scope], *columns)
        return {r["dedupe_key"]: r["job_id"] for r in rows}
