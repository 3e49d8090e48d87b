"""Statements of debounce and throttle (migration 0019).

Debounce: one ``INSERT ... ON CONFLICT`` on the unique index of dedupe scope
'debounce' per call. The burst's first call inserts the job; each later call
meets the pending holder and moves its due time to the call plus the quiet
period (never past the burst's first call plus its longest wait) and gives
it the call's fields. A holder already claimed (waiting in a worker's buffer)
is locked but left alone: the statement returns no row and the caller tries
again once the claim has started or been handed back.

Throttle: the period's row in ``scheduler_throttles`` is taken (an upsert
that overwrites only a period that has ended) and the job written by the
same statement; a held period writes nothing, and :meth:`TimingStore.throttle_holder`
reads the id of the job that took it.

Due times are the database's: ``statement_timestamp()`` is the call, the
row's ``created_at`` (the inserting transaction's ``now()``) its burst's start.
"""

from __future__ import annotations

from typing import Any

from ..enums import DEFAULT_QUEUE
from .dedupe import HELD_DEBOUNCED
from .jobs import NewJob
from .names import Executor, Qualifier

_COLUMNS = """job_id, job_name, task_name, execution_time, status, task_data, priority,
    max_retries, misfire_grace_time, timeout, retry_policy, dedupe_key, dedupe_scope, queue,
    concurrency_key, max_running_per_key, rate_count_per_key, rate_period_per_key, key_ordered"""

# $1..$11: the row's fields (see _debounce_args); $12 the quiet period and $13
# the longest wait (NULL: none), in seconds; $14 whether the holder may be
# updated only if it is $15 (a merge read that holder's arguments first);
# $16..$20 the row's concurrency key and per-key limits (migration 0017).
# A new burst's row wakes the workers through the INSERT trigger. A call that
# moves the due time earlier (a shorter debounce or longest wait than the
# burst's earlier calls gave) wakes them itself: they may sleep until the old
# time (sent as job inserts send it: '' for the default queue). ``before`` is
# read from the statement's snapshot: a hint for the wake-up only.
_DEBOUNCE = f"""
WITH before AS (
    SELECT j.execution_time FROM scheduled_jobs j WHERE j.dedupe_key = $10 AND {HELD_DEBOUNCED}
), written AS (
    INSERT INTO scheduled_jobs AS j ({_COLUMNS})
    VALUES ($1, $2, $3,
            LEAST(statement_timestamp() + make_interval(secs => $12::float8),
                  now() + make_interval(secs => $13::float8)),
            'pending', $4::jsonb, $5, $6, $7, $8, $9::jsonb, $10, 'debounce', $11,
            $16, $17, $18, $19, $20)
    ON CONFLICT (dedupe_key) WHERE dedupe_scope = 'debounce' AND NOT started_before
        AND (status = 'pending' OR (status = 'running' AND claimed_ahead))
    DO UPDATE SET job_name = EXCLUDED.job_name, task_name = EXCLUDED.task_name,
        execution_time = LEAST(statement_timestamp() + make_interval(secs => $12::float8),
                               j.created_at + make_interval(secs => $13::float8)),
        task_data = EXCLUDED.task_data, priority = EXCLUDED.priority,
        max_retries = EXCLUDED.max_retries, misfire_grace_time = EXCLUDED.misfire_grace_time,
        timeout = EXCLUDED.timeout, retry_policy = EXCLUDED.retry_policy, queue = EXCLUDED.queue,
        concurrency_key = EXCLUDED.concurrency_key,
        max_running_per_key = EXCLUDED.max_running_per_key,
        rate_count_per_key = EXCLUDED.rate_count_per_key,
        rate_period_per_key = EXCLUDED.rate_period_per_key, key_ordered = EXCLUDED.key_ordered
    WHERE j.status = 'pending' AND (NOT $14::bool OR j.job_id = $15::text)
    RETURNING j.job_id, j.execution_time, j.queue
), woke AS (
    SELECT pg_notify('pg_scheduler_jobs',
                     CASE WHEN w.queue = '{DEFAULT_QUEUE}' THEN '' ELSE w.queue END)
      FROM written w, before b
     WHERE w.execution_time < b.execution_time
)
SELECT w.job_id, (SELECT count(*) FROM woke) AS woken FROM written w
"""

# The holder of a debounce key, locked (a merge reads its arguments).
_DEBOUNCE_HOLDER = f"""
SELECT j.job_id, j.task_name, j.status, j.task_data::text AS task_data
  FROM scheduled_jobs j
 WHERE j.dedupe_key = $1 AND {HELD_DEBOUNCED}
   FOR UPDATE
"""

