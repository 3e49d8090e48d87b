"""The statements of the keyed claim and the per-key listing (see
:mod:`pg_scheduler.store.keys`, which runs them)."""

from __future__ import annotations

from .job_sql import _CLAIMED_COLUMNS, claim_set
from .queues import served_groups

# The rows a worker running $tasks in $queues (NULL: every queue) may claim.
_SERVED_ROW = """{j}.task_name = ANY({tasks}::text[])
           AND ({queues}::text[] IS NULL OR {j}.queue = ANY({queues}::text[]))
           AND NOT EXISTS (SELECT 1 FROM scheduler_queues q
                            WHERE q.name = {j}.queue AND q.paused)"""

# Starts of key ``{k}`` counted against a rate of ``{rp}`` seconds: the window
# plus a slack for the gap between a claim and the job's own start, as the
# global limits count it (LimitStore.RATE_MARGIN; ``{margin}``).
_STARTED = """(SELECT count(*) FROM scheduler_key_starts s
                 WHERE s.concurrency_key = {k}
                   AND s.started_at > clock_timestamp() - make_interval(
                       secs => {rp} + {margin} * LEAST(0.25, 0.1 * {rp})))"""
_RUNNING = """(SELECT count(*) FROM scheduled_jobs r
                 WHERE r.status = 'running' AND r.concurrency_key = {k})"""

# Every key with a pending unordered row, with its first entry in the index
# (its most urgent pending row), and every key with an unfinished ordered row:
# one index descent per key on each of the two indexes.
_KEYS = """
unordered_keys AS (
    (SELECT j.concurrency_key AS k, j.priority AS p, j.execution_time AS t,
            j.max_running_per_key AS m, j.rate_count_per_key AS rc, j.rate_period_per_key AS rp,
            j.task_name AS tn, j.queue AS qn
       FROM scheduled_jobs j
      WHERE j.status = 'pending' AND j.concurrency_key IS NOT NULL AND NOT j.key_ordered
      ORDER BY j.concurrency_key, j.priority, j.execution_time LIMIT 1)
    UNION ALL
    SELECT n.k, n.p, n.t, n.m, n.rc, n.rp, n.tn, n.qn FROM unordered_keys u
     CROSS JOIN LATERAL (
        SELECT j.concurrency_key AS k, j.priority AS p, j.execution_time AS t,
               j.max_running_per_key AS m, j.rate_count_per_key AS rc,
               j.rate_period_per_key AS rp, j.task_name AS tn, j.queue AS qn
          FROM scheduled_jobs j
         WHERE j.status = 'pending' AND j.concurrency_key IS NOT NULL AND NOT j.key_ordered
           AND j.concurrency_key > u.k
         ORDER BY j.concurrency_key, j.priority, j.execution_time LIMIT 1) n
), ordered_keys AS (
    (SELECT j.concurrency_key AS k FROM scheduled_jobs j
      WHERE j.key_ordered AND j.status IN ('pending', 'running', 'waiting')
      ORDER BY j.concurrency_key, j.key_seq LIMIT 1)
    UNION ALL
    SELECT n.k FROM ordered_keys o
     CROSS JOIN LATERAL (
        SELECT j.concurrency_key AS k FROM scheduled_jobs j
         WHERE j.key_ordered AND j.status IN ('pending', 'running', 'waiting')
           AND j.concurrency_key > o.k
         ORDER BY j.concurrency_key, j.key_seq LIMIT 1) n
)"""

# The oldest unfinished job of ordered key ``{k}``: the only one that may run.
_ORDERED_HEAD = """(SELECT x.job_id FROM scheduled_jobs x
                  WHERE x.key_ordered AND x.status IN ('pending', 'running', 'waiting')
                    AND x.concurrency_key = {k}
                  ORDER BY x.key_seq LIMIT 1)"""

