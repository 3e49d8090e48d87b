"""The statements on ``scheduled_jobs`` (run by :class:`~pg_scheduler.store.jobs.Store`):
insert, claim, the in-process start, the next-due probe, complete/retry/fail,
release, cancel, read and set status.

They are written against the indexes in ``schema.sql``: the claim and the
next-due probe read ``scheduled_jobs_claim_idx`` one served (queue, task,
priority) group at a time (see ``queues``);
heartbeat, rescue and release use ``scheduled_jobs_running_idx``. Time is
always the database's ``now()``, never the worker's clock.
"""

from __future__ import annotations

from ..enums import FINAL_STATUS_VALUES
from .batches import BATCH_OF_JOB
from .event_sql import events_cte
from .queues import seeds_from, served_groups
from .workflow_sql import RESUME_COLUMNS

_INSERT_COLUMNS = """
    job_id, job_name, task_name, execution_time, status, task_data, priority,
    max_retries, misfire_grace_time, timeout, retry_policy, dedupe_key, dedupe_scope, queue,
    concurrency_key, max_running_per_key, rate_count_per_key, rate_period_per_key, key_ordered
"""
# Fair share (migration 0018): NewJob's last two fields.
_FAIR_COLUMNS = "fair_share_key, fair_share_weight"
_INSERT_FROM_ARRAYS = f"""
    INSERT INTO scheduled_jobs ({_INSERT_COLUMNS}, {_FAIR_COLUMNS})
    SELECT d.job_id, d.job_name, d.task_name, d.execution_time, 'pending', d.task_data::jsonb,
           d.priority, d.max_retries, d.misfire_grace_time, d.timeout, d.retry_policy::jsonb,
           d.dedupe_key, d.dedupe_scope, d.queue, d.concurrency_key, d.max_running_per_key,
           d.rate_count_per_key, d.rate_period_per_key, d.key_ordered, d.fair_share_key,
           d.fair_share_weight
      FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::text[],
                  $6::int[], $7::int[], $8::int[], $9::float8[], $10::text[],
                  $11::text[], $12::text[], $13::text[], $14::text[], $15::int[],
                  $16::int[], $17::float8[], $18::bool[], $19::text[], $20::float8[])
        AS d(job_id, job_name, task_name, execution_time, task_data, priority,
             max_retries, misfire_grace_time, timeout, retry_policy, dedupe_key, dedupe_scope,
             queue, concurrency_key, max_running_per_key, rate_count_per_key,
             rate_period_per_key, key_ordered, fair_share_key, fair_share_weight)
"""
# One row: plain VALUES plans and runs about 0.3 ms faster than unnest().
_INSERT_ONE = f"""
    INSERT INTO scheduled_jobs ({_INSERT_COLUMNS}, {_FAIR_COLUMNS})
    VALUES ($1, $2, $3, $4, 'pending', $5::jsonb, $6, $7, $8, $9, $10::jsonb, $11, $12, $13,
            $14, $15, $16, $17, $18, $19, $20)
"""
# REPLACE overwrites a pending or finished job and makes it pending with fresh
# counters; a running attempt is never touched (its lease stays valid), nor a
# parked workflow (under way, as a running job is). A job that had run is new:
# its workflow steps, signals and children go (migration 0014's trigger).
_REPLACE_SET = """
    DO UPDATE SET job_name = EXCLUDED.job_name, task_name = EXCLUDED.task_name,
        execution_time = EXCLUDED.execution_time, task_data = EXCLUDED.task_data,
        priority = EXCLUDED.priority, max_retries = EXCLUDED.max_retries,
        misfire_grace_time = EXCLUDED.misfire_grace_time, timeout = EXCLUDED.timeout,
        retry_policy = EXCLUDED.retry_policy, dedupe_key = EXCLUDED.dedupe_key,
        dedupe_scope = EXCLUDED.dedupe_scope, queue = EXCLUDED.queue,
        concurrency_key = EXCLUDED.concurrency_key,
        max_running_per_key = EXCLUDED.max_running_per_key,
        rate_count_per_key = EXCLUDED.rate_count_per_key,
        rate_period_per_key = EXCLUDED.rate_period_per_key,
        key_ordered = EXCLUDED.key_ordered, key_seq = EXCLUDED.key_seq,
        fair_share_key = EXCLUDED.fair_share_key,
        fair_share_weight = EXCLUDED.fair_share_weight,
        status = 'pending', retry_count = 0,
        attempts = 0, rescue_count = 0, unstarted_rescues = 0, error_message = NULL,
        error_traceback = NULL,
        result = NULL, worker_id = NULL, last_heartbeat = NULL, lease_until = NULL,
        started_at = NULL, finished_at = NULL, created_at = now(),
        claimed_ahead = false, started_before = false
    WHERE scheduled_jobs.status NOT IN ('running', 'waiting')
"""

