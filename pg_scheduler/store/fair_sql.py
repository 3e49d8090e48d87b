"""The fair claim's statements: weighted fair share between keys (migration 0018).

Rows with a ``fair_share_key`` live in ``scheduled_jobs_fair_idx``,
``(queue, task_name, fair_share_key, priority, execution_time) WHERE status =
'pending' AND fair_share_key IS NOT NULL``; the plain claim index leaves them
out. While such rows are pending, a worker claims with :data:`FAIR_CLAIM`
instead of the plain claim: one statement that

* finds the distinct (queue, task, key, priority) groups of keyed rows with
  one index descent each (a recursive skip scan, as ``queues.GROUPS`` does
  for the plain index), keeps those the worker serves, and reads each from
  its head (``FOR UPDATE SKIP LOCKED``), twice the key's share of the
  claim by weight and two rows more (a key behind its share catches up
  in the claims that follow; the rows left over are unlocked at the statement's end);
* takes the plain claim's own candidates beside them (rows without a key:
  one more tenant, the key ``''``, weight 1);
* gives every candidate a virtual finish tag: its key's recent cost (the sum
  of 1/weight over the key's recent starts, decaying with a time constant
  of :data:`TAU` seconds, read from ``scheduler_fair_share_starts``; a key
  more than a claim's worth (``$2``) below the least cost of the keys with
  a record starts from there, so a key that was idle earns a claim's worth
  of credit at most), plus the running sum of 1/weight of the key's candidates up to
  this one, in (priority, execution_time) order;
* keeps the best ``$2`` by (priority, tag): priority first, then the key
  furthest below its share; starts them as the plain claim does; and adds
  what it started to this worker's own rows of the record, in the same
  statement.

Each worker writes only its own record rows, so no claim ever waits on
another's. Two workers claiming at once both read the other's last committed
starts: their shares stay within a claim of each other. A weight set per key
(``scheduler_fair_share_weights``) wins over the one the job carries; None: 1.
"""

from __future__ import annotations

from .job_sql import _CLAIMED_COLUMNS, claim_set, due_in_groups
from .queues import FAIR_GROUPS, served_groups

#: Seconds: the time constant of the record's decay (a start counts e^-1 of
#: itself after TAU seconds).
TAU = 2.0

# Every keyed group's due rows, counted (``n``) with the oldest's time
# (``oldest``), for the reports of work no worker serves (workers.py,
# orphans.py): CTE ``fair_due_groups`` (queue, task_name, n, oldest), of the
# groups whose task matches the SQL condition ``{keep}`` on ``g.task_name``
# (after WITH RECURSIVE ... FAIR_GROUPS).
FAIR_DUE_GROUPS = """
fair_due_groups AS (
    SELECT g.queue, g.task_name, c.n, c.oldest
      FROM fair_groups g
     CROSS JOIN LATERAL (
        SELECT count(*) AS n, min(j.execution_time) AS oldest FROM scheduled_jobs j
         WHERE j.status = 'pending' AND j.fair_share_key IS NOT NULL
           AND j.queue = g.queue AND j.task_name = g.task_name
           AND j.fair_share_key = g.fair_share_key AND j.priority = g.priority
           AND j.execution_time <= now()
     ) c
     WHERE g.execution_time <= now() AND {keep}
)"""


def fair_served(tasks: str, queues: str, caps: str, default_cap: str) -> str:
    """CTE ``fair_served``: the keyed groups of ``tasks`` in ``queues`` (NULL:
    all) not paused and bound by no global limit, with each queue's cap (as
    queues.served_groups; needs its ``bound`` CTE)."""
    return f"""fair_served AS (
    SELECT g.queue, g.task_name, g.fair_share_key AS fkey, g.priority,
           g.execution_time AS head, coalesce(c.cap, {default_cap}) AS cap,
           g.fair_share_weight AS head_weight
      FROM fair_groups g
      LEFT JOIN unnest({queues}::text[], {caps}::int[]) AS c(queue, cap) ON c.queue = g.queue
     WHERE g.task_name = ANY({tasks}::text[])
       AND ({queues}::text[] IS NULL OR c.queue IS NOT NULL)
       AND NOT EXISTS (SELECT 1 FROM scheduler_queues q
                        WHERE q.name = g.queue AND q.paused)
       AND NOT EXISTS (SELECT 1 FROM bound b
                        WHERE (b.scope = 'task' AND b.name = g.task_name)
                           OR (b.scope = 'queue' AND b.name = g.queue))
)"""


# A record row's cost (or starts) decayed to now.
_DECAYED = "{0}.{1} * exp(-GREATEST(0, EXTRACT(EPOCH FROM now() - {0}.at)) / {tau})"