# Every key with due work this worker may run, the most urgent first, as the
# keyed claim visits them (a key whose first entry is not due yet is placed
# at "now": it may have a due row of a less urgent priority). ``{where}``
# keeps or cuts them.
_VISITS = """
    SELECT v.k, min(v.p) AS p, min(v.t) AS t, min(v.m) AS m, min(v.rc) AS rc,
           min(v.rp) AS rp, min(v.tn) AS tn, min(v.qn) AS qn, bool_or(v.o) AS o FROM (
        SELECT u.k, u.p, LEAST(u.t, now()) AS t, u.m, u.rc, u.rp, u.tn, u.qn, false AS o
          FROM unordered_keys u
        UNION ALL
        SELECT o.k, -2147483648, '-infinity'::timestamptz, NULL, NULL, NULL, NULL, NULL, true
          FROM ordered_keys o
    ) v
     WHERE {where}
     GROUP BY v.k"""

# Each visited key's head (its most urgent due row this worker runs) and its
# room; the first $3 keys whose room is not gone (read without a lock: an
# estimate) and whose head is at least as urgent as the due plain work (when
# $4 cuts), each locked with pg_try_advisory_xact_lock on its hash.
_HEADS = f"""heads AS MATERIALIZED (
    SELECT c.k, h.priority, h.head
      FROM visits c
     CROSS JOIN LATERAL (
        SELECT u.priority, u.head, u.most, u.rc, u.rp FROM (
            (SELECT j.priority, j.execution_time AS head, j.max_running_per_key AS most,
                    j.rate_count_per_key AS rc, j.rate_period_per_key AS rp
               FROM scheduled_jobs j
              WHERE j.status = 'pending' AND j.concurrency_key = c.k AND NOT j.key_ordered
                AND j.execution_time <= now()
                AND {_SERVED_ROW.format(j="j", tasks="$1", queues="$2")}
              ORDER BY j.priority, j.execution_time LIMIT 1)
            UNION ALL
            (SELECT o.priority, o.execution_time, 1, o.rate_count_per_key, o.rate_period_per_key
               FROM scheduled_jobs o
              WHERE o.job_id = {_ORDERED_HEAD.format(k="c.k")}
                AND o.status = 'pending' AND o.execution_time <= now()
                AND {_SERVED_ROW.format(j="o", tasks="$1", queues="$2")})
        ) u
        ORDER BY u.priority, u.head LIMIT 1
     ) h
     WHERE (h.most IS NULL OR {_RUNNING.format(k="c.k")} < h.most)
       AND (h.rc IS NULL OR {_STARTED.format(k="c.k", rp="h.rp", margin="$5")} < h.rc)
       AND NOT EXISTS (SELECT 1 FROM plain p WHERE (h.priority, h.head) > (p.priority, p.head))
     LIMIT $3
)
SELECT h.k, h.priority, h.head, pg_try_advisory_xact_lock($6::int, hashtext(h.k)) AS locked
  FROM heads h
"""

# A key at least as urgent as the due plain work (all of them without a cut).
_UNCUT = "NOT EXISTS (SELECT 1 FROM plain c WHERE (v.p, v.t) > (c.priority, c.head))"

# The most urgent due plain job ($4: cut at it; else none).
_PLAIN = """plain AS (
    SELECT s.priority, s.head FROM served s
     WHERE $4 AND s.head <= now()
     ORDER BY s.priority, s.head LIMIT 1
)"""

# $1 tasks, $2 queues (NULL: all), $3 how many keys at most, $4 whether to cut
# at the most urgent due plain job (only keyed work at least as urgent), $5
# the rate window's margin, $6 the advisory lock class of this schema.
# The keys are visited in the order of their first index entry, and only as
# many as it takes to find $3 whose due head this worker runs and whose room
# is not gone: each visit reads the key's head and counts its running jobs.
_LOCK_KEYS = f"""
{served_groups("$1", "$2", "NULL", "0", limits="none")},
{_KEYS}, {_PLAIN}, visits AS MATERIALIZED (
    SELECT x.k FROM ({_VISITS.format(where=_UNCUT)}) x ORDER BY x.p, x.t
), {_HEADS}"""

