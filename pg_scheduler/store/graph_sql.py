"""Operations on whole workflows: statements of :mod:`.graph_ops`.

A *graph* is the set of jobs joined by declared dependencies
(``job_dependencies``, migration 0015), walked in both directions: every
edge is read through an index (the primary key leads with ``depends_on``,
``job_dependencies_job_idx`` with ``job_id``). A code-first workflow's
children go with it when it is cancelled (migration 0014's trigger).
"""

from __future__ import annotations

from .event_sql import events_cte
from .names import CANCEL_CHANNEL, JOBS_CHANNEL

#: What a job cancelled by its dependency's end says (migration 0015); a
#: graph's retry reopens exactly those.
CASCADE_REASON = "cancelled: its dependency %"

# Every job joined to $1 by dependencies, either way; at most $2 of them.
_GRAPH = """
WITH RECURSIVE graph(job_id) AS (
    SELECT $1::text
    UNION
    SELECT n.job_id FROM graph g
     CROSS JOIN LATERAL (
        SELECT e.job_id FROM job_dependencies e WHERE e.depends_on = g.job_id
        UNION ALL
        SELECT e.depends_on FROM job_dependencies e WHERE e.job_id = g.job_id
     ) n
)
SELECT g.job_id FROM graph g LIMIT $2
"""

# The jobs of a graph as an operator sees them.
_NODES = """
SELECT j.job_id, j.task_name, j.queue, j.status, j.wait_kind, j.created_at, j.started_at,
       j.finished_at, j.error_message, j.parent_job_id,
       coalesce(ARRAY(SELECT e.depends_on FROM job_dependencies e
                       WHERE e.job_id = j.job_id ORDER BY e.ordinal), '{}') AS depends_on
  FROM scheduled_jobs j
 WHERE j.job_id = ANY($1::text[])
 ORDER BY j.created_at, j.job_id
"""

# Cancel every unfinished job of $1 (locked in job_id order, so two operations
# on one graph never deadlock); running ones are told through the cancel
# channel like cancel_job(). $2: the reason recorded on each.
_CANCEL_MANY = f"""
WITH target AS (
    SELECT job_id, status, attempts, worker_id, started_at FROM scheduled_jobs
     WHERE job_id = ANY($1::text[]) AND status IN ('pending', 'running', 'waiting')
     ORDER BY job_id
       FOR UPDATE
), cancelled AS (
    UPDATE scheduled_jobs j
       SET status = 'cancelled', finished_at = now(), lease_until = NULL, wait_kind = NULL,
           error_message = $2
      FROM target t
     WHERE j.job_id = t.job_id AND j.status IN ('pending', 'running', 'waiting')
    RETURNING j.job_id, j.task_name, j.attempts, j.queue
), kept AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error)
    SELECT t.job_id, t.attempts, t.worker_id, t.started_at, 'cancelled', $2
      FROM target t JOIN cancelled c ON c.job_id = t.job_id
     WHERE t.status = 'running'
), {
    events_cte(
        "SELECT 'cancelled', c.job_id, c.task_name, c.attempts, t.worker_id, NULL::float8,"
        " c.queue FROM cancelled c JOIN target t ON t.job_id = c.job_id"
    )
}
SELECT c.job_id, t.status AS was,
       CASE WHEN t.status = 'running' THEN pg_notify('{CANCEL_CHANNEL}', c.job_id) END
  FROM cancelled c JOIN target t ON t.job_id = c.job_id, sent
 ORDER BY c.job_id
"""

# The job to retry, locked.
_LOCK_JOB = "SELECT job_id, status FROM scheduled_jobs WHERE job_id = $1 FOR UPDATE"

# Dependents of $1 (ids) that its end cancelled, with all their edges:
# (job_id, depends_on, met, edge status).
_CASCADED = f"""
SELECT d.job_id, e.depends_on, e.met, e.status
  FROM (SELECT DISTINCT f.job_id FROM job_dependencies f
         WHERE f.depends_on = ANY($1::text[]) AND NOT f.met AND f.on_failure = 'cancel') c
  JOIN scheduled_jobs d ON d.job_id = c.job_id
  JOIN job_dependencies e ON e.job_id = d.job_id
 WHERE (d.status = 'cancelled') IS TRUE AND d.error_message LIKE '{CASCADE_REASON}'
 ORDER BY d.job_id, e.ordinal
"""

# The edges a job waits on: (depends_on, met, edge status).
_EDGES_OF = """
SELECT e.depends_on, e.met, e.status FROM job_dependencies e
 WHERE e.job_id = $1 ORDER BY e.ordinal
"""

# Edges from the reopened jobs that are not met forget the end they recorded:
# the dependency runs again.
_RESET_EDGES = """
UPDATE job_dependencies e SET status = NULL, result = NULL
 WHERE e.depends_on = ANY($1::text[]) AND NOT e.met
"""