# $1 tasks, $2 how many rows, $3 worker, $4 lease seconds, $5 how many start
# now, $6 queues served (NULL: all), $7 the most rows per queue: the plain
# claim's parameters (job_sql._CLAIM).
FAIR_CLAIM = f"""
{served_groups("$1", "$6", "$7", "$2", limits="none")},
{due_in_groups("$2")}, {FAIR_GROUPS},
{fair_served("$1", "$6", "$7", "$2")},
fair_due AS (
    -- Each key's weight as its head row or the weights table gives it, and
    -- its share of the keys' (and the unkeyed rows') weights: a key reads
    -- twice its share of the claim, and two rows more, from each group.
    SELECT s.*, coalesce(w.weight, s.head_weight, 1) AS weight
      FROM fair_served s
      LEFT JOIN scheduler_fair_share_weights w ON w.fair_share_key = s.fkey
     WHERE s.head <= now()
), fair_reads AS (
    SELECT d.*, LEAST(d.cap, $2, 2 + 2 * ceil($2 * d.weight / (
               (SELECT sum(k.weight) FROM (SELECT DISTINCT ON (fkey) weight FROM fair_due
                                            ORDER BY fkey, priority) k)
               + CASE WHEN EXISTS (SELECT 1 FROM kept) THEN 1 ELSE 0 END))::int) AS reads
      FROM fair_due d
), fair_candidates AS (
    SELECT c.job_id, c.tid, c.expired, s.priority, c.execution_time, s.queue, s.cap,
           s.fkey, c.weight
      FROM fair_reads s
     CROSS JOIN LATERAL (
        SELECT j.job_id, j.ctid AS tid, j.execution_time, j.fair_share_weight AS weight,
               (j.started_at IS NULL AND j.misfire_grace_time IS NOT NULL
                AND j.execution_time + make_interval(secs => j.misfire_grace_time) < now())
                   AS expired
          FROM scheduled_jobs j
         WHERE j.status = 'pending' AND j.fair_share_key IS NOT NULL
           AND j.queue = s.queue AND j.task_name = s.task_name
           AND j.fair_share_key = s.fkey AND j.priority = s.priority
           AND j.execution_time >= s.head AND j.execution_time <= now()
         ORDER BY j.execution_time
         LIMIT s.reads
           FOR UPDATE SKIP LOCKED
     ) c
), every_candidate AS (
    SELECT k.job_id, k.tid, k.expired, k.priority, k.execution_time, q.queue, q.cap,
           '' AS fkey, NULL::float8 AS weight
      FROM kept k JOIN candidates q ON q.job_id = k.job_id
    UNION ALL
    SELECT job_id, tid, expired, priority, execution_time, queue, cap, fkey, weight
      FROM fair_candidates
), load AS (
    SELECT k.fkey, w.weight AS key_weight,
           coalesce((SELECT sum({_DECAYED.format("r", "cost", tau=TAU)})
                       FROM scheduler_fair_share_starts r
                      WHERE r.fair_share_key = k.fkey), 0) AS cost
      FROM (SELECT DISTINCT fkey FROM every_candidate) k
      LEFT JOIN scheduler_fair_share_weights w ON w.fair_share_key = k.fkey
), floor AS (
    SELECT coalesce(min(cost) FILTER (WHERE cost > 0), 0) AS cost FROM load
), tagged AS (
    SELECT e.job_id, e.tid, e.expired, e.priority, e.execution_time, e.queue, e.cap, e.fkey,
           1.0 / coalesce(l.key_weight, e.weight, 1) AS cost,
           GREATEST(l.cost, f.cost - $2)
           + sum(1.0 / coalesce(l.key_weight, e.weight, 1))
                 OVER (PARTITION BY e.fkey ORDER BY e.priority, e.execution_time, e.job_id
                       ROWS UNBOUNDED PRECEDING) AS tag
      FROM every_candidate e JOIN load l ON l.fkey = e.fkey CROSS JOIN floor f
), fair_kept AS (
    SELECT job_id, tid, expired, priority, tag, execution_time, fkey, cost
      FROM (SELECT t.*, row_number() OVER (PARTITION BY t.queue
                                           ORDER BY t.priority, t.tag, t.execution_time)
                                  AS in_queue
              FROM tagged t) r
     WHERE r.in_queue <= r.cap
     ORDER BY priority, tag, execution_time
     LIMIT $2
), placed AS (
    SELECT job_id, tid, expired, fkey, cost,
           row_number() OVER (PARTITION BY expired ORDER BY priority, tag, execution_time)
               AS place
      FROM fair_kept
), claimed AS (
    UPDATE scheduled_jobs j
       SET {claim_set("$3", "$4", "NOT picked.expired AND picked.place > $5")}
      FROM placed AS picked
     WHERE j.ctid = picked.tid
    RETURNING {_CLAIMED_COLUMNS}, picked.fkey, picked.cost
), recorded AS (
    INSERT INTO scheduler_fair_share_starts AS r (fair_share_key, worker_id, cost, starts, at)
    SELECT c.fkey, $3, sum(c.cost), count(*), now()
      FROM claimed c
     WHERE c.status = 'running'
     GROUP BY c.fkey
    ON CONFLICT (fair_share_key, worker_id) DO UPDATE
       SET cost = {_DECAYED.format("r", "cost", tau=TAU)} + EXCLUDED.cost,
           starts = {_DECAYED.format("r", "starts", tau=TAU)} + EXCLUDED.starts,
           at = now()
)
SELECT c.job_id, c.job_name, c.task_name, c.queue, c.task_data, c.priority,
       c.execution_time, c.status, c.attempts, c.retry_count, c.max_retries, c.timeout,
       c.retry_policy, c.claimed_ahead, c.has_dependents
  FROM claimed c
"""