# What the worker reads of a claimed row (the claim and the in-process start).
_CLAIMED_COLUMNS = (
    """j.job_id, j.job_name, j.task_name, j.queue, j.task_data::text AS task_data,
          j.priority, j.execution_time, j.status, j.attempts, j.retry_count,
          j.max_retries, j.timeout, j.retry_policy::text AS retry_policy, j.claimed_ahead,
          j.has_dependents, """
    + RESUME_COLUMNS
)


# $1 tasks, $2 how many rows, $3 worker, $4 lease seconds, $5 how many start
# now, $6 queues served (NULL: all), $7 the most rows per queue (parallel to $6).
# Each served (queue, task, priority) group is read from its head (see
# queues.py); rows past the first $5 (in the order the worker starts them)
# wait in its local buffer: they are marked claimed_ahead until its heartbeat
# says they started. With several groups due, each locks up to its cap and the
# claim keeps the best $2 by (priority, execution_time); the rest are unlocked
# when the statement ends.
def due_in_groups(limit: str, cut: str | None = None) -> str:
    """CTEs ``candidates`` and ``kept``: from each ``served`` group (see
    queues.served_groups) its due rows from the head, locked (SKIP LOCKED), at
    most the group's queue cap and ``limit``; ``kept``: the best ``limit`` of
    them by (priority, execution_time) within each queue's cap, each marked
    ``expired`` when past its misfire grace. Shared by the plain and the
    limited claim. ``cut`` (``"<"`` or ``"<="``): rows are read only while
    their execution_time compares so with ``served.cut`` (an index bound, so a
    group cut short is not read past the cut).

    Each row carries ``tid``, the ctid of the version the scan locked: the
    UPDATE finds it by that (a TID scan) instead of a primary-key descent per
    row, 1.5 us less server CPU per claimed job. The row is locked by this
    statement, so no one else can move it meanwhile. A version committed
    after the statement's snapshot (the lock followed an update made
    meanwhile) is not visible to the UPDATE: that row is left pending for the
    next claim, where a job-id join would have re-checked and taken it.
    """
    cut_bound = "" if cut is None else f" AND j.execution_time {cut} s.cut"
    return f"""candidates AS (
    SELECT c.job_id, c.tid, c.expired, s.priority, c.execution_time, s.queue, s.cap
      FROM served s
     CROSS JOIN LATERAL (
        SELECT j.job_id, j.ctid AS tid, j.execution_time,
               (j.started_at IS NULL AND j.misfire_grace_time IS NOT NULL
                AND j.execution_time + make_interval(secs => j.misfire_grace_time) < now())
                   AS expired
          FROM scheduled_jobs j
         WHERE j.status = 'pending' AND j.fair_share_key IS NULL
           AND j.queue = s.queue AND j.task_name = s.task_name
           AND j.priority = s.priority AND j.execution_time >= s.head
           AND j.concurrency_key IS NULL
           AND j.execution_time <= now(){cut_bound}
         ORDER BY j.execution_time
         LIMIT LEAST(s.cap, {limit})
           FOR UPDATE SKIP LOCKED
     ) c
), kept AS (
    SELECT job_id, tid, expired, priority, execution_time
      FROM (SELECT p.*, row_number() OVER (PARTITION BY p.queue
                                           ORDER BY p.priority, p.execution_time) AS in_queue
              FROM candidates p) r
     WHERE r.in_queue <= r.cap
     ORDER BY priority, execution_time
     LIMIT {limit}
)"""


