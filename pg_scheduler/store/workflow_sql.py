"""The statements of durable workflows (migration 0014), run by
:class:`~pg_scheduler.store.workflows.WorkflowStore`: a run's records, its
parks, its children, signals, and the timer that wakes parked workflows.

Every write a run makes carries the lease guard of the run (``$1`` job, ``$2``
worker, ``$3`` attempt: the row must still be ``running`` there), as every
write out of ``running`` does: a run that lost its job to the rescuer can no
longer record a step, park or spawn. A step is written once per ``(job_id,
seq)``; two runs racing for one (a stale run and its successor) cannot both
record it, and the one that finds it taken adopts what is there.

Parking is a lock, then a read, in one transaction: the run's row is locked
first (:data:`_LOCK_RUN`; for children, then its ``workflow_waits`` row,
:data:`_LOCK_FAMILY`), then a new statement, with a snapshot taken after the
lock, reads whether what the run waits for is already there (a signal, its
children's ends). Whoever releases a parked workflow locks the same row
first (a signal: the run's row; a child's end: the ``workflow_waits`` row,
``pg_scheduler_workflow_job_done`` in 0016). So either the release commits
first and the run sees it, or the run parks first and the release finds it
parked: no wake-up is lost. A sleep has no one to race with and parks in one
statement.
"""

from __future__ import annotations

from ..enums import DEFAULT_QUEUE, FINAL_STATUS_VALUES

_GUARD = "j.job_id = $1 AND j.worker_id = $2 AND j.attempts = $3 AND j.status = 'running'"
_FINAL = "(" + ", ".join(f"'{status}'" for status in FINAL_STATUS_VALUES) + ")"
# What a row parked on, cleared when that is over.
_NO_WAIT = (
    "wait_kind = NULL, wait_for = NULL, wake_at = NULL, wait_seq = NULL, wait_children = NULL"
)
# A spawn step as the parent reads it: a child that ended (its row final,
# joined as c when the step waits) is over, with its row's outcome; a child
# whose row is gone or reopened has its outcome copied on the step (migration
# 0016). The child's columns are NULL unless its row is final.
_CHILD_END = (
    "c.status AS child_status, c.result::text AS child_result, c.error_message AS child_error"
)
# A step's columns as a run reads them. A spawn step still waiting comes as
# its child's id and detached flag, not as JSON (a fan-out's parent reads
# thousands: store/workflows.py StepRow).
_STEP_COLUMNS = """s.seq, s.kind, s.name, s.key, s.status,
       CASE WHEN s.kind = 'spawn' AND s.status = 'waiting' THEN NULL
            ELSE s.result::text END AS result,
       s.error, s.attempts,
       CASE WHEN s.kind = 'spawn' AND s.status = 'waiting' THEN s.result ->> 'job_id' END
           AS spawned_id,
       CASE WHEN s.kind = 'spawn' AND s.status = 'waiting'
            THEN coalesce((s.result ->> 'detached')::boolean, false) END AS spawned_detached"""
# Their names, in order (as the columns of a subquery r).
_STEP_NAMES = ", ".join(
    f"r.{name}"
    for name in (
        "seq kind name key status result error attempts spawned_id spawned_detached"
        " child_status child_result child_error"
    ).split()
)
# The same for the operator's views, in SQL: {s} the step, {c} the child's row
# (joined only while the step waits and the row is final).
_STEP_STATUS = (
    "CASE WHEN {s}.kind = 'spawn' AND {s}.status = 'waiting' AND {c}.status IS NOT NULL "
    "THEN 'completed' ELSE {s}.status END"
)
_STEP_RESULT = (
    "CASE WHEN {s}.kind = 'spawn' AND {s}.status = 'waiting' AND {c}.status IS NOT NULL "
    "THEN {s}.result || jsonb_build_object('outcome', jsonb_build_object("
    "'status', {c}.status, 'result', {c}.result, 'error', {c}.error_message)) "
    "ELSE {s}.result END"
)
# A run that parks: the row leaves this worker; the run is not counted as an
# attempt (as a hand-back is not); it has started (its "pending" dedupe key is gone).
_LEAVE_WORKER = """worker_id = NULL, lease_until = NULL, last_heartbeat = NULL,
           claimed_ahead = false, started_before = true,
           attempts = GREATEST(j.attempts - 1, 0)"""