# Whether any keyed row is pending (one descent of scheduled_jobs_fair_idx).
FAIR_PENDING = """
SELECT EXISTS (SELECT 1 FROM scheduled_jobs j
                WHERE j.status = 'pending' AND j.fair_share_key IS NOT NULL)
"""

# Seconds until the earliest keyed head a worker running $1 in $2 (NULL:
# all) may claim (negative: due now); NULL: none.
FAIR_NEXT_DUE = f"""
WITH RECURSIVE {FAIR_GROUPS},
bound AS MATERIALIZED (SELECT l.scope, l.name FROM scheduler_limits l),
{fair_served("$1", "$2", "NULL", "0")}
SELECT EXTRACT(EPOCH FROM (min(s.head) - now()))::float8 FROM fair_served s
"""

# Record rows whose starts have decayed to nothing (a minute is 30 TAU).
FORGET_OLD_STARTS = """
DELETE FROM scheduler_fair_share_starts WHERE at < now() - interval '1 minute'
"""

SET_WEIGHT = """
INSERT INTO scheduler_fair_share_weights AS w (fair_share_key, weight) VALUES ($1, $2)
ON CONFLICT (fair_share_key) DO UPDATE SET weight = EXCLUDED.weight, updated_at = now()
"""
CLEAR_WEIGHT = """
DELETE FROM scheduler_fair_share_weights WHERE fair_share_key = $1 RETURNING fair_share_key
"""

# The busiest keys ($1 of them): pending (due now and later), running, recent
# starts (decayed, per TAU), the weight set per key, if any. The pending rows
# are counted from scheduled_jobs_fair_idx; running ones from the running index.
BUSIEST = f"""
WITH pending AS (
    SELECT j.fair_share_key AS fkey, count(*) AS waiting,
           count(*) FILTER (WHERE j.execution_time <= now()) AS due
      FROM scheduled_jobs j
     WHERE j.status = 'pending' AND j.fair_share_key IS NOT NULL
     GROUP BY 1
), running AS (
    SELECT j.fair_share_key AS fkey, count(*) AS running
      FROM scheduled_jobs j
     WHERE j.status = 'running' AND j.fair_share_key IS NOT NULL
     GROUP BY 1
), recent AS (
    SELECT r.fair_share_key AS fkey, sum({_DECAYED.format("r", "starts", tau=TAU)}) AS starts
      FROM scheduler_fair_share_starts r
     WHERE r.fair_share_key <> ''
     GROUP BY 1
), keys AS (
    SELECT fkey FROM pending UNION SELECT fkey FROM running UNION SELECT fkey FROM recent
    UNION SELECT fair_share_key FROM scheduler_fair_share_weights
)
SELECT k.fkey AS fair_share_key,
       coalesce(p.waiting, 0)::bigint AS waiting, coalesce(p.due, 0)::bigint AS due,
       coalesce(r.running, 0)::bigint AS running,
       coalesce(s.starts, 0)::float8 AS recent_starts,
       w.weight AS weight
  FROM keys k
  LEFT JOIN pending p ON p.fkey = k.fkey
  LEFT JOIN running r ON r.fkey = k.fkey
  LEFT JOIN recent s ON s.fkey = k.fkey
  LEFT JOIN scheduler_fair_share_weights w ON w.fair_share_key = k.fkey
 ORDER BY coalesce(r.running, 0) + coalesce(s.starts, 0) DESC, coalesce(p.waiting, 0) DESC,
          k.fkey
 LIMIT $1
"""