def claim_set(worker: str, lease: str, claimed_ahead: str) -> str:
    """The SET list that starts (or, past its grace, expires) each ``picked`` row."""
    return f"""status = CASE WHEN picked.expired THEN 'expired' ELSE 'running' END,
       worker_id = {worker},
       attempts = j.attempts + CASE WHEN picked.expired THEN 0 ELSE 1 END,
       started_at = CASE WHEN picked.expired THEN j.started_at ELSE now() END,
       last_heartbeat = now(),
       lease_until = CASE WHEN picked.expired THEN NULL
                          ELSE now() + make_interval(secs => {lease}) END,
       finished_at = CASE WHEN picked.expired THEN now() END,
       claimed_ahead = {claimed_ahead},
       error_message = CASE WHEN picked.expired
           THEN format('expired: not started within misfire_grace_time (%s s) of %s',
                       j.misfire_grace_time, j.execution_time)
           ELSE j.error_message END"""


def claim_picked() -> str:
    """The claim's last step, after the CTEs that pick the rows (``kept``): number
    the rows to start by urgency ($5 of them start at once, the rest are claimed
    ahead; $3 the worker, $4 the lease) and write them claimed. Shared by the
    plain claim and the claim beside limits (store/limits.py). A fragment, not a
    statement: the statements that embed it are listed in states.py."""
    return f"""placed AS (
    SELECT job_id, tid, expired,
           row_number() OVER (PARTITION BY expired ORDER BY priority, execution_time) AS place
      FROM kept
)
UPDATE scheduled_jobs j
   SET {claim_set("$3", "$4", "NOT picked.expired AND picked.place > $5")}
  FROM placed AS picked
 WHERE j.ctid = picked.tid
RETURNING {_CLAIMED_COLUMNS}
"""


_CLAIM = f"""
{served_groups("$1", "$6", "$7", "$2", limits="none")},
{due_in_groups("$2")}, {claim_picked()}"""

# The same claim over the groups $8 to $11 name, each from its floor
# (queues.SEEDED_GROUPS; engine/heads.py says when).
_CLAIM_SEEDED = f"""
{served_groups("$1", "$6", "$7", "$2", limits="none", seeds=seeds_from(8))},
{due_in_groups("$2")}, {claim_picked()}"""

# One due job written already claimed by a worker of this process (``$19``),
# which starts it at once: no NOTIFY hop, no claim. Whether it is due is the
# database's call; a job that is not, that is past its misfire grace (the
# claim expires those), or whose queue is paused, comes back pending like any insert.
_INSERT_RUNNING = f"""
INSERT INTO scheduled_jobs AS j ({_INSERT_COLUMNS},
                                 worker_id, attempts, started_at, last_heartbeat, lease_until)
SELECT $1, $2, $3, $4, CASE WHEN d.due THEN 'running' ELSE 'pending' END, $5::jsonb,
       $6, $7, $8, $9, $10::jsonb, $11, $12, $13, $14, $15, $16, $17, $18,
       CASE WHEN d.due THEN $19 END, CASE WHEN d.due THEN 1 ELSE 0 END,
       CASE WHEN d.due THEN now() END, CASE WHEN d.due THEN now() END,
       CASE WHEN d.due THEN now() + make_interval(secs => $20) END
  FROM (SELECT $4::timestamptz <= now()
               AND ($8::int IS NULL OR $4::timestamptz + make_interval(secs => $8::int) >= now())
               AND NOT EXISTS (SELECT 1 FROM scheduler_queues q
                                WHERE q.name = $13::text AND q.paused)
               -- Jobs a global limit binds start only through the limited claim.
               AND NOT EXISTS (SELECT 1 FROM scheduler_limits l
                                WHERE (l.scope = 'task' AND l.name = $3::text)
                                   OR (l.scope = 'queue' AND l.name = $13::text))
               -- Keyed jobs start only through the keyed claim (store/keys.py).
               AND $14::text IS NULL
                   AS due) AS d
RETURNING {_CLAIMED_COLUMNS}
"""

