"""Statements on workers and the leases they hold: register/heartbeat, renew, rescue.

The heartbeat, rescue and release use ``scheduled_jobs_running_idx``. Rows of
dead workers (stale heartbeat or expired lease) go back to pending here.
"""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from .event_sql import events_cte
from .fair_sql import FAIR_DUE_GROUPS
from .names import Qualifier
from .queues import FAIR_GROUPS, GROUPS

# The running rows of worker $1 that no other session has locked, locked here
# in job_id order. The heartbeat and the watchdog's renewal never wait for a
# row lock: a row another session holds (a completion of this worker in
# flight, an operator's transaction) is skipped, so neither can deadlock with
# a completion or stall behind a lock; it is still reported (``renewed``
# false) and renewed by the first heartbeat after the lock is gone.
_RENEWABLE = """renewable AS (
    SELECT job_id FROM scheduled_jobs
     WHERE worker_id = $1 AND status = 'running'
     ORDER BY job_id
       FOR NO KEY UPDATE SKIP LOCKED
)"""
_RENEWED = """
    UPDATE scheduled_jobs j
       SET last_heartbeat = now(), lease_until = now() + make_interval(secs => $2){extra}
     WHERE j.job_id = ANY((SELECT array_agg(r.job_id) FROM renewable r)::text[])
       AND j.worker_id = $1 AND j.status = 'running'
    RETURNING j.job_id, j.attempts, j.started_at,
              EXTRACT(EPOCH FROM now() - j.started_at)::float8 AS running_for
"""
_NOT_RENEWED = """
SELECT j.job_id, j.attempts, j.started_at,
       EXTRACT(EPOCH FROM now() - j.started_at)::float8 AS running_for, false
  FROM scheduled_jobs j
 WHERE j.worker_id = $1 AND j.status = 'running'
   AND NOT EXISTS (SELECT 1 FROM renewable r WHERE r.job_id = j.job_id)
"""

# $7: jobs claimed ahead that started since the last heartbeat.
_STARTED_AHEAD = """,
           claimed_ahead = j.claimed_ahead AND NOT (j.job_id = ANY($7::text[]))"""
_HEARTBEAT = f"""
WITH me AS (
    INSERT INTO scheduler_workers (worker_id, hostname, pid, max_concurrent, tasks)
    VALUES ($1, $3, $4, $5, $6::text[])
    ON CONFLICT (worker_id) DO UPDATE SET last_seen = now(), tasks = EXCLUDED.tasks
), {_RENEWABLE}, renewed AS ({_RENEWED.format(extra=_STARTED_AHEAD)})
SELECT job_id, attempts, started_at, running_for, true AS renewed FROM renewed
UNION ALL{_NOT_RENEWED}"""