# The NOTIFY of a row made pending by an UPDATE (the insert trigger sends one only
# for inserts): its queue, '' for the default one, as that trigger does.
_WAKE_NOTIFY = (
    "pg_notify('pg_scheduler_jobs', CASE WHEN {0}.queue = '"
    + DEFAULT_QUEUE
    + "' THEN '' ELSE {0}.queue END)"
)

# A job's incarnation (created_at: a REPLACE makes a new one), in microseconds.
_INCARNATION = "coalesce((extract(epoch FROM j.created_at) * 1000000)::bigint, 0)"
# The child of a spawn step s that waits, joined as c while its row is final:
# looked up by its id (the primary key, whatever the statistics say), for
# such a step only. As a plain join, statistics taken when no row was final
# (estimated: 1) made the planner read every final row once and compare each
# step with all of them: 0.9 ms a step at 10,000 final rows. The LIMIT keeps
# the planner from turning the lookup back into that join.
_CHILD_JOIN = (
    """LEFT JOIN LATERAL (
    SELECT c.status, c.result, c.error_message FROM scheduled_jobs c
     WHERE s.kind = 'spawn' AND s.status = 'waiting' AND c.job_id = s.result ->> 'job_id'
     LIMIT 1) c ON c.status IN """
    + _FINAL
)
# The starts of the runs of jobs $1: each job's incarnation (created_at: a
# REPLACE makes a new one), its deadline and the database's clock, on every
# row; then its steps recorded, one row each, in order (a job with none: one
# row, its step columns NULL). A spawn step waiting carries its child's end
# (child_status: the child's row is final; see _CHILD_END).
_LOAD_MANY = f"""
SELECT j.job_id, {_INCARNATION} AS incarnation, j.workflow_deadline, now() AS db_now,
       {_STEP_COLUMNS},
       {_CHILD_END}
  FROM scheduled_jobs j
  LEFT JOIN workflow_steps s ON s.job_id = j.job_id
  {_CHILD_JOIN}
 WHERE j.job_id = ANY($1::text[])
 ORDER BY j.job_id, s.seq
"""
# The same starts, returned by the claim with each row it takes (every
# statement that returns _CLAIMED_COLUMNS), so that a resumed run sends no
# statement of its own to begin: (incarnation, deadline, the database's
# clock), and the steps as _LOAD_MANY's step columns, in order, in one JSON
# array (asyncpg decodes an array of anonymous records 1.5 to 2 times slower
# from 3 records up).
# - Only for a row that started before (a parked workflow woken, a retry, a
#   rescue): one that never started has no records; NULL sends its run to
#   the loader, as does a row taken by a statement without these columns.
# - At most RESUME_MOST steps: past that (a fan-out's parent) the claim
#   returns one more and the run reads them all itself, so that a claim does
#   not hold the other jobs it takes while it reads thousands.
# - The claim's snapshot sees what woke the row (the wake and its records
#   commit together); a child that ends after it is found by the park, as
#   one that ends after the loader's read.
RESUME_MOST = 100
RESUME_COLUMNS = f"""CASE WHEN j.started_before
            THEN ROW({_INCARNATION}, j.workflow_deadline, now()) END AS resume,
       CASE WHEN j.started_before THEN (
           SELECT coalesce(json_agg(json_build_array({_STEP_NAMES}) ORDER BY r.seq),
                           '[]'::json)::text
             FROM (SELECT {_STEP_COLUMNS}, {_CHILD_END}
                     FROM workflow_steps s {_CHILD_JOIN}
                    WHERE s.job_id = j.job_id
                    ORDER BY s.seq
                    LIMIT {RESUME_MOST + 1}) r) END AS resume_steps"""
# The first run of a workflow with a timeout: its deadline, from now.
_SET_DEADLINE = f"""
UPDATE scheduled_jobs j SET workflow_deadline = now() + make_interval(secs => $4::float8)
 WHERE {_GUARD} AND j.workflow_deadline IS NULL
RETURNING j.workflow_deadline
"""