# $1 tasks, $2 queues served (NULL: all). Paused queues are left out: a
# worker does not spin on them (resume_queue wakes it).
# Keyed rows (migration 0017) count from their earliest pending row.
# _NEXT_DUE_SEEDED: over the groups $3 to $6 name, each from its floor.
_NEXT_DUE_AFTER_GROUPS = """
SELECT EXTRACT(EPOCH FROM (LEAST(min(s.head), (
    SELECT min(k.execution_time) FROM scheduled_jobs k
     WHERE k.status = 'pending' AND k.concurrency_key IS NOT NULL
       AND k.task_name = ANY($1::text[]) AND ($2::text[] IS NULL OR k.queue = ANY($2::text[]))
)) - now()))::float8 FROM served s
"""
_NEXT_DUE = served_groups("$1", "$2", "NULL", "0") + _NEXT_DUE_AFTER_GROUPS
_NEXT_DUE_SEEDED = (
    served_groups("$1", "$2", "NULL", "0", seeds=seeds_from(3)) + _NEXT_DUE_AFTER_GROUPS
)

_LEASE_GUARD = "job_id = $1 AND worker_id = $2 AND attempts = $3 AND status = 'running'"

# What a completion statement does beside its rows (``done``): their
# dependents released (migration 0015) and their parents counted down
# (migration 0021), one set-based call each for the rows that have any. The
# statement's WHERE calls pg_scheduler_completing() first, so that the row
# triggers leave these rows to the calls.
_COUNTED = """counted AS (
    SELECT count(pg_scheduler_children_completed(x.parents, x.seqs)) AS n
      FROM (SELECT array_agg(d.parent_job_id) AS parents, array_agg(d.parent_seq) AS seqs
              FROM done d WHERE d.parent_job_id IS NOT NULL) x
     WHERE x.parents IS NOT NULL
)"""
_FOLLOW_UPS = f"""released AS (
    SELECT count(pg_scheduler_dependencies_completed(x.ids)) AS n
      FROM (SELECT array_agg(d.job_id) AS ids FROM done d WHERE d.has_dependents) x
     WHERE x.ids IS NOT NULL
), {_COUNTED}"""

# Completions: one pkey probe per id, and no join. $2 maps each id to
# [attempt, result] in one jsonb object (its key lookup is a binary search);
# the guard is wrapped in IS TRUE so that scheduled_jobs_running_idx is not a
# candidate. The earlier form joined the rows to unnest() of the id list: its
# generic plan (a prepared statement) expected one running row and ten ids,
# chose a nested loop that rescanned the list for every row, and a batch of
# 750 completions took 377 ms, O(n^2) in the batch size.
_DONE = """done AS (
    UPDATE scheduled_jobs j
       SET status = 'completed', finished_at = now(), lease_until = NULL,
           result = NULLIF($2::jsonb -> j.job_id -> 1, 'null'::jsonb)
     WHERE j.job_id = ANY($1::text[])
       AND j.attempts = ($2::jsonb -> j.job_id ->> 0)::int
       AND (j.worker_id = $3 AND j.status = 'running') IS TRUE
       AND (SELECT pg_scheduler_completing())
    RETURNING j.job_id, j.task_name, j.attempts, j.queue, j.has_dependents,
              j.parent_job_id, j.parent_seq
)"""
# The completed events of a completion statement's rows (``done``).
_COMPLETED_EVENTS = (
    "SELECT 'completed', job_id, task_name, attempts, $3::text, NULL::float8, queue FROM done"
)
_COMPLETE = f"""
WITH {_DONE}, {_FOLLOW_UPS}, {events_cte(_COMPLETED_EVENTS)}
SELECT d.job_id FROM done d, sent, released, counted
"""