# What a rescue writes for the rows of ``orphans`` (job_id, old_worker,
# unstarted, reason, give_up): each back to pending (or failed once it gave
# up), its attempt kept in job_attempts, the events sent. $2 is max_rescues.
_RESCUED = f"""rescued AS (
    UPDATE scheduled_jobs j
       SET status = CASE WHEN o.give_up THEN 'failed' ELSE 'pending' END,
           rescue_count = j.rescue_count + CASE WHEN o.unstarted THEN 0 ELSE 1 END,
           unstarted_rescues = j.unstarted_rescues + CASE WHEN o.unstarted THEN 1 ELSE 0 END,
           claimed_ahead = false,
           -- A row claimed ahead keeps a "pending" dedupe key it holds (0013).
           started_before = j.started_before OR NOT o.unstarted,
           finished_at = CASE WHEN o.give_up THEN now() END,
           error_message = CASE WHEN NOT o.give_up THEN NULL
               WHEN o.give_up AND o.unstarted
               THEN format('gave up: the workers holding this job (claimed ahead, not known'
                           ' to have started) died %s times; last: %s (%s)',
                           j.unstarted_rescues + 1, o.old_worker, o.reason)
               WHEN o.give_up
               THEN format('gave up: the workers running this job died %s times (max_rescues=%s);'
                           ' last: %s (%s)', j.rescue_count + 1, $2, o.old_worker, o.reason)
               WHEN o.unstarted
               THEN format('rescued from worker %s (%s) before it started (claimed ahead;'
                           ' not counted against max_rescues)', o.old_worker, o.reason)
               ELSE format('rescued from worker %s (%s) during attempt %s',
                           o.old_worker, o.reason, j.attempts) END,
           worker_id = CASE WHEN o.give_up THEN j.worker_id END,
           lease_until = NULL
      FROM orphans o
     WHERE j.job_id = o.job_id
    RETURNING j.job_id, j.task_name, j.status, j.attempts, o.old_worker, o.reason, o.unstarted,
              j.started_at, j.queue
), kept AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error)
    SELECT r.job_id, r.attempts, r.old_worker, r.started_at, 'rescued',
           CASE WHEN r.unstarted
                THEN format('rescued from worker %s (%s) before it started (claimed ahead;'
                            ' not counted against max_rescues)', r.old_worker, r.reason)
                ELSE format('rescued from worker %s (%s) during attempt %s',
                            r.old_worker, r.reason, r.attempts) END
      FROM rescued r
), {
    events_cte(
        "SELECT 'rescued', job_id, task_name, attempts, old_worker, NULL::float8, queue"
        " FROM rescued UNION ALL SELECT 'failed', job_id, task_name, attempts, old_worker,"
        " NULL::float8, queue FROM rescued WHERE status = 'failed'"
    )
}
SELECT r.job_id, r.task_name, r.status, r.attempts, r.old_worker, r.reason, r.unstarted,
       pg_notify('pg_scheduler_jobs', '*')
  FROM rescued r, sent
"""

# A job its dead worker had started counts against max_rescues ($2); one it
# held claimed ahead, never started, counts only against the cap $3 on such
# rescues (a job that killed its worker before a heartbeat reported its start
# still ends failed).
_RESCUE = f"""
WITH orphans AS (
    SELECT j.job_id, j.worker_id AS old_worker, j.claimed_ahead AS unstarted,
           CASE WHEN j.lease_until < now() THEN 'lease expired'
                ELSE 'worker heartbeat older than threshold' END AS reason,
           CASE WHEN j.claimed_ahead THEN j.unstarted_rescues + 1 > $3
                ELSE j.rescue_count + 1 > $2 END AS give_up
      FROM scheduled_jobs j
      LEFT JOIN scheduler_workers w ON w.worker_id = j.worker_id
     WHERE j.status = 'running'
       AND (j.lease_until < now() OR w.last_seen < now() - make_interval(secs => $1))
       FOR UPDATE OF j SKIP LOCKED
), {_RESCUED}"""

# The run of a workflow whose own statement lost its connection to the
# database (a restart, a failover, a network fault: workflows/run.py): its
# job ($1, still running here: worker $3, attempt $4) is rescued as from a
# dead worker, so that another run replays it from its records. It counts
# against max_rescues ($2) like a worker's death: a run that breaks its own
# connection every time ends failed instead of looping.
_RESCUE_INTERRUPTED = f"""
WITH orphans AS (
    SELECT j.job_id, j.worker_id AS old_worker, false AS unstarted,
           'its connection to the database was lost under the run' AS reason,
           j.rescue_count + 1 > $2 AS give_up
      FROM scheduled_jobs j
     WHERE j.job_id = $1 AND j.worker_id = $3 AND j.attempts = $4 AND j.status = 'running'
       FOR UPDATE OF j
), {_RESCUED}"""

_FORGET_DEAD_WORKERS = """
DELETE FROM scheduler_workers w
 WHERE w.last_seen < now() - make_interval(secs => $1)
   AND NOT EXISTS (SELECT 1 FROM scheduled_jobs j
                    WHERE j.worker_id = w.worker_id AND j.status = 'running')
"""

