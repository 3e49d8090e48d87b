"""The statements of the testing kit (``pg_scheduler.testing``): the virtual
clock's shift of recorded times, a dead run's lease run out, a workflow's
unfinished children.

The virtual clock never touches the database's clock: ``now()`` still decides
every wake-up, in the same statements as in production. It moves the times
recorded for the jobs not yet finished back by the span it advances (a
parked workflow's wake time, its deadline, the end of a sleep and the timeout
of a signal wait recorded in its steps, the due time of a pending job due
later, never earlier than now), which is what ``now()`` advancing by that span
would mean to them.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import NamedTuple

import asyncpg

from ..enums import FINAL_STATUS_VALUES
from .names import DEFAULT_SCHEMA, Executor, Qualifier

_FINAL = "(" + ", ".join(f"'{status}'" for status in FINAL_STATUS_VALUES) + ")"

# Shift by $1, or (with $2) by as much as brings $2 to now (never backwards).
# Both updates read the rows as they were before the statement.
_SHIFT = f"""
WITH d AS (
    SELECT CASE WHEN $2::timestamptz IS NULL THEN $1::interval
                ELSE GREATEST($2::timestamptz - now(), interval '0') END AS by
), jobs AS (
    UPDATE scheduled_jobs j
       SET wake_at = j.wake_at - d.by,
           workflow_deadline = j.workflow_deadline - d.by,
           execution_time = CASE WHEN j.status = 'pending' AND j.execution_time > now()
                                 THEN GREATEST(j.execution_time - d.by, now())
                                 ELSE j.execution_time END
      FROM d
     WHERE j.status NOT IN {_FINAL}
       AND (j.wake_at IS NOT NULL OR j.workflow_deadline IS NOT NULL
            OR (j.status = 'pending' AND j.execution_time > now()))
    RETURNING 1
), records AS (
    UPDATE workflow_steps s
       SET result = jsonb_set(s.result, '{{until}}',
                              to_jsonb((s.result ->> 'until')::timestamptz - d.by))
      FROM d, scheduled_jobs j
     WHERE j.job_id = s.job_id AND j.status NOT IN {_FINAL}
       AND s.kind IN ('sleep', 'signal') AND s.result ->> 'until' IS NOT NULL
    RETURNING 1
)
SELECT d.by, (SELECT count(*) FROM jobs) AS jobs, (SELECT count(*) FROM records) AS records
  FROM d
"""

# A run whose worker is gone: its lease ran out (the rescuer takes it next).
_EXPIRE_LEASE = """
UPDATE scheduled_jobs SET lease_until = now() - interval '1 second'
 WHERE job_id = $1 AND status = 'running'
RETURNING worker_id
"""

# The children of $1 that have not ended, in spawn order.
_UNFINISHED_CHILDREN = f"""
SELECT job_id FROM scheduled_jobs
 WHERE parent_job_id = $1 AND status NOT IN {_FINAL}
 ORDER BY parent_seq, job_id
"""


class Shifted(NamedTuple):
    by: timedelta
    jobs: int
    records: int


class TestingStore:
    """The testing kit's statements of one schema, through one pool."""

    def __init__(self, pool: asyncpg.Pool, schema: str = DEFAULT_SCHEMA) -> None:
        self.pool = pool
        q = Qualifier(schema)
        self._shift = q(_SHIFT)
        self._expire_lease = q(_EXPIRE_LEASE)
        self._unfinished_children = q(_UNFINISHED_CHILDREN)

    async def shift(self, db: Executor, by: timedelta | None, until: datetime | None) -> Shifted:
        """Move the recorded times back by ``by``, or by ``until - now()``."""
        row = await db.fetchrow(self._shift, by, until)
        return Shifted(row["by"], int(row["jobs"]), int(row["records"]))

    async def expire_lease(self, db: Executor, job_id: str) -> str | None:
        """The worker of running job ``job_id``, whose lease ran out now; None:
        the job is not running."""
        row = await db.fetchrow(self._expire_lease, job_id)
        return None if row is None else str(row["worker_id"])

    async def unfinished_children(self, db: Executor, job_id: str) -> list[str]:
        return [r["job_id"] for r in await db.fetch(self._unfinished_children, job_id)]