# Instead of every key, the keys $3 names, in that order (the next stretch of
# a list the worker read with _KEY_LIST: the keys with pending work, the most
# urgent first), each with the limits of its head as the list read them ($6
# max_running_per_key, $7/$8 the rate, $11 whether it has ordered jobs, $12/$13
# its task and queue): the first $9 of them this worker runs whose room is not
# gone (estimated from those limits without a lock: the running keyed jobs
# counted in one read, the starts in the rate window) are locked, as
# they come, without reading their heads; _CLAIM_KEYS reads those once, under
# the locks. With the most urgent due plain job ($4: to cut at it; $1 tasks,
# $2 queues, $5 the lock class, $10 the rate window's margin). Each row: the
# key, its place in $3, whether it was locked, and the cut.
_LOCK_LISTED = f"""
{served_groups("$1", "$2", "NULL", "0", limits="none")},
{_PLAIN}, running AS MATERIALIZED (
    SELECT coalesce(jsonb_object_agg(x.k, x.n), '{{}}'::jsonb) AS counts FROM (
        SELECT r.concurrency_key AS k, count(*) AS n FROM scheduled_jobs r
         WHERE r.status = 'running' AND r.concurrency_key IS NOT NULL
         GROUP BY r.concurrency_key) x
), roomy AS (
    SELECT l.k, l.n FROM unnest($3::text[], $6::int[], $7::int[], $8::float8[], $11::bool[],
                                $12::text[], $13::text[])
                         WITH ORDINALITY AS l(k, most, rc, rp, o, tn, qn, n)
     WHERE (l.most IS NULL
            OR coalesce(((SELECT c.counts FROM running c) ->> l.k)::int, 0) < l.most)
       AND (l.rc IS NULL OR {_STARTED.format(k="l.k", rp="l.rp", margin="$10")} < l.rc)
       -- Runnable here: the head as listed is of a task and queue this worker
       -- serves (or the key has ordered jobs); else a due row of one is
       -- looked for, as the claim would (a key of other workers' tasks is
       -- not locked: their claims would pass it over).
       AND (l.o OR (l.tn = ANY($1::text[]) AND ($2::text[] IS NULL OR l.qn = ANY($2::text[])))
            OR EXISTS (SELECT 1 FROM scheduled_jobs j
                        WHERE j.status = 'pending' AND j.concurrency_key = l.k
                          AND NOT j.key_ordered AND j.execution_time <= now()
                          AND {_SERVED_ROW.format(j="j", tasks="$1", queues="$2")}))
     LIMIT $9
)
SELECT o.k, o.n, pg_try_advisory_xact_lock($5::int, hashtext(o.k)) AS locked,
       p.priority AS cut_priority, p.head AS cut_head
  FROM roomy o
  LEFT JOIN plain p ON true
 ORDER BY o.n"""

# Every key with pending keyed work, the most urgent first: the visiting
# order of _LOCK_KEYS, uncut, for _LOCK_LISTED; with the limits of each key's
# first entry (max_running_per_key, the rate, its task and queue; NULL for an
# ordered key's), and whether it has unfinished ordered jobs. $1 how many at most.
_KEY_LIST = f"""
WITH RECURSIVE {_KEYS}
SELECT x.k, x.m, x.rc, x.rp, x.o, x.tn, x.qn
  FROM ({_VISITS.format(where="true")}) x
 ORDER BY x.p, x.t LIMIT $1
"""

# The candidate rows of locked key ``b.k`` (of ``{busy}``: the locked keys, or
# those that may have ordered jobs): its unordered pending rows from the head
# (at most $4), or its ordered head; due, runnable here, locked.
_CANDIDATES = """
SELECT b.k, b.running, c.* FROM {busy} b
 CROSS JOIN LATERAL (
    SELECT j.job_id, j.ctid AS tid, j.priority, j.execution_time,
           j.max_running_per_key AS most, j.rate_count_per_key AS rc,
           j.rate_period_per_key AS rp,
           (j.started_at IS NULL AND j.misfire_grace_time IS NOT NULL
            AND j.execution_time + make_interval(secs => j.misfire_grace_time) < now())
               AS expired
      FROM scheduled_jobs j
     WHERE {where}
       AND j.execution_time <= now() AND {served}
       AND ($7::int IS NULL OR (j.priority, j.execution_time) <= ($7::int, $8::timestamptz))
     ORDER BY j.priority, j.execution_time
     LIMIT LEAST($4::int, GREATEST(0, coalesce(b.head_most, $4::int) - b.running))
       FOR UPDATE SKIP LOCKED
 ) c"""