# The same completion by a worker that takes over the dependents it releases
# (migration 0023; engine/hand_off.py): each row of the answer is a job it
# completed (``handed`` false, only job_id set) or a dependent now running
# here (``handed`` true, the claimed columns). $4 the lease (s), $5 the tasks
# and $6 the queues (NULL: all) the worker's plain claim serves, $7 how many
# it may take over, $8 how many of those start at once (the rest are claimed
# ahead). A dependent less urgent than the most urgent due work of those
# groups, limited or not, is left pending (the groups are read only when some
# row has dependents; keyed and fair-share rows, claimed apart, are not among
# them). Their start events go with the completions'.
_HANDED_COLUMNS = (
    "job_name, task_name, queue, task_data, priority, execution_time, status, attempts, "
    "retry_count, max_retries, timeout, retry_policy, claimed_ahead, has_dependents"
).split(", ")
_COMPLETE_HANDING = f"""
{served_groups("$5", "$6", "NULL", "0")},
{_DONE}, urgent AS (
    SELECT min(s.priority) AS priority FROM served s WHERE s.head <= now()
), handed AS (
    SELECT h.* FROM (SELECT array_agg(d.job_id) AS ids FROM done d WHERE d.has_dependents) x
     CROSS JOIN LATERAL pg_scheduler_dependencies_handed(
         x.ids, $3::text, $4::float8, $5::text[], $6::text[], $7::int, $8::int,
         (SELECT u.priority FROM urgent u)) h
     WHERE x.ids IS NOT NULL
), {_COUNTED}, {
    events_cte(
        _COMPLETED_EVENTS
        + " UNION ALL SELECT 'started', job_id, task_name, attempts, $3::text, NULL::float8,"
        " queue FROM handed"
    )
}
SELECT d.job_id, false AS handed, {", ".join(f"NULL AS {c}" for c in _HANDED_COLUMNS)}
  FROM done d, sent, counted
UNION ALL
SELECT h.job_id, true, {", ".join(f"h.{c}" for c in _HANDED_COLUMNS)}
  FROM handed h
"""
_COMPLETE_AND_DELETE = """
DELETE FROM scheduled_jobs j
 WHERE j.job_id = ANY($1::text[])
   AND j.attempts = ($2::jsonb -> j.job_id ->> 0)::int
   AND (j.worker_id = $3 AND j.status = 'running') IS TRUE
RETURNING j.job_id
"""

# The same completion when a batch could not be written (a statement_timeout,
# lock_timeout or cancel, typically while another session holds a row lock):
# it never waits for a row lock. ``mine``: the rows of the batch this attempt
# still holds that no one has locked, locked here in job_id order; each row of
# the answer says whether it was written (``written``) or is held by another
# session (``NOT written``: still running here in this statement's snapshot,
# write it later). A row in neither is no longer this attempt's.
_MINE = """mine AS (
    SELECT j.job_id FROM scheduled_jobs j
     WHERE j.job_id = ANY($1::text[])
       AND j.attempts = ($2::jsonb -> j.job_id ->> 0)::int
       AND (j.worker_id = $3 AND j.status = 'running') IS TRUE
     ORDER BY j.job_id
       FOR NO KEY UPDATE SKIP LOCKED
)"""
_HELD_ELSEWHERE = """
SELECT j.job_id, false FROM scheduled_jobs j
 WHERE j.job_id = ANY($1::text[])
   AND j.attempts = ($2::jsonb -> j.job_id ->> 0)::int
   AND (j.worker_id = $3 AND j.status = 'running') IS TRUE
   AND NOT EXISTS (SELECT 1 FROM mine m WHERE m.job_id = j.job_id)
"""
_COMPLETE_UNLOCKED = f"""
WITH {_MINE}, done AS (
    UPDATE scheduled_jobs j
       SET status = 'completed', finished_at = now(), lease_until = NULL,
           result = NULLIF($2::jsonb -> j.job_id -> 1, 'null'::jsonb)
     WHERE j.job_id = ANY((SELECT array_agg(m.job_id) FROM mine m)::text[])
       AND j.attempts = ($2::jsonb -> j.job_id ->> 0)::int
       AND (j.worker_id = $3 AND j.status = 'running') IS TRUE
       AND (SELECT pg_scheduler_completing())
    RETURNING j.job_id, j.task_name, j.attempts, j.queue, j.has_dependents,
              j.parent_job_id, j.parent_seq
), {_FOLLOW_UPS}, {events_cte(_COMPLETED_EVENTS)}
SELECT d.job_id, true AS written FROM done d, sent, released, counted
UNION ALL{_HELD_ELSEWHERE}"""
_COMPLETE_AND_DELETE_UNLOCKED = f"""
WITH {_MINE}, done AS (
    DELETE FROM scheduled_jobs j
     WHERE j.job_id = ANY((SELECT array_agg(m.job_id) FROM mine m)::text[])
       AND j.attempts = ($2::jsonb -> j.job_id ->> 0)::int
       AND (j.worker_id = $3 AND j.status = 'running') IS TRUE
    RETURNING j.job_id
)
SELECT d.job_id, true AS written FROM done d
UNION ALL{_HELD_ELSEWHERE}"""