# Only the (queue, task, priority) groups (and keyed groups) of tasks no
# live worker has are counted (see queues.py): a backlog of tasks that do have workers costs one
# index descent per group.
# Tasks no live worker has (a condition on ``g.task_name``).
_UNKNOWN_KEEP = """NOT (g.task_name = ANY($1::text[]))
       AND NOT EXISTS (
           SELECT 1 FROM scheduler_workers w
            WHERE w.last_seen >= now() - make_interval(secs => $2)
              AND g.task_name = ANY(w.tasks))"""
_UNKNOWN_TASKS = f"""
WITH RECURSIVE {GROUPS}, {FAIR_GROUPS}, {FAIR_DUE_GROUPS.format(keep=_UNKNOWN_KEEP)}
SELECT t.task_name, sum(t.n)::bigint AS pending
  FROM (SELECT g.task_name, c.n
          FROM groups g
         CROSS JOIN LATERAL (
            SELECT count(*) AS n FROM scheduled_jobs j
             WHERE j.status = 'pending' AND j.concurrency_key IS NULL AND j.fair_share_key IS NULL
               AND j.queue = g.queue AND j.task_name = g.task_name
               AND j.priority = g.priority AND j.execution_time <= now()
         ) c
         WHERE g.execution_time <= now()
           AND {_UNKNOWN_KEEP}
        UNION ALL
        -- Rows with a fair share key (migration 0018), from their own index.
        SELECT task_name, n FROM fair_due_groups) t
 GROUP BY t.task_name
 ORDER BY t.task_name
"""

_RENEW_LEASE = """
UPDATE scheduled_jobs
   SET last_heartbeat = now(), lease_until = now() + make_interval(secs => $3)
 WHERE job_id = $1 AND worker_id = $2 AND status = 'running'
RETURNING job_id
"""
# The watchdog's renewal while the event loop is blocked (services/stall.py),
# on its own connection: this worker's row and every lease it holds. Unlike
# _HEARTBEAT it reports nothing and registers nothing: the loop does that.
_STALL_RENEW = f"""
WITH me AS (
    UPDATE scheduler_workers SET last_seen = now() WHERE worker_id = $1
), {_RENEWABLE}, renewed AS ({_RENEWED.format(extra="")})
SELECT job_id FROM renewed
UNION ALL
SELECT job_id FROM ({_NOT_RENEWED}) AS held_elsewhere
"""
_UNREGISTER = "DELETE FROM scheduler_workers WHERE worker_id = $1"
_LIVE_WORKERS = """
SELECT worker_id, hostname, pid, started_at, last_seen, max_concurrent, tasks
  FROM scheduler_workers
 WHERE last_seen >= now() - make_interval(secs => $1)
 ORDER BY started_at
"""

# What a worker must be granted (after an owner migrated), per table: see the
# docs' "Schemas and privileges" (Operations). One probe, before the worker registers.
_MISSING_PRIVILEGES = """
SELECT t.name, p.privilege
  FROM unnest($1::text[], $2::text[]) AS t(name, privileges)
 CROSS JOIN LATERAL unnest(string_to_array(t.privileges, ',')) AS p(privilege)
 WHERE to_regclass(t.name) IS NULL
    OR NOT has_table_privilege(to_regclass(t.name), p.privilege)
 ORDER BY 1, 2
"""