# One step's record. A failed step (or a wait record) is written over by the
# same step at the same place; a completed one never: the statement then says
# held but not written, and the run reads what is there (_RECORD).
_CHECKPOINT = f"""
WITH lease AS (
    SELECT EXISTS (SELECT 1 FROM scheduled_jobs j WHERE {_GUARD}) AS held
), written AS (
    INSERT INTO workflow_steps AS s (job_id, seq, kind, name, key, status, result, error,
                                     attempts, started_at)
    SELECT $1, $4, $5, $6, $7, $8, $9::jsonb, $10, $11, $12 FROM lease WHERE lease.held
    ON CONFLICT (job_id, seq) DO UPDATE
       SET status = EXCLUDED.status, result = EXCLUDED.result, error = EXCLUDED.error,
           attempts = s.attempts + EXCLUDED.attempts, started_at = EXCLUDED.started_at,
           finished_at = now()
     WHERE s.status <> 'completed' AND s.kind = EXCLUDED.kind AND s.name = EXCLUDED.name
       AND s.key = EXCLUDED.key
    RETURNING 1
)
SELECT l.held, EXISTS (SELECT 1 FROM written) AS written FROM lease l
"""
_RECORD = """
SELECT seq, kind, name, key, status, result::text AS result, error, attempts
  FROM workflow_steps WHERE job_id = $1 AND seq = $2
"""

# A sleep parks in one statement: nothing but the clock can end it. Until
# ($7, or now + $8 seconds) and the time the row wakes (the deadline if
# sooner); "over": go on now; "soon" (within $9 seconds): pending, due at that
# time (the claim wakes the worker then); "later": waiting, the timer service
# makes it pending $9 seconds ahead.
_PARK_SLEEP = f"""
WITH d AS (
    SELECT x.until, LEAST(x.until, j.workflow_deadline) AS wake, j.queue
      FROM scheduled_jobs j,
           (SELECT coalesce($7::timestamptz, now() + make_interval(secs => $8::float8))
                   AS until) x
     WHERE {_GUARD}
), how AS (
    SELECT d.until, d.wake, d.queue,
           CASE WHEN d.wake <= now() THEN 'over'
                WHEN d.wake <= now() + make_interval(secs => $9::float8) THEN 'soon'
                ELSE 'later' END AS how
      FROM d
), rec AS (
    INSERT INTO workflow_steps AS s (job_id, seq, kind, name, key, status, result, attempts,
                                     started_at, finished_at)
    SELECT $1, $4, 'sleep', $5, $6,
           CASE WHEN h.how = 'later' OR h.wake < h.until THEN 'waiting' ELSE 'completed' END,
           jsonb_build_object('until', h.until), 1, $10,
           CASE WHEN h.how = 'later' OR h.wake < h.until THEN now() ELSE h.until END
      FROM how h
    ON CONFLICT (job_id, seq) DO UPDATE
       SET status = EXCLUDED.status, finished_at = EXCLUDED.finished_at
     WHERE s.kind = 'sleep' AND s.status = 'waiting'
    RETURNING 1
), parked AS (
    UPDATE scheduled_jobs j
       SET status = CASE WHEN h.how = 'soon' THEN 'pending' ELSE 'waiting' END,
           execution_time = CASE WHEN h.how = 'soon' THEN h.wake ELSE j.execution_time END,
           {_LEAVE_WORKER},
           wait_kind = CASE WHEN h.how = 'soon' THEN NULL ELSE 'sleep' END,
           wait_for = NULL, wake_at = h.wake, wait_seq = $4, wait_children = NULL
      FROM how h
     WHERE {_GUARD} AND h.how <> 'over'
    RETURNING j.status, j.queue
)
SELECT h.how, h.until, h.wake, (SELECT count(*) FROM rec) AS recorded,
       (SELECT count(*) FROM parked) AS parked,
       (SELECT count(CASE WHEN p.status = 'pending' THEN {_WAKE_NOTIFY.format("p")} END)
          FROM parked p) AS notified
  FROM how h
"""