# An attempt that did not complete goes to job_attempts (migration 0006); the
# job row keeps only the error of its current state, so a pending job has none.
_ATTEMPT_OUTCOME = "CASE WHEN {0}::text LIKE 'timed out after %' THEN 'timed_out' ELSE 'failed' END"
_RETRY = f"""
WITH retried AS (
    UPDATE scheduled_jobs
       SET status = 'pending', retry_count = retry_count + 1, worker_id = NULL,
           lease_until = NULL, execution_time = now() + make_interval(secs => $4),
           error_message = NULL, error_traceback = NULL, started_before = true
     WHERE {_LEASE_GUARD}
    RETURNING job_id, task_name, attempts, started_at, execution_time, queue
), kept AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error, traceback)
    SELECT job_id, attempts, $2, started_at, {_ATTEMPT_OUTCOME.format("$5")}, $5, $6 FROM retried
), {
    events_cte(
        "SELECT 'retried', job_id, task_name, attempts, $2::text, NULL::float8, queue FROM retried"
    )
}
SELECT r.execution_time FROM retried r, sent
"""
_FAIL = f"""
WITH failed AS (
    UPDATE scheduled_jobs
       SET status = 'failed', finished_at = now(), lease_until = NULL,
           error_message = $4, error_traceback = $5
     WHERE {_LEASE_GUARD}
    RETURNING job_id, task_name, attempts, started_at, queue
), kept AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error, traceback)
    SELECT job_id, attempts, $2, started_at, {_ATTEMPT_OUTCOME.format("$4")}, $4, $5 FROM failed
), {
    events_cte(
        "SELECT 'failed', job_id, task_name, attempts, $2::text, NULL::float8, queue FROM failed"
    )
}
SELECT f.job_id FROM failed f, sent
"""


_RELEASED_EVENTS = events_cte(
    "SELECT 'handed_back', job_id, task_name, attempts, $2::text, NULL::float8, queue FROM released"
)


def _released(where: str, returning: str) -> str:
    """Running rows of worker ``$2`` matching ``where`` back to pending, the
    attempt not counted; a row not claimed ahead had started, so it keeps the
    "pending" dedupe key it let go (migration 0013)."""
    return f"""    UPDATE scheduled_jobs
       SET status = 'pending', worker_id = NULL, lease_until = NULL,
           attempts = GREATEST(attempts - 1, 0),
           started_before = started_before OR NOT claimed_ahead
     WHERE {where} AND worker_id = $2 AND status = 'running'
    RETURNING {returning}"""


