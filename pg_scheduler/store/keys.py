"""The keyed claim: jobs with a ``concurrency_key`` (migration 0017).

The plain claim never reads keyed rows (its index leaves them out). A keyed
claim runs in one transaction of two statements:

1. ``_LOCK_KEYS`` finds the keys with a due head this worker may run whose
   room (read without a lock: an estimate) is not gone, the most urgent
   first, and takes ``pg_try_advisory_xact_lock`` on each one's hash (a key
   another claim holds is skipped: that claim serves it now).
2. ``_CLAIM_KEYS`` (a fresh snapshot under READ COMMITTED, so it sees every
   start committed before the lock was granted: the holder commits before it
   lets go) counts, per locked key, the rows running and the starts in the
   rate window, and starts at most what each key has room for, each key
   from its head by priority then time; an ordered key only its oldest
   unfinished job (by ``key_seq``), and only if that one is pending and due.
   The starts of rate-limited keys are appended to ``scheduler_key_starts``
   and the key's starts that left the window are dropped, under the same lock.

No row is shared by every claim: two claims on different keys never wait
for each other. The counts come from the job rows themselves, so an expired
lease (the rescuer puts the row back to pending) frees its key's slot, and
nothing survives a crash that could drift. Each job is held to its own
limits (jobs of one key should agree on them).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from datetime import datetime

import asyncpg

from .job_sql import _CLAIMED_COLUMNS, claim_set
from .names import Executor, Qualifier
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
    (SELECT j.concurrency_key AS k, j.priority AS p, j.execution_time AS t
       FROM scheduled_jobs j
      WHERE j.status = 'pending' AND j.concurrency_key IS NOT NULL AND NOT j.key_ordered
      ORDER BY j.concurrency_key, j.priority, j.execution_time LIMIT 1)
    UNION ALL
    SELECT n.k, n.p, n.t FROM unordered_keys u
     CROSS JOIN LATERAL (
        SELECT j.concurrency_key AS k, j.priority AS p, j.execution_time AS t
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
    SELECT v.k, min(v.p) AS p, min(v.t) AS t FROM (
        SELECT u.k, u.p, LEAST(u.t, now()) AS t FROM unordered_keys u
        UNION ALL
        SELECT o.k, -2147483648, '-infinity'::timestamptz FROM ordered_keys o
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

# The same, visiting the keys $7 names, in that order (a list the worker read
# with _KEY_LIST: the keys with due work, the most urgent first), instead of
# every key: the keys' heads, room and the cut are read as above.
_LOCK_LISTED = f"""
{served_groups("$1", "$2", "NULL", "0", limits="none")},
{_PLAIN}, visits AS MATERIALIZED (
    SELECT l.k FROM unnest($7::text[]) WITH ORDINALITY AS l(k, n) ORDER BY l.n
), {_HEADS}"""

# Every key with pending keyed work, the most urgent first: the visiting
# order of _LOCK_KEYS, uncut, for _LOCK_LISTED. $1 how many at most.
_KEY_LIST = f"""
WITH RECURSIVE {_KEYS}
SELECT x.k FROM ({_VISITS.format(where="true")}) x ORDER BY x.p, x.t LIMIT $1
"""

# The candidate rows of locked key ``b.k``: its unordered pending rows from the
# head (at most $4), or its ordered head; due, runnable here, locked.
_CANDIDATES = """
SELECT b.k, b.running, c.* FROM busy b
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

