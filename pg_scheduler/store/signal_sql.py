"""The statements that send signals to workflows (migration 0014), run by
:class:`~pg_scheduler.store.workflows.WorkflowStore`: one signal, or many in
one transaction.

A sender locks the job's row first, as whoever releases a parked workflow
does (``workflow_sql`` explains why no wake-up is lost). A workflow parked
on the signal's name gets it at once: the signal is bound to that wait, the
wait's record is completed with the payload (the run that resumes replays it
and sends no statement of its own for it) and the row is pending now, with a
NOTIFY. Otherwise the signal is kept until a wait takes it.

A signal with an idempotency key (migration 0025) that the job already has
stores nothing and wakes nothing: the sender holds the job's row lock, so a
concurrent send of the same key has committed (the unique index's ON
CONFLICT sees it) or waits for this one.
"""

from __future__ import annotations

from .workflow_sql import _FINAL, _NO_WAIT, _WAKE_NOTIFY

# One signal, in one statement: refused (nothing written) for an unknown or
# finished job, and stores nothing when the job has a signal of key $4
# (signal_id NULL, the job unfinished). A row pending to wake for the wait
# (its timeout near) is bound the same way as a parked one.
_SIGNAL = f"""
WITH target AS (
    SELECT j.job_id, j.status, j.wait_kind, j.wait_for, j.wait_seq, j.queue
      FROM scheduled_jobs j WHERE j.job_id = $1
       FOR UPDATE
), sent AS (
    INSERT INTO workflow_signals (job_id, name, payload, consumed_seq, idempotency_key)
    SELECT t.job_id, $2, $3::jsonb,
           CASE WHEN t.wait_kind = 'signal' AND t.wait_for = $2 THEN t.wait_seq END, $4::text
      FROM target t WHERE t.status NOT IN {_FINAL}
        ON CONFLICT (job_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id, consumed_seq
), answered AS (
    UPDATE workflow_steps w
       SET status = 'completed', finished_at = now(),
           result = jsonb_build_object('payload', $3::jsonb)
      FROM sent s
     WHERE w.job_id = $1 AND w.seq = s.consumed_seq AND w.kind = 'signal'
       AND w.status = 'waiting'
), woken AS (
    UPDATE scheduled_jobs j
       SET status = CASE WHEN j.status IN ('waiting', 'pending') THEN 'pending'
                         ELSE j.status END,
           execution_time = CASE WHEN j.status IN ('waiting', 'pending') THEN now()
                                 ELSE j.execution_time END,
           {_NO_WAIT}
      FROM sent s
     WHERE j.job_id = $1 AND s.consumed_seq IS NOT NULL
    RETURNING j.status, j.queue
)
SELECT t.status, (SELECT s.id FROM sent s) AS signal_id,
       (SELECT count(CASE WHEN w.status = 'pending' THEN {_WAKE_NOTIFY.format("w")} END)
          FROM woken w) AS woken
  FROM target t
"""

# Many signals, first statement (in the sender's transaction): every target
# row locked, in id order (two senders never wait for each other in a
# cycle); the ids that are unknown ($1), or finished (with their status).
# Nothing is written: any row returned refuses the whole batch.
_SIGNAL_CHECK = f"""
WITH wanted AS (
    SELECT DISTINCT x.job_id FROM unnest($1::text[]) AS x(job_id)
), locked AS (
    SELECT j.job_id, j.status FROM scheduled_jobs j
     WHERE j.job_id IN (SELECT w.job_id FROM wanted w)
     ORDER BY j.job_id
       FOR UPDATE
)
SELECT w.job_id, l.status FROM wanted w LEFT JOIN locked l ON l.job_id = w.job_id
 WHERE l.job_id IS NULL OR l.status IN {_FINAL}
 ORDER BY w.job_id
"""
# Many signals, second statement: each stored, in the order given, except
# one whose key ($4, NULL for none) its job has already (the first statement
# locked every row, so this statement sees every other sender's signal to
# them; the caller drops repeats within the batch); for each job, the first
# signal named as its parked wait is bound to that wait, the wait's record
# completed and the row made pending; one NOTIFY per queue.
_SIGNAL_MANY = f"""
WITH d AS (
    SELECT x.job_id, x.name, x.payload, x.ord, x.idempotency_key
      FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY
        AS x(job_id, name, payload, idempotency_key, ord)
     WHERE x.idempotency_key IS NULL
        OR NOT EXISTS (SELECT 1 FROM workflow_signals g
                        WHERE g.job_id = x.job_id AND g.idempotency_key = x.idempotency_key)
), target AS (
    SELECT j.job_id, j.wait_kind, j.wait_for, j.wait_seq FROM scheduled_jobs j
     WHERE j.job_id IN (SELECT d.job_id FROM d) AND j.status NOT IN {_FINAL}
), first AS (
    SELECT DISTINCT ON (d.job_id) d.ord
      FROM d JOIN target t ON t.job_id = d.job_id
     WHERE t.wait_kind = 'signal' AND t.wait_for = d.name
     ORDER BY d.job_id, d.ord
), sent AS (
    INSERT INTO workflow_signals (job_id, name, payload, consumed_seq, idempotency_key)
    SELECT d.job_id, d.name, d.payload::jsonb,
           CASE WHEN f.ord IS NOT NULL THEN t.wait_seq END, d.idempotency_key
      FROM d JOIN target t ON t.job_id = d.job_id
      LEFT JOIN first f ON f.ord = d.ord
     ORDER BY d.ord
    RETURNING job_id, consumed_seq, payload
), answered AS (
    UPDATE workflow_steps w
       SET status = 'completed', finished_at = now(),
           result = jsonb_build_object('payload', s.payload)
      FROM sent s
     WHERE w.job_id = s.job_id AND w.seq = s.consumed_seq AND w.kind = 'signal'
       AND w.status = 'waiting'
), woken AS (
    UPDATE scheduled_jobs j
       SET status = CASE WHEN j.status IN ('waiting', 'pending') THEN 'pending'
                         ELSE j.status END,
           execution_time = CASE WHEN j.status IN ('waiting', 'pending') THEN now()
                                 ELSE j.execution_time END,
           {_NO_WAIT}
      FROM sent s
     WHERE j.job_id = s.job_id AND s.consumed_seq IS NOT NULL
    RETURNING j.status, j.queue
)
SELECT (SELECT count(*) FROM sent) AS sent,
       (SELECT count(*) FROM woken w WHERE w.status = 'pending') AS woken,
       (SELECT count({_WAKE_NOTIFY.format("q")})
          FROM (SELECT DISTINCT w.queue FROM woken w WHERE w.status = 'pending') q) AS notified
"""

# Which of the (job_id, idempotency key) pairs ($1, $2) are stored already:
# a finished job refuses a signal unless it is one it has (a repeat after a
# lost answer). Run after the statement that locked the rows, so that every
# send before it is seen.
_SIGNAL_KEPT = """
SELECT g.job_id, g.idempotency_key FROM workflow_signals g
  JOIN unnest($1::text[], $2::text[]) AS x(job_id, idempotency_key)
    ON g.job_id = x.job_id AND g.idempotency_key = x.idempotency_key
"""