# A graph's retry: the failed job ($1, failed/cancelled/expired) runs again
# (pending, due now; or waiting, when some dependency of its own has not
# completed yet), and the dependents its end cancelled ($2) wait again for
# their dependencies, each with its count of unmet edges. An operator's
# action, like the CLI's retry: attempts keep counting.
_REOPEN = f"""
WITH unmet AS (
    SELECT e.job_id, count(*) FILTER (WHERE NOT e.met)::int AS n
      FROM job_dependencies e
     WHERE e.job_id = ANY($2::text[]) OR e.job_id = $1
     GROUP BY e.job_id
), reopened AS (
    UPDATE scheduled_jobs j
       SET status = CASE WHEN coalesce(u.n, 0) = 0 THEN 'pending' ELSE 'waiting' END,
           wait_kind = CASE WHEN coalesce(u.n, 0) = 0 THEN NULL ELSE 'dependencies' END,
           dependencies_unmet = CASE WHEN u.n IS NULL THEN j.dependencies_unmet ELSE u.n END,
           execution_time = CASE WHEN j.job_id = $1 THEN now()
                                 ELSE greatest(j.execution_time, now()) END,
           finished_at = NULL, worker_id = NULL, lease_until = NULL, result = NULL,
           error_message = NULL, error_traceback = NULL,
           started_before = j.started_before OR j.started_at IS NOT NULL
      FROM (SELECT $1::text AS job_id UNION SELECT unnest($2::text[])) r
      LEFT JOIN unmet u ON u.job_id = r.job_id
     WHERE j.job_id = r.job_id
       AND (j.status IN ('failed', 'cancelled', 'expired')) IS TRUE
    RETURNING j.job_id, j.task_name, j.attempts, j.queue, j.status
), {
    events_cte(
        "SELECT 'scheduled', job_id, task_name, attempts, NULL::text, NULL::float8, queue"
        " FROM reopened"
    )
}
SELECT r.job_id, r.status,
       CASE WHEN r.status = 'pending' THEN pg_notify('{JOBS_CHANNEL}', '*') END
  FROM reopened r, sent
"""

# A fork: a new run of the workflow $1 as $2, due now, with the same task,
# arguments and options; a fresh row otherwise.
_FORK_JOB = f"""
WITH made AS (
    INSERT INTO scheduled_jobs (job_id, job_name, task_name, queue, task_data, priority,
                                execution_time, status, max_retries, retry_policy,
                                misfire_grace_time, timeout)
    SELECT $2, s.job_name, s.task_name, s.queue, s.task_data, s.priority, now(), 'pending',
           s.max_retries, s.retry_policy, s.misfire_grace_time, s.timeout
      FROM scheduled_jobs s WHERE s.job_id = $1
    RETURNING job_id, task_name, attempts, queue
), {
    events_cte(
        "SELECT 'scheduled', job_id, task_name, attempts, NULL::text, NULL::float8, queue FROM made"
    )
}
SELECT m.job_id, pg_notify('{JOBS_CHANNEL}', '*') FROM made m, sent
"""

# The steps a fork keeps: those of $1 before seq $2.
_STEPS_BEFORE = """
SELECT seq, kind, name, key, status FROM workflow_steps
 WHERE job_id = $1 AND seq < $2 ORDER BY seq
"""
_STEP_NAMED = """
SELECT min(seq) FROM workflow_steps WHERE job_id = $1 AND name = $2
"""
_COPY_STEPS = """
INSERT INTO workflow_steps (job_id, seq, kind, name, key, status, result, error, attempts,
                            started_at, finished_at)
SELECT $2, seq, kind, name, key, status, result, error, attempts, started_at, finished_at
  FROM workflow_steps WHERE job_id = $1 AND seq < $3
"""

# Workflows and graphs, newest first: a job with checkpoints of its own, or
# the first job of a graph (it has dependents and depends on nothing).
# $1: a status or NULL; $2: at most this many.
_LIST = """
SELECT j.job_id, j.task_name, j.queue, j.status, j.wait_kind, j.created_at, j.finished_at,
       CASE WHEN j.has_dependents THEN 'graph' ELSE 'workflow' END AS kind,
       (SELECT count(*) FROM workflow_steps s WHERE s.job_id = j.job_id)::int AS steps
  FROM scheduled_jobs j
 WHERE ($1::text IS NULL OR j.status = $1)
   AND j.parent_job_id IS NULL
   AND ((j.has_dependents AND j.dependencies_unmet IS NULL)
        OR EXISTS (SELECT 1 FROM workflow_steps s WHERE s.job_id = j.job_id))
 ORDER BY j.created_at DESC, j.job_id DESC
 LIMIT $2
"""