# $1 the locked keys, $2 tasks, $3 queues (NULL: all), $4 at most this many,
# $5 worker, $6 lease seconds, $7/$8 only rows at least as urgent as this
# (priority, execution_time; NULL: no cut), $9 the rate window's margin, $10
# how many start at once (the rest are claimed ahead).
_CLAIM_KEYS = f"""
WITH busy AS (
    -- Each locked key's running jobs, and the limit of its head (how many
    -- rows the key's read takes at most: no more than may start).
    SELECT l.k, {_RUNNING.format(k="l.k")} AS running,
           (SELECT j.max_running_per_key FROM scheduled_jobs j
             WHERE j.status = 'pending' AND j.concurrency_key = l.k AND NOT j.key_ordered
             ORDER BY j.priority, j.execution_time LIMIT 1) AS head_most
      FROM (SELECT DISTINCT unnest($1::text[]) AS k) l
), unordered AS (
    {
    _CANDIDATES.format(
        where="j.status = 'pending' AND j.concurrency_key = b.k AND NOT j.key_ordered",
        served=_SERVED_ROW.format(j="j", tasks="$2", queues="$3"),
    )
}
), ordered AS (
    {
    _CANDIDATES.format(
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
              j.rate_count_per_key AS claimed_rate
), stamped AS (
    INSERT INTO scheduler_key_starts (concurrency_key, started_at)
    SELECT c.claimed_key, clock_timestamp() FROM claimed c
     WHERE c.status = 'running' AND c.claimed_rate IS NOT NULL
), pruned AS (
    DELETE FROM scheduler_key_starts s
     USING (SELECT k, max(rp) AS rp FROM picked WHERE rc IS NOT NULL GROUP BY k) w
     WHERE s.concurrency_key = w.k
       AND s.started_at < clock_timestamp() - make_interval(secs => 2 * w.rp + 1)
)
SELECT * FROM claimed
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


def lock_class(schema: str) -> int:
    """The advisory lock class (an int4) of one schema's key locks."""
    return zlib.crc32(f"pg_scheduler_keys:{schema}".encode()) - 2**31


class KeyStore:
    """The keyed claim and the per-key listing of one schema."""

    #: Slack on the rate window (see LimitStore.RATE_MARGIN): the same rule.
    RATE_MARGIN = 1.0

    def __init__(self, q: Qualifier) -> None:
        self._lock = q(_LOCK_KEYS)
        self._lock_listed = q(_LOCK_LISTED)
        self._key_list = q(_KEY_LIST)
        self._claim = q(_CLAIM_KEYS)
        self._busiest = q(_BUSIEST)
        self._class = lock_class(q.schema)

    async def claim(
        self,
        conn: asyncpg.Connection,
        *,
        limit: int,
        tasks: Sequence[str],
        queues: Sequence[str] | None,
        worker_id: str,
        lease_seconds: float,
        cut: bool,
        start_now: int | None = None,
        listed: Sequence[str] | None = None,
    ) -> tuple[list[asyncpg.Record], list[str], tuple[int, datetime] | None]:
        """Start up to ``limit`` due keyed jobs of ``tasks`` in ``queues``
        (None: every queue), within their keys' limits; ``cut``: only work at
        least as urgent as the most urgent due plain job; ``listed``: visit
        these keys, in this order (see :meth:`key_list`), instead of every
        key. Returns the rows, the keys with due work and room seen (in the
        order visited), and the most urgent of those this claim could not
        lock (another claim holds it). Past the first ``start_now`` (default:
        all) rows are claimed ahead, but for rate-limited keys, whose rows
        are taken only as many as start now."""
        args = [
            list(tasks),
            None if queues is None else list(queues),
            limit,
            cut,
            self.RATE_MARGIN,
            self._class,
        ]
        async with conn.transaction():
            if listed is None:
                heads = await conn.fetch(self._lock, *args)
            else:
                heads = await conn.fetch(self._lock_listed, *args, list(listed))
            seen = [h["k"] for h in heads]
            locked = [h["k"] for h in heads if h["locked"]]
            held = [(h["priority"], h["head"]) for h in heads if not h["locked"]]
            if not locked:
                return [], seen, min(held, default=None)
            rows = await conn.fetch(
                self._claim,
                locked,
                list(tasks),
                None if queues is None else list(queues),
                limit,
                worker_id,
                lease_seconds,
                None,
                None,
                self.RATE_MARGIN,
                limit if start_now is None else start_now,
            )
        return rows, seen, min(held, default=None)

    async def key_list(self, db: Executor, limit: int) -> list[str]:
        """Up to ``limit`` keys with pending keyed work, the most urgent first
        (the order a keyed claim visits them in)."""
        return [r["k"] for r in await db.fetch(self._key_list, limit)]

    async def busiest(self, db: Executor, limit: int = 20) -> list[asyncpg.Record]:
        """The busiest keys (running, then waiting): key, running, waiting, the
        limits, and starts in the rate window."""
        return await db.fetch(self._busiest, limit)