# $1..$13: the row (NewJob's order) up to its queue; $14 the period in seconds;
# $15..$19 the row's concurrency key and per-key limits (migration 0017).
_THROTTLE = f"""
WITH won AS (
    INSERT INTO scheduler_throttles AS t (throttle_key, job_id, until)
    VALUES ($11, $1, statement_timestamp() + make_interval(secs => $14::float8))
    ON CONFLICT (throttle_key) DO UPDATE SET job_id = EXCLUDED.job_id, until = EXCLUDED.until
     WHERE t.until <= statement_timestamp()
    RETURNING t.job_id
)
INSERT INTO scheduled_jobs ({_COLUMNS})
SELECT won.job_id, $2, $3, $4, 'pending', $5::jsonb, $6, $7, $8, $9, $10::jsonb, $11, $12, $13,
       $15, $16, $17, $18, $19
  FROM won
RETURNING job_id
"""

# Periods that ended more than a minute ago: the vacuum drops them (the key's
# next call inserts a fresh row, as it would overwrite an ended one). A held
# period's row (until in the future) is never touched, and a call racing the
# delete either finds the row gone or, having locked it first, has moved its
# end past the cut, which the delete's recheck then sees.
PRUNE_THROTTLES = """
DELETE FROM scheduler_throttles
 WHERE until < clock_timestamp() - interval '1 minute'
"""

# Who holds a key's period now: (job id, whether the period is still on).
_THROTTLE_HOLDER = """
SELECT job_id, until > statement_timestamp() AS held FROM scheduler_throttles
 WHERE throttle_key = $1
"""


def _debounce_args(row: NewJob) -> tuple[Any, ...]:
    return (
        row.job_id,
        row.job_name,
        row.task_name,
        row.task_data,
        row.priority,
        row.max_retries,
        row.misfire_grace_time,
        row.timeout,
        row.retry_policy,
        row.dedupe_key,
        row.queue,
    )


def _key_args(row: NewJob) -> tuple[Any, ...]:
    return (
        row.concurrency_key,
        row.max_running_per_key,
        row.rate_count_per_key,
        row.rate_period_per_key,
        row.key_ordered,
    )


def debounce_params(
    row: NewJob, seconds: float, max_wait: float | None, merged: bool, only_holder: str | None
) -> tuple[Any, ...]:
    """The parameters of ``_DEBOUNCE`` (asyncpg's and the DB-API writer's)."""
    return (*_debounce_args(row), seconds, max_wait, merged, only_holder, *_key_args(row))


def throttle_params(row: NewJob, period: float) -> tuple[Any, ...]:
    """The parameters of ``_THROTTLE``."""
    return (*row[:13], period, *_key_args(row))


class TimingStore:
    """The debounce and throttle statements of one schema."""

    def __init__(self, q: Qualifier) -> None:
        self._debounce = q(_DEBOUNCE)
        self._debounce_holder = q(_DEBOUNCE_HOLDER)
        self._throttle = q(_THROTTLE)
        self._throttle_holder = q(_THROTTLE_HOLDER)

    async def debounce(
        self,
        db: Executor,
        row: NewJob,
        seconds: float,
        max_wait: float | None,
        only_holder: str | None = None,
        merged: bool = False,
    ) -> str | None:
        """Insert ``row`` as its key's burst, or give the pending holder its
        fields and move its due time; the id of the job written. None: the
        holder waits claimed in a worker's buffer, or (``merged``) the key is
        held by a job other than ``only_holder``: nothing was written."""
        args = debounce_params(row, seconds, max_wait, merged, only_holder)
        return await db.fetchval(self._debounce, *args)  # type: ignore[no-any-return]

    async def debounce_holder(self, db: Executor, key: str) -> Any:
        """The row holding debounce key ``key`` (job_id, task_name, status,
        task_data), locked until the end of the transaction; None if free."""
        return await db.fetchrow(self._debounce_holder, key)

    async def throttle(self, db: Executor, row: NewJob, period: float) -> str | None:
        """Write ``row`` if its key's period is free (taking it); its id, else None."""
        return await db.fetchval(self._throttle, *throttle_params(row, period))  # type: ignore[no-any-return]

    async def throttle_holder(self, db: Executor, key: str) -> tuple[str, bool] | None:
        """(job id, still held) of the job that took ``key``'s latest period."""
        found = await db.fetchrow(self._throttle_holder, key)
        return None if found is None else (found["job_id"], found["held"])