# Parking for a signal or for children, first statement: the run's row,
# locked (None: the run lost its job). now() is the transaction's start, the
# same in every statement after it.
_LOCK_RUN = f"""
SELECT now() AS db_now, j.workflow_deadline, j.queue
  FROM scheduled_jobs j WHERE {_GUARD}
   FOR UPDATE
"""
# The signal for the wait at seq $2: one a sender already gave it, else the
# oldest unread one named $3 (taken for it now).
_TAKE_SIGNAL = """
WITH delivered AS (
    SELECT s.id, s.payload FROM workflow_signals s
     WHERE s.job_id = $1 AND s.consumed_seq = $2
     ORDER BY s.id LIMIT 1
), oldest AS (
    SELECT s.id FROM workflow_signals s
     WHERE s.job_id = $1 AND s.name = $3 AND s.consumed_seq IS NULL
       AND NOT EXISTS (SELECT 1 FROM delivered)
     ORDER BY s.id LIMIT 1
), taken AS (
    UPDATE workflow_signals s SET consumed_seq = $2 FROM oldest o WHERE s.id = o.id
    RETURNING s.id, s.payload
)
SELECT id, payload::text AS payload FROM delivered
UNION ALL
SELECT id, payload::text FROM taken
"""
# Parking on children, second statement: the workflow's workflow_waits row
# locked (every child's end updates it first), so that the read after it sees
# every end that committed before, and every end after it waits for the park.
_LOCK_FAMILY = """
SELECT w.job_id FROM workflow_waits w WHERE w.job_id = $1 FOR UPDATE
"""
# The children spawned at seqs $2 that have ended, with their outcome (a spawn
# step still waiting on a child whose row is not final is left out: the run
# already holds it as waiting).
_SPAWNED_ENDED = f"""
SELECT {_STEP_COLUMNS},
       {_CHILD_END}
  FROM workflow_steps s
  {_CHILD_JOIN}
 WHERE s.job_id = $1 AND s.seq = ANY($2::int[]) AND s.kind = 'spawn'
   AND (s.status <> 'waiting' OR c.status IS NOT NULL)
"""
# A wait that is over (a signal taken, a timeout, children ended): its record
# completed, and what the row waited for forgotten.
_FINISH_WAIT = f"""
WITH lease AS (
    SELECT EXISTS (SELECT 1 FROM scheduled_jobs j WHERE {_GUARD}) AS held
), rec AS (
    INSERT INTO workflow_steps AS s (job_id, seq, kind, name, key, status, result, attempts,
                                     started_at)
    SELECT $1, $4, $5, $6, $7, 'completed', $8::jsonb, 1, $9 FROM lease WHERE lease.held
    ON CONFLICT (job_id, seq) DO UPDATE
       SET status = 'completed', result = EXCLUDED.result, finished_at = now()
     WHERE s.status = 'waiting' AND s.kind = EXCLUDED.kind
    RETURNING 1
), cleared AS (
    UPDATE scheduled_jobs j SET {_NO_WAIT}
     WHERE {_GUARD} AND j.wait_kind IS NOT NULL
    RETURNING 1
)
SELECT l.held, EXISTS (SELECT 1 FROM rec) AS written, (SELECT count(*) FROM cleared) AS cleared
  FROM lease l
"""
# Park after _LOCK_RUN found nothing to go on with: the wait's record, and the
# row waiting ($12 "soon": pending, due at $11, the deadline or the timeout,
# near enough for the claim's own wait). Parked on children: $14 the spawn
# steps waited on, $15 how many of their children had not ended when the run
# looked, kept on its workflow_waits row (each end counts it down; the last
# one wakes the row: 0016).
_PARK = f"""
WITH rec AS (
    INSERT INTO workflow_steps AS s (job_id, seq, kind, name, key, status, result, attempts,
                                     started_at)
    VALUES ($1, $4, $5, $6, $7, 'waiting', $8::jsonb, 1, $13)
    ON CONFLICT (job_id, seq) DO UPDATE SET result = EXCLUDED.result
     WHERE s.status = 'waiting' AND s.kind = EXCLUDED.kind
    RETURNING 1
), parked AS (
    UPDATE scheduled_jobs j
       SET status = CASE WHEN $12 THEN 'pending' ELSE 'waiting' END,
           execution_time = CASE WHEN $12 THEN $11 ELSE j.execution_time END,
           {_LEAVE_WORKER},
           wait_kind = $9, wait_for = $10, wake_at = $11, wait_seq = $4,
           wait_children = $14::int4range
     WHERE {_GUARD}
    RETURNING j.status, j.queue
), counted AS (
    UPDATE workflow_waits w
       SET wait_from = lower($14::int4range), wait_to = upper($14::int4range), wait_left = $15
      FROM parked p
     WHERE w.job_id = $1 AND $14::int4range IS NOT NULL
)
SELECT p.status, (SELECT count(*) FROM rec) AS recorded,
       CASE WHEN p.status = 'pending' THEN {_WAKE_NOTIFY.format("p")} END AS notified
  FROM parked p
"""