# $1 the locked keys (distinct), $2 tasks, $3 queues (NULL: all), $4 at most
# this many, $5 worker, $6 lease seconds, $7/$8 only rows at least as urgent
# as this (priority, execution_time; NULL: no cut), $9 the rate window's
# margin, $10 how many start at once (the rest are claimed ahead), $11 the
# limit of each key's head if known (parallel to $1; NULL: read it), $12
# whether each key has unfinished ordered jobs (parallel to $1; NULL: look).
_CLAIM_KEYS = f"""
WITH busy AS (
    -- Each locked key's running jobs, and the limit of its head (how many
    -- rows the key's read takes at most: no more than may start), unless
    -- $11 gives it (as the worker's list read it: only a bound on the rows
    -- read, as each row is held to its own limit below).
    -- The running jobs are counted for every key in one read: a count per key
    -- could be planned on the worker_id index (as cheap with no running rows
    -- in the statistics), which reads every running row for each key.
    SELECT l.k, l.ordered, coalesce(r.n, 0) AS running,
           coalesce(l.most,
                    (SELECT j.max_running_per_key FROM scheduled_jobs j
                      WHERE j.status = 'pending' AND j.concurrency_key = l.k
                        AND NOT j.key_ordered
                      ORDER BY j.priority, j.execution_time LIMIT 1)) AS head_most
      FROM unnest($1::text[], $11::int[], $12::bool[]) AS l(k, most, ordered)
      LEFT JOIN (SELECT x.concurrency_key AS k, count(*) AS n FROM scheduled_jobs x
                  WHERE x.status = 'running' AND x.concurrency_key = ANY($1::text[])
                  GROUP BY x.concurrency_key) r ON r.k = l.k
), unordered AS (
    {
    _CANDIDATES.format(
        busy="busy",
        where="j.status = 'pending' AND j.concurrency_key = b.k AND NOT j.key_ordered",
        served=_SERVED_ROW.format(j="j", tasks="$2", queues="$3"),
    )
}
), ordered AS (
    {
    _CANDIDATES.format(
        busy="(SELECT * FROM busy WHERE ordered IS NOT FALSE)",
        where=f"j.job_id = {_ORDERED_HEAD.format(k='b.k')} AND j.status = 'pending'",
        served=_SERVED_ROW.format(j="j", tasks="$2", queues="$3"),
    )
}
), ranked AS (
    SELECT p.*, row_number() OVER (PARTITION BY p.k ORDER BY p.priority, p.execution_time)
                    AS nth
      FROM (SELECT * FROM unordered UNION ALL SELECT * FROM ordered) p
), kept AS (
    SELECT r.job_id, r.tid, r.expired, r.priority, r.execution_time, r.k, r.rc, r.rp
      FROM ranked r
     WHERE (r.most IS NULL OR r.running + r.nth <= r.most)
       AND (r.rc IS NULL OR {_STARTED.format(k="r.k", rp="r.rp", margin="$9")} + r.nth <= r.rc)
     ORDER BY r.priority, r.execution_time
     LIMIT $4
), placed AS (
    -- The first $10 start at once; the rest wait in the worker's buffer,
    -- claimed ahead (holding their key's slot), unless a rate binds them: a
    -- start stamped now must start now.
    SELECT k.*, row_number() OVER (ORDER BY k.priority, k.execution_time) AS place
      FROM kept k
), picked AS (
    SELECT * FROM placed WHERE place <= $10 OR rc IS NULL
), claimed AS (
    UPDATE scheduled_jobs j
       SET {claim_set("$5", "$6", "NOT picked.expired AND picked.place > $10")}
      FROM picked
     WHERE j.ctid = picked.tid
    RETURNING {_CLAIMED_COLUMNS}, j.concurrency_key AS claimed_key,
              j.rate_count_per_key AS claimed_rate, j.rate_period_per_key AS claimed_period
), stamped AS (
    INSERT INTO scheduler_key_starts (concurrency_key, started_at, job_id)
    SELECT c.claimed_key, clock_timestamp(), c.job_id FROM claimed c
     WHERE c.status = 'running' AND c.claimed_rate IS NOT NULL
), pruned AS (
    DELETE FROM scheduler_key_starts s
     USING (SELECT k, max(rp) AS rp FROM picked WHERE rc IS NOT NULL GROUP BY k) w
     WHERE s.concurrency_key = w.k
       AND s.started_at < clock_timestamp() - make_interval(secs => 2 * w.rp + 1)
)
SELECT * FROM claimed
"""