def _release_where(where: str) -> str:
    """Hand running jobs back without consuming the attempt (graceful shutdown,
    or claims this worker holds in the database but never started). A row not
    claimed ahead had started as far as the database knows: it has let its
    "pending" dedupe key go (migration 0013) and does not take it back."""
    return f"""
WITH released AS (
{_released(where, "job_id, task_name, attempts, started_at, claimed_ahead, queue")}
), kept AS (
    -- Only attempts that had started: a claimed-ahead row handed back never ran.
    INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error)
    SELECT job_id, attempts + 1, $2, started_at, 'handed_back', 'handed back by worker ' || $2
      FROM released WHERE NOT claimed_ahead
), {_RELEASED_EVENTS}
SELECT r.job_id, pg_notify('pg_scheduler_jobs', '*') FROM released r, sent
"""


_RELEASE = _release_where("job_id = ANY($1::text[])")
# Ghosts the heartbeat saw: only the very claim it saw ($3: its started_at). A row
# handed back since and claimed again here has a new started_at and is kept.
_RELEASE_GHOSTS = _release_where(
    "(job_id, started_at) IN (SELECT * FROM unnest($1::text[], $3::timestamptz[]))"
)

# A running attempt cancelled goes to job_attempts; ``target`` is the row
# before the update (locked, so the status read is the one replaced). A parked
# workflow (waiting) is cancelled like a pending job; the children of a
# workflow are cancelled with it (migration 0014's trigger).
_CANCEL = f"""
WITH target AS (
    SELECT job_id, status, attempts, worker_id, started_at FROM scheduled_jobs
     WHERE job_id = $1 AND status IN ('pending', 'running', 'waiting')
       FOR UPDATE
), cancelled AS (
    UPDATE scheduled_jobs j
       SET status = 'cancelled', finished_at = now(), lease_until = NULL
      FROM target t
     WHERE j.job_id = t.job_id AND j.status IN ('pending', 'running', 'waiting')
    RETURNING j.job_id, j.task_name, j.attempts, j.queue
), kept AS (
    INSERT INTO job_attempts (job_id, attempt, worker_id, started_at, outcome, error)
    SELECT t.job_id, t.attempts, t.worker_id, t.started_at, 'cancelled', 'cancelled by cancel_job()'
      FROM target t JOIN cancelled c ON c.job_id = t.job_id
     WHERE t.status = 'running'
), {
    events_cte(
        "SELECT 'cancelled', c.job_id, c.task_name, c.attempts, t.worker_id, NULL::float8,"
        " c.queue FROM cancelled c JOIN target t ON t.job_id = c.job_id"
    )
}
SELECT c.job_id, pg_notify('pg_scheduler_cancel', c.job_id) FROM cancelled c, sent
"""

_JOB_COLUMNS = """
    job_id, job_name, task_name, status, priority, execution_time, created_at,
    started_at, finished_at, last_heartbeat, lease_until, attempts, retry_count,
    max_retries, rescue_count, worker_id, misfire_grace_time, timeout,
    retry_policy::text AS retry_policy, task_data::text AS task_data,
    result::text AS result, error_message, error_traceback, dedupe_key, dedupe_scope,
    parent_job_id, wait_kind, wait_for, wake_at, concurrency_key, max_running_per_key,
    rate_count_per_key, rate_period_per_key, key_ordered, fair_share_key, fair_share_weight
"""

_EXISTING_IDS = "SELECT job_id FROM scheduled_jobs WHERE job_id = ANY($1::text[])"
# With its progress, the attempts that did not complete (job_attempts) and
# its batch (scheduler_batches), in one read.
_GET_JOB_COLUMNS = f"""{_JOB_COLUMNS}, progress, progress_message, progress_at,
       (SELECT json_agg(json_build_object(
                   'attempt', a.attempt, 'worker_id', a.worker_id, 'started_at', a.started_at,
                   'finished_at', a.finished_at, 'outcome', a.outcome, 'error', a.error,
                   'traceback', a.traceback) ORDER BY a.attempt_id)::text
          FROM job_attempts a WHERE a.job_id = j.job_id) AS attempt_history"""