# Children: one statement for every spawn not yet written. Each child is a
# job like any other, whose id the parent's step decides (a run that spawns
# it again writes nothing new); its spawn step waits for its end. The
# parent's workflow_waits row exists before any child can end (0016).
_SPAWN = f"""
WITH lease AS (
    SELECT j.job_id FROM scheduled_jobs j WHERE {_GUARD}
), flagged AS (
    UPDATE scheduled_jobs j SET has_children = true
      FROM lease l WHERE j.job_id = l.job_id AND NOT j.has_children
    RETURNING 1
), family AS (
    INSERT INTO workflow_waits (job_id) SELECT l.job_id FROM lease l
    ON CONFLICT (job_id) DO NOTHING
), kids AS (
    INSERT INTO scheduled_jobs (job_id, job_name, task_name, execution_time, status, task_data,
                                priority, max_retries, misfire_grace_time, timeout,
                                retry_policy, queue, parent_job_id, parent_seq,
                                concurrency_key, max_running_per_key, rate_count_per_key,
                                rate_period_per_key, key_ordered, fair_share_key,
                                fair_share_weight)
    SELECT d.job_id, d.job_name, d.task_name, now(), 'pending', d.task_data::jsonb,
           d.priority, d.max_retries, NULL, d.timeout, d.retry_policy::jsonb, d.queue, $1, d.seq,
           d.concurrency_key, d.max_running_per_key, d.rate_count_per_key,
           d.rate_period_per_key, d.key_ordered, d.fair_share_key, d.fair_share_weight
      FROM unnest($4::text[], $5::text[], $6::text[], $7::text[], $8::int[], $9::int[],
                  $10::float8[], $11::text[], $12::text[], $13::int[], $18::text[], $19::int[],
                  $20::int[], $21::float8[], $22::bool[], $23::text[], $24::float8[])
        AS d(job_id, job_name, task_name, task_data, priority, max_retries, timeout,
             retry_policy, queue, seq, concurrency_key, max_running_per_key, rate_count_per_key,
             rate_period_per_key, key_ordered, fair_share_key, fair_share_weight),
           lease
    ON CONFLICT (job_id) DO NOTHING
    RETURNING 1
), recs AS (
    INSERT INTO workflow_steps (job_id, seq, kind, name, key, status, result, attempts,
                                started_at)
    SELECT $1, r.seq, 'spawn', r.name, r.key, 'waiting', r.result::jsonb, 1, $17
      FROM unnest($13::int[], $14::text[], $15::text[], $16::text[])
        AS r(seq, name, key, result),
           lease
    ON CONFLICT (job_id, seq) DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM lease) > 0 AS held, (SELECT count(*) FROM recs) AS recorded,
       (SELECT count(*) FROM kids) AS inserted, (SELECT count(*) FROM flagged) AS flagged
"""

# The timer service: parked rows due within $1 seconds become pending, due at
# their wake time (the claim wakes a worker then); at most $2 per statement,
# rows another worker's timer holds skipped. A sleep is over by then: its
# record is closed. A signal wait keeps what it waits for: a signal sent
# before the row runs still goes to that wait.
_WAKE_DUE = f"""
WITH due AS (
    SELECT j.job_id, j.wait_kind, j.wait_seq FROM scheduled_jobs j
     WHERE j.status = 'waiting' AND j.wake_at <= now() + make_interval(secs => $1::float8)
     ORDER BY j.wake_at
     LIMIT $2
       FOR UPDATE SKIP LOCKED
), woken AS (
    UPDATE scheduled_jobs j
       SET status = 'pending', execution_time = j.wake_at,
           wait_kind = CASE WHEN d.wait_kind = 'sleep' THEN NULL ELSE j.wait_kind END,
           wait_seq = CASE WHEN d.wait_kind = 'sleep' THEN NULL ELSE j.wait_seq END
      FROM due d
     WHERE j.job_id = d.job_id AND j.status = 'waiting'
    RETURNING j.job_id, j.queue, j.wake_at, d.wait_kind, d.wait_seq
), closed AS (
    UPDATE workflow_steps s SET status = 'completed', finished_at = w.wake_at
      FROM woken w
     WHERE w.wait_kind = 'sleep' AND s.job_id = w.job_id AND s.seq = w.wait_seq
       AND s.status = 'waiting' AND (s.result ->> 'until')::timestamptz <= w.wake_at
    RETURNING 1
)
SELECT (SELECT count(*) FROM woken) AS woken,
       (SELECT count({_WAKE_NOTIFY.format("q")}) FROM (SELECT DISTINCT queue FROM woken) q)
           AS notified,
       (SELECT count(*) FROM closed) AS closed
"""