class WorkerStatements:
    """The workers' half of :class:`~pg_scheduler.store.Store` (qualified there)."""

    pool: asyncpg.Pool
    _heartbeat: str
    _renew_lease: str
    _stall_renew: str
    _fail: str
    _retry: str
    _unregister: str
    _rescue: str
    _rescue_interrupted: str
    _forget_dead_workers: str
    _live_workers: str
    _unknown_tasks: str
    _missing_privileges: str
    qualify: Qualifier

    async def missing_privileges(self, needed: dict[str, str]) -> list[str]:
        """``needed``: table -> comma-separated privileges; those not granted, as
        "PRIVILEGE on schema.table" (a table that does not exist is reported too)."""
        names = [self.qualify.table(t) for t in needed]
        rows = await self.pool.fetch(self._missing_privileges, names, list(needed.values()))
        return [f"{r['privilege']} on {r['name']}" for r in rows]

    async def heartbeat(
        self,
        worker_id: str,
        lease_seconds: float,
        hostname: str,
        pid: int,
        max_concurrent: int,
        tasks: list[str],
        started_ahead: Sequence[str] = (),
    ) -> list[asyncpg.Record]:
        """Renew this worker's row and every lease it holds, in one statement;
        ``started_ahead``: claimed-ahead jobs that have started since the last one."""
        return await self.pool.fetch(
            self._heartbeat,
            worker_id,
            lease_seconds,
            hostname,
            pid,
            max_concurrent,
            tasks,
            list(started_ahead),
        )

    async def renew_lease(self, job_id: str, worker_id: str, lease_seconds: float) -> bool:
        value = await self.pool.fetchval(
            self._renew_lease,
            job_id,
            worker_id,
            lease_seconds,
        )
        return value is not None

    # -- from the watchdog thread, on its own connection (the loop is blocked) --

    async def renew_while_stalled(
        self, conn: asyncpg.Connection, worker_id: str, lease_seconds: float, timeout: float
    ) -> list[str]:
        """Renew this worker's row and all its leases; the ids still running here."""
        rows = await conn.fetch(self._stall_renew, worker_id, lease_seconds, timeout=timeout)
        return [r["job_id"] for r in rows]

    async def fail_blocker(
        self,
        conn: asyncpg.Connection,
        job_id: str,
        worker_id: str,
        attempt: int,
        error: str,
        traceback: str | None,
        retry_delay: float | None,
        timeout: float,
    ) -> bool:
        """Fail (``retry_delay`` None) or retry the attempt that blocks the loop,
        under the lease guard; False if this worker no longer holds it."""
        if retry_delay is None:
            args: tuple[object, ...] = (self._fail, job_id, worker_id, attempt, error, traceback)
        else:
            args = (self._retry, job_id, worker_id, attempt, retry_delay, error, traceback)
        return await conn.fetchval(*args, timeout=timeout) is not None

    async def unregister_worker(self, worker_id: str) -> None:
        await self.pool.execute(self._unregister, worker_id)

    async def rescue_orphans(
        self, heartbeat_threshold: float, max_rescues: int, max_unstarted_rescues: int
    ) -> list[asyncpg.Record]:
        """Return jobs of dead workers (stale heartbeat or expired lease) to pending."""
        rows = await self.pool.fetch(
            self._rescue, heartbeat_threshold, max_rescues, max_unstarted_rescues
        )
        await self.pool.execute(self._forget_dead_workers, heartbeat_threshold * 10)
        return rows

    async def rescue_interrupted(
        self, job_id: str, worker_id: str, attempt: int, max_rescues: int
    ) -> asyncpg.Record | None:
        """Rescue the job of a run whose connection was lost under it (see
        _RESCUE_INTERRUPTED): its row, or None if it is no longer running here."""
        return await self.pool.fetchrow(
            self._rescue_interrupted, job_id, max_rescues, worker_id, attempt
        )

    async def live_workers(self, heartbeat_threshold: float) -> list[asyncpg.Record]:
        return await self.pool.fetch(self._live_workers, heartbeat_threshold)

    async def unknown_tasks(
        self, local_tasks: list[str], heartbeat_threshold: float
    ) -> dict[str, int]:
        """Due pending jobs whose task no live worker has registered, by task name."""
        rows = await self.pool.fetch(self._unknown_tasks, local_tasks, heartbeat_threshold)
        return {r["task_name"]: r["pending"] for r in rows}

    # -- single-job operations -----------------------------------------------