_GET_JOB = f"""
SELECT {_GET_JOB_COLUMNS}, bm.batch_id, bm.batch_size
  FROM scheduled_jobs j{BATCH_OF_JOB}
 WHERE j.job_id = $1
"""
# The same for a role that may not read scheduler_batches (a waiter granted
# SELECT on the job tables before migration 0020): no batch.
_GET_JOB_UNBATCHED = f"""
SELECT {_GET_JOB_COLUMNS}, NULL::text AS batch_id, NULL::int AS batch_size
  FROM scheduled_jobs j
 WHERE j.job_id = $1
"""
# The event is the one the transition means (a pending row forced from running
# is handed back; from a final state, scheduled again). started_before (0013):
# a row that had started, or a finished row that was ever claimed, does not
# take a "pending" dedupe key back; a pending row or one claimed ahead keeps
# what it has.
# The final statuses as an SQL list of text literals.
_FINAL_LIST = ", ".join(f"'{status}'" for status in FINAL_STATUS_VALUES)
_SET_STATUS = f"""
WITH target AS (
    SELECT job_id, status, worker_id FROM scheduled_jobs WHERE job_id = $1 FOR UPDATE
), changed AS (
    UPDATE scheduled_jobs j
       SET status = $2,
           started_before = j.started_before
               OR (t.status = 'running' AND NOT j.claimed_ahead)
               OR (t.status NOT IN ('pending', 'running') AND j.started_at IS NOT NULL),
           finished_at = CASE WHEN $2 IN ({_FINAL_LIST})
                              THEN now() END,
           lease_until = CASE WHEN $2 = 'running' THEN j.lease_until END,
           worker_id = CASE WHEN $2 = 'pending' THEN NULL ELSE j.worker_id END
      FROM target t
     WHERE j.job_id = t.job_id
    RETURNING j.job_id, j.task_name, j.attempts, j.queue, t.status AS old_status,
              t.worker_id AS old_worker, j.has_dependents
), released AS (
    -- A running job forced to completed releases its dependents (migration 0015).
    SELECT count(pg_scheduler_dependencies_completed(ARRAY[c.job_id])) AS n
      FROM changed c
     WHERE c.has_dependents AND c.old_status = 'running' AND $2 = 'completed'
), {
    events_cte(
        "SELECT CASE WHEN old_status = $2 THEN NULL"
        f" WHEN $2 IN ({_FINAL_LIST}) THEN $2::text"
        " WHEN $2 = 'running' THEN 'started'"
        " WHEN old_status = 'running' THEN 'handed_back' ELSE 'scheduled' END,"
        " job_id, task_name, attempts, old_worker, NULL::float8, queue FROM changed"
    )
}
SELECT c.job_id FROM changed c, sent, released
"""


def _hand_back_unstarted(where: str) -> str:
    """Rows of worker ``$2`` that never started here go back to pending: the
    attempt is not counted and none is recorded in job_attempts (nothing ran).
    A row not claimed ahead let its "pending" dedupe key go when it was written
    running, and does not take it back (see _release_where)."""
    return f"""
WITH released AS (
{_released(where, "job_id, task_name, attempts, queue")}
), {_RELEASED_EVENTS}
SELECT r.job_id, pg_notify('pg_scheduler_jobs', '*') FROM released r, sent
"""


# Shutdown: every row held here that this process does not own ($1: the rows
# it still owns: jobs that ignored their cancellation, outcomes not written).
# Rows of in-process starts whose caller was cancelled, claims whose answer
# was lost, rows that arrived after the buffer was handed back.
_RELEASE_UNOWNED = _hand_back_unstarted("NOT (job_id = ANY($1::text[]))")
# An in-process start whose caller was cancelled while its insert was in
# flight: the row, if it landed, as that insert wrote it (started_at and
# created_at are both the insert's now(); a later claim of it has a later
# started_at and is not touched).
_RELEASE_LOCAL_START = _hand_back_unstarted(
    "job_id = $1 AND attempts = 1 AND started_at = created_at"
)