# A rate-limited job about to start later than the window's margin after its
# claim was sent (see engine/rate_starts.py), under its key's lock (taken by
# the statement before, so this one's snapshot sees every start committed
# before the lock was granted): $1 key, $2 job, $3 the worker, $4 the
# attempt, $5 the rate's count, $6 its period (s), $7 the margin.
# If the job is still this worker's attempt, its latest stamp is dropped and,
# when the key's other starts in the window leave room, a new one is stamped
# now: ``moved`` true; with no room, ``moved`` false (the worker hands the
# job back). No row: the job is no longer this attempt's, nothing written.
_RESTAMP = """
WITH mine AS (
    SELECT 1 FROM scheduled_jobs
     WHERE job_id = $2::text AND worker_id = $3::text AND attempts = $4::int
       AND status = 'running'
), own AS (
    SELECT s.ctid AS tid FROM scheduler_key_starts s, mine
     WHERE s.concurrency_key = $1 AND s.job_id = $2
     ORDER BY s.started_at DESC LIMIT 1
), others AS (
    SELECT (SELECT count(*) FROM scheduler_key_starts s
             WHERE s.concurrency_key = $1::text
               AND s.ctid NOT IN (SELECT tid FROM own)
               AND s.started_at > clock_timestamp() - make_interval(
                   secs => $6::float8 + $7::float8 * LEAST(0.25, 0.1 * $6::float8))) AS n
      FROM mine
), dropped AS (
    DELETE FROM scheduler_key_starts s USING own WHERE s.ctid = own.tid
), stamped AS (
    INSERT INTO scheduler_key_starts (concurrency_key, started_at, job_id)
    SELECT $1, clock_timestamp(), $2 FROM others WHERE others.n < $5::int
)
SELECT others.n < $5::int AS moved FROM others
"""

# Starts older than the longest window a rate may have (7 days) count for
# nothing: the vacuum drops them (keys no claim has taken since).
PRUNE_KEY_STARTS = """
DELETE FROM scheduler_key_starts
 WHERE started_at < clock_timestamp() - interval '8 days'
"""

# The busiest keys: running and waiting jobs, and starts in the last minute.
_BUSIEST = """
SELECT j.concurrency_key AS key,
       count(*) FILTER (WHERE j.status = 'running')::bigint AS running,
       count(*) FILTER (WHERE j.status = 'pending')::bigint AS waiting,
       min(j.max_running_per_key) AS max_running_per_key,
       min(j.rate_count_per_key) AS rate_count,
       min(j.rate_period_per_key) AS rate_period,
       bool_or(j.key_ordered) AS ordered,
       (SELECT count(*) FROM scheduler_key_starts s
         WHERE s.concurrency_key = j.concurrency_key
           AND s.started_at > clock_timestamp()
               - make_interval(secs => coalesce(min(j.rate_period_per_key), 60)))::bigint
           AS started_in_window
  FROM scheduled_jobs j
 WHERE j.concurrency_key IS NOT NULL AND j.status IN ('pending', 'running')
 GROUP BY j.concurrency_key
 ORDER BY count(*) FILTER (WHERE j.status = 'running') DESC,
          count(*) FILTER (WHERE j.status = 'pending') DESC, j.concurrency_key
 LIMIT $1
"""
