"""Job events sent by the statements that make the transitions (migration 0010).

A statement that moves jobs between states ends with the CTE :func:`events_cte`
builds: one ``pg_notify`` per kind (split so no payload exceeds about 6,000
bytes; PostgreSQL refuses 8,000) on the schema's events channel, in the
statement's own transaction, so an event is sent exactly when its transition
commits. Replaces 0006's statement-level triggers, whose transition tables
and PL/pgSQL call cost every claim, completion and heartbeat (about a quarter
of the drain) whether anyone listened or not.

Payload: ``{"k": kind, "t": epoch seconds, "j": [[job_id, task, attempt,
worker_id, progress, queue], ...]}`` (read by :mod:`pg_scheduler.notify.events`). The
high-volume kinds (scheduled, started, completed) are sent only while some
subscriber or waiter keeps a row of ``scheduler_event_flags`` fresh: a drain
nobody watches pays one index probe per statement, not a payload per job.
"""

from __future__ import annotations

FLAGGED = ("scheduled", "started", "completed")


def events_cte(source: str) -> str:
    """A CTE named ``sent`` (one row) that notifies the events of ``source``,
    a query of (kind, job_id, task_name, attempts, worker_id, progress, queue).

    The statement must read ``sent`` (e.g. ``FROM done d, sent``), or
    PostgreSQL never runs it."""
    flagged = ", ".join(f"'{k}'" for k in FLAGGED)
    return f"""sent AS (
    SELECT count(*) AS notified FROM (
        SELECT pg_notify('pg_scheduler_events',
                         format('{{"k":"%s","t":%s,"j":[%s]}}', e.kind,
                                extract(epoch FROM now()), string_agg(e.item, ','))) AS n
          FROM (SELECT x.kind, x.item,
                       sum(octet_length(x.item) + 1)
                           OVER (PARTITION BY x.kind ORDER BY x.job_id) / 4500 AS chunk
                  FROM (SELECT s.kind, s.job_id,
                               json_build_array(s.job_id, s.task_name, s.attempts,
                                                s.worker_id, s.progress, s.queue)::text AS item
                          FROM ({source}) AS s(kind, job_id, task_name, attempts, worker_id,
                                             progress, queue)
                         WHERE s.kind IS NOT NULL
                           AND (s.kind NOT IN ({flagged}) OR EXISTS (
                                SELECT 1 FROM scheduler_event_flags f
                                 WHERE f.kind = s.kind AND f.until > now()))) x
                 WHERE octet_length(x.item) <= 1500) e
         GROUP BY e.kind, e.chunk) notes
)"""


# Events of rows the engine changed by a statement that sends none (the claim:
# started, expired): $1 kind, $2..$4 job ids, tasks, attempts, $5 worker, $6 queues.
_EMIT = f"""
WITH {
    events_cte(
        "SELECT $1::text, u.job_id, u.task_name, u.attempts, $5::text, NULL::float8, u.queue"
        " FROM unnest($2::text[], $3::text[], $4::int[], $6::text[])"
        " AS u(job_id, task_name, attempts, queue)"
    )
}
SELECT notified FROM sent
"""
# Which flagged kinds some subscriber wants, and for how many more seconds.
_WANTED = """
SELECT kind, EXTRACT(EPOCH FROM until - now())::float8 AS seconds
  FROM scheduler_event_flags WHERE until > now()
"""
